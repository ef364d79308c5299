"""Task runners of the parallel stages, chosen by configuration when a flow run starts.

Parallel stages (batch-scoring files, parsing document batches, tuning trials) fan out on
Prefect's thread pool, on Dask through ``prefect-dask`` (a local cluster by default, or an
existing scheduler at ``INDUSFLOW_RUNNER_ADDRESS``) or on Ray through ``prefect-ray`` (a
local Ray by default, or an existing cluster at ``INDUSFLOW_RUNNER_ADDRESS``). No home-made
pool or cluster.

A Ray run hands its workers what a task needs through the job's ``runtime_env``
(:func:`ray_runtime_env`): the project's packages as the flow imports them (``py_modules``:
the workers run the flow's code, whatever the nodes have installed) and the flow's
``INDUSFLOW_*`` settings with the home resolved (``env_vars``), never a secret: the
``runtime_env`` is stored by the cluster and shown by its tools, so a worker takes keys and
credentials from its own environment.

Flows declare ``task_runner=ConfiguredTaskRunner()``: the ``INDUSFLOW_RUNNER_*`` settings are
read when the run starts, in the process that runs the flow, so a run from the CLI, the UI
or a deployment behaves the same and importing a flow module reads nothing.
"""

from __future__ import annotations

import logging
import os
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Self

from prefect.task_runners import TaskRunner

from infra.errors import IndusflowError
from infra.secrets import shareable_settings
from infra.settings import RunnerKind, RunnerSettings, get_core_settings, get_runner_settings

log = logging.getLogger(__name__)

#: Ray's switch that keeps a node on 127.0.0.1 when "0" (see :func:`make_task_runner`).
LOOPBACK_RAY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
#: The project's top-level packages: a Ray run ships them to its workers.
PROJECT_PACKAGES = ("flows", "tasks", "solutions", "infra")


def make_task_runner(kind: RunnerKind | None = None, workers: int | None = None,
                     address: str | None = None, settings: RunnerSettings | None = None) -> Any:
    """A Prefect task runner from the arguments, falling back to ``INDUSFLOW_RUNNER_*`` (``address``: the
    existing Dask scheduler or Ray cluster of ``kind``; None: a local one)."""
    settings = settings or get_runner_settings()
    kind = kind or settings.kind
    workers = workers or settings.workers
    address = address or settings.address
    if kind == "ray":
        if not address:
            # a local Ray: its servers listen on 127.0.0.1 only. On Linux Ray 2.60 swaps 127.0.0.1 for the
            # machine's outward address and listens on every interface (ray-project/ray#59110) unless
            # this (misnamed) switch is off; it is read when ray is imported, and no worker node joins
            # a local Ray anyway
            os.environ.setdefault(LOOPBACK_RAY, "0")
        try:
            import ray
            from prefect_ray import RayTaskRunner
        except ImportError as exc:
            raise IndusflowError(
                "the ray task runner needs the prefect-ray and ray packages: pip install 'indusflow[ray]'"
            ) from exc
        if ray.is_initialized():  # a Ray worker entering its task's flow context: prefect-ray starts nothing
            return RayTaskRunner(address=address)
        if address:
            return RayTaskRunner(address=address, init_kwargs={"runtime_env": ray_runtime_env()})
        return RayTaskRunner(init_kwargs={"num_cpus": workers, "include_dashboard": False,
                                          "runtime_env": ray_runtime_env()})
    if kind == "dask":
        try:
            from prefect_dask import DaskTaskRunner
        except ImportError as exc:
            raise IndusflowError(
                "the dask task runner needs the prefect-dask package: pip install 'indusflow[dask]'"
            ) from exc
        if address:
            return DaskTaskRunner(address=address)
        return DaskTaskRunner(cluster_kwargs={
            # worker processes: torch's thread pools and random state belong to a process
            "n_workers": workers, "threads_per_worker": 1, "processes": True,
            "dashboard_address": None,
        })
    from prefect.task_runners import ThreadPoolTaskRunner

    return ThreadPoolTaskRunner(max_workers=workers)


def ray_runtime_env() -> dict[str, Any]:
    """The ``runtime_env`` of a Ray run: the project's packages as this process imports them
    (``py_modules``) and its shareable ``INDUSFLOW_*`` settings with ``INDUSFLOW_HOME`` resolved
    (``env_vars``; :func:`infra.secrets.shareable_settings`: never a secret)."""
    root = Path(__file__).resolve().parents[1]
    modules = [str(root / name) for name in PROJECT_PACKAGES if (root / name / "__init__.py").is_file()]
    env, refused = shareable_settings(os.environ)
    if refused:
        log.warning("not handing %s to the Ray workers (a credential in a URL): they read it from their own "
                    "environment", ", ".join(refused))
    env["INDUSFLOW_HOME"] = str(get_core_settings().resolved_home())
    return {"py_modules": modules, "env_vars": env, "excludes": ["__pycache__/", "*.pyc"]}


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

    def __enter__(self) -> Self:
        self._inner = make_task_runner()
        self._inner.__enter__()
        self._started = True
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            if self._inner is not None:
                self._inner.__exit__(*exc_info)
        finally:
            self._started = False

    def submit(self, task: Any, parameters: dict[str, Any], wait_for: Any = None, dependencies: Any = None) -> Any:
        with self._api_for_workers():
            return self._inner.submit(task, parameters, wait_for=wait_for, dependencies=dependencies)

    def map(self, task: Any, parameters: dict[str, Any], wait_for: Any = None) -> Any:
        with self._api_for_workers():
            return self._inner.map(task, parameters, wait_for=wait_for)

    def _api_for_workers(self) -> AbstractContextManager[Any]:
        """Tasks that run in other processes (Dask, Ray) report to this run's API.

        A task carries the run's Prefect settings to its worker. A command-line run names its API
        there (its temporary server's URL, :func:`infra.prefect_env.prefect_cli_settings`); a flow called
        on Prefect's own ephemeral API (no ``PREFECT_API_URL``) has no URL in them, and each worker process
        started an ephemeral server of its own (15 s on 2 cores, every one writing the same SQLite
        database). While a task is handed over, the settings name this process's server instead;
        it listens on 127.0.0.1, so workers on other machines need ``PREFECT_API_URL`` set to a
        server they reach, as before."""
        from prefect.context import FlowRunContext
        from prefect.settings import PREFECT_API_URL, temporary_settings

        if runs_on_local_threads(self) or PREFECT_API_URL.value():
            return nullcontext()
        context = FlowRunContext.get()
        url = getattr(getattr(context, "client", None), "api_url", None)
        return temporary_settings(updates={PREFECT_API_URL: str(url)}) if url else nullcontext()
