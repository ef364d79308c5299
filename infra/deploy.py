"""Register and run the scheduled deployments defined in the deployment config.

    python -m infra.deploy list                      # what the config resolves to
    python -m infra.deploy serve                     # serve all with their schedules (no work pool)
    python -m infra.deploy apply --pool NAME         # register all to a work pool (process/docker/kubernetes)
    python -m infra.deploy run fraud-batch-score/hourly-batch-score --param inbox=/data/in --wait

``serve`` and ``apply`` talk to the Prefect API in ``PREFECT_API_URL`` (``make ui`` starts
a local server). Flows are loaded from their ``module:function`` entrypoints, so this
module, like the rest of ``infra``, never imports the flows at import time. The GPU pools
of the config become Prefect global concurrency limits (``gpu-<pool>``) on both paths.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from typing import Any, NoReturn

from infra.deploy_config import DeployConfig, DeployConfigError, DeploymentSpec, load_deploy_config
from infra.errors import IndusflowError
from infra.resources import PoolType, ResourceSpec, job_variables
from infra.secrets import shareable_settings

log = logging.getLogger(__name__)


class DeployError(IndusflowError):
    """A deployment cannot be built or registered."""


def load_flow(spec: DeploymentSpec) -> Any:
    """The Prefect flow object named by ``spec.flow`` (``module:function``)."""
    import importlib

    from prefect import Flow

    module_name, _, attr = spec.flow.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise DeployError(f"deployment {spec.name}: cannot import {module_name}: {exc}") from exc
    obj = getattr(module, attr, None)
    if not isinstance(obj, Flow):
        raise DeployError(f"deployment {spec.name}: {spec.flow} is not a Prefect flow")
    return obj


def full_name(flow_obj: Any, spec: DeploymentSpec) -> str:
    """Prefect's ``flow-name/deployment-name``."""
    return f"{flow_obj.name}/{spec.name}"


def _schedules(spec: DeploymentSpec, config: DeployConfig) -> list[Any] | None:
    from prefect.schedules import Cron

    if not spec.cron:
        return None
    return [Cron(spec.cron, timezone=config.timezone)]


def _check_parameters(flow_obj: Any, spec: DeploymentSpec) -> None:
    try:
        flow_obj.validate_parameters(dict(spec.parameters))
    except Exception as exc:  # noqa: BLE001 - Prefect raises ParameterTypeError / SignatureMismatchError
        raise DeployError(f"deployment {spec.name}: parameters {spec.parameters} do not fit {spec.flow}: {exc}") from None


def build_deployments(config: DeployConfig, only: list[str] | None = None, *,
                      pool: str | None = None, pool_type: PoolType = "process",
                      image: str | None = None) -> list[Any]:
    """RunnerDeployments for the config (all, or the ``only`` names), for ``serve`` or a pool."""
    from prefect.deployments.runner import EntrypointType

    wanted = set(only or [])
    unknown = wanted - {d.name for d in config.deployments}
    if unknown:
        raise DeployError(f"no deployment named {sorted(unknown)} in the config (have {[d.name for d in config.deployments]})")
    env = forwarded_env(pool_type) if pool else {}  # refuses credentials before anything is loaded
    out = []
    for spec in config.deployments:
        if wanted and spec.name not in wanted:
            continue
        flow_obj = load_flow(spec)
        _check_parameters(flow_obj, spec)
        resources = config.resource_for(flow_obj.name) or ResourceSpec()
        kwargs: dict[str, Any] = {}
        if pool:
            kwargs["work_pool_name"] = pool
            variables = job_variables(resources, pool_type, image=image, env=env,
                                      home=config.home_volume)
            if variables:
                kwargs["job_variables"] = variables
        deployment = flow_obj.to_deployment(
            name=spec.name,
            schedules=_schedules(spec, config),
            paused=spec.paused,
            parameters=dict(spec.parameters),
            description=spec.description or flow_obj.description,
            tags=[*spec.tags, "indusflow"],
            concurrency_limit=spec.concurrency,
            entrypoint_type=EntrypointType.MODULE_PATH,
            **kwargs,
        )
        out.append(deployment)
    return out


def forwarded_env(pool_type: PoolType) -> dict[str, str]:
    """Environment of the pool's flow runs: logging set-up, and for a process pool on this
    machine the ``INDUSFLOW_*`` settings of the shell that registers (never keys, tokens or
    salts: neither a variable named like one nor any setting that ``infra.settings`` holds as a
    secret, such as ``INDUSFLOW_SERVE_AUDIT_SALT``, which would un-pseudonymise the audit log).

    Job variables are stored by the Prefect API and shown in its UI to everyone who can read the
    deployment, so a setting whose value carries a credential in a URL (``user:password@``, a
    token as the user name, a ``?token=`` query) is refused rather than forwarded or silently
    dropped: dropping it would run the flows against another store than the shell's.

    Raises:
        DeployError: naming each such variable and the fix.
    """
    from infra.settings import get_deploy_settings

    keep = {**RUN_ENV, "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(get_deploy_settings().heartbeat_s)}
    if pool_type != "process":
        return keep
    # a secret URL setting (Redis, the tuning store) is forwarded unless it carries a credential,
    # like any URL (dropping it would run the flows against another store); other secrets never are
    shared, refused = shareable_settings(os.environ)
    keep.update(shared)
    if refused:
        raise DeployError(
            f"refusing to forward {', '.join(refused)} into the deployments' job variables, which the Prefect "
            "API and UI show to anyone who can read them. Take the credential out of the URL (a Milvus server "
            "takes it as INDUSFLOW_MILVUS_TOKEN, which is never forwarded) and give it to the worker's own "
            "environment, or run apply without it: env -u NAME python -m infra.deploy apply ..."
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
    stop for ``INDUSFLOW_DEPLOY_CRASHED_AFTER_S``: a worker, pod or machine killed with its runs
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

    from infra.settings import get_deploy_settings

    settings = get_deploy_settings()
    automation = AutomationCore(
        name=CRASH_AUTOMATION,
        description=f"A flow run with no heartbeat for {settings.crashed_after_s} s (its worker, pod or machine was "
                    "killed) is marked Crashed, so a re-run can take over (a training resumes from last.ckpt).",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", *(f"prefect.flow-run.{s}" for s in _FINAL_EVENTS)},
            match={"prefect.resource.id": ["prefect.flow-run.*"]},
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=settings.crashed_after_s),
        ),
        actions=[ChangeFlowRunState(state=StateType.CRASHED,
                                    message=f"no heartbeat for {settings.crashed_after_s} s: its worker or machine "
                                            "stopped")],
    )
    with get_client(sync_client=True) as client:
        existing = client.read_automations_by_name(CRASH_AUTOMATION)
        if existing:
            client.update_automation(existing[0].id, automation)
            return str(existing[0].id)
        return str(client.create_automation(automation))


def _api_url() -> str | None:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


def describe(config: DeployConfig) -> list[dict[str, Any]]:
    """One row per deployment: what ``list`` prints."""
    rows = []
    for spec in config.deployments:
        flow_obj = load_flow(spec)
        resources = config.resource_for(flow_obj.name)
        rows.append({
            "deployment": full_name(flow_obj, spec),
            "cron": spec.cron,
            "timezone": config.timezone,
            "parameters": spec.parameters,
            "concurrency": spec.concurrency,
            "resources": resources.model_dump() if resources else None,
            "tags": spec.tags,
        })
    return rows


def cmd_list(args: argparse.Namespace) -> int:
    config = load_deploy_config()
    rows = describe(config)
    if args.json:
        home = config.home_volume.model_dump() if config.home_volume else None
        print(json.dumps({"timezone": config.timezone, "gpu_pools": config.gpu_pools, "home_volume": home,
                          "deployments": rows}))
        return 0
    print(f"time zone {config.timezone}; GPU pools {config.gpu_pools or 'none'}")
    if config.home_volume:
        home = config.home_volume
        print(f"home at {home.mount_path} on docker volume {home.docker or '-'}, "
              f"kubernetes claim {home.kubernetes or '-'}")
    for row in rows:
        res = row["resources"] or {}
        res_text = ", ".join(f"{k}={v}" for k, v in res.items() if v not in (None, "auto")) or "defaults"
        print(f"  {row['deployment']:<45} cron {row['cron'] or '-':<14} params {json.dumps(row['parameters'])}  resources {res_text}")
    return 0


#: Served and pool-run flow runs route the project's loggers to Prefect (console + UI).
RUN_ENV = {"PREFECT_LOGGING_EXTRA_LOGGERS": "infra,tasks,solutions,flows", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


def cmd_serve(args: argparse.Namespace) -> int:
    from prefect import serve

    if threading.current_thread() is threading.main_thread():
        # Ctrl-C stops the server: a shell starts a background job (`... &`, a script's child)
        # with SIGINT ignored, and the child inherits that; Prefect's serve() stops on the
        # KeyboardInterrupt that the default handler raises
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for key, value in RUN_ENV.items():  # inherited by the flow-run subprocesses
        os.environ.setdefault(key, value)
    config = load_deploy_config()
    if not _api_url():
        print("warning: PREFECT_API_URL is not set: serving against a temporary in-process API that the UI "
              "cannot see. Start a server first (make ui) and export PREFECT_API_URL=http://127.0.0.1:4200/api",
              file=sys.stderr)
    deployments = build_deployments(config, args.only)
    limits = ensure_gpu_limits(config)
    if limits:
        print(f"GPU concurrency limits: {limits}")
    serve(*deployments, limit=args.limit)
    global _SERVED
    _SERVED = True
    return 0


#: set once ``serve()`` has returned: the runner has stopped, nothing is left to run
_SERVED = False


def _exit_without_teardown(rc: int) -> NoReturn:
    """Exit after a finished ``serve`` without Python's module teardown.

    The flows import torch and Lightning, whose teardown after the last exit handler takes
    1.3-1.7 s on two cores (measured: a process that only imports them needs 1.3 s to exit
    on SIGINT), so Ctrl-C would stop the server only after ~2 s. The exit handlers (Prefect's
    log and event workers drain there) and logging's flush still run first.
    """
    import atexit

    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def cmd_apply(args: argparse.Namespace) -> int:
    config = load_deploy_config()
    image = args.image
    if args.pool_type in ("docker", "kubernetes") and not image:
        from infra.settings import get_deploy_settings

        image = get_deploy_settings().image
        if not image:
            raise DeployError(f"a {args.pool_type} pool needs --image (or INDUSFLOW_DEPLOY_IMAGE): build it from the Dockerfile")
    forwarded_env(args.pool_type)  # refuses credentials before the Prefect API is asked anything
    if args.create_pool:
        _ensure_pool(args.pool, args.pool_type)
    else:
        _require_pool(args.pool)
    deployments = build_deployments(config, args.only, pool=args.pool, pool_type=args.pool_type, image=image)
    limits = ensure_gpu_limits(config)
    crash_detection = ensure_crash_detection()
    ids = {}
    for deployment in deployments:
        ids[f"{deployment.flow_name}/{deployment.name}"] = str(deployment.apply())
    if args.json:
        print(json.dumps({"pool": args.pool, "deployments": ids, "gpu_limits": limits,
                          "crash_detection": crash_detection}))
    else:
        for name, dep_id in ids.items():
            print(f"registered {name} ({dep_id}) to pool {args.pool}")
        print(f"automation {CRASH_AUTOMATION!r} marks a run Crashed when its heartbeats stop")
        print(f"start a worker: prefect worker start --pool {args.pool}")
    return 0


def _ensure_pool(name: str, pool_type: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists

    with get_client(sync_client=True) as client:
        try:
            client.create_work_pool(WorkPoolCreate(name=name, type=pool_type))
            print(f"created {pool_type} work pool {name}")
        except ObjectAlreadyExists:
            pass


def _require_pool(name: str) -> None:
    """The pool exists (registering to a missing one makes the server answer 500 later)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(name)
        except ObjectNotFound:
            raise DeployError(f"work pool {name!r} does not exist: add --create-pool, or create it first "
                              f"(prefect work-pool create {name} --type TYPE)") from None


def _parse_param(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"--param {text!r} is not KEY=VALUE")
    key, value = text.split("=", 1)
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def cmd_run(args: argparse.Namespace) -> int:
    from prefect.deployments import run_deployment

    params = dict(args.param or [])
    run = run_deployment(args.name, parameters=params, timeout=args.timeout if args.wait else 0)
    state = run.state
    print(f"flow run {run.name} ({run.id}) of {args.name}: {state.name if state else 'scheduled'}")
    if args.json:
        print(json.dumps({"flow_run_id": str(run.id), "name": run.name, "state": state.type.value if state else None}))
    if args.wait and (state is None or not state.is_completed()):
        return 1
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one ``error:`` line (exit 2), as the flows' commands do."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"error: {message} (see {self.prog} --help)\n")
        raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python -m infra.deploy", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list", help="show the deployments the config defines")
    p.add_argument("--json", action="store_true", help="print them as one JSON object")
    p.set_defaults(fn=cmd_list)
    p = sub.add_parser("serve", help="serve the deployments with their schedules (no work pool; Ctrl-C stops)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="serve only these deployments")
    p.add_argument("--limit", type=int, help="at most this many flow runs at once")
    p.set_defaults(fn=cmd_serve)
    p = sub.add_parser("apply", help="register the deployments to a work pool")
    p.add_argument("--pool", required=True, help="work pool name")
    p.add_argument("--pool-type", choices=["process", "docker", "kubernetes"], default="process",
                   help="type of the pool: decides the job variables (default %(default)s)")
    p.add_argument("--image", help="worker image for docker/kubernetes pools (default INDUSFLOW_DEPLOY_IMAGE)")
    p.add_argument("--create-pool", action="store_true", help="create the pool if it does not exist")
    p.add_argument("--only", nargs="+", metavar="NAME", help="register only these deployments")
    p.add_argument("--json", action="store_true", help="print the registered ids as one JSON object")
    p.set_defaults(fn=cmd_apply)
    p = sub.add_parser("run", help="trigger a run of a deployment (flow-name/deployment-name)")
    p.add_argument("name", help="e.g. fraud-batch-score/hourly-batch-score")
    p.add_argument("--param", action="append", type=_parse_param, metavar="KEY=VALUE",
                   help="a parameter (JSON values allowed); repeat for more")
    p.add_argument("--wait", action="store_true", help="wait for the run to finish; exit 1 unless Completed")
    p.add_argument("--timeout", type=float, default=3600, help="seconds to wait with --wait (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the run as one JSON object on the last line")
    p.set_defaults(fn=cmd_run)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except (DeployConfigError, DeployError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    code = main()
    if _SERVED:
        _exit_without_teardown(code)
    sys.exit(code)
