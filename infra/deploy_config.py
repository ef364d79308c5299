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
from typing import Any
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


def resource_spec(flow_name: str) -> ResourceSpec | None:
    """The resource spec of ``flow_name`` in the current config (None: no entry)."""
    path = config_path()
    try:
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        raise DeployConfigError(f"deployment config {path} does not exist (INDUSFLOW_DEPLOY_CONFIG)") from None
    return _cached(str(path), mtime, get_deploy_settings().timezone).resource_for(flow_name)
