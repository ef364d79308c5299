"""Predicting RUL and failure probability from windows, and the trained models as plain modules
with one ``(batch, 2)`` output (for export, compression and serving), rebuilt from registry params."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from solutions.sensor.model import (
    RULModel,
    SensorRULEnsemble,
    SensorRULModel,
    rul_cap_of,
    rul_model_from_params,
)


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


class SensorEnsembleOutputs(nn.Module):
    """A :class:`SensorRULEnsemble` as a plain module with one ``(batch, 2)`` output, as
    :class:`SensorOutputs` is for one model (same state-dict keys as the ensemble)."""

    def __init__(self, model: SensorRULEnsemble) -> None:
        super().__init__()
        self.members = nn.ModuleList(SensorOutputs(m) for m in model.members)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([m(x) for m in self.members]).mean(0)

def build_module(params: dict) -> SensorOutputs | SensorEnsembleOutputs:
    """A fresh fp32 sensor model (RUL and failure heads as one output) from registry params."""
    model = rul_model_from_params(params)
    return SensorEnsembleOutputs(model) if isinstance(model, SensorRULEnsemble) else SensorOutputs(model)
