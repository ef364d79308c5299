"""Task runners of the parallel stages, chosen by configuration.

Parallel stages (batch-scoring files, parsing document batches, tuning trials) fan out on
Prefect's default thread pool or on Dask through ``prefect-dask`` — a local cluster by
default, or an existing scheduler at ``INDUSFLOW_RUNNER_DASK_ADDRESS``. No home-made pool.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from infra.errors import IndusflowError

RunnerKind = Literal["threads", "dask"]


class RunnerSettings(BaseSettings):
    """The task runner of the parallel stages."""

    model_config = SettingsConfigDict(env_prefix="INDUSFLOW_RUNNER_", extra="ignore")

    kind: RunnerKind = Field(
        default="threads",
        description="'threads' (Prefect's ThreadPoolTaskRunner) or 'dask' (prefect-dask's DaskTaskRunner).",
    )
    workers: int = Field(default=2, ge=1, description="Threads, or local Dask workers, at once.")
    dask_address: str | None = Field(
        default=None,
        description="An existing Dask scheduler (tcp://host:8786). Default: a local cluster "
        "of `workers` single-threaded worker processes, started for the run.",
    )
    dask_processes: bool = Field(default=True, description="Local Dask workers as processes (else threads).")


def get_runner_settings() -> RunnerSettings:
    return RunnerSettings()


def make_task_runner(kind: RunnerKind | None = None, workers: int | None = None,
                     dask_address: str | None = None, settings: RunnerSettings | None = None) -> Any:
    """A Prefect task runner from the arguments, falling back to ``INDUSFLOW_RUNNER_*``."""
    settings = settings or get_runner_settings()
    kind = kind or settings.kind
    workers = workers or settings.workers
    if kind == "dask":
        try:
            from prefect_dask import DaskTaskRunner
        except ImportError as exc:
            raise IndusflowError(
                "the dask task runner needs the prefect-dask package: pip install 'indusflow[dask]'"
            ) from exc
        address = dask_address or settings.dask_address
        if address:
            return DaskTaskRunner(address=address)
        return DaskTaskRunner(cluster_kwargs={
            "n_workers": workers, "threads_per_worker": 1, "processes": settings.dask_processes,
            "dashboard_address": None,
        })
    from prefect.task_runners import ThreadPoolTaskRunner

    return ThreadPoolTaskRunner(max_workers=workers)
