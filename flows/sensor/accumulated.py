"""The accumulated sensor data (scored readings + arrived failure events, Parquet by day)
as training input: its run-to-failure trajectories become a readings table and an events
table, aligned like any readings file."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from infra.home import home_layout
from infra.store import stable_hash
from solutions.sensor import data as D
from solutions.sensor import monitoring as M
from solutions.sensor import schema as S
from solutions.sensor.config import SensorConfig
from tasks import accumulate as A
from tasks.prepare import materialize_table

#: ``<home>/accumulated/<name>``: the scored readings, and the failure events (by failure day).
READINGS = "sensor"
FAILURES = "sensor-failures"


def readings_root() -> Path:
    """Where the scored readings accumulate (day partitions)."""
    return home_layout().accumulated(READINGS)


def failures_root() -> Path:
    """Where the arrived failure events accumulate (day partitions of the failure day)."""
    return home_layout().accumulated(FAILURES)


def _partitions_key(root: Path) -> dict[str, int]:
    return {str(d): (A.partition_dir(root, d) / A.PARTITION_FILE).stat().st_mtime_ns for d in A.days(root)}


def accumulated_plan(config: SensorConfig) -> D.GridPlan:
    """The grid plan of the accumulated run-to-failure trajectories (every asset with both
    readings and a failure event; RUL labels from the event).

    Raises:
        DataValidationError: nothing has accumulated yet, or too few assets have failed.
    """
    readings_at, failures_at = readings_root(), failures_root()
    key = {"v": "1", "readings": stable_hash(_partitions_key(readings_at)),
           "failures": stable_hash(_partitions_key(failures_at))}
    readings = A.read_window(readings_at, what="accumulated sensor readings")
    failures = A.read_window(failures_at, what="accumulated failure events") if A.days(failures_at) else \
        pd.DataFrame(columns=[S.ASSET, M.FAILED_AT])  # none yet: run_to_failure says what is missing
    rows, events = M.run_to_failure(readings, failures, source=str(readings_at.parent))
    stored = materialize_table("sensor-accumulated-readings", key, lambda: rows)
    stored_events = materialize_table("sensor-accumulated-events", key, lambda: events)
    return D.readings_plan(Path(stored.path), Path(stored_events.path), {}, config.align)
