"""The window encoders: a 3-block dilated 1D-CNN, a residual causal dilated TCN and a patch
transformer, pooled over time into one embedding (:class:`SensorEncoder`), and the window
statistics they may read beside it."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

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
