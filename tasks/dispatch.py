"""Start another flow from a running one: its deployment when the Prefect API has it, else
a direct call.

A monitor that decides to retrain runs the ``fraud-adapt`` deployment (on the deployment's
work pool, with its resources, visible as its own run) through ``run_deployment``. Where
that deployment is not registered (a laptop run, ``python -m flows.fraud monitor`` without
``prefect deploy``, a test) the same flow is called in-process with the same parameters, so
the loop still closes and the champion rule still decides.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

log = logging.getLogger(__name__)


class Dispatched(BaseModel):
    """How a flow was started."""

    model_config = ConfigDict(frozen=True)

    deployment: str
    how: Literal["deployment", "direct"]
    flow_run_id: str | None = None
    result: Any = None


def deployment_exists(name: str) -> bool:
    """Whether the Prefect API knows deployment ``flow-name/deployment-name``."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_deployment_by_name(name)
        except ObjectNotFound:
            return False
    return True


def deployment_served(name: str) -> bool:
    """Whether the Prefect API knows deployment ``flow-name/deployment-name`` and a worker is
    polling its work pool now (the pool is READY): a run sent there is picked up, where a
    registered deployment whose pool has no worker would leave it scheduled for good."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import WorkPoolStatus
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            deployment = client.read_deployment_by_name(name)
            if not deployment.work_pool_name:
                return False
            pool = client.read_work_pool(deployment.work_pool_name)
        except ObjectNotFound:
            return False
    return pool.status == WorkPoolStatus.READY


def dispatch(deployment: str, parameters: Mapping[str, Any], fallback: Callable[..., Any] | None = None,
             *, wait: bool = False) -> Dispatched:
    """Run ``deployment`` (``flow-name/deployment-name``) with ``parameters``.

    Args:
        deployment: the deployment's full name.
        parameters: the run's parameters (they override the deployment's).
        fallback: the flow to call in-process when the deployment is not registered
            (None: raise instead).
        wait: wait for the deployment's run to finish (default: only schedule it; a worker
            of its pool picks it up).

    Raises:
        LookupError: the deployment is not registered and there is no fallback.
    """
    if deployment_exists(deployment):
        from prefect.deployments import run_deployment

        run = run_deployment(name=deployment, parameters=dict(parameters), timeout=None if wait else 0,
                             as_subflow=True)
        log.warning("started deployment %s: flow run %s", deployment, run.id)
        return Dispatched(deployment=deployment, how="deployment", flow_run_id=str(run.id))
    if fallback is None:
        raise LookupError(f"deployment {deployment!r} is not registered (run `prefect --no-prompt deploy --all`)")
    log.warning("deployment %s is not registered; running its flow in-process", deployment)
    return Dispatched(deployment=deployment, how="direct", result=fallback(**dict(parameters)))
