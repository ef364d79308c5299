"""Where a sensor run's grid table comes from, and what its bad readings were.

A source is a NASA C-MAPSS folder, a long-format readings file (plus events), or the
seeded synthetic fleet. :func:`cmapss_plan` and :func:`readings_plan` name everything the
grid depends on (its content key) and how to build it; the build returns the grid and the
:class:`~solutions.sensor.schema.BadReadingReport` the reader measured. The report is
stored under the home's prepared folder beside the grid (:func:`save_bad_readings`), so a
run that reuses a stored grid reports the counts of the run that built it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from infra.errors import DataValidationError
from infra.home import home_layout
from infra.store import sha256_file, stable_hash, write_json_atomic
from solutions.sensor.align import (
    align_readings,
    check_table_columns,
    clean_events,
    clean_readings,
    load_readings,
)
from solutions.sensor.cmapss import REGIMES, check_subset, has_test_files, load_cmapss
from solutions.sensor.config import (
    DEFAULT_STRIDE,
    AlignConfig,
    SensorConfig,
    SensorSource,
    SyntheticFleetConfig,
    WindowConfig,
)
from solutions.sensor.schema import BadReadingReport, ColumnMapping
from solutions.sensor.synthetic import generate_fleet

#: Bump when the grid code changes, so stored grids are rebuilt (2: C-MAPSS bad values counted).
GRID_VERSION = "2"
CMAPSS_FILES = ("train", "test", "RUL")


@dataclass(frozen=True)
class GridPlan:
    """How to build one grid table and what it depends on.

    Attributes:
        name: table name in the prepared store (``sensor-grid``, ``sensor-cmapss-fd001``).
        key: everything the grid depends on (input hashes, settings, code version).
        build: reads and aligns the input; returns the grid and the measured bad readings.
    """

    name: str
    key: Mapping[str, Any]
    build: Callable[[], tuple[pd.DataFrame, BadReadingReport]] = field(compare=False)

    def bad_readings_path(self) -> Path:
        """The stored bad-reading counts of this grid."""
        return home_layout().prepared() / f"{self.name}-bad-readings-{stable_hash(dict(self.key))}.json"


def _digest(path: Path) -> str:
    return sha256_file(path) if path.exists() else str(path)


def cmapss_plan(folder: Path, subset: str) -> GridPlan:
    """The grid of one C-MAPSS subset (train and test units)."""
    folder = Path(folder).expanduser()
    subset = check_subset(subset)
    files = [folder / f"{kind}_{subset}.txt" for kind in CMAPSS_FILES]
    key = {"files": [_digest(f) for f in files], "v": GRID_VERSION}
    return GridPlan(f"sensor-cmapss-{subset.lower()}", key, lambda: load_cmapss(folder, subset))


def readings_plan(data: Path, events: Path | None, columns: Mapping[str, str], align: AlignConfig,
                  data_sha256: str | None = None, encoding: str | None = None) -> GridPlan:
    """The grid of a long-format readings file (and its failure events, if any)."""
    data = Path(data).expanduser()
    events = Path(events).expanduser() if events else None
    key = {
        "file": data_sha256 or _digest(data),
        "events": _digest(events) if events else None,
        "columns": dict(columns),
        "align": align.model_dump(),
        "v": GRID_VERSION,
        **({"encoding": encoding} if encoding else {}),
    }
    return GridPlan("sensor-grid", key,
                    lambda: load_readings(data, ColumnMapping(dict(columns)), align, events, encoding))


def fleet_key(fleet: SyntheticFleetConfig) -> dict[str, Any]:
    """Content key of the synthetic fleet's readings and events tables."""
    return {"fleet": fleet.model_dump(), "v": "1"}


def fleet_readings(fleet: SyntheticFleetConfig) -> pd.DataFrame:
    """The synthetic fleet's long-format readings."""
    return generate_fleet(fleet)[0]


def fleet_events(fleet: SyntheticFleetConfig) -> pd.DataFrame:
    """The synthetic fleet's failure events."""
    return generate_fleet(fleet)[1]


def save_bad_readings(plan: GridPlan, report: BadReadingReport) -> None:
    """Store the counts measured while building ``plan``'s grid."""
    write_json_atomic(plan.bad_readings_path(), report.model_dump())


def stored_bad_readings(plan: GridPlan) -> BadReadingReport | None:
    """The counts stored for ``plan``'s grid, if any."""
    path = plan.bad_readings_path()
    return BadReadingReport.model_validate_json(path.read_text()) if path.exists() else None


def build_grid(source: SensorSource, config: SensorConfig) -> tuple[pd.DataFrame, BadReadingReport]:
    """The grid of a source and its bad readings, built now without the prepared store.

    For code below the tasks layer (a compression adapter, a benchmark); the flows use
    the content-addressed store instead (``flows/sensor/steps.py``).
    """
    if source.cmapss_dir:
        return cmapss_plan(Path(source.cmapss_dir), source.subset).build()
    if source.data:
        events = Path(source.events) if source.events else None
        return readings_plan(Path(source.data), events, source.columns, config.align).build()
    readings, events = generate_fleet(config.fleet)
    clean, report = clean_readings(readings, config.align, "synthetic fleet")
    return align_readings(clean, clean_events(events), config.align, report)


def window_config(source: SensorSource, config: SensorConfig) -> WindowConfig:
    """The window settings, with C-MAPSS regime counts known per subset (one test cut each
    when the test file is there) and the training stride resolved (1 for C-MAPSS)."""
    w = config.window
    if source.cmapss_dir:
        # the test file's units are cut already; engines held out of the train file are cut as configured
        held_out = not has_test_files(Path(source.cmapss_dir), source.subset)
        update: dict[str, Any] = {} if held_out else {"test_cuts": 1}
        if w.stride is None:
            update["stride"] = 1
        if w.n_regimes == "auto":
            update["n_regimes"] = REGIMES.get(check_subset(source.subset), "auto")
        w = w.model_copy(update=update)
    return w if w.stride is not None else w.model_copy(update={"stride": DEFAULT_STRIDE})


def check_source_files(source: SensorSource) -> None:
    """Pre-flight: the input files or folder exist and a readings file has the mapped columns.

    Raises:
        DataValidationError: naming the missing file or column (and the flag that fixes it).
    """
    if source.cmapss_dir:
        folder = Path(source.cmapss_dir).expanduser()
        if not folder.is_dir():
            raise DataValidationError("C-MAPSS folder not found (--cmapss-dir)", source=str(folder))
        subset = check_subset(source.subset)
        absent = [f"{kind}_{subset}.txt" for kind in CMAPSS_FILES if not (folder / f"{kind}_{subset}.txt").is_file()]
        if f"train_{subset}.txt" in absent or len(absent) == 1:
            raise DataValidationError(
                f"has no {', '.join(absent)}; download the C-MAPSS data set into it (the train file alone "
                "is enough: test engines are then held out of it)", source=str(folder)
            )
    mapping = ColumnMapping(dict(source.columns))
    if source.data:
        check_table_columns(Path(source.data).expanduser(), mapping, "readings")
    if source.events:
        check_table_columns(Path(source.events).expanduser(), mapping, "events")
