"""Settings of hyper-parameter tuning: where studies are stored and how trials run."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class TuneSettings(BaseSettings):
    """Study storage and the task runner that runs trials in parallel."""

    model_config = SettingsConfigDict(env_prefix="INDUSFLOW_TUNE_", extra="ignore")

    storage_url: str | None = Field(
        default=None,
        description="Optuna storage URL (e.g. postgresql://user:pass@host/db) shared by "
        "several machines. Default: one SQLite file per study under <home>/tuning/.",
    )
    task_runner: Literal["threads", "dask"] = Field(
        default="threads",
        description="Prefect task runner of the trials: 'threads' (ThreadPoolTaskRunner) or "
        "'dask' (prefect-dask's DaskTaskRunner; needs the prefect-dask package).",
    )
    dask_address: str | None = Field(
        default=None,
        description="Address of an existing Dask scheduler (tcp://host:8786). Default: a "
        "local cluster started by the runner.",
    )
    max_in_flight: int = Field(
        default=2, ge=1, description="Default number of trials trained at the same time."
    )


def get_tune_settings() -> TuneSettings:
    """Read the tuning settings from the environment now."""
    return TuneSettings()
