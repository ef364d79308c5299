"""The compress flow's parameters: how far to compress and what to try."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CompressConfig(BaseModel):
    """How far to compress and what to try."""

    model_config = ConfigDict(frozen=True)

    tolerance: float = Field(default=0.01, ge=0, lt=1, description="Largest relative drop of the primary metric accepted.")
    try_all: bool = Field(default=False, description="Run every stage, not only until one fits the tolerance.")
    sensitivity_ratios: tuple[float, ...] = Field(
        default=(0.3, 0.6, 0.9), description="Pruning ratios of the per-layer sensitivity analysis."
    )
    prune_ratio: float = Field(
        default=0.5, gt=0, lt=1, description="Share of neurons / channels (structured) and of weights (global) removed."
    )
    finetune_epochs: int = Field(default=3, ge=0, description="Fine-tuning epochs after pruning (0: none).")
    distill_epochs: int = Field(default=5, ge=1, description="Student training epochs.")
    temperature: float = Field(default=4.0, gt=0, description="Distillation temperature.")
    alpha: float = Field(default=0.5, ge=0, le=1, description="Weight of the soft (teacher) loss in distillation.")
    latency_batch: int = Field(default=256, ge=1, description="Batch size of the latency measurement.")
    onnx_atol: float = Field(default=1e-4, gt=0, description="Largest ONNX vs PyTorch output difference accepted.")
    register_variant: bool = Field(default=True, description="Register the chosen candidate as a variant.")
