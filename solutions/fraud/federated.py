"""Federated fraud training: banks that train one model without sharing a row.

Plain functions, no Prefect and no Flower (the Flower apps in :mod:`solutions.fraud.flower_apps`
call these): partitioning a table into banks, a bank's own data (validated, split on the
shared time boundaries, window features from its own rows), the terminal day counts banks
may sum to compute terminal features over every bank's transactions, the moments a bank shares
to agree on one preprocessor, the local training loop (optionally DP-SGD through Opacus) and
its privacy accounting.
"""

from __future__ import annotations

import copy
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict
from sklearn.metrics import average_precision_score, roc_auc_score
from torch.utils.data import DataLoader

from infra.determinism import seeded
from infra.errors import DataValidationError
from infra.store import sha256_file
from infra.tables import TimeSplit, assign_periods, validate_table
from solutions.fraud import pipeline as P
from solutions.fraud import schema as S
from solutions.fraud.config import SequenceModelConfig
from solutions.fraud.model import FraudSequenceModel, focal_loss
from solutions.fraud.sequences import STATIC_CATEGORICAL, STEP_CATEGORICAL, FraudPreprocessor, SequenceDataset

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


# ------------------------------------------------------------------------------------
# weights on the wire


def get_weights(model: torch.nn.Module) -> list[np.ndarray]:
    """The model's state as numpy arrays, in ``state_dict`` order."""
    return [v.detach().cpu().numpy().copy() for v in model.state_dict().values()]


def set_weights(model: torch.nn.Module, weights: list[np.ndarray]) -> None:
    """Load arrays produced by :func:`get_weights` (same architecture)."""
    keys = list(model.state_dict())
    if len(keys) != len(weights):
        raise ValueError(f"got {len(weights)} arrays for {len(keys)} tensors")
    model.load_state_dict({k: torch.as_tensor(w) for k, w in zip(keys, weights, strict=True)}, strict=True)


# ------------------------------------------------------------------------------------
# local training (optionally DP-SGD)


class DPSettings(BaseModel):
    """A bank's DP-SGD settings for the whole federation."""

    model_config = ConfigDict(frozen=True)

    epsilon: float
    delta: float
    max_grad_norm: float
    rounds: int
    local_epochs: int


@dataclass
class PrivacyState:
    """One bank's DP-SGD state across rounds: noise chosen once for the whole budget, the
    Opacus privacy engine (its RDP accountant accumulates every step)."""

    settings: DPSettings
    sample_rate: float
    steps_per_epoch: int
    noise_multiplier: float
    engine: Any = field(repr=False)

    def epsilon(self) -> float:
        """ε spent so far at the budget's δ (Opacus' RDP accountant)."""
        return float(self.engine.accountant.get_epsilon(delta=self.settings.delta)) if self.steps() else 0.0

    def steps(self) -> int:
        return int(sum(h[2] for h in self.engine.accountant.history))


def privacy_for(settings: DPSettings, n_train: int, batch_size: int) -> PrivacyState:
    """The noise multiplier that spends ``settings.epsilon`` over every round's steps
    (Poisson sampling at 1 / ceil(n_train / batch_size), as Opacus' loader does), and a fresh Opacus engine."""
    from opacus import PrivacyEngine
    from opacus.accountants.utils import get_noise_multiplier

    steps_per_epoch = max(1, math.ceil(n_train / batch_size))  # Opacus samples at 1 / len(loader)
    q = 1.0 / steps_per_epoch
    total = steps_per_epoch * settings.local_epochs * settings.rounds
    sigma = get_noise_multiplier(target_epsilon=settings.epsilon, target_delta=settings.delta, sample_rate=q,
                                 steps=total, accountant="rdp")
    return PrivacyState(settings, q, steps_per_epoch, float(sigma), PrivacyEngine(accountant="rdp"))


def accountant_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    """ε of ``steps`` DP-SGD steps by Opacus' own RDP accountant (what the card should say)."""
    from opacus.accountants import RDPAccountant

    acc = RDPAccountant()
    acc.history = [(noise_multiplier, sample_rate, steps)]
    return float(acc.get_epsilon(delta=delta))


@dataclass
class BankSetup:
    """A bank's sequences under the federation's preprocessor."""

    data: BankData
    setup: P.SequenceSetup

    def n_train(self) -> int:
        return len(self.setup.row_index.get("train", []))


def bank_setup(data: BankData, pre: FraudPreprocessor, cfg: SequenceModelConfig) -> BankSetup:
    """The bank's train/val/test sequences under the shared preprocessor."""
    periods = tuple(p for p in ("train", "val", "test") if (data.periods() == p).any())
    return BankSetup(data, P.sequence_setup(data.table, data.features, cfg, preprocessor=pre, periods=periods))


def _loss(model: FraudSequenceModel, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    hp = model.hparams
    if hp.loss == "focal":
        return focal_loss(logits, y, hp.focal_gamma)
    return F.binary_cross_entropy_with_logits(logits, y, pos_weight=torch.as_tensor(hp.pos_weight))


@dataclass(frozen=True)
class LocalFit:
    """What one bank's local training returns."""

    examples: int
    loss: float
    steps: int
    epsilon: float | None = None
    optimizer_state: dict[str, Any] | None = None


def train_local(model: FraudSequenceModel, bank: BankSetup, cfg: SequenceModelConfig, epochs: int,
                seed: int, privacy: PrivacyState | None = None,
                optimizer_state: dict[str, Any] | None = None,
                on_epoch: Callable[[int], None] | None = None) -> LocalFit:
    """Train ``model`` in place on the bank's train period for ``epochs`` (AdamW, resumed from
    ``optimizer_state`` when given; with ``privacy``, Opacus DP-SGD: GRU -> DPGRU, per-sample
    clipping and noise, Poisson batches over every train row; the negative subsampling is off
    since it depends on the labels). ``on_epoch(epoch)`` is called after each epoch (from 1), with
    torch's random state given back after it. The returned fit holds the AdamW state."""
    model.train()
    dm = bank.setup.datamodule
    if privacy is None:
        loader = dm.train_dataloader()
        net, optimizer = model, torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        if optimizer_state is not None:
            optimizer.load_state_dict(copy.deepcopy(optimizer_state))  # AdamW would step the caller's tensors
    else:
        from opacus.validators import ModuleValidator

        dp_model = ModuleValidator.fix(model)
        optimizer = torch.optim.AdamW(dp_model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        if optimizer_state is not None:  # moments of earlier privatised gradients: post-processing, no ε spent
            optimizer.load_state_dict(copy.deepcopy(optimizer_state))
        dataset = SequenceDataset(dm.arrays, dm.splits["train"], dm.seq_len)
        plain = DataLoader(_NonEmpty(dataset), batch_size=cfg.batch_size, collate_fn=_collate)
        net, optimizer, loader = privacy.engine.make_private(
            module=dp_model, optimizer=optimizer, data_loader=plain, noise_multiplier=privacy.noise_multiplier,
            max_grad_norm=privacy.settings.max_grad_norm, poisson_sampling=True)
    total, count, steps = 0.0, 0, 0
    with seeded(seed):
        for epoch in range(1, epochs + 1):
            for batch in loader:
                if not len(batch["y"]):
                    continue
                optimizer.zero_grad(set_to_none=True)
                logits = net(batch).float()
                loss = _loss(model, logits, batch["y"])
                loss.backward()
                optimizer.step()
                total += float(loss.detach()) * len(logits)
                count += len(logits)
                steps += 1
            if on_epoch is not None:
                rng = torch.get_rng_state()
                on_epoch(epoch)
                torch.set_rng_state(rng)
                model.train()
    if privacy is not None:
        plain_keys = model.state_dict().keys()
        trained = net._module.state_dict() if hasattr(net, "_module") else net.state_dict()
        model.load_state_dict({k: trained[k] for k in plain_keys})
    model.eval()
    return LocalFit(examples=bank.n_train(), loss=total / max(1, count), steps=steps,
                    epsilon=privacy.epsilon() if privacy is not None else None,
                    optimizer_state=(optimizer.original_optimizer if privacy is not None else optimizer).state_dict())


def train_best_val(model: FraudSequenceModel, bank: BankSetup, cfg: SequenceModelConfig, epochs: int,
                   seed: int) -> int:
    """Train ``model`` as :func:`train_local` does (no DP) and leave it at the epoch with the best
    validation AP (early stopping, as ``fraud train`` does); returns that epoch (0: the bank has
    no validation row of both classes, and the last epoch is kept)."""
    best: tuple[float, dict[str, torch.Tensor] | None, int] = (-math.inf, None, 0)

    def keep_best(epoch: int) -> None:
        nonlocal best
        ap = ranking_metrics(*bank_scores(model, bank, "val"))["ap"]
        if not math.isnan(ap) and ap > best[0]:
            best = (ap, copy.deepcopy(model.state_dict()), epoch)

    train_local(model, bank, cfg, epochs, seed=seed, on_epoch=keep_best)
    if best[1] is not None:
        model.load_state_dict(best[1])
    model.eval()
    return best[2]


class _NonEmpty(torch.utils.data.Dataset):
    """A sequence dataset whose batch fetch accepts an empty index list (Poisson batches)."""

    def __init__(self, inner: SequenceDataset) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.inner[i]

    def __getitems__(self, items: list[int]) -> Any:
        return self.inner.__getitems__(items) if len(items) else []


def _collate(batch: Any) -> Any:
    return batch


# ------------------------------------------------------------------------------------
# evaluation


def ranking_metrics(y: np.ndarray, s: np.ndarray) -> dict[str, float]:
    """Average precision and ROC-AUC (NaN without both classes)."""
    y = np.asarray(y, dtype="float64")
    if not 0 < y.sum() < len(y):
        return {"ap": math.nan, "roc_auc": math.nan}
    return {"ap": float(average_precision_score(y, s)), "roc_auc": float(roc_auc_score(y, s))}


def period_labels(bank: BankSetup, period: str) -> np.ndarray:
    """The bank's labels of one period, in input-row order (as :func:`P.score_period` returns scores)."""
    return bank.data.table.loc[bank.data.periods() == period, S.LABEL].to_numpy(dtype="float64")


def bank_scores(model: FraudSequenceModel, bank: BankSetup, period: str) -> tuple[np.ndarray, np.ndarray]:
    """(labels, scores) of the bank's rows of one period (empty when it has none)."""
    if period not in bank.setup.row_index:
        return np.zeros(0), np.zeros(0)
    return period_labels(bank, period), P.score_period(model, bank.setup, period)
