"""The trainable sensor models: masked-reconstruction pre-training of a :class:`SensorEncoder`,
the RUL / failure heads and their training loss and schedule, seed ensembles, the data module,
and how registry params rebuild a model.

The encoders are in :mod:`solutions.sensor.encoder`; prediction and the one-output export
modules in :mod:`solutions.sensor.inference`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

from solutions.sensor.encoder import SensorEncoder


def random_mask(shape: tuple[int, int, int], p_time: float, p_sensor: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Boolean mask (batch, channels, time): whole time steps and whole sensors."""
    b, c, t = shape
    time = torch.rand(b, 1, t, generator=generator) < p_time
    sensor = torch.rand(b, c, 1, generator=generator) < p_sensor
    return time | sensor


class MaskedReconstruction(L.LightningModule):
    """Self-supervised pre-training: mask random time steps and sensors, reconstruct them.

    The decoder sees the per-step features plus the pooled 256-d embedding, so both the
    conv trunk and the projection learn. The loss is the MSE on masked positions only.
    """

    def __init__(
        self,
        n_channels: int,
        channels: int = 64,
        embedding_dim: int = 256,
        dropout: float = 0.1,
        mask_time: float = 0.3,
        mask_sensor: float = 0.15,
        lr: float = 2e-3,
        pooling: str = "meanmax",
        norm: str = "batch",
        stats: bool = False,
        arch: str = "cnn",
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.encoder = SensorEncoder(n_channels, channels, embedding_dim, dropout, pooling, norm, stats, arch)
        self.lift = nn.Linear(embedding_dim, self.encoder.step_dim)
        self.decoder = nn.Sequential(
            nn.Conv1d(self.encoder.step_dim, channels, 3, padding=1), nn.GELU(), nn.Conv1d(channels, n_channels, 1)
        )
        self._val_gen: torch.Generator | None = None

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        seen = x.masked_fill(mask, 0.0)
        h = self.encoder.steps(seen)
        z = self.encoder.pool(h, seen)
        return self.decoder(h + self.lift(z).unsqueeze(-1))

    def _step(self, batch: Any, stage: str) -> torch.Tensor:
        x = batch[0]
        if stage == "train":
            gen = None
        else:
            if self._val_gen is None:
                self._val_gen = torch.Generator()
            self._val_gen.manual_seed(0)
            gen = self._val_gen
        mask = random_mask(tuple(x.shape), self.hparams.mask_time, self.hparams.mask_sensor, gen).to(x.device)
        recon = self(x, mask)
        m = mask.float()
        loss = ((recon - x) ** 2 * m).sum() / m.sum().clamp_min(1.0)
        self.log(f"{stage}/loss", loss, prog_bar=True, on_epoch=True, on_step=False, batch_size=len(x))
        return loss

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._step(batch, "val")

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=1e-4)


class SensorHeads(nn.Module):
    """RUL regression (scaled by the cap) and failure-within-horizon logit."""

    def __init__(self, embedding_dim: int, hidden: int = 64, dropout: float = 0.1) -> None:
        super().__init__()
        self.shared = nn.Sequential(nn.Linear(embedding_dim, hidden), nn.GELU(), nn.Dropout(dropout))
        self.rul = nn.Linear(hidden, 1)
        self.fail = nn.Linear(hidden, 1)

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.shared(z)
        return self.rul(h).squeeze(-1), self.fail(h).squeeze(-1)


#: learning-rate schedules of :class:`SensorRULModel` (per optimiser step, over the planned steps)
LR_SCHEDULES = ("constant", "cosine")


def lr_factor(step: int, total: int, schedule: str, warmup: float = 0.05) -> float:
    """Multiplier of the base learning rate at optimiser ``step`` of ``total``.

    ``cosine``: linear warm-up over the first ``warmup`` share of the steps, then a cosine
    decay to 1% of the base rate at the last planned step (early stopping may end sooner).
    ``constant``: 1. Without a known total (0) the rate stays constant.
    """
    if schedule == "constant" or total <= 0:
        return 1.0
    ramp = max(1, int(warmup * total))
    if step < ramp:
        return (step + 1) / ramp
    progress = min(1.0, (step - ramp) / max(1, total - ramp))
    return 0.01 + 0.99 * 0.5 * (1.0 + math.cos(math.pi * progress))


def rul_fail_loss(
    pred: torch.Tensor, logit: torch.Tensor, rul: torch.Tensor, fail: torch.Tensor, *,
    rul_cap: float, fail_weight: float, pos_weight: float,
) -> torch.Tensor:
    """The training loss of the two heads: MSE of RUL / cap + ``fail_weight`` x weighted BCE of the logit."""
    mse = F.mse_loss(pred, rul / rul_cap)
    bce = F.binary_cross_entropy_with_logits(logit, fail, pos_weight=torch.tensor(pos_weight, device=logit.device))
    return mse + fail_weight * bce


class SensorRULModel(L.LightningModule):
    """Encoder + heads, trained on labelled windows (RUL MSE + weighted BCE)."""

    def __init__(
        self,
        n_channels: int,
        channels: int = 64,
        embedding_dim: int = 256,
        dropout: float = 0.1,
        rul_cap: float = 125.0,
        fail_weight: float = 0.5,
        lr: float = 2e-3,
        pos_weight: float = 1.0,
        lr_schedule: str = "constant",
        warmup: float = 0.05,
        pooling: str = "meanmax",
        input_noise: float = 0.0,
        norm: str = "batch",
        stats: bool = False,
        arch: str = "cnn",
    ) -> None:
        super().__init__()
        if lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"unknown lr_schedule {lr_schedule!r}; known: {', '.join(LR_SCHEDULES)}")
        self.save_hyperparameters()
        self.encoder = SensorEncoder(n_channels, channels, embedding_dim, dropout, pooling, norm, stats, arch)
        self.heads = SensorHeads(embedding_dim, dropout=dropout)
        self._last_lr_factor = 1.0

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.heads(self.encoder(x))

    def _step(self, batch: Any, stage: str) -> torch.Tensor:
        x, rul, fail = batch
        noise = self.hparams.get("input_noise", 0.0)
        if stage == "train" and noise > 0:
            # Gaussian noise on the normalised inputs: the model cannot learn engines by their sensor noise
            x = x + noise * torch.randn_like(x)
        pred, logit = self(x)
        cap = self.hparams.rul_cap
        loss = rul_fail_loss(pred, logit, rul, fail, rul_cap=cap, fail_weight=self.hparams.fail_weight,
                             pos_weight=self.hparams.pos_weight)
        with torch.no_grad():
            rmse = torch.sqrt(F.mse_loss(pred.clamp(0, 1) * cap, rul))
        self.log(f"{stage}/loss", loss, on_epoch=True, on_step=False, batch_size=len(x))
        self.log(f"{stage}/rmse", rmse, prog_bar=True, on_epoch=True, on_step=False, batch_size=len(x))
        return loss

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train")

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self.hparams.get("lr_schedule", "constant") == "constant":
            return
        total = self.trainer.estimated_stepping_batches
        factor = lr_factor(self.global_step, int(total) if math.isfinite(total) else 0,
                           self.hparams.lr_schedule, self.hparams.warmup)
        for group in self.trainer.optimizers[0].param_groups:
            # each group keeps its own base rate; a group a fine-tuning callback added since the
            # last step was given a rate derived from the scheduled one, so undo that factor
            if "scheduled_from_lr" not in group:
                group["scheduled_from_lr"] = group["lr"] / self._last_lr_factor
            group["lr"] = group["scheduled_from_lr"] * factor
        self._last_lr_factor = factor

    def on_validation_epoch_start(self) -> None:
        # windows trained with input noise left noisy BatchNorm statistics: re-estimate them on
        # the clean training windows, so validation (and the checkpoint it picks) sees the model
        # as it will predict
        train_ds = getattr(self.trainer.datamodule, "train_ds", None) if self.trainer.training else None
        if self.hparams.get("input_noise", 0.0) > 0 and train_ds is not None:
            recalibrate_batchnorm(self.encoder, train_ds.tensors[0])

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._step(batch, "val")

    def configure_optimizers(self) -> Any:
        # only trainable parameters: a fine-tuning callback adds the others as it unfreezes them
        params = [p for p in self.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=self.hparams.lr, weight_decay=1e-4)

    def load_encoder(self, state_dict: dict[str, torch.Tensor]) -> int:
        """Copy ``encoder.*`` tensors of a pre-trained state dict; returns how many."""
        enc = {k[len("encoder."):]: v for k, v in state_dict.items() if k.startswith("encoder.")}
        self.encoder.load_state_dict(enc)
        return len(enc)


@torch.no_grad()
def recalibrate_batchnorm(encoder: SensorEncoder, x: torch.Tensor, batch_size: int = 1024, max_windows: int = 8192) -> None:
    """Re-estimate the encoder's BatchNorm running statistics on clean windows ``x`` (at most
    ``max_windows``, evenly spaced), as a cumulative average; the encoder's mode is restored.

    Layers that do not track statistics (frozen by a fine-tuning schedule, which keeps their
    pre-trained statistics) are left as they are.
    """
    norms = [m for m in encoder.modules() if isinstance(m, nn.BatchNorm1d) and m.track_running_stats]
    if not norms or len(x) == 0:
        return
    was_training = encoder.training
    momenta = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    encoder.train()
    device = next(encoder.parameters()).device
    idx = torch.linspace(0, len(x) - 1, min(len(x), max_windows)).long()
    for i in range(0, len(idx), batch_size):
        encoder.steps(x[idx[i : i + batch_size]].to(device))
    for m, momentum in zip(norms, momenta):
        m.momentum = momentum
    encoder.train(was_training)

class SensorRULEnsemble(L.LightningModule):
    """Sensor RUL models trained alone from different seeds, as one model: the mean of their RUL
    heads and of their failure logits.

    It is not trained itself: :meth:`of` wraps trained members. Registry params rebuild it
    (``SensorRULEnsemble(**hparams)``: the member count and one member's hyper-parameters);
    its state dict holds member ``i``'s weights under ``members.<i>.``.
    """

    def __init__(self, members: int, member: dict[str, Any]) -> None:
        super().__init__()
        if members < 1:
            raise ValueError(f"an ensemble needs at least one member, got {members}")
        self.save_hyperparameters()
        self.members = nn.ModuleList(SensorRULModel(**member) for _ in range(members))

    @classmethod
    def of(cls, models: Sequence[SensorRULModel]) -> SensorRULEnsemble:
        """The ensemble of trained ``models`` (same hyper-parameters; their weights are copied)."""
        first = dict(models[0].hparams)
        for i, m in enumerate(models[1:], start=1):
            # the failure loss's class weight follows each member's training windows (cross-fitted
            # members train on different assets); it plays no part in a prediction
            if {k: v for k, v in dict(m.hparams).items() if k != "pos_weight"} != \
                    {k: v for k, v in first.items() if k != "pos_weight"}:
                raise ValueError(f"ensemble member {i} has other hyper-parameters than member 0")
        ensemble = cls(len(models), first)
        for target, source in zip(ensemble.members, models):
            target.load_state_dict(source.state_dict())
        return ensemble.eval()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        outs = [m(x) for m in self.members]
        return torch.stack([o[0] for o in outs]).mean(0), torch.stack([o[1] for o in outs]).mean(0)



#: a trained RUL/failure model: one CNN or a seed ensemble of them
RULModel = SensorRULModel | SensorRULEnsemble


def rul_cap_of(model: RULModel) -> float:
    """The RUL cap the model's RUL head is scaled by."""
    hp = model.hparams
    return float(hp["member"]["rul_cap"] if "member" in hp else hp["rul_cap"])


class WindowDataModule(L.LightningDataModule):
    """Train/val loaders over window arrays. Labels are optional (pre-training).

    A small training set is resampled (with replacement) to ``min_samples_per_epoch``
    per epoch, so few-label runs take enough optimiser steps.
    """

    def __init__(
        self,
        train: tuple[np.ndarray, ...],
        val: tuple[np.ndarray, ...],
        batch_size: int = 256,
        min_samples_per_epoch: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.train_ds = TensorDataset(*(torch.as_tensor(np.asarray(a, dtype=np.float32)) for a in train))
        self.val_ds = TensorDataset(*(torch.as_tensor(np.asarray(a, dtype=np.float32)) for a in val))
        self.batch_size = batch_size
        self.min_samples = min_samples_per_epoch
        self.seed = seed

    def train_dataloader(self) -> DataLoader:
        n = len(self.train_ds)
        if n < self.min_samples:
            gen = torch.Generator().manual_seed(self.seed)
            sampler = RandomSampler(self.train_ds, replacement=True, num_samples=self.min_samples, generator=gen)
            return DataLoader(self.train_ds, batch_size=self.batch_size, sampler=sampler, drop_last=True)
        gen = torch.Generator().manual_seed(self.seed)
        return DataLoader(self.train_ds, batch_size=self.batch_size, shuffle=True, drop_last=n > self.batch_size,
                          generator=gen)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_ds, batch_size=1024)


def rul_model_from_params(params: dict) -> RULModel:
    """A fresh RUL model (one CNN or a seed ensemble, by the params' ``architecture``) from registry params."""
    kinds = {cls.__name__: cls for cls in (SensorRULModel, SensorRULEnsemble)}
    if params.get("architecture") not in kinds:
        raise ValueError(f"not a sensor RUL model: {params.get('architecture')!r}")
    return kinds[params["architecture"]](**params["hparams"])
