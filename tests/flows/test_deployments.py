"""Deployments against a real (test) Prefect API: registration, a served run, GPU limits."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from flows.fraud.cli import main
from infra.deploy import build_deployments, ensure_gpu_limits
from infra.deploy_config import load_deploy_config
from infra.resources import TrainerArgs, gpu_slot
from solutions.fraud.synthetic import generate_transactions
from tasks.ledger import FileLedger

REPO = Path(__file__).resolve().parents[2]
EXPECTED = {
    "fraud-train/nightly-retrain": "0 2 * * *",
    "fraud-batch-score/hourly-batch-score": "0 * * * *",
    "sensor-batch-score/every-10-min-score": "*/10 * * * *",
    "sensor-train/weekly-retrain": "0 3 * * 0",
    "sensor-monitor/hourly-monitor": "5 * * * *",
    "rag-ingest/reingest-watched-folder": "*/15 * * * *",
}


def _api_url() -> str:
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    assert url, "the test harness sets a Prefect API URL"
    return url


def test_every_deployment_registers_with_schedule_and_parameter_schema() -> None:
    from prefect.client.orchestration import get_client

    config = load_deploy_config()
    deployments = build_deployments(config)
    for deployment in deployments:
        deployment.apply()
    with get_client(sync_client=True) as client:
        for name, cron in EXPECTED.items():
            registered = client.read_deployment_by_name(name)
            schedule = registered.schedules[0].schedule
            assert (schedule.cron, schedule.timezone) == (cron, "UTC"), name
            assert registered.global_concurrency_limit is not None and registered.global_concurrency_limit.limit == 1
            assert registered.entrypoint.startswith(("flows.fraud.", "flows.sensor.", "flows.rag."))
            assert "indusflow" in registered.tags
        scoring = client.read_deployment_by_name("fraud-batch-score/hourly-batch-score")
        props = scoring.parameter_openapi_schema["properties"]
        assert {"inbox", "model", "columns", "settle_seconds"} <= set(props)  # the UI's form
        assert props["settle_seconds"]["default"] == 30.0
        ingest = client.read_deployment_by_name("rag-ingest/reingest-watched-folder")
        assert ingest.parameters == {"params": {"prune": True}}
        assert "params" in ingest.parameter_openapi_schema["properties"]


def test_apply_registers_the_same_definitions_to_a_process_pool(monkeypatch) -> None:
    from prefect.client.orchestration import get_client

    from infra.deploy import main as deploy_main

    monkeypatch.setenv("INDUSFLOW_DEPLOY_TIMEZONE", "Europe/Berlin")
    assert deploy_main(["apply", "--pool", "test-process", "--create-pool", "--only", "nightly-retrain",
                        "every-10-min-score", "--json"]) == 0
    with get_client(sync_client=True) as client:
        train = client.read_deployment_by_name("fraud-train/nightly-retrain")
        score = client.read_deployment_by_name("sensor-batch-score/every-10-min-score")
        assert client.read_work_pool("test-process").type == "process"
    assert train.work_pool_name == "test-process" and score.work_pool_name == "test-process"
    assert train.schedules[0].schedule.timezone == "Europe/Berlin"
    # the flow's resource spec became job variables: threads follow its cpus
    assert train.job_variables["env"]["OMP_NUM_THREADS"] == "2"
    assert score.job_variables["env"]["INDUSFLOW_TRAIN_NUM_THREADS"] == "1"
    assert train.job_variables["env"]["PREFECT_LOGGING_EXTRA_LOGGERS"] == "infra,tasks,solutions,flows"
    assert "INDUSFLOW_HOME" in train.job_variables["env"]  # a process pool on this machine shares the home


def test_apply_to_a_missing_pool_is_one_error_line_naming_it(capsys) -> None:
    from infra.deploy import main as deploy_main

    # without --create-pool, registering to a pool that does not exist would make the server answer 500
    assert deploy_main(["apply", "--pool", "no-such-pool", "--only", "nightly-retrain"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "'no-such-pool' does not exist" in err[0], err
    assert "--create-pool" in err[0]


def test_container_pools_mount_the_shared_home_from_the_config() -> None:
    from infra.resources import IMAGE_HOME

    config = load_deploy_config()
    home = config.home_volume
    assert home is not None
    (docker,) = build_deployments(config, ["nightly-retrain"], pool="d", pool_type="docker", image="img:1")
    assert docker.job_variables["volumes"] == [f"{home.docker}:{IMAGE_HOME}"]
    assert docker.job_variables["env"]["INDUSFLOW_HOME"] == IMAGE_HOME
    (k8s,) = build_deployments(config, ["nightly-retrain"], pool="k", pool_type="kubernetes", image="img:1")
    assert k8s.job_variables["volumes"][0]["persistentVolumeClaim"] == {"claimName": home.kubernetes}
    assert k8s.job_variables["volume_mounts"][0]["mountPath"] == IMAGE_HOME
    without = config.model_copy(update={"home_volume": None})
    (plain,) = build_deployments(without, ["nightly-retrain"], pool="k", pool_type="kubernetes", image="img:1")
    assert "volumes" not in plain.job_variables and "volume_mounts" not in plain.job_variables


def test_a_served_scoring_deployment_run_completes(tmp_path: Path) -> None:
    """`python -m infra.deploy serve` in a subprocess; a run triggered through the API completes."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    tiny = ["--n-accounts", "300", "--n-terminals", "150", "--n-days", "40", "--max-epochs", "1", "--seq-len", "8"]
    assert main(["train", *tiny, "--no-baseline", "--model", "fraud-served"]) == 0
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    generate_transactions(n_accounts=60, n_terminals=30, n_days=4, seed=7).to_csv(inbox / "batch.csv", index=False)

    env = {**os.environ, "PREFECT_API_URL": _api_url(), "OMP_NUM_THREADS": "1"}
    log_file = open(tmp_path / "serve.log", "w")  # noqa: SIM115 - the server writes to it until the test ends
    server = subprocess.Popen([sys.executable, "-m", "infra.deploy", "serve", "--only", "hourly-batch-score"],
                              cwd=REPO, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        run = run_deployment(
            "fraud-batch-score/hourly-batch-score",
            parameters={"inbox": str(inbox), "model": "fraud-served", "settle_seconds": 0},
            timeout=300,
        )
        log_file.flush()
        assert run.state is not None and run.state.is_completed(), (run.state, (tmp_path / "serve.log").read_text()[-3000:])
        # the served run scored the file with the champion and recorded it in the ledger
        entries = [e for e in FileLedger("fraud-batch-score").entries().values() if e.path == str(inbox / "batch.csv")]
        assert len(entries) == 1 and entries[0].status == "scored" and entries[0].model == "fraud-served:1"
        assert Path(entries[0].output).exists()
        with get_client(sync_client=True) as client:
            assert client.read_global_concurrency_limit_by_name("gpu-any").limit == 1
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log_file.close()


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


def test_serve_stops_on_sigint(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT) stops `python -m infra.deploy serve`, even when started with SIGINT
    ignored, as a shell's background job is (within 20 s: a generous bound, about 1 s quiet)."""
    import signal
    import time

    env = {**os.environ, "PREFECT_API_URL": _api_url(), "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log_file:
        # SIGINT ignored, then exec: as a shell starts `cmd &` (an ignored signal survives exec)
        ignoring = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                    "os.execv(sys.executable, [sys.executable, '-m', 'infra.deploy', 'serve', '--only', "
                    "'hourly-batch-score'])")
        server = subprocess.Popen([sys.executable, "-c", ignoring], cwd=REPO, env=env, stdout=log_file,
                                  stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        served = False
        while time.monotonic() < deadline and server.poll() is None and not served:
            served = "being served" in log_path.read_text()  # Prefect's start message: the runner polls
            time.sleep(0.5)
        assert served, log_path.read_text()[-3000:]
        time.sleep(2)  # the runner is polling now
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still serving 20 s after SIGINT\n{log_path.read_text()[-3000:]}") from None
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
