"""prefect.yaml against a real (test) Prefect API: `prefect deploy --all` registers every
deployment with its schedule, parameters, pool and job variables; a run on a worker completes;
GPU limits keep two trainings off one card."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from flows.fraud.cli import main
from infra.deploy import CRASH_AUTOMATION, ensure_gpu_limits
from infra.deploy_config import load_deploy_config
from infra.resources import TrainerArgs, gpu_slot
from solutions.fraud.synthetic import generate_transactions
from tasks.ledger import FileLedger
from tests.flows.run_states import forget_deployments

REPO = Path(__file__).resolve().parents[2]
PREFECT = [sys.executable, "-m", "prefect"]
#: every deployment of the project (flow-name/deployment-name) and its cron (None: started on demand)
EXPECTED = {
    "fraud-train/nightly-retrain": "0 2 * * *",
    "fraud-adapt/on-drift-adapt": None,
    "fraud-monitor/daily-monitor": "30 1 * * *",
    "fraud-batch-score/hourly-batch-score": "0 * * * *",
    "sensor-batch-score/every-10-min-score": "*/10 * * * *",
    "sensor-train/weekly-retrain": "0 3 * * 0",
    "sensor-monitor/hourly-monitor": "5 * * * *",
    "rag-ingest/reingest-watched-folder": "*/15 * * * *",
    "rag-ingest/kb-upload-ingest": None,
}


@pytest.fixture(autouse=True, scope="module")
def _registered_here_only() -> Iterator[None]:
    """The deployments and the pool registered here leave the shared test API with this module."""
    yield
    forget_deployments(*EXPECTED, pool="local")


def _api_url() -> str:
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    assert url, "the test harness sets a Prefect API URL"
    return url


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PREFECT_API_URL": _api_url(), "OMP_NUM_THREADS": "1", "COLUMNS": "200", **extra}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def _prefect(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PREFECT, *args], cwd=REPO, env=env or _env(), capture_output=True, text=True,
                          timeout=600, check=False)


def _deploy(*which: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The README's commands: the process pool `local`, then `prefect --no-prompt deploy` (``--all``)."""
    created = _prefect("work-pool", "create", "local", "--type", "process", "--overwrite", env=env)
    assert created.returncode == 0, created.stdout[-3000:] + created.stderr[-3000:]
    return _prefect("--no-prompt", "deploy", *(which or ["--all"]), env=env)


def test_prefect_yaml_declares_one_unique_deployment_per_job() -> None:
    declared = yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]
    names = [(d["entrypoint"], d["name"]) for d in declared]
    assert len(names) == len(set(names)) == len(EXPECTED)
    assert all(d["entrypoint"].startswith(("flows.fraud.", "flows.sensor.", "flows.rag.")) for d in declared)


def test_prefect_deploy_all_registers_every_deployment_with_its_schedule_pool_and_job_variables() -> None:
    from prefect.client.orchestration import get_client

    # the registering shell holds a secret and a setting: the setting reaches the runs, the secret never
    done = _deploy(env=_env(INDUSFLOW_SERVE_AUDIT_SALT="pepper-Secret-5", INDUSFLOW_EMBED_URL="http://127.0.0.1:9/v1"))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    with get_client(sync_client=True) as client:
        for name, cron in EXPECTED.items():
            registered = client.read_deployment_by_name(name)
            if cron is None:
                assert registered.schedules == [], name
            else:
                schedule = registered.schedules[0].schedule
                assert (schedule.cron, schedule.timezone) == (cron, "UTC"), name
            assert registered.work_pool_name == "local", name
            assert registered.entrypoint.startswith(("flows.fraud.", "flows.sensor.", "flows.rag.")), name
            assert registered.pull_steps in (None, []), name  # the installed package, no code fetched
            assert "indusflow" in registered.tags, name
            env = registered.job_variables["env"]
            assert env["PREFECT_LOGGING_EXTRA_LOGGERS"] == "infra,tasks,solutions,flows", name
            assert env["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == "30" and env["INDUSFLOW_HOME"] == os.environ["INDUSFLOW_HOME"]
            assert env["INDUSFLOW_EMBED_URL"] == "http://127.0.0.1:9/v1"
            variables = json.dumps(registered.job_variables)
            assert "pepper-Secret-5" not in variables and "INDUSFLOW_SERVE_AUDIT_SALT" not in variables, name
        train = client.read_deployment_by_name("fraud-train/nightly-retrain")
        assert train.global_concurrency_limit is not None and train.global_concurrency_limit.limit == 1
        assert train.parameters == {"source": "accumulated"}
        scoring = client.read_deployment_by_name("fraud-batch-score/hourly-batch-score")
        props = scoring.parameter_openapi_schema["properties"]
        assert {"inbox", "model", "columns", "settle_seconds"} <= set(props)  # the UI's form
        assert props["settle_seconds"]["default"] == 30.0
        ingest = client.read_deployment_by_name("rag-ingest/reingest-watched-folder")
        assert ingest.parameters == {"params": {"prune": True}}
        assert client.read_deployment_by_name("sensor-train/weekly-retrain").parameters == {
            "source": {"origin": "accumulated"}}
        # the build step's side of it: the GPU pool limits and the crash automation
        assert client.read_global_concurrency_limit_by_name("gpu-any").limit == 1
        assert client.read_automations_by_name(CRASH_AUTOMATION)


def test_prefect_deploy_refuses_a_credential_url_naming_it() -> None:
    env = _env(INDUSFLOW_MILVUS_URI="http://root:Milvus-Secret-9@milvus:19530",
               INDUSFLOW_LLM_URL="https://llm.internal/v1?api_key=Q9sEcReT")
    done = _deploy("-n", "every-10-min-score", env=env)
    text = done.stdout + done.stderr
    assert done.returncode != 0, text[-3000:]
    assert "INDUSFLOW_MILVUS_URI (password in its URL)" in text and "INDUSFLOW_LLM_URL (query in its URL)" in text
    assert "Milvus-Secret-9" not in text and "Q9sEcReT" not in text


def test_a_deployed_scoring_run_completes_on_a_worker(tmp_path: Path) -> None:
    """`prefect deploy --all`, `prefect worker start --pool local`; a run triggered through the API completes."""
    from prefect.deployments import run_deployment

    tiny = ["--n-accounts", "300", "--n-terminals", "150", "--n-days", "40", "--max-epochs", "1", "--seq-len", "8"]
    assert main(["train", *tiny, "--no-baseline", "--model", "fraud-served"]) == 0
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    generate_transactions(n_accounts=60, n_terminals=30, n_days=4, seed=7).to_csv(inbox / "batch.csv", index=False)
    done = _deploy()
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]

    env = _env(PREFECT_WORKER_QUERY_SECONDS="2", PREFECT_WORKER_PREFETCH_SECONDS="5")
    log_path = tmp_path / "worker.log"
    with open(log_path, "w") as log_file:
        worker = subprocess.Popen([*PREFECT, "worker", "start", "--pool", "local", "--type", "process"], cwd=REPO,
                                  env=env, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        run = run_deployment(
            "fraud-batch-score/hourly-batch-score",
            parameters={"inbox": str(inbox), "model": "fraud-served", "settle_seconds": 0},
            timeout=300,
        )
        assert run.state is not None and run.state.is_completed(), (run.state, log_path.read_text()[-3000:])
        # the run scored the file with the champion and recorded it in the ledger
        entries = [e for e in FileLedger("fraud-batch-score").entries().values() if e.path == str(inbox / "batch.csv")]
        assert len(entries) == 1 and entries[0].status == "scored" and entries[0].model == "fraud-served:1"
        assert Path(entries[0].output).exists()
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def test_two_trainings_never_share_one_gpu_slot() -> None:
    """Inside flow runs, the GPU pool's global concurrency limit holds a second training
    until the first ends, even though the machine has a second card."""
    from prefect import flow

    config = load_deploy_config()
    ensure_gpu_limits(config.model_copy(update={"gpu_pools": {"unit-test": 1}}))
    args = TrainerArgs(accelerator="gpu", devices=1, precision="32-true", strategy="auto", gpu_slots=1,
                       concurrency_name="gpu-unit-test")
    holding, release = threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    @flow
    def first_training() -> None:
        with gpu_slot(args, total_cards=2) as cards:
            seen["first"] = cards
            holding.set()
            release.wait(60)

    @flow
    def second_training(timeout_s: float) -> str:
        try:
            with gpu_slot(args, timeout_s=timeout_s, total_cards=2) as cards:
                seen["second"] = cards
                return "ran"
        except TimeoutError as exc:  # prefect's AcquireConcurrencySlotTimeoutError
            return type(exc).__name__

    thread = threading.Thread(target=first_training)
    thread.start()
    try:
        assert holding.wait(60)
        started = time.perf_counter()
        assert second_training(2.0) == "AcquireConcurrencySlotTimeoutError"
        assert time.perf_counter() - started >= 1.5 and "second" not in seen
    finally:
        release.set()
        thread.join(60)
    assert seen["first"] == [0]
    assert second_training(30.0) == "ran" and seen["second"] == [0]  # free again once the first ended


def test_the_crash_automation_is_written_again_only_when_it_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each write makes the server reload its triggers (a proactive evaluation running meanwhile logged
    an error): a second `apply` with the same automation writes nothing; a changed one is updated."""
    from prefect.client.orchestration import SyncPrefectClient

    from infra import deploy

    first = deploy.ensure_crash_detection()
    writes: list[object] = []
    update = SyncPrefectClient.update_automation
    monkeypatch.setattr(SyncPrefectClient, "update_automation",
                        lambda self, *args, **kwargs: writes.append(args) or update(self, *args, **kwargs))
    assert deploy.ensure_crash_detection() == first
    assert writes == []
    monkeypatch.setattr(deploy, "CRASHED_AFTER_S", deploy.CRASHED_AFTER_S + 60)
    assert deploy.ensure_crash_detection() == first
    assert len(writes) == 1
