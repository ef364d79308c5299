"""Canonical names of the sensor vertical, the column mapping and the bad-reading report.

Long-format readings (one row per reading) and failure events are brought to these
names with a :class:`ColumnMapping`. Aligned data is a *grid table*: one row per
(asset, step) with one column per aligned feature, gap flags and the labels.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from infra.tables import CanonicalMapping

# long-format readings and events
ASSET = "asset_id"
TIMESTAMP = "timestamp"
SENSOR = "sensor"
VALUE = "value"
FAILURE_TIME = "failure_time"
FAILURE_TYPE = "failure_type"
READING_COLUMNS: tuple[str, ...] = (ASSET, TIMESTAMP, SENSOR, VALUE)
EVENT_COLUMNS: tuple[str, ...] = (ASSET, FAILURE_TIME, FAILURE_TYPE)
CANONICAL: tuple[str, ...] = READING_COLUMNS + (FAILURE_TIME, FAILURE_TYPE)

# grid table
STEP = "step"
RUL = "rul"  #: remaining steps to failure (uncapped); NaN when the asset is censored
FAILED = "failed"  #: the asset's failure was observed (or is known, as in C-MAPSS test files)
SET = "set"  #: where the asset came from: ``fleet``, or ``train``/``test`` for C-MAPSS files
GAP_PREFIX = "gap__"  #: 1.0 where a sensor had no reading at this step
LABEL_COLUMNS: tuple[str, ...] = (ASSET, STEP, RUL, FAILED, FAILURE_TYPE, SET)


def feature_columns(columns: list[str] | tuple[str, ...], op_prefix: str = "op_") -> tuple[list[str], list[str], list[str]]:
    """Split a grid table's columns into (sensor features, operating settings, gap flags)."""
    values, ops, gaps = [], [], []
    for c in columns:
        if c in LABEL_COLUMNS:
            continue
        if c.startswith(GAP_PREFIX):
            gaps.append(c)
        elif c.startswith(op_prefix):
            ops.append(c)
        else:
            values.append(c)
    return values, ops, gaps


class ColumnMapping(CanonicalMapping):
    """Canonical column name -> source column name (unmapped ones are expected as is).

    Example:
        >>> ColumnMapping({"asset_id": "machine", "timestamp": "ts"}).columns["asset_id"]
        'machine'
    """

    canonical = CANONICAL


class BadReadingReport(BaseModel):
    """Readings and assets that were counted and left out, never dropped silently."""

    model_config = ConfigDict(frozen=False)

    source: str = ""
    readings_in: int = 0
    readings_used: int = 0
    nan: int = 0
    inf: int = 0
    non_numeric: int = 0
    out_of_range: int = 0
    duplicate_timestamps: int = 0
    out_of_order: int = Field(default=0, description="Readings found out of time order (sorted, kept).")
    after_failure: int = 0
    unknown_sensor: int = 0
    rows_dropped: int = Field(
        default=0, description="Rows that could not be placed (unreadable asset or step): dropped whole."
    )
    short_assets: list[str] = Field(default_factory=list, description="Assets with fewer than 2 steps: skipped.")
    assets_without_window: list[str] = Field(
        default_factory=list, description="Assets shorter than one window: skipped (or padded where noted)."
    )
    padded_assets: list[str] = Field(default_factory=list, description="Assets left-padded to one window.")
    events_for_unknown_assets: int = 0

    def bad_total(self) -> int:
        """Readings left out for a bad value or timestamp."""
        return (
            self.nan + self.inf + self.non_numeric + self.out_of_range + self.duplicate_timestamps
            + self.after_failure + self.unknown_sensor
        )

    def summary(self) -> str:
        """One line for logs and reports."""
        parts = [
            f"{self.readings_in} readings in, {self.readings_used} used",
            f"NaN {self.nan}", f"inf {self.inf}", f"non-numeric {self.non_numeric}",
            f"out of range {self.out_of_range}", f"duplicate timestamps {self.duplicate_timestamps}",
            f"out of order (sorted) {self.out_of_order}", f"after failure {self.after_failure}",
            f"assets skipped (< 2 steps) {len(self.short_assets)}",
            f"assets shorter than a window {len(self.assets_without_window)}",
        ]
        if self.rows_dropped:
            parts.append(f"rows dropped {self.rows_dropped}")
        if self.padded_assets:
            parts.append(f"assets padded {len(self.padded_assets)}")
        if self.events_for_unknown_assets:
            parts.append(f"events for unknown assets {self.events_for_unknown_assets}")
        return (self.source + ": " if self.source else "") + ", ".join(parts)
