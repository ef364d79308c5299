"""The shared test Prefect API, for the flow tests: the task-run states of a flow run as the API
records them, and forgetting deployments a test registered."""

from __future__ import annotations

import time
from collections.abc import Collection
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterId
from prefect.client.schemas.sorting import FlowRunSort
from prefect.exceptions import ObjectNotFound

FINAL = {"Completed", "Cached", "Failed", "Crashed"}


def task_states(flow_run_id: UUID, expected: Collection[str], timeout_s: float = 90.0) -> dict[str, str]:
    """Task name -> state name of the flow run's task runs (of each name, the last one recorded).

    The server records task runs from their events, a moment after the run: this waits until
    every ``expected`` task has a final state (or ``timeout_s`` passed) and returns what it saw.
    """
    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            # a task run's name is its task's name and a suffix ("load-table-a1b")
            states = {r.name.rsplit("-", 1)[0]: r.state_name for r in sorted(runs, key=lambda r: r.created)}
            if all(states.get(name) in FINAL for name in expected) or time.monotonic() > deadline:
                return states
            time.sleep(0.5)


def latest_flow_run_id(flow_name: str) -> UUID:
    """The id of the flow's last run."""
    with get_client(sync_client=True) as client:
        (run,) = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])),
                                       sort=FlowRunSort.START_TIME_DESC, limit=1)
    return run.id


def forget_deployments(*names: str, pool: str | None = None) -> None:
    """Delete deployments (``flow-name/deployment-name``) and a work pool of the shared test API.

    A registered deployment changes what other tests do: a monitor sends its retrain there instead
    of running it in-process, and the KB sends upload jobs to ``rag-ingest/kb-upload-ingest`` while
    its pool still counts a stopped worker as polling."""
    with get_client(sync_client=True) as client:
        for name in names:
            try:
                client.delete_deployment(client.read_deployment_by_name(name).id)
            except ObjectNotFound:
                pass
        if pool is not None:
            try:
                client.delete_work_pool(pool)
            except ObjectNotFound:
                pass
