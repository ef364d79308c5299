"""Typed results of the fraud flows (what ``--json`` prints, what the UI shows)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from infra.registry import ModelRef, PromotionDecision
from tasks.data import DatasetRef
from tasks.dispatch import Dispatched
from tasks.evaluate import EvalReport
from tasks.finetune import FreezeReport
from tasks.ledger import InboxRun
from tasks.monitoring import DriftHistory, DriftSummary, RetrainDecision
from tasks.train import TrainResult
from tasks.tune import TuneSummary


class PreparedFeatures(BaseModel):
    """Window features and periods of one transactions table under one split."""

    model_config = ConfigDict(frozen=True)

    features: DatasetRef
    split: str = Field(description="The split's periods, in words.")
    rows: dict[str, int] = Field(description="Rows per period.")


class FraudTrainResult(BaseModel):
    """What ``fraud-train`` produced."""

    model_config = ConfigDict(frozen=True)

    dataset: DatasetRef
    split: str
    rows: dict[str, int] = Field(description="Rows per period.")
    train: TrainResult
    sequence: EvalReport
    baseline: EvalReport | None
    winner: str = Field(description="The candidate registered: highest validation PR-AUC (sequence, baseline, ensemble).")
    candidates_val_auprc: dict[str, float] = Field(default_factory=dict, description="Validation PR-AUC per candidate.")
    model: ModelRef
    promotion: PromotionDecision
    report_dir: str
    seconds: float


class StageReports(BaseModel):
    """One model's test metrics on the new data, on its new pattern and on the old data."""

    model_config = ConfigDict(frozen=True)

    new: EvalReport
    pattern: EvalReport | None = Field(description="Legit rows and the new pattern's frauds only.")
    old: EvalReport


class FraudAdaptResult(BaseModel):
    """What ``fraud-adapt`` produced: metrics before/after on the new and the old data."""

    model_config = ConfigDict(frozen=True)

    parent: str
    freeze: FreezeReport
    train: TrainResult
    new_before: EvalReport
    new_after: EvalReport
    pattern_before: EvalReport | None
    pattern_after: EvalReport | None
    old_before: EvalReport
    old_after: EvalReport
    model: ModelRef
    promotion: PromotionDecision
    report_dir: str


class FraudScoreResult(BaseModel):
    """What ``fraud-score`` wrote."""

    model_config = ConfigDict(frozen=True)

    model: str
    input: str
    rows_scored: int
    flagged: int
    threshold: float
    output: str
    csv_output: str | None
    labelled: EvalReport | None = Field(default=None, description="Metrics when labels were given.")


class FraudBatchScoreResult(InboxRun):
    """What one ``fraud-batch-score`` run did with the inbox: ``rows`` transactions scored,
    ``flagged`` of them at or above the model's threshold."""

    drift: DriftSummary | None = Field(default=None, description="Inputs and scores against the champion's profile.")


class FraudTuneResult(BaseModel):
    """What ``fraud-tune`` produced."""

    model_config = ConfigDict(frozen=True)

    solution: str = "fraud"
    dataset: DatasetRef
    split: str
    summary: TuneSummary
    objective: str
    default_value: float | None = Field(description="Objective of the default parameters (trial 0), if run.")
    full_training_mean_s: float | None = Field(description="Mean wall time of the complete (un-pruned) trials.")
    trial_seconds_total: float = Field(description="Wall time of all finished trials, summed.")
    final: TrainResult
    test: EvalReport
    model: ModelRef
    promotion: PromotionDecision
    report_dir: str
    seconds: float


class LabelsIngest(BaseModel):
    """What one monitor run took from the labels inbox."""

    model_config = ConfigDict(frozen=True)

    files: int
    rows: int
    quarantined: dict[str, str] = Field(default_factory=dict)
    new_ids: list[str] = Field(default_factory=list, description="Transactions whose label arrived now.")


class Accumulated(BaseModel):
    """The accumulated training dataset after one monitor run."""

    model_config = ConfigDict(frozen=True)

    path: str
    files_added: int = Field(description="Scored input files added now.")
    days_written: int = Field(description="Day partitions written now (new rows or arrived labels).")
    days: int
    first_day: str | None
    last_day: str | None


class FraudMonitorResult(BaseModel):
    """What one ``fraud-monitor`` run found and did."""

    model_config = ConfigDict(frozen=True)

    labels_files: int
    labels_rows: int
    quarantined: dict[str, str]
    accumulated: Accumulated
    performance: list[dict[str, Any]] = Field(description="Realised metrics per scored day and model version.")
    decision: RetrainDecision
    dispatched: Dispatched | None = Field(description="The retrain started, if any.")
    retrain_result: FraudAdaptResult | FraudTrainResult | None = Field(default=None, description="Its result when it ran in-process.")
    drift: DriftHistory | None = Field(default=None, description="The batch runs' drift over the runs (plotted).")
    report_dir: str
