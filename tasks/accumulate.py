"""An accumulating dataset: rows partitioned by day (``<root>/day=YYYY-MM-DD/data.parquet``).

Batch-scored rows land here as they are monitored, and labels (or failure events) that
arrive later are written into the rows they belong to, so the dataset becomes the
training data of the next scheduled retrain. A partition is rewritten atomically with
the union of its old and new rows (one row per key, the newest wins); a retrain reads
the latest window (:func:`read_window`). Domain-agnostic: the caller names the key and
time columns.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable
from pathlib import Path

import pandas as pd

from infra.errors import DataValidationError
from infra.store import atomic_path

log = logging.getLogger(__name__)

PARTITION_FILE = "data.parquet"


def partition_dir(root: Path, day: dt.date) -> Path:
    return root / f"day={day.isoformat()}"


def days(root: Path) -> list[dt.date]:
    """The days that have a partition, oldest first."""
    if not root.exists():
        return []
    found = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith("day=") and (p / PARTITION_FILE).exists():
            try:
                found.append(dt.date.fromisoformat(p.name[4:]))
            except ValueError:
                log.warning("ignoring %s: not a day partition", p)
    return sorted(found)


def read_day(root: Path, day: dt.date) -> pd.DataFrame:
    path = partition_dir(root, day) / PARTITION_FILE
    return pd.read_parquet(path) if path.exists() else pd.DataFrame()


def write_day(root: Path, day: dt.date, frame: pd.DataFrame) -> Path:
    path = partition_dir(root, day) / PARTITION_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        frame.to_parquet(tmp, index=False)
    return path


def upsert_rows(root: Path, rows: pd.DataFrame, *, time_column: str, key: str) -> list[dt.date]:
    """Add ``rows`` to their day partitions; a key already there is replaced. Returns the
    days written."""
    if rows.empty:
        return []
    written = []
    for day, part in rows.groupby(rows[time_column].dt.date, sort=True):
        old = read_day(root, day)
        merged = part if old.empty else pd.concat([old, part], ignore_index=True)
        merged = merged.drop_duplicates(subset=[key], keep="last").sort_values(time_column, kind="stable")
        write_day(root, day, merged.reset_index(drop=True))
        written.append(day)
    return written


def update_days(root: Path, which: Iterable[dt.date], update: Callable[[pd.DataFrame], pd.DataFrame]) -> int:
    """Rewrite the partitions of ``which`` through ``update`` (e.g. fill arrived labels);
    returns the partitions rewritten."""
    n = 0
    for day in sorted(set(which)):
        old = read_day(root, day)
        if old.empty:
            continue
        write_day(root, day, update(old).reset_index(drop=True))
        n += 1
    return n


def read_window(root: Path, n_days: float | None = None, *, what: str = "accumulated dataset",
                min_days: float = 1) -> pd.DataFrame:
    """The rows of the latest ``n_days`` partitions (all when None), in time order.

    Raises:
        DataValidationError: fewer than ``min_days`` days have accumulated; the message
            says how many there are and from when to when.
    """
    have = days(root)
    span = (have[-1] - have[0]).days + 1 if have else 0
    if span < min_days:
        held = f"{span} day(s), {have[0]} to {have[-1]}" if have else "nothing yet"
        raise DataValidationError(
            f"the {what} holds {held}; at least {min_days:g} day(s) are needed (let batch scoring and "
            "the monitor run longer, or train on a file / synthetic data)", source=str(root))
    if n_days is not None:
        first = have[-1] - dt.timedelta(days=max(int(n_days) - 1, 0))
        have = [d for d in have if d >= first]
    return pd.concat([read_day(root, d) for d in have], ignore_index=True)
