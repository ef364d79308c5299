"""Federated fraud training: banks that train one model without sharing a row.

Plain functions, no Prefect and no Flower (the Flower apps in :mod:`solutions.fraud.flower_apps`
call these): the banks' data and what they share (:mod:`solutions.fraud.federated_data`, its names
importable from here too), the model's weights on the wire, the local training loop (optionally
DP-SGD through Opacus) with its privacy accounting, and the evaluation of a bank's scores.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict
from sklearn.metrics import average_precision_score, roc_auc_score
from torch.utils.data import DataLoader

from infra.determinism import seeded
from solutions.fraud import pipeline as P
from solutions.fraud import schema as S
from solutions.fraud.config import SequenceModelConfig
from solutions.fraud.federated_data import (
    TERMINAL_COUNTS,
    BankData,
    BankPartition,
    BankRefused,
    check_disjoint,
    federated_pos_weight,
    initial_model,
    load_bank,
    local_moments,
    merge_moments,
    merge_terminal_counts,
    partition_banks,
    shared_bank,
    terminal_day_counts,
    with_shared_terminals,
    write_partitions,
)
from solutions.fraud.model import FraudSequenceModel, focal_loss
from solutions.fraud.sequences import FraudPreprocessor, SequenceDataset

__all__ = [
    "TERMINAL_COUNTS", "BankData", "BankPartition", "BankRefused", "BankSetup", "DPSettings", "FraudPreprocessor",
    "FraudSequenceModel", "LocalFit", "PrivacyState", "accountant_epsilon", "bank_scores", "bank_setup",
    "check_disjoint", "federated_pos_weight", "get_weights", "initial_model", "load_bank", "local_moments",
    "merge_moments", "merge_terminal_counts", "partition_banks", "period_labels", "privacy_for", "ranking_metrics",
    "set_weights", "shared_bank", "terminal_day_counts", "train_best_val", "train_local", "with_shared_terminals",
    "write_partitions",
]

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
