"""Defaults of the sensor vertical: synthetic fleet, alignment, windows, model, training.

The flows take these pydantic models as parameters, so the Prefect UI renders a form
for them and the command line gets its ``--help`` from the same fields.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from solutions.sensor.cmapss import check_subset, has_test_files
from solutions.sensor.schema import ColumnMapping


class SensorSource(BaseModel):
    """Input data: a long-format readings file, a C-MAPSS folder, or the seeded synthetic fleet."""

    model_config = ConfigDict(frozen=True)

    data: str | None = Field(
        default=None, description="Long-format readings CSV/Parquet: asset_id, timestamp, sensor, value."
    )
    events: str | None = Field(
        default=None, description="Failure events CSV/Parquet: asset_id, failure_time, failure_type."
    )
    columns: dict[str, str] = Field(
        default_factory=dict, description="Column mapping canonical=SOURCE, e.g. asset_id=machine,timestamp=ts."
    )
    cmapss_dir: str | None = Field(
        default=None, description="Folder with the NASA C-MAPSS train_/test_/RUL_FDxxx.txt files."
    )
    subset: str = Field(default="FD001", description="C-MAPSS subset: FD001, FD002, FD003 or FD004.")
    origin: Literal["synthetic", "file", "accumulated"] | None = Field(
        default=None,
        description="Training data: the seeded synthetic fleet, the given file/folder, or the run-to-failure "
        "assets accumulated by batch scoring and sensor-monitor (None: the file/folder when given, else synthetic).",
    )

    @field_validator("columns")
    @classmethod
    def _canonical(cls, columns: dict[str, str]) -> dict[str, str]:
        ColumnMapping(columns)  # unknown canonical names or a source column mapped twice
        return columns

    @field_validator("subset")
    @classmethod
    def _known_subset(cls, subset: str) -> str:
        return check_subset(subset)

    @model_validator(mode="after")
    def _one_source(self) -> SensorSource:
        if self.data and self.cmapss_dir:
            raise ValueError("give either a readings file (data) or a C-MAPSS folder (cmapss_dir), not both")
        if self.events and not self.data:
            raise ValueError("failure events (events) belong to a readings file: give data too")
        given = bool(self.data or self.cmapss_dir)
        if self.origin == "accumulated" and given:
            raise ValueError("origin 'accumulated' trains on the accumulated data; drop data/cmapss_dir (or use origin 'file')")
        if self.origin == "file" and not given:
            raise ValueError("origin 'file' needs data (a readings file) or cmapss_dir")
        if self.origin == "synthetic" and given:
            raise ValueError("origin 'synthetic' ignores data/cmapss_dir; drop them (or use origin 'file')")
        return self

    def describe(self) -> str:
        """The input in a few words, for reports."""
        if self.cmapss_dir:
            held_out = "" if has_test_files(Path(self.cmapss_dir), self.subset) else " (train file only: test engines held out of it)"
            return f"C-MAPSS {self.subset} in {self.cmapss_dir}{held_out}"
        if self.origin == "accumulated":
            return "accumulated run-to-failure data"
        return self.data or "synthetic fleet"


class SyntheticFleetConfig(BaseModel):
    """The seeded synthetic fleet (the embedded default data)."""

    model_config = ConfigDict(frozen=True)

    n_assets: int = Field(default=100, ge=4, description="Machines in the fleet.")
    min_life: int = Field(default=150, ge=20, description="Shortest life, in grid steps (hours).")
    max_life: int = Field(default=330, ge=20, description="Longest life, in grid steps (hours).")
    censored_fraction: float = Field(
        default=0.2, ge=0, lt=1, description="Share of assets observed only up to a cut before failure."
    )
    fast_rate: int = Field(default=16, ge=2, description="Vibration samples per grid step.")
    noise: float = Field(default=1.0, ge=0, description="Scale of the sensor noise (1 = default).")
    bad_reading_rate: float = Field(
        default=0.0005, ge=0, lt=0.2, description="Share of readings corrupted (NaN, inf, spikes)."
    )
    seed: int = Field(default=0, description="Generator seed; same seed, same fleet.")

    @model_validator(mode="after")
    def _life_range(self) -> SyntheticFleetConfig:
        if self.max_life < self.min_life:
            raise ValueError(f"max_life ({self.max_life}) must be >= min_life ({self.min_life})")
        return self


class AlignConfig(BaseModel):
    """How long-format readings become one time grid per asset."""

    model_config = ConfigDict(frozen=True)

    step_seconds: float = Field(default=3600.0, gt=0, description="Grid step (seconds for datetimes).")
    fast_sensors: tuple[str, ...] | None = Field(
        default=None,
        description="Sensors aggregated to RMS/peak/kurtosis per step. None: every sensor sampled "
        "more often than twice per step.",
    )
    ffill_limit: int = Field(default=3, ge=0, description="Steps a slow sensor is carried forward.")
    op_prefix: str = Field(default="op_", description="Sensors with this prefix are operating settings.")
    valid_range: dict[str, tuple[float, float]] = Field(
        default_factory=lambda: {"*": (-1e6, 1e6)},
        description="Allowed [min, max] per sensor ('*' for all others); outside counts as bad.",
    )


#: training-window stride of non-C-MAPSS data when none is configured
DEFAULT_STRIDE = 3


class WindowConfig(BaseModel):
    """Fixed-length windows over the grid."""

    model_config = ConfigDict(frozen=True)

    length: int = Field(
        default=60, ge=2,
        description="Steps per window; engines cut shorter are left-padded (60 with padded training windows from "
        "row 20: C-MAPSS FD001 engine-split CV, 2 fold splits x 5 folds x 3 seeds, pre-trained CNN RMSE 12.66 -> "
        "12.10 against the GBM's 12.55; round 4's 40 predates the padded training windows).",
    )
    stride: int | None = Field(
        default=None, ge=1,
        description="Steps between training windows (None: 1 for C-MAPSS, every cycle as the standard protocol; "
        f"{DEFAULT_STRIDE} otherwise).",
    )
    pad_from: int | None = Field(
        default=20, ge=1,
        description="Training and validation windows also end at each asset's rows pad_from .. length-1, left-padded "
        "with its first reading, as an asset shorter than a window is padded when scored (None, or a value of at "
        "least the window length: they start at the length-th row, and a model meets padded windows only when it "
        "scores; with 60-step windows that cost the GBM 1.0 RMSE on FD001).",
    )
    test_cuts: int = Field(
        default=4, ge=1, description="Synthetic test assets are cut before failure this many times (random cuts)."
    )
    val_cuts: int = Field(
        default=10, ge=0,
        description="How validation scores RUL for early stopping and for choosing the registered candidate: N, the "
        "last window of N random cuts of each failed validation asset, as the test protocol and the C-MAPSS test file "
        "score; 0, every window of the validation assets. The failure-alert threshold is always calibrated on every "
        "validation window. (C-MAPSS FD001 engine-split CV, 2 fold splits x 5 folds, 3 scratch CNNs + GBM: the "
        "registered candidate's RMSE 11.69 / 12.21 with every window -> 11.54 / 11.87 with 10 cuts.)",
    )
    rul_cap: float = Field(default=125.0, gt=0, description="Piecewise-linear RUL cap.")
    horizon: int = Field(default=30, ge=1, description="Failure within this many steps = positive.")
    n_regimes: int | Literal["auto"] = Field(
        default="auto", description="Operating regimes (KMeans on op settings); auto: by silhouette, 1-6."
    )
    age_channel: bool = Field(
        default=False,
        description="Add the asset's age (steps since its first reading, z-scored on the training assets) as an input "
        "channel.",
    )


class ModelConfig(BaseModel):
    """The window encoder (1D-CNN by default) and its heads."""

    model_config = ConfigDict(frozen=True)

    arch: Literal["cnn", "tcn", "transformer"] = Field(
        default="cnn",
        description="Encoder trunk: the 3-block dilated CNN, a residual causal dilated TCN (4 blocks, dilations "
        "1-8), or a patch transformer (4-step tokens, 2 attention blocks); same pooling, window statistics, heads "
        "and pre-training for all three.",
    )
    channels: int = Field(default=32, ge=8, description="Width of the first conv layer (the others are 2x).")
    embedding_dim: int = Field(default=256, ge=8, description="Encoder output size.")
    dropout: float = Field(default=0.1, ge=0, lt=1, description="Dropout rate of the encoder and heads.")
    fail_weight: float = Field(
        default=0.05, ge=0,
        description="Weight of the failure-in-horizon loss (the RUL loss is an MSE of RUL / cap, ~0.02: a weight of "
        "0.5 let the failure loss drive the encoder, validation RMSE 16 against 14).",
    )
    pooling: Literal["meanmax", "mean", "meanlast"] = Field(
        default="mean",
        description="Pooling over time: window mean + max, window mean, or window mean + mean of the last steps.",
    )
    norm: Literal["batch", "none"] = Field(
        default="none",
        description="Normalisation after each conv: BatchNorm, or none (on C-MAPSS FD001 BatchNorm let the model "
        "tell training engines apart and miss new ones).",
    )
    window_stats: bool = Field(
        default=True,
        description="The encoder's projection also reads each input channel's window statistics (mean, std, min, "
        "max, last, slope, mean of the last steps: the GBM baseline's features) beside the pooled conv features "
        "(C-MAPSS FD001 engine-split CV, scratch CNN: RMSE 13.18 -> 12.33 and 13.86 -> 13.27 on two fold splits).",
    )


class PretrainConfig(BaseModel):
    """Self-supervised masked reconstruction."""

    model_config = ConfigDict(frozen=True)

    mask_time: float = Field(default=0.3, gt=0, lt=1, description="Share of time steps masked.")
    mask_sensor: float = Field(default=0.15, ge=0, lt=1, description="Share of sensors masked whole.")
    lr: float = Field(default=2e-3, gt=0, description="Pre-training learning rate.")
    batch_size: int = Field(default=256, ge=8, description="Pre-training batch size.")
    max_epochs: int = Field(default=5, ge=1, description="Pre-training epochs at most.")
    patience: int = Field(default=2, ge=1, description="Pre-training early-stopping patience (epochs).")
    stride: int = Field(default=4, ge=1, description="Window stride for pre-training.")
    seed: int = Field(default=0, description="Pre-training seed.")


class FinetuneConfig(BaseModel):
    """Supervised training (fine-tuning or from scratch)."""

    model_config = ConfigDict(frozen=True)

    label_fraction: float = Field(default=1.0, gt=0, le=1, description="Share of training assets labelled.")
    pretrained: bool = Field(
        default=True,
        description="Start from the pre-trained encoder (C-MAPSS FD001: the registered model's engine-split CV RMSE "
        "11.56 with it, 11.52 from scratch, bench/results/sensor_cv_cross_fit; sensor train 154 CPU-s with it, 183 "
        "from scratch, one torch thread: the frozen first epochs of progressive fine-tuning cost less than the "
        "pre-training, bench/results/sensor_cv_default_2026-12-06).",
    )
    mode: Literal["progressive", "top"] = Field(default="progressive", description="Fine-tuning schedule.")
    unfreeze_every: int = Field(default=2, ge=1, description="Epochs between unfreezing steps.")
    unfrozen_lr_ratio: float = Field(
        default=1.0, gt=0, le=1,
        description="Learning rate of a layer group when progressive fine-tuning unfreezes it, as a share of the "
        "current rate (0.1 left the pre-trained encoder nearly fixed: FD001 train RMSE 15.4 after 20 epochs).",
    )
    lr: float = Field(default=2e-3, gt=0, description="Learning rate.")
    batch_size: int = Field(default=256, ge=8, description="Batch size.")
    max_epochs: int = Field(default=20, ge=1, description="Training epochs at most.")
    patience: int = Field(default=4, ge=1, description="Early-stopping patience (epochs, on the smoothed RMSE).")
    min_samples_per_epoch: int = Field(
        default=4096, ge=1, description="Few-label runs resample the labelled windows up to this."
    )
    lr_schedule: Literal["constant", "cosine"] = Field(
        default="cosine", description="Learning-rate schedule: cosine decay over max_epochs after a short warm-up."
    )
    smoothing: float | None = Field(
        default=0.6, ge=0, lt=1,
        description="Early stopping and the best epoch follow a moving average of the validation RMSE "
        "with this weight on the past (None: the raw value).",
    )
    input_noise: float = Field(
        default=0.0, ge=0,
        description="Std of Gaussian noise added to the normalised training windows (0: none; it was needed "
        "against over-fitting with BatchNorm, and without BatchNorm it cost validation RMSE).",
    )
    alert_threshold: float | None = Field(
        default=None, gt=0, lt=1, description="Alert when P(failure) >= this; None: max F1 on validation."
    )
    seed: int = Field(default=0, description="Seed of the labelled draw and of training.")
    members: int = Field(
        default=3, ge=1,
        description="CNNs trained from seeds seed, seed + 1, ...; their mean is the CNN candidate (C-MAPSS FD001 "
        "engine-split CV, 2 fold splits x 5 folds: one CNN RMSE 12.10, the mean of 3 11.87; on FD001 the 3 members are "
        "~100 of sensor train's ~154 CPU-s, one torch thread).",
    )
    cross_fit: bool = Field(
        default=True,
        description="Cross-fitting, on by default (off: every member validates on the same assets). Member i "
        "validates (early stopping) on its own disjoint block of validation assets and trains on "
        "the others, a GBM is fitted per block (the GBM candidate is their mean), and the choice between the CNN, "
        "the GBM and their mean pools every block's out-of-fold predictions: members x as many validation assets "
        "(FD001 engine-split CV, 2 fold splits x 5 folds, 3 CNNs from scratch: the registered model 11.71 -> 11.52 "
        "RMSE, and the validation estimate's bias 1.02 -> 0.28; bench/results/sensor_cv_cross_fit). Fewer blocks "
        "when the assets cannot give one per member.",
    )


class SplitConfig(BaseModel):
    """Split by asset, never by row."""

    model_config = ConfigDict(frozen=True)

    val_fraction: float = Field(default=0.15, gt=0, lt=0.5, description="Share of assets for validation.")
    test_fraction: float = Field(default=0.2, gt=0, lt=0.5, description="Share of assets for test.")
    seed: int = Field(default=0, description="Seed of the asset split.")


class SensorConfig(BaseModel):
    """Everything the sensor flows need besides their input data."""

    model_config = ConfigDict(frozen=True)

    fleet: SyntheticFleetConfig = SyntheticFleetConfig()
    align: AlignConfig = AlignConfig()
    window: WindowConfig = WindowConfig()
    model: ModelConfig = ModelConfig()
    pretrain: PretrainConfig = PretrainConfig()
    finetune: FinetuneConfig = FinetuneConfig()
    split: SplitConfig = SplitConfig()
    baseline: bool = Field(default=True, description="Fit the gradient-boosting baseline beside the CNN.")
    extra_archs: tuple[Literal["cnn", "tcn", "transformer"], ...] = Field(
        default=(),
        description="Also train a network with each of these encoder trunks (as model.arch's network is trained: "
        "same pre-training choice and members); the network with the lowest validation RUL RMSE is the network "
        "candidate (a heavier recipe: each trunk adds its training time; none by default).",
    )
    encoder_name: str = Field(default="sensor-encoder", description="Registry name of the encoder.")
    model_name: str = Field(default="sensor-rul", description="Registry name of the RUL/failure model.")


class SensorHeldOut(BaseModel):
    """Sensor held-out data: C-MAPSS files, a long-format readings file, or the synthetic fleet."""

    model_config = ConfigDict(frozen=True)

    data: str | None = Field(default=None, description="Long-format readings CSV or Parquet (default: the synthetic fleet).")
    events: str | None = Field(default=None, description="Failure events CSV or Parquet beside the readings.")
    columns: dict[str, str] = Field(default_factory=dict, description="Column mapping canonical=SOURCE.")
    cmapss_dir: str | None = Field(default=None, description="Folder with the NASA C-MAPSS files (instead of a readings file).")
    subset: str = Field(default="FD001", description="C-MAPSS subset.")
    fleet: SyntheticFleetConfig = Field(
        default=SyntheticFleetConfig(), description="The synthetic fleet, when no file is given."
    )
