"""The banks' side of federated fraud training before any model trains: partitioning a table into
banks, a bank's own data (validated, split on the shared time boundaries, window features from its
own rows), the terminal day counts banks may sum so terminal features count every bank's
transactions, and the moments a bank shares so all agree on one preprocessor. No row leaves a bank.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict

from infra.errors import DataValidationError
from infra.store import sha256_file
from infra.tables import TimeSplit, assign_periods, validate_table
from solutions.fraud import pipeline as P
from solutions.fraud import schema as S
from solutions.fraud.config import SequenceModelConfig
from solutions.fraud.model import FraudSequenceModel
from solutions.fraud.sequences import STATIC_CATEGORICAL, STEP_CATEGORICAL, FraudPreprocessor

# ------------------------------------------------------------------------------------
# partitioning (the orchestrator's side: it holds the simulated banks' tables)


def _stable_bucket(values: pd.Series, k: int) -> np.ndarray:
    digest = [int.from_bytes(hashlib.blake2b(str(v).encode(), digest_size=8).digest(), "big") for v in values]
    return (np.asarray(digest, dtype=np.uint64) % np.uint64(k)).astype("int64")


def partition_banks(df: pd.DataFrame, clients: int, by: str | None = None) -> np.ndarray:
    """The bank (0..clients-1) of every row.

    Default: a stable hash of ``account_id`` (an account's rows all go to one bank). With ``by``,
    the column's distinct values, sorted, are dealt round-robin (a column with ``clients``
    values maps one value to one bank). Raises ValueError when a bank would be empty.
    """
    if by is None:
        uniq = pd.Series(df[S.ACCOUNT_ID].astype("string").unique())
        bucket = dict(zip(uniq, _stable_bucket(uniq, clients), strict=True))
        banks = df[S.ACCOUNT_ID].astype("string").map(bucket).to_numpy(dtype="int64")
    else:
        if by not in df:
            raise ValueError(f"--partition-by: no column {by!r} in the table")
        values = df[by].astype("string").fillna("<missing>")
        distinct = sorted(values.unique())
        if len(distinct) < clients:
            raise ValueError(f"--partition-by {by}: {len(distinct)} distinct values, fewer than {clients} banks")
        banks = values.map({v: i % clients for i, v in enumerate(distinct)}).to_numpy(dtype="int64")
    counts = np.bincount(banks, minlength=clients)
    if (counts == 0).any():
        raise ValueError(f"bank {int(np.flatnonzero(counts == 0)[0])} would hold no rows; use fewer clients")
    return banks


class BankPartition(BaseModel):
    """One bank's table as the orchestrator wrote it (its client gets only this)."""

    model_config = ConfigDict(frozen=True)

    bank: int
    path: str
    sha256: str
    rows: int
    accounts: int


def write_partitions(df: pd.DataFrame, banks: np.ndarray, out_dir: Path) -> list[BankPartition]:
    """One Parquet file per bank (its rows only); their hashes and sizes."""
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = []
    for bank in range(int(banks.max()) + 1):
        rows = df.loc[banks == bank].reset_index(drop=True)
        path = out_dir / f"bank-{bank}.parquet"
        rows.to_parquet(path, index=False)
        parts.append(BankPartition(bank=bank, path=str(path), sha256=sha256_file(path), rows=len(rows),
                                   accounts=int(rows[S.ACCOUNT_ID].nunique())))
    return parts


def check_disjoint(parts: list[BankPartition]) -> None:
    """Raise AssertionError unless no account and no transaction is in two banks' files."""
    seen_acc: dict[str, int] = {}
    seen_tx: set[str] = set()
    for part in parts:
        table = pd.read_parquet(part.path, columns=[S.ACCOUNT_ID, S.TRANSACTION_ID])
        for acc in table[S.ACCOUNT_ID].astype("string").unique():
            if seen_acc.setdefault(acc, part.bank) != part.bank:
                raise AssertionError(f"account in banks {seen_acc[acc]} and {part.bank}")
        tx = set(table[S.TRANSACTION_ID].astype("string"))
        if tx & seen_tx:
            raise AssertionError(f"bank {part.bank} shares transactions with another bank")
        seen_tx |= tx


# ------------------------------------------------------------------------------------
# a bank's own data (the client's side)


class BankRefused(DataValidationError):
    """A bank's data failed validation: it is refused before any training starts."""


@dataclass
class BankData:
    """A bank's validated rows, their periods and their window features (its rows only)."""

    bank: int
    table: pd.DataFrame
    features: pd.DataFrame
    sha256: str

    def periods(self) -> np.ndarray:
        return self.features[P.PERIOD].to_numpy()

    def rows(self) -> dict[str, int]:
        return {str(k): int(v) for k, v in pd.Series(self.periods()).value_counts().sort_index().items()}


def load_bank(part: BankPartition, bounds: TimeSplit, delay_days: float) -> BankData:
    """Read this bank's file (and no other: its hash must match what the orchestrator wrote),
    validate it, split it on the shared time boundaries and compute its window features from
    its own rows. Raises :class:`BankRefused` on invalid data, AssertionError on a wrong file."""
    path = Path(part.path)
    digest = sha256_file(path)
    if digest != part.sha256:
        raise AssertionError(f"bank {part.bank}: {path.name} is not the partition written for this bank")
    try:
        table = validate_table(pd.read_parquet(path), P.transaction_schema(), source=f"bank {part.bank} ({path.name})")
    except DataValidationError as exc:
        raise BankRefused(f"bank {part.bank} refused: {exc}") from None
    periods = assign_periods(table[S.TIMESTAMP], bounds)
    train = periods == "train"
    if not train.any() or table.loc[train, S.LABEL].nunique() < 2:
        raise BankRefused(f"bank {part.bank} refused: its train period holds no rows of one class "
                          f"({int(table.loc[train, S.LABEL].sum())} frauds in {int(train.sum())} rows)")
    features = P.build_features(table, periods, delay_days)
    return BankData(bank=part.bank, table=table, features=features, sha256=digest)


def shared_bank(banks: list[BankData], bounds: TimeSplit, delay_days: float) -> BankData:
    """What a data-sharing agreement would give (the comparison's upper bound, never the
    federation): every bank's rows in one table, in time (then transaction id) order, with window features computed
    over all of them, so a terminal's risk counts the frauds every bank saw there (each bank's
    own features count only its own)."""
    table = pd.concat([b.table for b in banks], ignore_index=True)
    table = table.sort_values([S.TIMESTAMP, S.TRANSACTION_ID], kind="stable").reset_index(drop=True)
    features = P.build_features(table, assign_periods(table[S.TIMESTAMP], bounds), delay_days)
    return BankData(bank=-1, table=table, features=features, sha256="")


# ------------------------------------------------------------------------------------
# terminal statistics summed across banks (share_terminal_stats)

_NS_PER_DAY = 86_400 * 10**9
TERMINAL_COUNTS = ("n", "known", "fraud")


def _days(timestamps: pd.Series) -> np.ndarray:
    """Whole days since the epoch (UTC) of each timestamp."""
    ns = pd.to_datetime(timestamps, utc=True).to_numpy(dtype="datetime64[ns]").astype("int64")
    return ns // _NS_PER_DAY


def _no_counts() -> dict[str, list]:
    return {"terminal": [], "day": [], **{k: [] for k in TERMINAL_COUNTS}}


def terminal_day_counts(data: BankData) -> dict[str, list]:
    """What a bank shares with ``share_terminal_stats``: per terminal and UTC day, its
    transactions there, those with a known label and the frauds among them (no account, amount
    or time of day), as JSON-ready columns."""
    table = data.table
    if S.TERMINAL_ID not in table:
        return _no_counts()
    label = pd.to_numeric(table[S.LABEL], errors="coerce")
    frame = pd.DataFrame({"terminal": table[S.TERMINAL_ID].astype(str).to_numpy(), "day": _days(table[S.TIMESTAMP]),
                          "n": 1, "known": label.notna().astype("int64").to_numpy(),
                          "fraud": (label.fillna(0) > 0).astype("int64").to_numpy()})
    counts = frame.groupby(["terminal", "day"], sort=True)[list(TERMINAL_COUNTS)].sum().reset_index()
    return {col: counts[col].tolist() for col in counts.columns}


def merge_terminal_counts(shared: list[dict[str, list]]) -> dict[str, list]:
    """The banks' terminal day counts summed (what the server sends back)."""
    frames = [pd.DataFrame(s) for s in shared if s.get("terminal")]
    if not frames:
        return _no_counts()
    total = pd.concat(frames).groupby(["terminal", "day"], sort=True)[list(TERMINAL_COUNTS)].sum().reset_index()
    return {col: total[col].tolist() for col in total.columns}


def with_shared_terminals(data: BankData, totals: dict[str, list], delay_days: float) -> BankData:
    """The bank's data with its terminal window features recomputed from the summed day counts:
    ``term_nb_tx_{w}d`` counts every bank's transactions at the terminal in the ``w`` whole days
    before the day of ``t - delay`` and ``term_risk_{w}d`` the share of frauds among those with a
    known label (0 when none is), as the bank's own features do over ``[t - delay - w, t - delay)``."""
    windows = sorted(int(c[len("term_nb_tx_"):-1]) for c in data.features.columns if c.startswith("term_nb_tx_"))
    if not windows or not totals.get("terminal"):
        return data
    names = pd.Index(sorted(set(totals["terminal"])))
    day0, day1 = int(min(totals["day"])), int(max(totals["day"]))
    width = day1 - day0 + 1
    cum = {}
    t_idx, d_idx = names.get_indexer(totals["terminal"]), np.asarray(totals["day"], dtype="int64") - day0
    for key in TERMINAL_COUNTS:
        grid = np.zeros((len(names), width + 1))
        grid[t_idx, d_idx + 1] = np.asarray(totals[key], dtype="float64")
        cum[key] = np.cumsum(grid, axis=1)  # cum[:, j]: days day0 .. day0 + j - 1
    table = data.table
    rows = names.get_indexer(table[S.TERMINAL_ID].astype(str)) if S.TERMINAL_ID in table else np.full(len(table), -1)
    seen = rows >= 0
    end = _days(table[S.TIMESTAMP] - pd.Timedelta(days=round(delay_days))) - day0  # day of t - delay, excluded
    features = data.features.copy()
    for w in windows:
        hi, lo = np.clip(end, 0, width), np.clip(end - w, 0, width)
        r = np.where(seen, rows, 0)
        n, known, fraud = ((cum[k][r, hi] - cum[k][r, lo]) * seen for k in TERMINAL_COUNTS)
        features[f"term_nb_tx_{w}d"] = n
        features[f"term_risk_{w}d"] = np.divide(fraud, known, out=np.zeros(len(table)), where=known > 0)
    return BankData(bank=data.bank, table=table, features=features, sha256=data.sha256)


# ------------------------------------------------------------------------------------
# one preprocessor for every bank, from shared moments (no rows leave a bank)


def local_moments(data: BankData, cfg: SequenceModelConfig) -> dict[str, Any]:
    """What a bank shares to agree on the preprocessor: per-feature counts, sums and sums of
    squares over its train rows, its category vocabularies and its train class counts."""
    names = P.context_feature_names(data.features) if cfg.use_window_features else ()
    train = data.periods() == "train"
    pre = FraudPreprocessor(names)
    blocks = pre.training_blocks(data.table, train, data.features)
    moments = {}
    for key, x in blocks.items():
        finite = np.isfinite(x)
        x0 = np.where(finite, x, 0.0)
        moments[key] = {"n": finite.sum(0).tolist(), "sum": x0.sum(0).tolist(), "sumsq": (x0 ** 2).sum(0).tolist()}
    vocab = {col: sorted(str(v) for v in data.table.loc[train, col].dropna().unique()) if col in data.table else []
             for col in STEP_CATEGORICAL + STATIC_CATEGORICAL}
    labels = data.table.loc[train, S.LABEL].to_numpy(dtype="float64")
    return {"window_feature_names": list(names), "moments": moments, "vocab": vocab,
            "train_pos": float(labels.sum()), "train_neg": float(len(labels) - labels.sum())}


def merge_moments(shared: list[dict[str, Any]]) -> tuple[FraudPreprocessor, float, float]:
    """The federation's preprocessor (pooled means and standard deviations, union of
    vocabularies) and the pooled train (positives, negatives)."""
    if not shared:
        raise ValueError("no bank shared its moments")
    names = shared[0]["window_feature_names"]
    for s in shared[1:]:
        if s["window_feature_names"] != names:
            raise ValueError("banks disagree on the window features")
    state: dict[str, Any] = {"window_feature_names": names}
    for key in ("step", "static", "window"):
        n = np.sum([s["moments"][key]["n"] for s in shared], axis=0).astype("float64")
        total = np.sum([s["moments"][key]["sum"] for s in shared], axis=0)
        sq = np.sum([s["moments"][key]["sumsq"] for s in shared], axis=0)
        with np.errstate(all="ignore"):
            mean = np.where(n > 0, total / np.maximum(n, 1), 0.0)
            std = np.sqrt(np.maximum(np.where(n > 0, sq / np.maximum(n, 1), 0.0) - mean ** 2, 0.0))
        std = np.where(np.isfinite(std) & (std > 1e-9), std, 1.0)
        state[f"{key}_mean"], state[f"{key}_std"] = np.atleast_1d(mean).tolist(), np.atleast_1d(std).tolist()
    state["vocab"] = {col: sorted(set().union(*(s["vocab"][col] for s in shared)))
                      for col in STEP_CATEGORICAL + STATIC_CATEGORICAL}
    pos = float(sum(s["train_pos"] for s in shared))
    neg = float(sum(s["train_neg"] for s in shared))
    return FraudPreprocessor.from_dict(state), pos, neg


def federated_pos_weight(pos: float, neg: float, negative_rate: float) -> float:
    """sqrt(negatives seen / positives), as :func:`solutions.fraud.pipeline.pos_weight_for`."""
    return float(math.sqrt(neg * negative_rate / pos)) if pos > 0 else 1.0


def initial_model(pre: FraudPreprocessor, cfg: SequenceModelConfig, pos_weight: float) -> FraudSequenceModel:
    """The global model of round 0 (its weights follow ``cfg.seed``)."""
    return P.build_model(pre, cfg, pos_weight)
