"""A team's Prefect server, for real: ``prefect server start`` on PostgreSQL, a process work pool
and ``prefect worker start``; ``prefect deploy --all`` registers the deployments of a prefect.yaml
(the shipped one's build step and pool, two deployments of its own). Then a
cron deployment fires on its own schedule and completes on the worker; a run created through the
API with custom parameters (what the UI's form does) completes on the worker, with the settings
the flows need reaching it through the pool's job variables (the worker's own environment has
no INDUSFLOW_ setting) and no secret among them; the worker is killed mid-training (SIGKILL to
its process group: the worker and the flow-run process), the run is marked crashed when its
heartbeats stop (the automation the build step keeps), and a re-run on a new worker resumes from
``last.ckpt``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.deploy import CRASH_AUTOMATION
from tests.servers.team import ROOT, Proc, alive, base_env, pg_bin, postgres, prefect_server, start, wait_for

pytestmark = [pytest.mark.servers,
              pytest.mark.skipif(pg_bin() is None, reason="no PostgreSQL (Debian postgresql; .ci/run installs it)")]

POOL = "team"
MODEL = "team-fraud"
#: a small synthetic training, slow enough (no early stop) to be stopped after its first epochs
TRAIN = {"config": {"data": {"n_accounts": 300, "n_terminals": 150, "n_days": 40, "seed": 5},
                    "model": {"seq_len": 8, "max_epochs": 80, "patience": 80}, "model_name": MODEL,
                    "candidates": ["sequence"]}}
QUICK = {"config": {**TRAIN["config"], "model": {"seq_len": 8, "max_epochs": 2, "patience": 5},
                    "model_name": f"{MODEL}-quick"}}

DEPLOY_CONFIG = """\
resources:
  fraud-train: {cpus: 1}
"""


def _prefect_yaml(folder: Path) -> Path:
    """The shipped prefect.yaml with its build step and pull steps, pool `team`, two deployments."""
    shipped = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    pool = {**shipped["definitions"]["work_pools"]["local"], "name": POOL}
    deployments = [
        {"name": "every-minute-batch-score", "entrypoint": "flows.fraud.fraud_batch_score",
         "schedules": [{"cron": "* * * * *", "timezone": "UTC"}], "tags": ["fraud"], "work_pool": pool},
        {"name": "train-on-request", "entrypoint": "flows.fraud.fraud_train", "tags": ["fraud"], "work_pool": pool},
    ]
    path = folder / "prefect.yaml"
    path.write_text(yaml.safe_dump({**{k: shipped[k] for k in ("name", "build", "pull")}, "deployments": deployments}))
    return path


def _worker(env: dict[str, str], folder: Path, n: int) -> Proc:
    """``prefect worker start`` on the pool, with no INDUSFLOW_ setting in its environment."""
    worker_env = {k: v for k, v in env.items() if not k.startswith("INDUSFLOW_")}
    worker_env.update({"PREFECT_WORKER_QUERY_SECONDS": "2", "PREFECT_WORKER_PREFETCH_SECONDS": "5"})
    return start(f"worker-{n}", [sys.executable, "-m", "prefect", "worker", "start", "--pool", POOL, "--type",
                                 "process", "--name", f"worker-{n}"], worker_env, folder)


def _state(client: Any, run_id: uuid.UUID) -> str:
    run = client.read_flow_run(run_id)
    return run.state.type.value if run.state else "NONE"


def _epoch(ckpt: Path) -> int:
    """The epoch a Lightning checkpoint was saved at."""
    import torch

    return int(torch.load(ckpt, map_location="cpu", weights_only=True)["epoch"])


def _logs(client: Any, run_id: uuid.UUID) -> str:
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])), limit=200)
    return "\n".join(entry.message for entry in logs)


def test_team_server_on_postgres_runs_deployments_on_a_worker_and_resumes_a_crashed_training(
        tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    home = tmp_path / "home"
    (home / "inbox" / "fraud").mkdir(parents=True)
    config = tmp_path / "deployments.yaml"
    config.write_text(DEPLOY_CONFIG)
    env = base_env(home, tmp_path / "prefect-home")
    env["INDUSFLOW_DEPLOY_CONFIG"] = str(config)
    workers: list[Proc] = []
    with postgres() as pg, prefect_server(pg.url, tmp_path, env) as api, \
            temporary_settings({PREFECT_API_URL: api}):
        env["PREFECT_API_URL"] = api
        # the registering shell holds a secret: it must not reach the job variables
        prefect = [sys.executable, "-m", "prefect"]
        subprocess.run([*prefect, "work-pool", "create", POOL, "--type", "process"], env=env, cwd=ROOT, check=True,
                       capture_output=True, timeout=240)
        applied = subprocess.run([*prefect, "--no-prompt", "deploy", "--all", "--prefect-file", str(_prefect_yaml(tmp_path))],
                                 env={**env, "INDUSFLOW_SERVE_AUDIT_SALT": "pepper-secret"}, cwd=ROOT,
                                 check=False, capture_output=True, text=True, timeout=600)  # imports the flows
        assert applied.returncode == 0, applied.stdout[-3000:] + applied.stderr[-3000:]
        try:
            workers.append(_worker(env, tmp_path, 1))
            with get_client(sync_client=True) as client:
                ids = {name: client.read_deployment_by_name(name).id
                       for name in ("fraud-batch-score/every-minute-batch-score", "fraud-train/train-on-request")}
                train_dep = client.read_deployment(ids["fraud-train/train-on-request"])
                variables = json.dumps(train_dep.job_variables)
                assert str(home) in variables and "pepper-secret" not in variables
                assert "INDUSFLOW_SERVE_AUDIT_SALT" not in variables
                assert train_dep.job_variables["env"]["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == "30"
                assert client.read_automations_by_name(CRASH_AUTOMATION)

                # 1. a run created through the API with custom parameters, as the UI form does
                quick = client.create_flow_run_from_deployment(train_dep.id, parameters=QUICK)
                # 2. meanwhile the cron deployment fires on its own schedule and completes on the worker
                cron_id = ids["fraud-batch-score/every-minute-batch-score"]

                def cron_completed() -> bool:
                    runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[cron_id])))
                    return any(r.state is not None and r.state.is_completed() for r in runs)

                wait_for(cron_completed, "no scheduled run of the cron deployment completed", 150, 2,
                         lambda: workers[-1].tail())
                [cron_run] = [r for r in client.read_flow_runs(
                    deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[cron_id])))
                    if r.state is not None and r.state.is_completed()][:1]
                assert cron_run.auto_scheduled and cron_run.work_pool_name == POOL

                wait_for(lambda: _state(client, quick.id) in ("COMPLETED", "FAILED", "CRASHED"),
                         "the API-created run did not finish", 300, 2, lambda: workers[-1].tail())
                assert _state(client, quick.id) == "COMPLETED", _logs(client, quick.id)[-3000:]
                assert (home / "registry" / f"{MODEL}-quick").is_dir()  # the home came through job variables

                # 3. the worker killed mid-training: crashed when its heartbeats stop; a re-run resumes
                before = set(home.rglob("last.ckpt"))  # the quick run's
                long = client.create_flow_run_from_deployment(train_dep.id, parameters=TRAIN)
                wait_for(lambda: _state(client, long.id) == "RUNNING" and bool(set(home.rglob("last.ckpt")) - before),
                         "the long training did not save a checkpoint", 300, 1, lambda: workers[-1].tail())
                killed = workers[-1].kill_tree()  # SIGKILL: the worker and its flow-run process
                workers[-1].popen.wait(60)
                wait_for(lambda: not any(alive(pid) for pid in killed), "a killed process lives on", 20)
                [ckpt] = set(home.rglob("last.ckpt")) - before
                killed_at = _epoch(ckpt)
                assert killed_at < TRAIN["config"]["model"]["max_epochs"] - 1, "killed after training had ended"
                wait_for(lambda: _state(client, long.id) == "CRASHED", "the killed run was not marked crashed",
                         200, 2, lambda: f"{_state(client, long.id)}\n{workers[-1].tail()}")
                assert "no heartbeat" in (client.read_flow_run(long.id).state.message or "")
                workers.append(_worker(env, tmp_path, 2))
                again = client.create_flow_run_from_deployment(train_dep.id, parameters=TRAIN)
                wait_for(lambda: _state(client, again.id) in ("COMPLETED", "FAILED", "CRASHED"),
                         "the re-run did not finish", 420, 2, lambda: workers[-1].tail())
                assert _state(client, again.id) == "COMPLETED", _logs(client, again.id)[-3000:]
                # Lightning restored the killed run's last.ckpt and trained on from there to the end
                assert f"Restored all states from the checkpoint at {ckpt}" in workers[-1].tail(100_000)
                trained = json.loads((ckpt.parent / "train_result.json").read_text())
                assert trained["resumed_from_epoch"] == killed_at + 1
                assert trained["epochs_trained_now"][0] == killed_at + 1
                assert trained["epochs_completed"] == TRAIN["config"]["model"]["max_epochs"] == _epoch(ckpt) + 1
        finally:
            for worker in workers:
                worker.stop()
