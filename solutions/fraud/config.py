"""Defaults of the fraud vertical: data, split, sequence model and baseline.

The flows take these pydantic models as parameters, so the Prefect UI renders a form
for them and the command line gets its ``--help`` from the same fields.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SyntheticDataConfig(BaseModel):
    """The seeded synthetic transaction generator (the embedded default data)."""

    model_config = ConfigDict(frozen=True)

    n_accounts: int = Field(default=3000, ge=10, description="Accounts (customers).")
    n_terminals: int = Field(default=1000, ge=5, description="Terminals / merchants.")
    n_days: int = Field(default=58, ge=7, description="Days of transactions.")
    fraud_rate: float = Field(default=0.01, gt=0, lt=0.2, description="Target share of fraud.")
    seed: int = Field(default=0, description="Generator seed; same seed, same data.")
    new_pattern: bool = Field(default=False, description="Inject a new fraud pattern late on.")


class SplitConfig(BaseModel):
    """Time periods counted back from the end of the data (days)."""

    model_config = ConfigDict(frozen=True)

    train_days: float = Field(default=14, gt=0, description="Training period, validation included.")
    val_days: float = Field(default=3, ge=0, description="Last part of the training period, for early stopping.")
    delay_days: float = Field(default=7, ge=0, description="Labels not known yet: never trained on.")
    test_days: float = Field(default=7, gt=0, description="Test period.")

    @model_validator(mode="after")
    def _val_inside_train(self) -> SplitConfig:
        if self.val_days >= self.train_days:
            raise ValueError(
                f"val_days ({self.val_days}) must be smaller than train_days ({self.train_days})"
            )
        return self


class SequenceModelConfig(BaseModel):
    """The GRU sequence model and its training."""

    model_config = ConfigDict(frozen=True)

    seq_len: int = Field(default=16, ge=1, le=256, description="Steps: the current transaction and its predecessors.")
    hidden: int = Field(default=64, ge=4, description="GRU hidden size (= sequence embedding size).")
    mlp_hidden: int = Field(default=128, ge=4, description="Width of the first MLP layer.")
    dropout: float = Field(default=0.1, ge=0, lt=1, description="Dropout of the MLP head.")
    use_window_features: bool = Field(
        default=True,
        description="Concatenate the transaction's window features (account and delayed "
        "terminal-risk aggregates) with the sequence embedding and static attributes.",
    )
    loss: Literal["bce", "focal"] = Field(default="bce", description="Imbalance handling.")
    focal_gamma: float = Field(default=2.0, ge=0, description="Focusing exponent of the focal loss.")
    lr: float = Field(default=2e-3, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(default=1e-4, ge=0, description="AdamW weight decay.")
    batch_size: int = Field(default=512, ge=8, description="Sequences per training batch.")
    negative_rate: float = Field(
        default=0.3,
        gt=0,
        le=1,
        description="Share of legit training transactions drawn afresh each epoch (all frauds "
        "are always used). Below 1 an epoch costs about that share of a full pass.",
    )
    max_epochs: int = Field(default=12, ge=1, description="Training epochs at most.")
    patience: int = Field(default=3, ge=1, description="Epochs without a better validation PR-AUC before stopping.")
    seed: int = Field(default=0, description="Seed of weights, sampling and shuffling.")


class BaselineConfig(BaseModel):
    """The HistGradientBoosting baseline on window features."""

    model_config = ConfigDict(frozen=True)

    enabled: bool = Field(default=True, description="Train the baseline beside the sequence model.")
    delay_days: float = Field(default=7, ge=0, description="Label delay used by terminal risk features.")


class FraudTrainConfig(BaseModel):
    """Everything the fraud train flow needs besides its input data."""

    model_config = ConfigDict(frozen=True)

    data: SyntheticDataConfig = SyntheticDataConfig()
    split: SplitConfig = SplitConfig()
    model: SequenceModelConfig = SequenceModelConfig()
    baseline: BaselineConfig = BaselineConfig()
    fpr_target: float = Field(default=0.01, gt=0, lt=1, description="FPR for recall@FPR.")
    model_name: str = Field(default="fraud-seq", description="Registry name of the model.")
    candidates: tuple[Literal["sequence", "baseline", "ensemble"], ...] = Field(
        default=("sequence", "baseline", "ensemble"), min_length=1,
        description="Candidates that may be registered (the best on validation among them wins; "
        "the others are still reported): sequence, baseline (the GBM), ensemble (their mean).",
    )

    @model_validator(mode="after")
    def _candidates_trained(self) -> FraudTrainConfig:
        if not self.baseline.enabled and not set(self.candidates) & {"sequence"}:
            raise ValueError(f"candidates {list(self.candidates)} need the baseline, which is turned off")
        return self


# ------------------------------------------------------------------------------------
# hyper-parameter search space (checked by the tuning task before any trial runs)


class FloatParam(BaseModel):
    """A float drawn from [low, high], on a log scale when ``log``."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["float"] = "float"
    name: str = Field(description="A field of the config being tuned.")
    low: float
    high: float
    log: bool = False


class IntParam(BaseModel):
    """An integer drawn from [low, high] in steps of ``step`` (log scale when ``log``)."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["int"] = "int"
    name: str = Field(description="A field of the config being tuned.")
    low: int
    high: int
    step: int = 1
    log: bool = False


class CategoricalParam(BaseModel):
    """One of a fixed list of choices."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["categorical"] = "categorical"
    name: str = Field(description="A field of the config being tuned.")
    choices: tuple[str | int | float | bool, ...]


ParamSpec = FloatParam | IntParam | CategoricalParam

#: What ``python -m flows.fraud tune`` searches, over :class:`SequenceModelConfig` fields.
SEARCH_SPACE: tuple[ParamSpec, ...] = (
    FloatParam(name="lr", low=3e-4, high=1e-2, log=True),
    IntParam(name="hidden", low=16, high=128, log=True),
    IntParam(name="mlp_hidden", low=32, high=256, log=True),
    FloatParam(name="dropout", low=0.0, high=0.4),
    CategoricalParam(name="seq_len", choices=(8, 16, 32)),
    FloatParam(name="weight_decay", low=1e-6, high=1e-2, log=True),
    CategoricalParam(name="loss", choices=("bce", "focal")),
)
