"""Defaults of the fraud vertical: data, split, sequence model, baseline and federation.

The flows take these pydantic models as parameters, so the Prefect UI renders a form
for them and the command line gets its ``--help`` from the same fields.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: Where a training run takes its transactions from (a flow parameter: kept here, in a light
#: module, so the command line reads it without importing the flows).
TrainingSource = Literal["synthetic", "file", "accumulated"]


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


class FraudHeldOut(BaseModel):
    """Held-out data: a file (--data, --columns and --seed serve every model type), or synthetic transactions.

    ``data`` and ``columns`` name a transactions file for a fraud model; the compress
    command hands them to a sensor model's options too (a readings file there).
    """

    model_config = ConfigDict(frozen=True)

    data: str | None = Field(
        default=None, description="Held-out data, CSV or Parquet: transactions (fraud) or long-format readings (sensor); "
        "default: the seeded synthetic data."
    )
    columns: dict[str, str] = Field(
        default_factory=dict, description="Column mapping canonical=SOURCE of the data file, e.g. account_id=CUSTOMER_ID."
    )
    accounts: str | None = Field(
        default=None, description="Optional accounts table: account_id, age, occupation, account_age_days."
    )
    synthetic: SyntheticDataConfig = Field(
        default=SyntheticDataConfig(), description="The synthetic data, when no file is given."
    )


# ------------------------------------------------------------------------------------
# federated training (fraud-federate; the training itself: solutions.fraud.federated)

#: The small sequence model federated runs default to (2 busy cores; every bank trains it per round).
SMALL_MODEL = SequenceModelConfig(hidden=32, mlp_hidden=64, seq_len=8, batch_size=256, max_epochs=1)


#: DP-SGD defaults, from bench/fraud_federated.py on the default synthetic data (3 banks, 12 rounds,
#: ε = 8; AP 0.27-0.36 with the earlier defaults, 0.67 with these): clipping at 1.0 left fraud rows
#: under-fitted (bench/fraud_dp_pooled.py: one bank, no noise, clipping alone cut AP from 0.81 to
#: 0.57; at 10 it cost almost nothing); batches of 512 beat 256, 1,024 and 2,048; three epochs per
#: round beat one.
DP_MAX_GRAD_NORM = 10.0
DP_BATCH_SIZE = 512
DP_LEARNING_RATE = 0.006
DP_LOCAL_EPOCHS = 3

#: The federation's rounds by default. Measured with bench/fraud_federated.py (3 banks, seeds 0-2; the
#: figures in docs/benchmarks.md#federated-training): test AP on the handbook-format days 0.580 at 12
#: rounds, 0.615 at 24, 0.620 at 36 (0.37 at the earlier default of 3); on the synthetic data 0.750, 0.771, 0.774.
FEDERATION_ROUNDS = 24
#: Test AP of that bench on the handbook-format days at 24 rounds: the banks' own terminal features, and
#: with ``share_terminal_stats`` (the run's summary quotes them when it is off).
HANDBOOK_AP_OWN_TERMINALS, HANDBOOK_AP_SHARED_TERMINALS = 0.615, 0.711


class FederationConfig(BaseModel):
    """How the banks federate: how many, how the table is split, rounds, faults, privacy."""

    model_config = ConfigDict(frozen=True)

    clients: int = Field(default=3, ge=1, le=32, description="Banks (Flower clients), one process each.")
    partition_by: str | None = Field(
        default=None, description="Column that names the bank (e.g. a bank or region id); default: a stable "
        "hash of account_id, so an account belongs to one bank.")
    rounds: int = Field(default=FEDERATION_ROUNDS, ge=1, description="Federated training rounds (after the "
                        "moments round). A federation needs more rounds than pooled training needs epochs: each "
                        "averages the banks' passes over a part of the rows each.")
    local_epochs: int = Field(default=1, ge=1, description="Epochs each bank trains per round.")
    server_learning_rate: float = Field(
        default=1.0, gt=0, description="Server step on the banks' mean update (Flower FedAvgM; 1 with no "
        "momentum is plain FedAvg).")
    server_momentum: float = Field(default=0.0, ge=0, lt=1, description="Server momentum of FedAvgM (0: none).")
    keep_local_optimizer: bool = Field(
        default=True, description="Each bank keeps its AdamW moments from round to round (the weights still "
        "come from the server; with DP the moments come from privatised gradients, so no ε is spent).")
    min_clients: int | None = Field(default=None, ge=1, description="Fewest banks a round needs (default: "
                                    "clients - 1, at least 1): a crashed or slow bank leaves a partial round.")
    round_timeout_s: float = Field(default=600, gt=0, description="A bank slower than this in a round is "
                                   "counted as failed for that round.")
    connect_timeout_s: float = Field(default=180, gt=0, description="How long the server waits for every bank "
                                     "to connect before round 1.")
    dp_epsilon: float | None = Field(default=None, gt=0, description="Per-bank (ε, δ) budget for DP-SGD over "
                                     "all rounds; default: no differential privacy.")
    dp_delta: float = Field(default=1e-5, gt=0, lt=1, description="δ of the DP budget.")
    dp_max_grad_norm: float = Field(default=DP_MAX_GRAD_NORM, gt=0, description="Per-sample gradient clipping "
                                    "norm (DP). Too small a norm clips every fraud row's gradient to the size of an "
                                    "ordinary row's, and the model under-fits the rare class.")
    dp_batch_size: int | None = Field(default=DP_BATCH_SIZE, ge=8, description="Expected Poisson batch of "
                                      "DP-SGD (None: the model's batch size). Larger batches cut the noise per "
                                      "averaged gradient at the same budget, but take fewer steps.")
    dp_learning_rate: float | None = Field(default=DP_LEARNING_RATE, gt=0, description="AdamW learning rate "
                                           "under DP-SGD (None: the model's).")
    dp_local_epochs: int | None = Field(default=DP_LOCAL_EPOCHS, ge=1, description="Epochs each bank trains per "
                                        "round under DP-SGD (None: local_epochs). The noise is set for the whole "
                                        "budget, so more passes cost noise, not ε.")
    best_round: bool = Field(
        default=True, description="Keep the round whose global model scored the best validation AP (row-weighted "
        "over the banks; early stopping for a federation), not the last one; the pooled and bank-alone comparisons "
        "keep their best validation epoch alike. Under DP the last round is kept: the banks' validation scores are "
        "not noised, so choosing by them would spend privacy the accountant does not count.")
    share_terminal_stats: bool = Field(
        default=False, description="Before the moments round, every bank shares each terminal's daily counts "
        "(transactions, known labels, frauds; no account, amount or time of day) and the server sums them, so a "
        "terminal's window features count every bank's transactions there in whole days, not only the bank's own. "
        "The counts are not noised: DP covers the weight updates only, and the card says so.")
    port: int = Field(default=0, ge=0, le=65535, description="Server port on 127.0.0.1 (0: a free one).")

    @model_validator(mode="after")
    def _min_clients(self) -> FederationConfig:
        if self.min_clients is not None and self.min_clients > self.clients:
            raise ValueError(f"min_clients ({self.min_clients}) is larger than clients ({self.clients})")
        return self

    def client_model(self, model: SequenceModelConfig) -> SequenceModelConfig:
        """The model config each bank trains with: the DP batch size and learning rate under DP."""
        if self.dp_epsilon is None:
            return model
        update = {k: v for k, v in (("batch_size", self.dp_batch_size), ("lr", self.dp_learning_rate)) if v is not None}
        return model.model_copy(update=update) if update else model

    def epochs_per_round(self) -> int:
        """Epochs each bank trains per round: ``dp_local_epochs`` under DP (when set), else ``local_epochs``."""
        if self.dp_epsilon is not None and self.dp_local_epochs is not None:
            return self.dp_local_epochs
        return self.local_epochs

    def selects_best_round(self) -> bool:
        """Whether the federation keeps its best-validation round (never under DP)."""
        return self.best_round and self.dp_epsilon is None

    def recipe_notes(self) -> list[str]:
        """What to change for the measured recipe, one line each: too few rounds, and the terminal
        statistics each bank keeps to itself (a choice the banks make, so only said, never switched on)."""
        notes = []
        if self.rounds < FEDERATION_ROUNDS:
            notes.append(f"rounds: {self.rounds}; the federation was measured to keep improving up to "
                         f"{FEDERATION_ROUNDS} (--rounds {FEDERATION_ROUNDS}, the default; docs/benchmarks.md)")
        if not self.share_terminal_stats:
            notes.append(f"terminal features from each bank's own rows: on the handbook-format data "
                         f"--share-terminal-stats (the banks share each terminal's daily counts of transactions, "
                         f"labels and frauds, not noised) reached test AP {HANDBOOK_AP_SHARED_TERMINALS} against "
                         f"{HANDBOOK_AP_OWN_TERMINALS} ({FEDERATION_ROUNDS} rounds), where the banks agree to share them")
        return notes

    def needed(self) -> int:
        """Fewest banks a round needs."""
        return self.min_clients if self.min_clients is not None else max(1, self.clients - 1)


class FederateConfig(BaseModel):
    """Everything ``fraud-federate`` needs besides its input data."""

    model_config = ConfigDict(frozen=True)

    federation: FederationConfig = FederationConfig()
    data: SyntheticDataConfig = SyntheticDataConfig()
    split: SplitConfig = SplitConfig()
    model: SequenceModelConfig = SMALL_MODEL
    delay_days: float = Field(default=7, ge=0, description="Label delay used by terminal risk features.")
    compare: bool = Field(default=True, description="Also train pooled, bank-alone and the pooled GBM baseline "
                          "for the report.")
    fpr_target: float = Field(default=0.01, gt=0, lt=1, description="FPR for recall@FPR.")
    model_name: str = Field(default="fraud-federated", description="Registry name of the model.")


class ClientFault(BaseModel):
    """Fault injection for a bank (tests, drills): crash or stall in one training round."""

    model_config = ConfigDict(frozen=True)

    crash_round: int | None = None
    slow_round: int | None = None
    slow_s: float = 0.0
