"""Task runners of the parallel stages, chosen by configuration when a flow run starts.

Parallel stages (batch-scoring files, parsing document batches, tuning trials) fan out on
Prefect's thread pool or on Dask through ``prefect-dask`` — a local cluster by default, or
an existing scheduler at ``INDUSFLOW_RUNNER_DASK_ADDRESS``. No home-made pool.

Flows declare ``task_runner=ConfiguredTaskRunner()``: the ``INDUSFLOW_RUNNER_*`` settings are
read when the run starts, in the process that runs the flow, so a run from the CLI, the UI
or a deployment behaves the same and importing a flow module reads nothing.
"""

from __future__ import annotations

from typing import Any

from prefect.task_runners import TaskRunner

from infra.errors import IndusflowError
from infra.settings import RunnerKind, RunnerSettings, get_runner_settings


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


def runs_on_local_threads(runner: Any) -> bool:
    """Whether ``runner`` (a :class:`ConfiguredTaskRunner`'s chosen runner, if it is one) runs
    tasks on this process's thread pool rather than on workers elsewhere (Dask, Ray)."""
    from prefect.task_runners import ThreadPoolTaskRunner

    inner = getattr(runner, "_inner", None) if isinstance(runner, ConfiguredTaskRunner) else runner
    return isinstance(inner, ThreadPoolTaskRunner)


class ConfiguredTaskRunner(TaskRunner):
    """Delegates to the runner that ``INDUSFLOW_RUNNER_*`` names, read when the run starts."""

    def __init__(self) -> None:
        self._inner: Any = None
        super().__init__()

    @property
    def name(self) -> str:
        return f"configured-{self._inner.name}" if self._inner is not None else "configured"

    def duplicate(self) -> ConfiguredTaskRunner:
        return type(self)()

    def __enter__(self) -> ConfiguredTaskRunner:
        self._inner = make_task_runner()
        self._inner.__enter__()
        self._started = True
        return self

    def __exit__(self, *exc_info: Any) -> None:
        try:
            if self._inner is not None:
                self._inner.__exit__(*exc_info)
        finally:
            self._started = False

    def submit(self, task: Any, parameters: dict[str, Any], wait_for: Any = None, dependencies: Any = None) -> Any:
        return self._inner.submit(task, parameters, wait_for=wait_for, dependencies=dependencies)

    def map(self, task: Any, parameters: dict[str, Any], wait_for: Any = None) -> Any:
        return self._inner.map(task, parameters, wait_for=wait_for)
