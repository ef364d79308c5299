"""History for batch scoring: the transactions before a file that its window features and
account sequences look back on.

A file of the hourly batch job holds an hour of transactions. Scored alone, every account's
sequence and every 1/7/30-day window starts at the file's first row, so its scores are not
the scores the model was validated with. Measured on the README's journey, the last day of
the adapted champion's data (6,341 rows) scored alone: score PSI 1.51 against the champion's
profile, 637 flagged; after its history: PSI 0.028, 95 flagged. The history of a file is, before its
first timestamp, every transaction of its accounts and its terminals' last 30 days before
the label delay, from:

- the champion's own training table (the content-addressed validated table named by the
  version's ``data_hash``; it carries labels, so the terminals' delayed-label risk is known
  as it was in training), and
- the transactions the batch job scored before (one Parquet part per scored file under
  ``root``, pruned to the newest ``KEEP_DAYS``; no scores, no labels).

Files scored at the same time on several workers do not see each other. Pure pandas and
pyarrow: the flows pass the folders.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import pandas as pd
import pyarrow.dataset as pads

from infra.store import atomic_path
from solutions.fraud import schema as S

log = logging.getLogger(__name__)

#: Days a terminal's windows look back on before the label delay (the longest window).
TERMINAL_WINDOW_DAYS = 30.0
#: Days of scored transactions the batch job keeps (account sequences, the mean amount before a
#: transaction and "new terminal" flags look back over all the history there is).
KEEP_DAYS = 90.0


def _rows_before(path: Path, table: pd.DataFrame, terminals_from: pd.Timestamp, hi: pd.Timestamp) -> pd.DataFrame:
    """Rows of the Parquet file or folder ``path`` before ``hi``: every row of the table's
    accounts, and the rows of its terminals from ``terminals_from``; in the table's columns
    (plus ``label`` where the source has it)."""
    dataset = pads.dataset(str(path), format="parquet")
    names = set(dataset.schema.names)
    if S.TIMESTAMP not in names or S.ACCOUNT_ID not in names:
        return table.iloc[0:0]
    ts = pads.field(S.TIMESTAMP)
    wanted = pads.field(S.ACCOUNT_ID).isin(table[S.ACCOUNT_ID].dropna().astype(str).unique().tolist())
    if S.TERMINAL_ID in names and S.TERMINAL_ID in table:
        terminals = table[S.TERMINAL_ID].dropna().astype(str).unique().tolist()
        wanted = wanted | (pads.field(S.TERMINAL_ID).isin(terminals) & (ts >= terminals_from.to_datetime64()))
    columns = [c for c in table.columns if c in names] + ([S.LABEL] if S.LABEL in names and S.LABEL not in table else [])
    return dataset.to_table(columns=columns, filter=(ts < hi.to_datetime64()) & wanted).to_pandas()


def history_before(table: pd.DataFrame, sources: Iterable[Path], delay_days: float) -> pd.DataFrame:
    """The transactions of ``sources`` (Parquet files or folders; absent ones are skipped)
    before the table's first timestamp: all of its accounts' and, for its terminals, the
    ``TERMINAL_WINDOW_DAYS + delay_days`` before it; without any of its own transaction ids;
    in the table's columns (plus ``label`` where a source has it)."""
    if table.empty:
        return table.iloc[0:0]
    first = pd.Timestamp(table[S.TIMESTAMP].min())
    terminals_from = first - pd.Timedelta(days=TERMINAL_WINDOW_DAYS + delay_days)
    parts = []
    for source in map(Path, sources):
        if not source.exists() or (source.is_dir() and not any(source.glob("*.parquet"))):
            continue
        parts.append(_rows_before(source, table, terminals_from, first))
    parts = [p for p in parts if not p.empty]
    if not parts:
        return table.iloc[0:0]
    history = pd.concat(parts, ignore_index=True)
    if S.TRANSACTION_ID in history and S.TRANSACTION_ID in table:
        history = history[~history[S.TRANSACTION_ID].isin(set(table[S.TRANSACTION_ID]))]
        history = history.drop_duplicates(S.TRANSACTION_ID, keep="first")  # the champion's data first
    return history.reset_index(drop=True)


def with_history(table: pd.DataFrame, history: pd.DataFrame) -> tuple[pd.DataFrame, str | None]:
    """The history followed by the table, in time order, and the timestamp from which rows are
    scored (None without history: score the table as it is)."""
    if history.empty:
        return table, None
    first = pd.Timestamp(table[S.TIMESTAMP].min())
    history = history.astype({c: table[c].dtype for c in history.columns if c in table.columns}, errors="ignore")
    joined = pd.concat([history, table], ignore_index=True, sort=False)
    joined = joined.sort_values(S.TIMESTAMP, kind="stable").reset_index(drop=True)
    return joined, first.isoformat()


def record_scored(root: Path, key: str, table: pd.DataFrame, days: float = KEEP_DAYS) -> Path:
    """Keep a scored file's transactions (its own columns, no label) as ``<root>/<key>.parquet``
    for later files; parts whose newest row is more than ``days`` older than the newest part's
    are removed."""
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"{key}.parquet"
    kept = table.drop(columns=[c for c in (S.LABEL, "scenario") if c in table.columns])
    with atomic_path(target) as tmp:
        kept.to_parquet(tmp, index=False)
    _prune(root, days)
    return target


def _prune(root: Path, days: float) -> None:
    newest: dict[Path, pd.Timestamp] = {}
    for part in root.glob("*.parquet"):
        try:
            stamps = pd.read_parquet(part, columns=[S.TIMESTAMP])[S.TIMESTAMP]
        except (OSError, ValueError):
            continue  # being written by another worker, or not ours
        if not stamps.empty:
            newest[part] = pd.Timestamp(stamps.max())
    if not newest:
        return
    cutoff = max(newest.values()) - pd.Timedelta(days=days)
    for part, stamp in newest.items():
        if stamp < cutoff:
            part.unlink(missing_ok=True)
            log.info("batch history: dropped %s (older than %g days)", part.name, days)
