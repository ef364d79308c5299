"""Reader of the NASA C-MAPSS turbofan files (users download them; nothing is shipped).

Each ``train_FDxxx.txt`` / ``test_FDxxx.txt`` is space separated, without a header, one
row per (unit, cycle) and 26 columns: unit, cycle, three operational settings and 21
sensors, often with trailing spaces. Train units run to failure; test units stop before
failure and ``RUL_FDxxx.txt`` gives each test unit's true remaining cycles, one integer
per line. The result is a grid table as produced by :mod:`solutions.sensor.align`.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from infra.errors import DataValidationError
from solutions.sensor import schema as S
from solutions.sensor.schema import BadReadingReport

log = logging.getLogger(__name__)

OP_COLUMNS: tuple[str, ...] = ("op_setting_1", "op_setting_2", "op_setting_3")
SENSOR_COLUMNS: tuple[str, ...] = tuple(f"sensor_{i}" for i in range(1, 22))
READING_COLUMNS: tuple[str, ...] = (*OP_COLUMNS, *SENSOR_COLUMNS)  #: 24 readings per line
COLUMNS: tuple[str, ...] = ("unit", "cycle", *READING_COLUMNS)
SUBSETS = ("FD001", "FD002", "FD003", "FD004")
#: operating regimes of each subset (FD002/FD004 fly six conditions)
REGIMES = {"FD001": 1, "FD002": 6, "FD003": 1, "FD004": 6}
#: above this share of unreadable values in one column the file is not taken as C-MAPSS
MAX_BAD_SHARE = 0.5
#: how a missing value may be written (counted as NaN; anything else unreadable is non-numeric)
NAN_TEXT = ("nan", "-nan", "+nan")


def check_subset(subset: str) -> str:
    """``FD001``..``FD004`` (case-insensitive), or a clear error."""
    name = subset.strip().upper()
    if name not in SUBSETS:
        raise DataValidationError(f"unknown C-MAPSS subset {subset!r}; known: {', '.join(SUBSETS)}")
    return name


def _not_finite(text: pd.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(parsed values, NaN written as such, infinities, text that is no number) of one column."""
    parsed = pd.to_numeric(text, errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
    missing = np.isnan(parsed)
    written_nan = text.str.lower().isin(NAN_TEXT).to_numpy()
    return parsed, missing & written_nan, np.isinf(parsed), missing & ~written_nan


def _too_many(bad: np.ndarray, raw: pd.DataFrame, col: str, lines: np.ndarray, source: str) -> None:
    if bad.mean() > MAX_BAD_SHARE:
        first = np.flatnonzero(bad)[:5].tolist()
        raise DataValidationError(
            f"{int(bad.sum())} of {len(bad)} values are not finite numbers (e.g. {raw[col].iloc[first[0]]!r} "
            f"on line {lines[first[0]]}); is this a C-MAPSS file?",
            source=source, column=col, rows=first,
        )


def read_cmapss_file(path: Path, report: BadReadingReport | None = None) -> pd.DataFrame:
    """One C-MAPSS data file as a frame with the 26 named columns.

    Bad values are counted in ``report`` (if given), never dropped silently: a setting or
    sensor value that is not a finite number (``nan``, ``inf``, text) is left out (NaN in
    the frame, which the normaliser maps to the regime mean); a line whose unit or cycle
    is not a finite number cannot be placed and is dropped whole (``rows_dropped``).

    Raises:
        DataValidationError: missing file, wrong column count, more than half of one
            column unreadable, or cycles that do not increase within a unit (naming the rows).
    """
    path = Path(path)
    source = str(path)
    if not path.exists():
        raise DataValidationError(
            "file not found; download the C-MAPSS data set and pass its folder with --cmapss-dir", source=source
        )
    rows, numbers = [], []
    with open(path, encoding="ascii", errors="replace") as handle:
        for number, line in enumerate(handle):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != len(COLUMNS):
                raise DataValidationError(
                    f"line {number + 1} has {len(fields)} fields, the C-MAPSS format has {len(COLUMNS)} "
                    "(unit, cycle, 3 settings, 21 sensors)",
                    source=source, rows=[number],
                )
            rows.append(fields)
            numbers.append(number + 1)
    if not rows:
        raise DataValidationError("file has no data lines", source=source)
    raw = pd.DataFrame(rows, columns=list(COLUMNS))
    lines = np.asarray(numbers)
    placed = np.ones(len(raw), dtype=bool)
    keys = {}
    for col in ("unit", "cycle"):
        parsed, _, _, _ = _not_finite(raw[col])
        unreadable = ~np.isfinite(parsed)
        _too_many(unreadable, raw, col, lines, source)
        placed &= ~unreadable
        keys[col] = parsed
    counts = {"nan": 0, "inf": 0, "non_numeric": 0}
    values = {}
    for col in READING_COLUMNS:
        parsed, nan, inf, text = _not_finite(raw[col])
        _too_many(nan | inf | text, raw, col, lines, source)
        for name, bad in (("nan", nan), ("inf", inf), ("non_numeric", text)):
            counts[name] += int((bad & placed).sum())
        values[col] = np.where(np.isfinite(parsed), parsed, np.nan)[placed]
    if report is not None:
        left_out = sum(counts.values())
        report.readings_in += len(raw) * len(READING_COLUMNS)
        report.readings_used += int(placed.sum()) * len(READING_COLUMNS) - left_out
        report.nan += counts["nan"]
        report.inf += counts["inf"]
        report.non_numeric += counts["non_numeric"]
        report.rows_dropped += int((~placed).sum())
    if not placed.all():
        log.warning("%s: %d line(s) without a readable unit or cycle dropped (e.g. line %d)",
                    source, int((~placed).sum()), lines[~placed][0])
    out = pd.DataFrame({"unit": keys["unit"][placed].astype("int64"), "cycle": keys["cycle"][placed].astype("int64")})
    for col in READING_COLUMNS:
        out[col] = values[col]
    kept_rows = np.flatnonzero(placed)
    unit, cycle = out["unit"].to_numpy(), out["cycle"].to_numpy()
    same = unit[1:] == unit[:-1]
    backwards = np.flatnonzero(same & (cycle[1:] <= cycle[:-1])) + 1
    if len(backwards):
        raise DataValidationError(
            f"cycles out of order or repeated within a unit at {len(backwards)} line(s) "
            f"(e.g. unit {unit[backwards[0]]} cycle {cycle[backwards[0]]} on line {lines[kept_rows[backwards[0]]]}); "
            "C-MAPSS files list each unit's cycles in increasing order",
            source=source, column="cycle", rows=kept_rows[backwards[:5]].tolist(),
        )
    return out


def read_rul_file(path: Path) -> np.ndarray:
    """True remaining cycles of each test unit, in unit order."""
    path = Path(path)
    if not path.exists():
        raise DataValidationError("file not found", source=str(path))
    values = []
    for number, line in enumerate(path.read_text(encoding="ascii", errors="replace").splitlines()):
        text = line.strip()
        if not text:
            continue
        try:
            values.append(int(float(text.split()[0])))
        except ValueError as exc:
            raise DataValidationError(
                f"line {number + 1} is {text!r}, not an integer number of cycles", source=str(path), rows=[number]
            ) from exc
    return np.asarray(values, dtype=np.int64)


def _to_grid(frame: pd.DataFrame, prefix: str, set_name: str, rul_at_end: np.ndarray | None) -> pd.DataFrame:
    units = frame["unit"].to_numpy()
    last = frame.groupby("unit")["cycle"].transform("max").to_numpy()
    grid = pd.DataFrame({S.ASSET: [f"{prefix}{u}" for u in units], S.STEP: frame["cycle"].to_numpy() - 1})
    for col in (*OP_COLUMNS, *SENSOR_COLUMNS):
        grid[col] = frame[col].to_numpy()
    extra = 0 if rul_at_end is None else rul_at_end[np.searchsorted(np.unique(units), units)]
    grid[S.RUL] = (last - frame["cycle"].to_numpy() + extra).astype("float64")
    grid[S.FAILED] = True
    grid[S.FAILURE_TYPE] = "unknown"
    grid[S.SET] = set_name
    return grid


def has_test_files(directory: Path, subset: str) -> bool:
    """True when the folder holds the subset's test units and their true RUL (not only ``train_``)."""
    directory = Path(directory).expanduser()
    subset = check_subset(subset)
    return (directory / f"test_{subset}.txt").is_file() and (directory / f"RUL_{subset}.txt").is_file()


def load_cmapss(directory: Path, subset: str = "FD001") -> tuple[pd.DataFrame, BadReadingReport]:
    """The train and test units of one subset as one grid table (``set`` = train/test),
    and the counts of what the reader saw in both files.

    Train units get ``rul`` = cycles left to their last cycle; test units get the value
    from ``RUL_FDxxx.txt`` plus the cycles after each row. A folder with the training file
    only (no ``test_``/``RUL_`` files) gives the train units alone: the sensor flows then hold
    engines of it out for validation and test (split by engine, never by window).
    """
    directory = Path(directory).expanduser()
    subset = check_subset(subset)
    report = BadReadingReport(source=str(directory))
    train = read_cmapss_file(directory / f"train_{subset}.txt", report)
    if not has_test_files(directory, subset):
        log.info("%s: train_%s.txt only (no test_/RUL_ files): %d engines, test engines will be held out of them",
                 directory, subset, train["unit"].nunique())
        return _to_grid(train, "train-", "train", None), report
    test = read_cmapss_file(directory / f"test_{subset}.txt", report)
    rul = read_rul_file(directory / f"RUL_{subset}.txt")
    n_test = test["unit"].nunique()
    if len(rul) != n_test:
        raise DataValidationError(
            f"has {len(rul)} values but test_{subset}.txt has {n_test} units; one line per test unit is needed",
            source=str(directory / f"RUL_{subset}.txt"),
        )
    grid = pd.concat(
        [_to_grid(train, "train-", "train", None), _to_grid(test, "test-", "test", rul)], ignore_index=True
    )
    return grid, report
