"""Load and validate tables into the artifact store; time-ordered splits.

Plain functions first (unit-testable without Prefect), thin tasks at the bottom.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from prefect import task
from prefect.cache_policies import NONE
from pydantic import BaseModel, ConfigDict, Field

from infra.errors import DataValidationError
from infra.home import home_layout
from infra.store import atomic_path, sha256_file, stable_hash
from infra.tables import read_table

log = logging.getLogger(__name__)

ColumnKind = Literal["id", "float", "int", "datetime", "binary", "category", "str"]
MAX_ROWS_SHOWN = 5


class ColumnSpec(BaseModel):
    """One column of a table schema."""

    model_config = ConfigDict(frozen=True)

    name: str
    kind: ColumnKind
    required: bool = True
    nullable: bool = False
    min_value: float | None = None


class TableSchema(BaseModel):
    """What a table must look like. The label column, if any, must hold both classes."""

    model_config = ConfigDict(frozen=True)

    name: str
    columns: tuple[ColumnSpec, ...]
    time_column: str | None = None
    label_column: str | None = None
    min_rows: int = 1

    def fingerprint(self) -> str:
        return stable_hash(self.model_dump())


class DatasetRef(BaseModel):
    """A validated table in the artifact store (Parquet), small enough to pass between tasks."""

    model_config = ConfigDict(frozen=True)

    path: str
    content_hash: str
    n_rows: int
    columns: dict[str, str] = Field(description="column -> dtype")
    source: str

    def read(self, columns: Sequence[str] | None = None) -> pd.DataFrame:
        """Read the table (or some of its columns) back."""
        return pd.read_parquet(self.path, columns=list(columns) if columns else None)


# --------------------------------------------------------------------------------------
# reading and validation


def _bad_rows(mask: pd.Series) -> list[int]:
    return [int(i) for i in np.flatnonzero(mask.to_numpy())[:MAX_ROWS_SHOWN]]


def _examples(series: pd.Series, rows: list[int]) -> str:
    return ", ".join(repr(series.iloc[r]) for r in rows[:3])


def validate_table(df: pd.DataFrame, schema: TableSchema, source: str) -> pd.DataFrame:
    """Coerce types and check a table against ``schema``.

    Returns a new frame with only the schema's columns (optional ones when present),
    typed, in file order. Raises :class:`DataValidationError` naming the file, the column
    and the first offending rows (0-based data rows; CSV line = row + 2).
    """
    if len(df) < schema.min_rows:
        raise DataValidationError(
            f"has {len(df)} rows, at least {schema.min_rows} needed", source=source
        )
    missing = [c.name for c in schema.columns if c.required and c.name not in df.columns]
    if missing:
        raise DataValidationError(
            f"missing required column(s) {missing}; the file has {list(df.columns)}. "
            "Map differently named columns with a column mapping (e.g. --columns "
            f"{missing[0]}=YOUR_COLUMN).",
            source=source,
            column=missing[0],
        )
    out: dict[str, pd.Series] = {}
    for spec in schema.columns:
        if spec.name not in df.columns:
            continue
        raw = df[spec.name].reset_index(drop=True)
        col = _coerce(raw, spec, source)
        if not spec.nullable:
            nulls = col.isna()
            if nulls.any():
                rows = _bad_rows(nulls)
                raise DataValidationError(
                    f"{int(nulls.sum())} empty value(s) where none are allowed",
                    source=source,
                    column=spec.name,
                    rows=rows,
                )
        if spec.min_value is not None and spec.kind in {"float", "int"}:
            low = col < spec.min_value
            if low.any():
                rows = _bad_rows(low)
                raise DataValidationError(
                    f"{int(low.sum())} value(s) below the minimum {spec.min_value}: "
                    f"{_examples(raw, rows)}",
                    source=source,
                    column=spec.name,
                    rows=rows,
                )
        out[spec.name] = col
    table = pd.DataFrame(out)
    if schema.label_column and schema.label_column in table:
        counts = table[schema.label_column].value_counts()
        if len(counts) < 2:
            only = counts.index[0] if len(counts) else "none"
            raise DataValidationError(
                f"labels are all one class ({only!r}); a binary classifier needs both 0 and 1",
                source=source,
                column=schema.label_column,
            )
    return table


def _coerce(raw: pd.Series, spec: ColumnSpec, source: str) -> pd.Series:
    present = raw.notna()
    if spec.kind in {"float", "int"}:
        col = pd.to_numeric(raw, errors="coerce")
        bad = present & col.isna()
        if not bad.any():
            bad = present & ~np.isfinite(col.astype("float64").fillna(0.0))
        if bad.any():
            rows = _bad_rows(bad)
            raise DataValidationError(
                f"{int(bad.sum())} non-numeric or infinite value(s), e.g. {_examples(raw, rows)}",
                source=source,
                column=spec.name,
                rows=rows,
            )
        return col.astype("float64") if spec.kind == "float" else col
    if spec.kind == "datetime":
        if pd.api.types.is_datetime64_any_dtype(raw):
            col = raw
        else:
            col = pd.to_datetime(raw, errors="coerce", format="mixed")
        bad = present & col.isna()
        if bad.any():
            rows = _bad_rows(bad)
            raise DataValidationError(
                f"{int(bad.sum())} unparseable timestamp(s), e.g. {_examples(raw, rows)}",
                source=source,
                column=spec.name,
                rows=rows,
            )
        if getattr(col.dt, "tz", None) is not None:
            col = col.dt.tz_convert("UTC").dt.tz_localize(None)
        return col.astype("datetime64[ns]")
    if spec.kind == "binary":
        mapped = raw.map(_to_binary)
        bad = present & mapped.isna()
        if bad.any():
            rows = _bad_rows(bad)
            raise DataValidationError(
                f"{int(bad.sum())} value(s) that are not a binary label (0/1, true/false), "
                f"e.g. {_examples(raw, rows)}",
                source=source,
                column=spec.name,
                rows=rows,
            )
        return mapped.astype("Int8") if spec.nullable else mapped.astype("int8")
    # id, category, str: keep as strings (ids may be numeric in the file)
    return raw.astype("string")


_TRUE = {"1", "1.0", "true", "t", "yes", "y"}
_FALSE = {"0", "0.0", "false", "f", "no", "n"}


def _to_binary(value: object) -> float:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return np.nan
    if isinstance(value, (bool, np.bool_)):
        return float(value)
    text = str(value).strip().lower()
    if text in _TRUE:
        return 1.0
    if text in _FALSE:
        return 0.0
    return np.nan


def load_table(
    path: Path,
    schema: TableSchema,
    *,
    columns: Mapping[str, str] | None = None,
) -> DatasetRef:
    """Read, rename (canonical <- source), validate and store a table as Parquet.

    The stored file is content-addressed (source bytes + schema + mapping), so loading
    an unchanged file again reuses the stored Parquet without parsing it.
    """
    path = Path(path)
    if not path.exists():
        raise DataValidationError("file not found", source=str(path))
    mapping = dict(columns or {})
    key = stable_hash(
        {"file": sha256_file(path), "schema": schema.fingerprint(), "columns": mapping}
    )
    target = home_layout().datasets() / f"{schema.name}-{key}.parquet"
    meta_path = target.with_suffix(".json")
    if target.exists() and meta_path.exists():
        log.info("reusing validated %s for %s (content hash %s)", target.name, path, key)
        return DatasetRef(**json.loads(meta_path.read_text()))
    df = read_table(path)
    if mapping:
        absent = [src for src in mapping.values() if src not in df.columns]
        if absent:
            raise DataValidationError(
                f"column mapping names {absent}, which the file does not have; "
                f"it has {list(df.columns)}",
                source=str(path),
                column=absent[0],
            )
        df = df.rename(columns={src: canon for canon, src in mapping.items()})
    table = validate_table(df, schema, source=str(path))
    ref = store_table(table, target, key=key, source=str(path))
    return ref


def store_table(table: pd.DataFrame, target: Path, *, key: str, source: str) -> DatasetRef:
    """Write a validated frame as Parquet plus its small JSON description, atomically."""
    with atomic_path(target) as tmp:
        table.to_parquet(tmp, index=False)
    ref = DatasetRef(
        path=str(target),
        content_hash=key,
        n_rows=len(table),
        columns={c: str(t) for c, t in table.dtypes.items()},
        source=source,
    )
    with atomic_path(target.with_suffix(".json")) as tmp:
        tmp.write_text(ref.model_dump_json(indent=2))
    log.info("stored %d validated rows of %s as %s", len(table), source, target.name)
    return ref


# --------------------------------------------------------------------------------------
# time-ordered splits


class TimeSplit(BaseModel):
    """Period boundaries counted back from the end of the data (half-open intervals)."""

    model_config = ConfigDict(frozen=True)

    train_start: dt.datetime
    val_start: dt.datetime
    train_end: dt.datetime
    test_start: dt.datetime
    end: dt.datetime

    def describe(self) -> str:
        return (
            f"train [{self.train_start:%Y-%m-%d}, {self.val_start:%Y-%m-%d}) "
            f"val [{self.val_start:%Y-%m-%d}, {self.train_end:%Y-%m-%d}) "
            f"delay [{self.train_end:%Y-%m-%d}, {self.test_start:%Y-%m-%d}) "
            f"test [{self.test_start:%Y-%m-%d}, {self.end:%Y-%m-%d})"
        )


def time_split(
    timestamps: pd.Series,
    *,
    train_days: float,
    delay_days: float,
    test_days: float,
    val_days: float = 0.0,
) -> TimeSplit:
    """Periods counted back from the end of the data: ``[... history | train | val | delay | test]``.

    ``val`` is the last part of the training period (labels known, used for early stopping
    and thresholds); ``delay`` holds transactions whose labels are not known yet and is
    never trained on. Everything before ``train_start`` is history only.
    """
    if min(train_days, test_days) <= 0 or min(delay_days, val_days) < 0:
        raise ValueError("train_days and test_days must be > 0; delay_days, val_days >= 0")
    if val_days >= train_days:
        raise ValueError(f"val_days ({val_days}) must be smaller than train_days ({train_days})")
    last = pd.Timestamp(timestamps.max())
    first = pd.Timestamp(timestamps.min())
    end = last.normalize() + pd.Timedelta(days=1)
    test_start = end - pd.Timedelta(days=test_days)
    train_end = test_start - pd.Timedelta(days=delay_days)
    train_start = train_end - pd.Timedelta(days=train_days)
    val_start = train_end - pd.Timedelta(days=val_days)
    if train_start < first.normalize():
        span = (end - first.normalize()).days
        raise DataValidationError(
            f"the data spans {span} days ({first:%Y-%m-%d} to {last:%Y-%m-%d}) but the split "
            f"needs {train_days + delay_days + test_days:g} (train {train_days:g} + delay "
            f"{delay_days:g} + test {test_days:g}); shorten the periods"
        )
    return TimeSplit(
        train_start=train_start.to_pydatetime(),
        val_start=val_start.to_pydatetime(),
        train_end=train_end.to_pydatetime(),
        test_start=test_start.to_pydatetime(),
        end=end.to_pydatetime(),
    )


def assign_periods(timestamps: pd.Series, split: TimeSplit) -> np.ndarray:
    """Label each timestamp ``history``, ``train``, ``val``, ``delay`` or ``test``."""
    ts = pd.to_datetime(timestamps).to_numpy()
    edges = np.array(
        [split.train_start, split.val_start, split.train_end, split.test_start],
        dtype="datetime64[ns]",
    )
    names = np.array(["history", "train", "val", "delay", "test"])
    return names[np.searchsorted(edges, ts, side="right")]


# --------------------------------------------------------------------------------------
# tasks


# Cache policy: NONE on purpose. The store itself is content-addressed (source bytes +
# schema + mapping), which survives Prefect result-storage resets and never returns a
# reference to a deleted file.
load_table_task = task(
    load_table,
    name="load-table",
    description="Read, map, validate and store a CSV/Parquet table (content-addressed).",
    cache_policy=NONE,
)
