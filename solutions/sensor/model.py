"""The window encoders (1D-CNN, dilated TCN, patch transformer), masked-reconstruction
pre-training and the RUL / failure heads."""

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

#: how :class:`SensorEncoder` pools its per-step features over time
POOLINGS = ("meanmax", "mean", "meanlast")
#: steps at the end of a window whose features ``meanlast`` pooling averages
LAST_STEPS = 5
#: normalisation after each conv of :class:`SensorEncoder`
NORMS = ("batch", "none")
#: summary statistics per input channel that :func:`window_stats` returns
N_WINDOW_STATS = 7
#: encoder trunks (``arch``): the 3-block dilated CNN, a residual causal dilated TCN, a patch transformer
ARCHS = ("cnn", "tcn", "transformer")
#: time steps per token of the ``transformer`` trunk
PATCH = 4


def window_stats(x: torch.Tensor) -> torch.Tensor:
    """(batch, channels, time) -> (batch, channels * 7): per channel the window's mean, standard
    deviation, min, max, last value, least-squares slope times the window length (the change
    over the window) and the mean of the last ``LAST_STEPS`` steps, statistic by statistic.

    The summary features of the gradient-boosting baseline
    (``solutions.sensor.baseline.window_summary_features``; its slope is per step).
    """
    t = torch.arange(x.shape[2], dtype=x.dtype, device=x.device)
    tc = t - t.mean()
    slope = (x * (tc / (tc * tc).sum())).sum(dim=2) * x.shape[2]
    mean = x.mean(dim=2)
    std = ((x - mean.unsqueeze(-1)) ** 2).mean(dim=2).sqrt()
    return torch.cat([mean, std, x.amin(dim=2), x.amax(dim=2), x[:, :, -1], slope, x[:, :, -LAST_STEPS:].mean(dim=2)], 1)


class TCNBlock(nn.Module):
    """Residual block of a temporal convolutional network: two causal dilated convs (left-padded,
    so step t sees steps <= t), each followed by the norm and a GELU, plus a 1x1 skip when the
    width changes."""

    def __init__(self, i: int, o: int, k: int, d: int, dropout: float, norm: str) -> None:
        super().__init__()
        self.pad = (k - 1) * d
        self.conv1 = nn.Conv1d(i, o, k, dilation=d)
        self.norm1 = nn.BatchNorm1d(o) if norm == "batch" else nn.Identity()
        self.conv2 = nn.Conv1d(o, o, k, dilation=d)
        self.norm2 = nn.BatchNorm1d(o) if norm == "batch" else nn.Identity()
        self.drop = nn.Dropout(dropout)
        self.skip = nn.Conv1d(i, o, 1) if i != o else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(F.gelu(self.norm1(self.conv1(F.pad(x, (self.pad, 0))))))
        h = F.gelu(self.norm2(self.conv2(F.pad(h, (self.pad, 0)))))
        return h + self.skip(x)


class TCNTrunk(nn.Sequential):
    """Four :class:`TCNBlock` with dilations 1, 2, 4, 8 (kernel 3: a receptive field of 61 steps)."""

    def __init__(self, n_channels: int, channels: int, dropout: float, norm: str) -> None:
        c1, c2 = channels, channels * 2
        super().__init__(TCNBlock(n_channels, c1, 3, 1, dropout, norm), TCNBlock(c1, c2, 3, 2, dropout, norm),
                         TCNBlock(c2, c2, 3, 4, dropout, norm), TCNBlock(c2, c2, 3, 8, dropout, norm))


class AttentionBlock(nn.Module):
    """Pre-norm transformer block: multi-head self-attention and a GELU MLP, written with plain
    ``Linear`` layers and matmuls (no fused fast path), so it exports to ONNX and quantises like
    the heads."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"model width {dim} is not a multiple of {heads} heads")
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Dropout(dropout), nn.Linear(2 * dim, dim))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (batch, tokens, dim)
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // self.heads), dim=-1)
        x = x + self.drop(self.out((att @ v).transpose(1, 2).reshape(b, n, d)))
        return x + self.drop(self.mlp(self.norm2(x)))


def sinusoidal_positions(n: int, dim: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(n, dim) fixed sine/cosine position codes (any window length, no learned table)."""
    pos = torch.arange(n, device=device, dtype=dtype).unsqueeze(1)
    freq = torch.exp(torch.arange(0, dim, 2, device=device, dtype=dtype) * (-math.log(10000.0) / dim))
    pe = torch.zeros(n, dim, device=device, dtype=dtype)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq)[:, : dim // 2]
    return pe


class PatchTransformerTrunk(nn.Module):
    """Patch encoder: the window is cut into ``patch``-step tokens (a strided conv; a window whose
    length is not a multiple is left-padded with its first step), sine positions are added, two
    :class:`AttentionBlock` mix the tokens, and each token's features are repeated over its steps,
    so the trunk returns per-step features (batch, width, time) like the convolutional trunks."""

    def __init__(self, n_channels: int, width: int, dropout: float, patch: int = PATCH, layers: int = 2,
                 heads: int = 4) -> None:
        super().__init__()
        self.patch = patch
        self.embed = nn.Conv1d(n_channels, width, patch, stride=patch)
        self.blocks = nn.Sequential(*(AttentionBlock(width, heads, dropout) for _ in range(layers)))
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[2]
        pad = (-t) % self.patch
        if pad:
            x = torch.cat([x[:, :, :1].expand(-1, -1, pad), x], dim=2)
        tok = self.embed(x).transpose(1, 2)  # (batch, tokens, width)
        tok = tok + sinusoidal_positions(tok.shape[1], tok.shape[2], tok.device, tok.dtype)
        h = self.norm(self.blocks(tok)).transpose(1, 2)
        return h.repeat_interleave(self.patch, dim=2)[:, :, pad:]


class SensorEncoder(nn.Module):
    """Window of aligned sensors (batch, channels, time) -> ``embedding_dim`` vector.

    Three dilated conv blocks keep the time axis; two poolings over time are projected to
    the embedding: ``meanmax`` the mean and the max over the window, ``mean`` the mean alone,
    ``meanlast`` the mean over the window and over its last ``LAST_STEPS`` steps. (On C-MAPSS
    the max over noisy steps let the model tell training engines apart by their noise and
    overfit: validation RMSE 19 against 17 with the mean alone.) ``norm``: a BatchNorm after
    each conv (``batch``), or none (``none``; on C-MAPSS FD001 the BatchNorm made the model
    fit the training engines and miss new ones: validation RMSE 18.9 against 14.7 without it,
    see ``bench/results/sensor_cnn_sweep.md``); the layer sits at the same index either way
    (an ``Identity``), so state-dict keys of the convs do not move. ``steps`` returns the
    per-step features (for decoders). ``stats``: the projection also reads the input window's
    :func:`window_stats` (the gradient-boosting baseline's features) beside the pooled conv
    features (engine-split CV on C-MAPSS FD001, scratch CNN: RMSE 13.18 -> 12.33 and 13.86 ->
    13.27 on two fold splits).

    ``arch`` picks the trunk (always the attribute ``convs``, so fine-tuning groups and the
    pooling/projection are shared): ``cnn`` the three conv blocks above, ``tcn`` a residual causal
    dilated :class:`TCNTrunk`, ``transformer`` a :class:`PatchTransformerTrunk` (its own LayerNorm;
    ``norm`` does not apply to it). Each trunk ends at ``2 x channels`` features per step.
    """

    def __init__(self, n_channels: int, channels: int = 64, embedding_dim: int = 256, dropout: float = 0.1,
                 pooling: str = "meanmax", norm: str = "batch", stats: bool = False, arch: str = "cnn") -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {pooling!r}; known: {', '.join(POOLINGS)}")
        if norm not in NORMS:
            raise ValueError(f"unknown norm {norm!r}; known: {', '.join(NORMS)}")
        if arch not in ARCHS:
            raise ValueError(f"unknown arch {arch!r}; known: {', '.join(ARCHS)}")
        self.pooling = pooling
        self.arch = arch
        c1, c2 = channels, channels * 2

        def block(i: int, o: int, k: int, d: int) -> nn.Sequential:
            layer = nn.BatchNorm1d(o) if norm == "batch" else nn.Identity()
            return nn.Sequential(nn.Conv1d(i, o, k, padding=d * (k // 2), dilation=d), layer, nn.GELU())

        self.convs: nn.Module
        if arch == "cnn":
            self.convs = nn.Sequential(block(n_channels, c1, 5, 1), block(c1, c2, 5, 2), block(c2, c2, 3, 4))
        elif arch == "tcn":
            self.convs = TCNTrunk(n_channels, channels, dropout, norm)
        else:
            self.convs = PatchTransformerTrunk(n_channels, c2, dropout)
        pooled = c2 if pooling == "mean" else 2 * c2
        self.stats = stats
        self.stat_dim = N_WINDOW_STATS * n_channels if stats else 0
        self.proj = nn.Sequential(nn.Dropout(dropout), nn.Linear(pooled + self.stat_dim, embedding_dim))
        self.step_dim = c2

    def steps(self, x: torch.Tensor) -> torch.Tensor:
        return self.convs(x)

    def pool(self, h: torch.Tensor, x: torch.Tensor | None = None) -> torch.Tensor:
        """The embedding of per-step features ``h``; an encoder with ``stats`` needs the window ``x`` too."""
        parts = [h.mean(dim=2)]
        if self.pooling != "mean":
            parts.append(h.amax(dim=2) if self.pooling == "meanmax" else h[:, :, -LAST_STEPS:].mean(dim=2))
        if self.stats:
            if x is None:
                raise ValueError("this encoder reads the window's statistics: pass the window x to pool()")
            parts.append(window_stats(x))
        return self.proj(parts[0] if len(parts) == 1 else torch.cat(parts, dim=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.steps(x), x)


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


def predict_outputs(module: nn.Module, x: np.ndarray, rul_cap: float, batch_size: int = 2048) -> tuple[np.ndarray, np.ndarray]:
    """:func:`predict` for a single-output module (``SensorOutputs`` or a compressed variant of
    it): column 0 is RUL / cap, column 1 the failure logit."""
    module.eval()
    rul, prob = [], []
    with torch.inference_mode():
        for i in range(0, len(x), batch_size):
            out = module(torch.as_tensor(x[i : i + batch_size], dtype=torch.float32)).float()
            rul.append((out[:, 0].clamp(0, 1) * rul_cap).cpu().numpy())
            prob.append(torch.sigmoid(out[:, 1]).cpu().numpy())
    if not rul:
        return np.zeros(0), np.zeros(0)
    return np.concatenate(rul).astype("float64"), np.concatenate(prob).astype("float64")


class SensorOutputs(nn.Module):
    """A :class:`SensorRULModel` as a plain module with one output tensor (for export and compression).

    ``forward(x)`` returns ``(batch, 2)``: column 0 the RUL head (RUL / ``rul_cap``, not
    clamped), column 1 the failure logit. It shares the model's encoder and heads, so its
    state dict has the same keys as the model's.
    """

    def __init__(self, model: SensorRULModel) -> None:
        super().__init__()
        self.encoder, self.heads = model.encoder, model.heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rul, logit = self.heads(self.encoder(x))
        return torch.stack([rul, logit], dim=-1)


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


class SensorEnsembleOutputs(nn.Module):
    """A :class:`SensorRULEnsemble` as a plain module with one ``(batch, 2)`` output, as
    :class:`SensorOutputs` is for one model (same state-dict keys as the ensemble)."""

    def __init__(self, model: SensorRULEnsemble) -> None:
        super().__init__()
        self.members = nn.ModuleList(SensorOutputs(m) for m in model.members)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([m(x) for m in self.members]).mean(0)


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


@torch.no_grad()
def predict(model: RULModel, x: np.ndarray, batch_size: int = 2048) -> tuple[np.ndarray, np.ndarray]:
    """(RUL in steps, failure probability) for windows ``x`` (n, channels, time)."""
    model.eval()
    rul, prob = [], []
    for i in range(0, len(x), batch_size):
        xb = torch.as_tensor(x[i : i + batch_size], dtype=torch.float32, device=model.device)
        r, logit = model(xb)
        rul.append((r.clamp(0, 1) * rul_cap_of(model)).float().cpu().numpy())
        prob.append(torch.sigmoid(logit).float().cpu().numpy())
    if not rul:
        return np.zeros(0), np.zeros(0)
    return np.concatenate(rul).astype("float64"), np.concatenate(prob).astype("float64")


def rul_model_from_params(params: dict) -> RULModel:
    """A fresh RUL model (one CNN or a seed ensemble, by the params' ``architecture``) from registry params."""
    kinds = {cls.__name__: cls for cls in (SensorRULModel, SensorRULEnsemble)}
    if params.get("architecture") not in kinds:
        raise ValueError(f"not a sensor RUL model: {params.get('architecture')!r}")
    return kinds[params["architecture"]](**params["hparams"])


def build_module(params: dict) -> SensorOutputs | SensorEnsembleOutputs:
    """A fresh fp32 sensor model (RUL and failure heads as one output) from registry params."""
    model = rul_model_from_params(params)
    return SensorEnsembleOutputs(model) if isinstance(model, SensorRULEnsemble) else SensorOutputs(model)
