"""Reader of the NASA C-MAPSS turbofan files (users download them; nothing is shipped).

Each ``train_FDxxx.txt`` / ``test_FDxxx.txt`` is space separated, without a header, one
row per (unit, cycle) and 26 columns: unit, cycle, three operational settings and 21
sensors, often with trailing spaces. Train units run to failure; test units stop before
failure and ``RUL_FDxxx.txt`` gives each test unit's true remaining cycles, one integer
per line. The result is a grid table as produced by :mod:`solutions.sensor.align`.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from infra.errors import DataValidationError
from solutions.sensor import schema as S

OP_COLUMNS: tuple[str, ...] = ("op_setting_1", "op_setting_2", "op_setting_3")
SENSOR_COLUMNS: tuple[str, ...] = tuple(f"sensor_{i}" for i in range(1, 22))
COLUMNS: tuple[str, ...] = ("unit", "cycle", *OP_COLUMNS, *SENSOR_COLUMNS)
SUBSETS = ("FD001", "FD002", "FD003", "FD004")
#: operating regimes of each subset (FD002/FD004 fly six conditions)
REGIMES = {"FD001": 1, "FD002": 6, "FD003": 1, "FD004": 6}


def check_subset(subset: str) -> str:
    """``FD001``..``FD004`` (case-insensitive), or a clear error."""
    name = subset.upper()
    if not re.fullmatch(r"FD\d{3}", name):
        raise DataValidationError(f"subset {subset!r} is not of the form FD001; known: {', '.join(SUBSETS)}")
    return name


def read_cmapss_file(path: Path) -> pd.DataFrame:
    """One C-MAPSS data file as a frame with the 26 named columns.

    Raises:
        DataValidationError: missing file, wrong column count, non-numeric values, or
            cycles that do not increase within a unit (naming the rows).
    """
    path = Path(path)
    source = str(path)
    if not path.exists():
        raise DataValidationError(
            "file not found; download the C-MAPSS data set and pass its folder with --cmapss-dir", source=source
        )
    rows = []
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
    if not rows:
        raise DataValidationError("file has no data lines", source=source)
    raw = pd.DataFrame(rows, columns=list(COLUMNS))
    out = pd.DataFrame(index=raw.index)
    for col in COLUMNS:
        num = pd.to_numeric(raw[col], errors="coerce")
        bad = num.isna().to_numpy() | ~np.isfinite(num.to_numpy(dtype="float64", na_value=np.nan))
        if bad.any():
            first = np.flatnonzero(bad)[:5].tolist()
            raise DataValidationError(
                f"{int(bad.sum())} values are not finite numbers (e.g. {raw[col].iloc[first[0]]!r} on line {first[0] + 1})",
                source=source, column=col, rows=first,
            )
        out[col] = num.astype("int64") if col in ("unit", "cycle") else num.astype("float64")
    unit, cycle = out["unit"].to_numpy(), out["cycle"].to_numpy()
    same = unit[1:] == unit[:-1]
    backwards = np.flatnonzero(same & (cycle[1:] <= cycle[:-1])) + 1
    if len(backwards):
        raise DataValidationError(
            f"cycles out of order or repeated within a unit at {len(backwards)} line(s) "
            f"(e.g. unit {unit[backwards[0]]} cycle {cycle[backwards[0]]} on line {backwards[0] + 1}); "
            "C-MAPSS files list each unit's cycles in increasing order",
            source=source, column="cycle", rows=backwards[:5].tolist(),
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


def load_cmapss(directory: Path, subset: str = "FD001") -> pd.DataFrame:
    """The train and test units of one subset as one grid table (``set`` = train/test).

    Train units get ``rul`` = cycles left to their last cycle; test units get the value
    from ``RUL_FDxxx.txt`` plus the cycles after each row.
    """
    directory = Path(directory).expanduser()
    subset = check_subset(subset)
    train = read_cmapss_file(directory / f"train_{subset}.txt")
    test = read_cmapss_file(directory / f"test_{subset}.txt")
    rul = read_rul_file(directory / f"RUL_{subset}.txt")
    n_test = test["unit"].nunique()
    if len(rul) != n_test:
        raise DataValidationError(
            f"has {len(rul)} values but test_{subset}.txt has {n_test} units; one line per test unit is needed",
            source=str(directory / f"RUL_{subset}.txt"),
        )
    return pd.concat(
        [_to_grid(train, "train-", "train", None), _to_grid(test, "test-", "test", rul)], ignore_index=True
    )
