"""The operations config: resources per flow, GPU pools, monitoring thresholds and approvals.

The packaged default is ``infra/deployments.yaml``; ``INDUSFLOW_DEPLOY_CONFIG`` names another
file, so resources and thresholds change without a code change. The deployments themselves
(flows, schedules, parameters, work pools) are Prefect's, in ``prefect.yaml``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from infra.errors import IndusflowError
from infra.resources import ResourceSpec
from infra.settings import get_deploy_settings

DEFAULT_CONFIG = Path(__file__).with_name("deployments.yaml")


class DeployConfigError(IndusflowError):
    """The deployment config file is missing or invalid."""


class MonitoringSpec(BaseModel):
    """Thresholds of a watched job (``monitoring.<flow name>`` in the config).

    A batch-scoring flow uses the drift fields; a monitor flow uses the performance gate,
    the streaks and the trigger (and reads its batch job's drift rows).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    psi: float = Field(default=0.25, gt=0, description="A feature drifts when its PSI exceeds this.")
    score_psi: float = Field(default=0.25, gt=0, description="The scores drift when their PSI exceeds this.")
    ks: float | None = Field(default=0.3, gt=0, le=1, description="KS distance limit of numeric features (None: off).")
    missing_delta: float = Field(default=0.1, ge=0, le=1, description="Rise of a feature's missing share that counts as drift.")
    min_rows: int = Field(default=30, ge=1, description="A column with fewer values in a run is recorded, not judged.")
    consecutive_runs: int = Field(default=3, ge=1, description="Drifted batch runs in a row that trigger the deployment.")
    metric: str = Field(
        default="pr_auc",
        description="The realised metric the gate judges (a column of the monitor's performance table, "
        "e.g. pr_auc, roc_auc, recall_at_fpr).")
    min_metric: float | None = Field(default=None, description="Realised metric below this fails the gate.")
    max_drop: float | None = Field(
        default=0.3, gt=0, lt=1,
        description="Realised metric below (1 - max_drop) x the version's reference fails the gate.")
    reference_days: int = Field(
        default=3, ge=0,
        description="The reference: the realised metric of the version's first N labelled days, pooled "
        "(0: its registered test metric). No relative gate until it has them.")
    consecutive_days: int = Field(
        default=2, ge=1, description="The recent window: the last N labelled days, pooled, are judged against the gate.")
    min_labels: int = Field(default=50, ge=1, description="Labelled rows a scored day needs to count.")
    trigger: str | None = Field(default=None, description="flow-name/deployment-name to run when a streak is reached.")

    @field_validator("trigger")
    @classmethod
    def _trigger(cls, v: str | None) -> str | None:
        if v is not None and (v.count("/") != 1 or not all(v.split("/"))):
            raise ValueError(f"{v!r}: use flow-name/deployment-name (e.g. fraud-adapt/on-drift-adapt)")
        return v


class DeployConfig(BaseModel):
    """The whole file."""

    model_config = ConfigDict(extra="forbid")

    gpu_pools: dict[str, int] = Field(default_factory=dict)
    resources: dict[str, ResourceSpec] = Field(default_factory=dict)
    monitoring: dict[str, MonitoringSpec] = Field(
        default_factory=dict, description="Drift and performance thresholds per flow name.")
    approval: dict[str, Literal["required", "none"]] = Field(
        default_factory=dict, description="Registry model name -> whether its champion moves only after "
        "a second person approves (tasks.approval).")

    @model_validator(mode="after")
    def _pools(self) -> DeployConfig:
        for flow_name, spec in self.resources.items():
            pool = spec.gpu_type or "any"
            if spec.gpus not in (0,) and self.gpu_pools and pool not in self.gpu_pools:
                raise ValueError(f"resources.{flow_name}: GPU pool {pool!r} is not in gpu_pools {sorted(self.gpu_pools)}")
        return self

    def resource_for(self, flow_name: str) -> ResourceSpec | None:
        return self.resources.get(flow_name)


def config_path() -> Path:
    return (get_deploy_settings().config or DEFAULT_CONFIG).expanduser()


def load_deploy_config(path: Path | None = None) -> DeployConfig:
    """Read and validate the deployment config (errors name the file and the field)."""
    import yaml

    settings = get_deploy_settings()
    path = (path or settings.config or DEFAULT_CONFIG).expanduser()
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise DeployConfigError(f"deployment config {path} does not exist (INDUSFLOW_DEPLOY_CONFIG)") from None
    except yaml.YAMLError as exc:
        raise DeployConfigError(f"deployment config {path} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise DeployConfigError(f"deployment config {path}: expected a mapping at the top level")
    moved = sorted({"deployments", "timezone"} & set(raw))
    if moved:
        raise DeployConfigError(f"deployment config {path}: {', '.join(moved)} moved to prefect.yaml (Prefect's "
                                "deployments, with a timezone per schedule): declare them there and remove them here")
    try:
        return DeployConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors()
        )
        raise DeployConfigError(f"deployment config {path}: {problems}") from None


@lru_cache(maxsize=8)
def _cached(path: str, mtime: float) -> DeployConfig:
    return load_deploy_config(Path(path))


def current_config() -> DeployConfig:
    """The current deployment config (re-read when its file changes)."""
    path = config_path()
    try:
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        raise DeployConfigError(f"deployment config {path} does not exist (INDUSFLOW_DEPLOY_CONFIG)") from None
    return _cached(str(path), mtime)


def monitoring_spec(flow_name: str) -> MonitoringSpec:
    """The monitoring thresholds of ``flow_name`` (the defaults when it has no entry)."""
    return current_config().monitoring.get(flow_name) or MonitoringSpec()


def resource_spec(flow_name: str) -> ResourceSpec | None:
    """The resource spec of ``flow_name`` in the current config (None: no entry)."""
    return current_config().resource_for(flow_name)
