"""INDUSFLOW_RUNNER_KIND=ray against a Ray cluster started here (``ray start --head`` on 127.0.0.1, 2
CPUs, so two worker processes take tasks side by side): tuning trials and multi-file batch scoring
give the thread runner's results, and a Ray worker process killed mid-batch loses no file. One
node only: a worker node would take Ray off loopback (tests/servers/ray_cluster.py).

The nodes start without the test's PYTHONPATH and with an INDUSFLOW_HOME of their own, which must
stay empty: the flow hands its workers the project's code and its home through the Ray job's
runtime_env. How the cluster is started and stopped: tests/servers/ray_cluster.py.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from tests.servers.ray_cluster import (
    RayCluster,
    listening_beyond_loopback,
    session_pids,
    start_cluster,
    titles,
)

# found, not imported: Ray reads RAY_AUTH_MODE when it is imported, and the driver's token is set below
pytestmark = [
    pytest.mark.servers,
    # a driver that never connects fails the test with every thread's stack (pytest-timeout's thread
    # method ends the process: under xdist the worker, replaced) instead of holding the run: a loaded
    # two-worker run once waited 20 min in ray.init. Each test takes 0.5-2 min here under load.
    pytest.mark.timeout(600, method="thread"),
    pytest.mark.skipif(importlib.util.find_spec("ray") is None or importlib.util.find_spec("prefect_ray") is None,
                       reason="ray is not importable: pip install 'indusflow[ray]'"),
]

TINY = ["--n-accounts", "300", "--n-terminals", "150", "--n-days", "40", "--seq-len", "8"]
MODEL = "fraud-ray-batch"


@pytest.fixture(scope="module", autouse=True)
def prefect_api() -> Iterator[None]:
    """A throwaway Prefect server for the module (as tests/flows does for its session)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        mp.setenv("PREFECT_SERVER_UI_ENABLED", "false")
        from prefect.logging.configuration import ensure_logging_setup
        from prefect.testing.utilities import prefect_test_harness

        with prefect_test_harness(server_startup_timeout=120):
            # Prefect's console handler takes the stream of its first use: pytest's, not a test's capsys
            ensure_logging_setup()
            yield


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    root = tmp_path_factory.mktemp("ray")
    decoy = root / "nodes-home"  # the nodes' own home: nothing may land there
    # the nodes do not see this checkout on their path (a worker imports the code the flow ships)
    ray = start_cluster(root, extra_env={"INDUSFLOW_HOME": str(decoy), "PYTHONPATH": "", "OMP_NUM_THREADS": "1"})
    try:
        assert listening_beyond_loopback(ray.head.sid) == [], "the Ray node listens beyond 127.0.0.1"
        yield ray
    finally:
        left = ray.stop()
        for node in ray.nodes:
            shutil.rmtree(node.temp_dir, ignore_errors=True)
    assert not left, f"Ray processes still alive after the teardown: {left}"
    assert not decoy.exists(), "a worker used its own INDUSFLOW_HOME instead of the flow's"


@pytest.fixture
def on_ray(cluster: RayCluster, monkeypatch: pytest.MonkeyPatch) -> RayCluster:
    """The flows' fan-out goes to the cluster."""
    monkeypatch.setenv("INDUSFLOW_RUNNER_KIND", "ray")
    monkeypatch.setenv("INDUSFLOW_RUNNER_ADDRESS", cluster.address)
    return cluster


@pytest.fixture(autouse=True)
def one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    # the same torch thread count in the test process and in the Ray workers (2 cores, 2 at once)
    monkeypatch.setenv("INDUSFLOW_TRAIN_NUM_THREADS", "1")


class TaskWatch:
    """Records the Ray tasks (``ray::<task>`` process titles) each node runs while it is open."""

    def __init__(self, cluster: RayCluster) -> None:
        self.cluster = cluster
        self.seen: dict[int, set[str]] = {node.sid: set() for node in cluster.nodes}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            for sid, names in self.seen.items():
                names.update(t.split()[0] for t in titles(sid) if t.startswith("ray::") and "Agent" not in t)

    def __enter__(self) -> TaskWatch:  # noqa: PYI034
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_tuning_trials_on_ray_match_the_thread_runner(on_ray: RayCluster, monkeypatch, capsys) -> None:
    from flows.fraud.cli import main

    def tune(study: str) -> dict:
        args = ["tune", *TINY, "--max-epochs", "2", "--study", study, "--model", f"fraud-{study}",
                "--max-in-flight", "2", "--trials", "2", "--json"]
        assert main(args) == 0
        return _last_json(capsys.readouterr().out)["summary"]

    with monkeypatch.context() as threads:
        threads.setenv("INDUSFLOW_RUNNER_KIND", "threads")
        local = tune("ray-cmp-threads")
    with TaskWatch(on_ray) as watch:
        remote = tune("ray-cmp-ray")
    assert all("ray::run-trial" in names for names in watch.seen.values()), watch.seen
    assert remote["best_params"] == local["best_params"] and remote["best_number"] == local["best_number"]
    assert remote["best_value"] == local["best_value"]
    trials = {t["number"]: (t["state"], t["params"], t["value"]) for t in local["ran_now"]}
    assert {t["number"]: (t["state"], t["params"], t["value"]) for t in remote["ran_now"]} == trials


@pytest.fixture(scope="module")
def trained_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home holding a tiny champion, trained on the thread runner; each test copies it."""
    from flows.fraud.cli import main
    from infra.home import home_layout

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INDUSFLOW_TRAIN_NUM_THREADS", "1")
        home = tmp_path_factory.mktemp("trained") / "home"
        mp.setenv("INDUSFLOW_HOME", str(home))
        assert main(["train", *TINY, "--max-epochs", "1", "--no-baseline", "--model", MODEL]) == 0
        assert home_layout().root == home.resolve()
    return home


def _fresh_home(trained: Path, where: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = where / "home"
    shutil.copytree(trained, home, symlinks=True)
    monkeypatch.setenv("INDUSFLOW_HOME", str(home))
    return home


def _inbox(where: Path, seeds: range) -> Path:
    """Files whose accounts and terminals are their own: no file's scores depend on another's history."""
    from solutions.fraud.synthetic import generate_transactions

    inbox = where / "inbox"
    inbox.mkdir()
    for seed in seeds:
        df = generate_transactions(n_accounts=40, n_terminals=20, n_days=3, seed=seed)
        df = df.drop(columns=["is_fraud", "scenario"], errors="ignore")
        df = df.assign(account_id=f"f{seed}-" + df["account_id"].astype(str),
                       terminal_id=f"f{seed}-" + df["terminal_id"].astype(str))
        df.to_parquet(inbox / f"part-{seed}.parquet", index=False)
    return inbox


def _batch(inbox: Path, **kw):
    import flows.fraud as F

    return F.fraud_batch_score(inbox=str(inbox), model=MODEL, settle_seconds=0, **kw)


def test_batch_scoring_on_ray_matches_the_thread_runner(on_ray: RayCluster, trained_home: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    outputs: dict[str, dict[str, pd.DataFrame]] = {}
    for kind in ("threads", "ray"):
        monkeypatch.setenv("INDUSFLOW_RUNNER_KIND", kind)
        where = tmp_path / kind
        _fresh_home(trained_home, where, monkeypatch)
        inbox = _inbox(where, range(71, 75))
        with TaskWatch(on_ray) as watch:
            run = _batch(inbox)
        assert run.scored == 4 and run.quarantined == 0 and run.failed == 0, run
        if kind == "ray":
            assert all("ray::score-file" in names for names in watch.seen.values()), watch.seen
        outputs[kind] = {Path(o).name: pd.read_parquet(o) for o in run.outputs}
    assert sorted(outputs["ray"]) == sorted(outputs["threads"])
    for name, frame in outputs["threads"].items():
        pd.testing.assert_frame_equal(outputs["ray"][name], frame, check_exact=True)


def test_a_command_line_run_shares_its_temporary_prefect_api_with_the_workers(
        on_ray: RayCluster, trained_home: Path, tmp_path: Path) -> None:
    """``python -m flows.fraud batch`` without PREFECT_API_URL (Prefect's ephemeral API): the Ray
    workers report to the command's server; before, each worker process started a server of its
    own on the same database (15 s on 2 cores, per worker)."""
    import os
    import subprocess
    import sys

    home = tmp_path / "home"
    shutil.copytree(trained_home, home, symlinks=True)
    inbox = _inbox(tmp_path, range(91, 93))
    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "PYTEST_"))}
    env.update(PYTHONPATH=str(repo), INDUSFLOW_HOME=str(home), PREFECT_HOME=str(tmp_path / "prefect"),
               PREFECT_SERVER_ANALYTICS_ENABLED="false", INDUSFLOW_RUNNER_KIND="ray",
               INDUSFLOW_RUNNER_ADDRESS=on_ray.address, INDUSFLOW_TRAIN_NUM_THREADS="1")
    with TaskWatch(on_ray) as watch:
        done = subprocess.run([sys.executable, "-m", "flows.fraud", "batch", "--inbox", str(inbox), "--model", MODEL,
                               "--settle-seconds", "0", "--json"], check=False, env=env, cwd=tmp_path,
                              capture_output=True,
                              text=True, timeout=240)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["scored"] == 2
    assert any("ray::score-file" in names for names in watch.seen.values()), watch.seen
    servers = [line for line in out.splitlines() if "Starting temporary server" in line]
    assert len(servers) == 1 and "pid=" not in servers[0], servers  # the command's own, no worker's


def _scoring_worker(cluster: RayCluster) -> int | None:
    """The pid of a Ray worker process that is scoring a file now."""
    for pid in session_pids(cluster.head.sid):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::score-file"):
                return pid
        except OSError:
            continue
    return None


def test_a_worker_killed_mid_batch_loses_no_file(on_ray: RayCluster, trained_home: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """kill -9 of a Ray worker process while it scores a file: every file ends scored exactly once
    in the ledger (Ray runs the lost task again, or the run releases the file and the next run
    scores it), none stays claimed."""
    import os
    import signal

    from tasks.ledger import FileLedger

    home = _fresh_home(trained_home, tmp_path, monkeypatch)
    inbox = _inbox(tmp_path, range(81, 87))
    killed: list[int] = []

    def kill_when_busy() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            pid = _scoring_worker(on_ray)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_when_busy, daemon=True)
    killer.start()
    first = _batch(inbox, return_state=True)
    killer.join()
    assert killed, "no Ray worker ever scored a file"
    assert not Path(f"/proc/{killed[0]}/cmdline").exists() or not Path(f"/proc/{killed[0]}/cmdline").read_bytes()

    def ledger() -> list[dict]:
        text = (home / "ledgers" / "fraud-batch-score.jsonl").read_text()
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    statuses = {e.sha256: e.status for e in FileLedger("fraud-batch-score").entries().values()}
    assert len(statuses) == 6 and set(statuses.values()) <= {"scored", "released"}, statuses
    released = [s for s, status in statuses.items() if status == "released"]
    print(f"killed mid-batch: {len(released)} file(s) released, first run {first.type.value}")
    assert first.is_failed() == bool(released)
    second = _batch(inbox)  # the next run (on the head node alone) takes the released files
    assert second.scored == len(released) and second.seen_before == 6 - len(released) and second.failed == 0
    latest = {e.sha256: e.status for e in FileLedger("fraud-batch-score").entries().values()}
    assert set(latest.values()) == {"scored"}
    lines = ledger()
    scored = [e["sha256"] for e in lines if e["status"] == "scored"]
    assert sorted(scored) == sorted(statuses), "a file was scored twice or not at all"
    assert not [e for e in lines if e["status"] == "quarantined"]
    assert all(Path(e["output"]).is_file() for e in lines if e["status"] == "scored")
