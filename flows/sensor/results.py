"""What the sensor flows return (typed; printed as JSON by ``--json``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from infra.registry import ModelRef, PromotionDecision
from solutions.sensor.schema import BadReadingReport
from tasks.data import DatasetRef
from tasks.dispatch import Dispatched
from tasks.evaluate import EvalReport
from tasks.evaluate_regression import RegressionReport
from tasks.finetune import FreezeReport
from tasks.ledger import InboxRun
from tasks.monitoring import DriftHistory, DriftSummary, RetrainDecision
from tasks.train import TrainResult


class SensorPretrainResult(BaseModel):
    """What ``sensor-pretrain`` produced."""

    model_config = ConfigDict(frozen=True)

    dataset: DatasetRef
    bad_readings: BadReadingReport
    assets: dict[str, int] = Field(description="Assets per split.")
    windows: dict[str, int]
    channels: list[str]
    train: TrainResult
    model: ModelRef
    promotion: PromotionDecision
    seconds: float


class SensorTrainResult(BaseModel):
    """What ``sensor-train`` produced."""

    model_config = ConfigDict(frozen=True)

    dataset: DatasetRef
    bad_readings: BadReadingReport
    pretrained_from: str | None
    label_fraction: float
    labelled_assets: int
    assets: dict[str, int]
    windows: dict[str, int]
    train: TrainResult
    freeze: FreezeReport | None
    rul: RegressionReport
    baseline_rul: RegressionReport | None
    failure: EvalReport | None
    baseline_failure: EvalReport | None
    alerts: dict[str, float] = Field(description="Lead time of the CNN's first alerts on failed test assets.")
    threshold: float = Field(description="The CNN's failure-alert threshold (``failure``'s); the registered "
                             "candidate's is ``model.params['threshold']``.")
    winner: str = Field(description="The candidate registered: lowest validation RUL RMSE (cnn, baseline, ensemble).")
    model: ModelRef
    promotion: PromotionDecision
    report_dir: str
    seconds: float


class SensorScoreResult(BaseModel):
    """What ``sensor-score`` wrote."""

    model_config = ConfigDict(frozen=True)

    model: str
    input: str
    assets_scored: int
    alerts: int
    threshold: float
    output: str
    csv_output: str | None
    bad_readings: BadReadingReport


class SensorBatchScoreResult(InboxRun):
    """What one ``sensor-batch-score`` run did with the inbox: ``rows`` assets scored (their
    latest window), ``flagged`` of them alerting (P(failure) at or above the threshold)."""

    bad_readings: dict[str, BadReadingReport] = Field(
        default_factory=dict, description="Score file -> the bad readings counted in its input file."
    )
    drift: DriftSummary | None = Field(default=None, description="Readings and predicted RUL against the champion's profile.")


class FailuresIngest(BaseModel):
    """What one monitor run took from the failures inbox."""

    model_config = ConfigDict(frozen=True)

    files: int
    rows: int
    quarantined: dict[str, str] = Field(default_factory=dict)


class SensorAccumulated(BaseModel):
    """The accumulated sensor data after one monitor run."""

    model_config = ConfigDict(frozen=True)

    path: str
    files_added: int = Field(description="Scored readings files added now.")
    days: int = Field(description="Day partitions of readings held.")
    first_day: str | None
    last_day: str | None
    failures: int = Field(description="Failure events held (one per asset).")


class SensorMonitorResult(BaseModel):
    """What one ``sensor-monitor`` run found."""

    model_config = ConfigDict(frozen=True)

    failures_files: int
    failures_rows: int
    quarantined: dict[str, str]
    accumulated: SensorAccumulated
    rul_error: list[dict] = Field(description="Realised RUL error per model version (MAE, RMSE, bias, within share).")
    judged: int = Field(description="Scored (asset, step) predictions whose asset has failed since.")
    decision: RetrainDecision | None = Field(default=None, description="Whether the champion is retrained, and why.")
    dispatched: Dispatched | None = Field(default=None, description="The retrain started, if any.")
    retrain_result: SensorTrainResult | None = Field(default=None, description="Its result when it ran in-process.")
    drift: DriftHistory | None = Field(default=None, description="The batch runs' drift over the runs (plotted).")
    report_dir: str
