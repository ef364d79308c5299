"""The one deploy step Prefect does not do for us, run by ``prefect deploy`` (``prefect.yaml``).

The deployments themselves (flows, schedules, parameters, work pools, job variables) are
declared in ``prefect.yaml`` at the repository root and registered with Prefect's own
``prefect --no-prompt deploy --all``. Its build step :func:`prepare` computes what a static
file cannot hold:

- the runs' environment: the project's loggers routed to the UI, the heartbeat, and for a
  process pool the ``INDUSFLOW_*`` settings of the registering shell minus secrets (a URL with
  a credential in it is refused, since job variables are readable in the UI);
- one Prefect global concurrency limit per GPU pool of ``infra/deployments.yaml``;
- the automation that marks a flow run Crashed when its heartbeats stop.
"""

from __future__ import annotations

import logging
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from infra.deploy_config import DeployConfig, load_deploy_config
from infra.errors import IndusflowError
from infra.resources import IMAGE_HOME
from infra.secrets import shareable_settings

log = logging.getLogger(__name__)

#: Prefect's project file: every deployment of the project.
PREFECT_YAML = Path(__file__).resolve().parents[1] / "prefect.yaml"


#: Seconds between a pool's flow-run heartbeats (PREFECT_FLOWS_HEARTBEAT_FREQUENCY in the job variables):
#: Prefect's minimum, so a killed worker's runs are found soonest (CRASHED_AFTER_S after).
HEARTBEAT_S = 30
#: Seconds without a heartbeat after which the crash-detection automation marks a pool's flow run Crashed:
#: three heartbeats, so one late event (a busy API or worker) never crashes a live run.
CRASHED_AFTER_S = 90
#: Pool-run flow runs route the project's loggers to Prefect (console + UI).
RUN_ENV = {"PREFECT_LOGGING_EXTRA_LOGGERS": "infra,tasks,solutions,flows", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


class DeployError(IndusflowError):
    """A deployment cannot be built or registered."""


def forwarded_env() -> dict[str, str]:
    """Environment of a process pool's flow runs: :func:`run_env`, and the ``INDUSFLOW_*``
    settings of the shell that registers (never keys, tokens or salts: neither a variable named like one nor any setting that ``infra.settings`` holds as a
    secret, such as ``INDUSFLOW_SERVE_AUDIT_SALT``, which would un-pseudonymise the audit log).

    Job variables are stored by the Prefect API and shown in its UI to everyone who can read the
    deployment, so a setting whose value carries a credential in a URL (``user:password@``, a
    token as the user name, a ``?token=`` query) is refused rather than forwarded or silently
    dropped: dropping it would run the flows against another store than the shell's.

    Raises:
        DeployError: naming each such variable and the fix.
    """
    keep = run_env()
    # a secret URL setting (Redis, the tuning store) is forwarded unless it carries a credential,
    # like any URL (dropping it would run the flows against another store); other secrets never are
    shared, refused = shareable_settings(os.environ)
    keep.update(shared)
    if refused:
        raise DeployError(
            f"refusing to forward {', '.join(refused)} into the deployments' job variables, which the Prefect "
            "API and UI show to anyone who can read them. Take the credential out of the URL (a Milvus server "
            "takes it as INDUSFLOW_MILVUS_TOKEN, which is never forwarded) and give it to the worker's own "
            "environment, or deploy without it: env -u NAME prefect --no-prompt deploy --all"
        )
    return keep


def ensure_gpu_limits(config: DeployConfig) -> dict[str, int]:
    """Create or resize one global concurrency limit per GPU pool (``gpu-<pool>``)."""
    from prefect.client.orchestration import get_client

    made: dict[str, int] = {}
    if not config.gpu_pools:
        return made
    with get_client(sync_client=True) as client:
        for pool, cards in config.gpu_pools.items():
            name = f"gpu-{pool}"
            client.upsert_global_concurrency_limit_by_name(name, cards)
            made[name] = cards
    return made


#: The automation ``apply`` keeps on the Prefect server (one, by name).
CRASH_AUTOMATION = "indusflow: crashed when heartbeats stop"
#: What ends a flow run's heartbeats on purpose.
_FINAL_EVENTS = ("Completed", "Failed", "Cancelled", "Crashed", "Paused", "Suspended")


def ensure_crash_detection() -> str:
    """Create (or update) the Prefect automation that marks a flow run Crashed when its heartbeats
    stop for :data:`CRASHED_AFTER_S`: a worker, pod or machine killed with its runs
    leaves them Running forever otherwise (a SIGKILL reaches no Prefect code). This is Prefect's
    own zombie detection: flow runs emit ``prefect.flow-run.heartbeat`` events (the pools' job
    variables set their frequency) and a proactive event trigger acts when they stop. Returns
    the automation's id.
    """
    from datetime import timedelta

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

    automation = AutomationCore(
        name=CRASH_AUTOMATION,
        description=f"A flow run with no heartbeat for {CRASHED_AFTER_S} s (its worker, pod or machine was "
                    "killed) is marked Crashed, so a re-run can take over (a training resumes from last.ckpt).",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", *(f"prefect.flow-run.{s}" for s in _FINAL_EVENTS)},
            match={"prefect.resource.id": ["prefect.flow-run.*"]},
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=CRASHED_AFTER_S),
        ),
        actions=[ChangeFlowRunState(state=StateType.CRASHED,
                                    message=f"no heartbeat for {CRASHED_AFTER_S} s: its worker or machine "
                                            "stopped")],
    )
    with get_client(sync_client=True) as client:
        existing = client.read_automations_by_name(CRASH_AUTOMATION)
        if existing:
            # written only when it changed: each write makes the server reload its triggers, and a
            # proactive evaluation running meanwhile logged "Trigger._automation has been garbage
            # collected" (Prefect 3.9.1, evaluate_proactive_triggers; seen in the docs tier)
            if _automation_fields(existing[0]) != _automation_fields(automation):
                client.update_automation(existing[0].id, automation)
            return str(existing[0].id)
        return str(client.create_automation(automation))


def _automation_fields(automation: Any) -> dict[str, Any]:
    """What an automation says (its trigger's generated id aside), to compare a stored one with ours."""
    from prefect.events.schemas.automations import AutomationCore

    core = AutomationCore.model_validate(automation.model_dump(include=set(AutomationCore.model_fields)))
    return core.model_dump(exclude={"trigger": {"id"}})


def run_env() -> dict[str, str]:
    """What every flow run of a pool gets: the project's loggers in the UI, the heartbeat."""
    return {**RUN_ENV, "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_S)}


def prepare() -> dict[str, Any]:
    """``prefect deploy``'s build step (``prefect.yaml``): refuse credentials, keep the GPU
    limits and the crash automation, and return the runs' environments for the job variables
    (``{{ indusflow.env }}`` for a process pool, ``{{ indusflow.container_env }}`` for docker
    and kubernetes pools).

    Raises:
        DeployError: a setting of the shell carries a credential in a URL.
    """
    env = forwarded_env()  # refuses credentials before the Prefect API is asked anything
    ensure_gpu_limits(load_deploy_config())
    ensure_crash_detection()
    return {"env": env, "container_env": {**run_env(), "INDUSFLOW_HOME": IMAGE_HOME}}


@lru_cache(maxsize=4)
def _declared(path: Path, mtime: float) -> tuple[dict[str, Any], ...]:
    import yaml

    return tuple(yaml.safe_load(path.read_text(encoding="utf-8")).get("deployments") or [])


def declared_parameters(flow_name: str, name: str, path: Path = PREFECT_YAML) -> dict[str, Any] | None:
    """The parameters ``prefect.yaml`` gives deployment ``name`` of the flow named like
    ``flow_name`` (``fraud-adapt`` -> entrypoint ``flows.fraud.fraud_adapt``); None when the
    file or the deployment is not there (an installed package without the repository)."""
    if not path.is_file():
        return None
    function = flow_name.replace("-", "_")
    for spec in _declared(path, path.stat().st_mtime):
        if spec.get("name") == name and str(spec.get("entrypoint", "")).rpartition(".")[2] == function:
            return dict(spec.get("parameters") or {})
    return None
