"""The deployment config: every scheduled job, its resources and the GPU pools, in one file.

The packaged default is ``infra/deployments.yaml``; ``INDUSFLOW_DEPLOY_CONFIG`` names
another file and ``INDUSFLOW_DEPLOY_TIMEZONE`` overrides its time zone, so schedules,
parameters and resources change without a code change. Flows are named by entrypoint
(``module:function``), as Prefect deployments reference them, so this module never
imports the flows themselves.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from infra.errors import IndusflowError
from infra.resources import HomeVolume, ResourceSpec
from infra.settings import get_deploy_settings

DEFAULT_CONFIG = Path(__file__).with_name("deployments.yaml")
_ENTRYPOINT = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


class DeployConfigError(IndusflowError):
    """The deployment config file is missing or invalid."""


def _check_cron(text: str) -> str:
    fields = text.split()
    if len(fields) != 5:
        raise ValueError(f"cron {text!r} must have 5 fields (minute hour day month weekday)")
    from prefect._internal.schemas.validators import validate_cron_string

    try:
        return validate_cron_string(text)
    except ValueError:
        raise ValueError(f"cron {text!r} is not a valid cron expression") from None


class DeploymentSpec(BaseModel):
    """One scheduled job."""

    model_config = ConfigDict(extra="forbid")

    name: str
    flow: str = Field(description="module:function of the flow")
    description: str | None = None
    cron: str | None = None
    parameters: dict[str, Any] = Field(default_factory=dict)
    tags: list[str] = Field(default_factory=list)
    concurrency: int | None = Field(default=None, ge=1)
    paused: bool = False

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"{v!r}: use lower-case letters, digits and '-'")
        return v

    @field_validator("flow")
    @classmethod
    def _flow(cls, v: str) -> str:
        if not _ENTRYPOINT.match(v):
            raise ValueError(f"{v!r} is not of the form package.module:function")
        return v

    @field_validator("cron")
    @classmethod
    def _cron(cls, v: str | None) -> str | None:
        return None if v is None else _check_cron(v)

    @property
    def module_entrypoint(self) -> str:
        """The Prefect module-path entrypoint (``package.module.function``)."""
        return self.flow.replace(":", ".")


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

    timezone: str = "UTC"
    gpu_pools: dict[str, int] = Field(default_factory=dict)
    resources: dict[str, ResourceSpec] = Field(default_factory=dict)
    home_volume: HomeVolume | None = Field(
        default=None,
        description="The home on a shared volume for docker/kubernetes pools (None: the image's own).",
    )
    monitoring: dict[str, MonitoringSpec] = Field(
        default_factory=dict, description="Drift and performance thresholds per flow name.")
    approval: dict[str, Literal["required", "none"]] = Field(
        default_factory=dict, description="Registry model name -> whether its champion moves only after "
        "a second person approves (tasks.approval).")
    deployments: list[DeploymentSpec] = Field(default_factory=list)

    @field_validator("timezone")
    @classmethod
    def _tz(cls, v: str) -> str:
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {v!r} (use an IANA name such as Europe/Berlin)") from None
        return v

    @model_validator(mode="after")
    def _unique(self) -> DeployConfig:
        seen: dict[str, str] = {}
        for d in self.deployments:
            key = f"{d.flow}/{d.name}"
            if key in seen:
                raise ValueError(f"deployment {d.name!r} of {d.flow} appears twice")
            seen[key] = d.name
        for flow_name, spec in self.resources.items():
            pool = spec.gpu_type or "any"
            if spec.gpus not in (0,) and self.gpu_pools and pool not in self.gpu_pools:
                raise ValueError(f"resources.{flow_name}: GPU pool {pool!r} is not in gpu_pools {sorted(self.gpu_pools)}")
        return self

    def resource_for(self, flow_name: str) -> ResourceSpec | None:
        return self.resources.get(flow_name)

    def deployment(self, flow_name: str, name: str) -> DeploymentSpec | None:
        """The deployment ``name`` of the flow whose function is named like ``flow_name``
        (``fraud-adapt`` -> ``...:fraud_adapt``), or None."""
        function = flow_name.replace("-", "_")
        for d in self.deployments:
            if d.name == name and d.flow.rpartition(":")[2] == function:
                return d
        return None


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
    if settings.timezone:
        raw["timezone"] = settings.timezone
    try:
        return DeployConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors()
        )
        raise DeployConfigError(f"deployment config {path}: {problems}") from None


@lru_cache(maxsize=8)
def _cached(path: str, mtime: float, tz: str | None) -> DeployConfig:
    return load_deploy_config(Path(path))


def current_config() -> DeployConfig:
    """The current deployment config (re-read when its file changes)."""
    path = config_path()
    try:
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        raise DeployConfigError(f"deployment config {path} does not exist (INDUSFLOW_DEPLOY_CONFIG)") from None
    return _cached(str(path), mtime, get_deploy_settings().timezone)


def monitoring_spec(flow_name: str) -> MonitoringSpec:
    """The monitoring thresholds of ``flow_name`` (the defaults when it has no entry)."""
    return current_config().monitoring.get(flow_name) or MonitoringSpec()


def resource_spec(flow_name: str) -> ResourceSpec | None:
    """The resource spec of ``flow_name`` in the current config (None: no entry)."""
    path = config_path()
    try:
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        raise DeployConfigError(f"deployment config {path} does not exist (INDUSFLOW_DEPLOY_CONFIG)") from None
    return _cached(str(path), mtime, get_deploy_settings().timezone).resource_for(flow_name)
