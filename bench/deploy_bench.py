"""Orchestration overhead and batch-scoring throughput, side by side in one run.

    python bench/deploy_bench.py [--tasks 50] [--repeats 3] [--rows 100000] [--part all|tasks|scoring] [--history N]

Prints one JSON line:
- ``ms_per_task_ephemeral`` / ``ms_per_task_server``: median over repeats of
  (flow of N trivial tasks - the same N calls without Prefect) / N, on Prefect's ephemeral
  API and on a local ``prefect server start`` (each in its own process, fresh home, after
  one warm-up flow so start-up is reported apart as ``*_start_s``);
- ``score_rows_per_s_flow`` vs ``score_rows_per_s_direct``: the ``fraud-batch-score`` flow
  on one inbox file vs calling its scoring function on the same file; ``score_ratio``
  (median direct time / median flow time). Both start cold: the worker's loaded model is
  forgotten before each timed call, so each pays one model load, as a fresh run does; both
  score with one intra-op thread (``OMP_NUM_THREADS=1``; the direct call runs in the main
  thread, whose thread count the training had raised).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _tasks_worker(n: int, repeats: int) -> None:
    """Run in a child process: time flows of n trivial tasks."""
    from prefect import flow, task

    @task
    def noop(i: int) -> int:
        return i

    @flow
    def many(n: int) -> int:
        return sum(noop(i) for i in range(n))

    started = time.perf_counter()
    many(1)  # warm-up: the API (ephemeral: starts here), flow registration
    start_s = time.perf_counter() - started
    flows, plain = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        many(n)
        flows.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        sum(noop.fn(i) for i in range(n))
        plain.append(time.perf_counter() - t0)
    print(json.dumps({"start_s": start_s, "flow_s": flows, "plain_s": plain}))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(args: list[str], env: dict[str, str]) -> dict:
    # this checkout's code, not an installed copy
    env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, __file__, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=3600,
                         check=False)
    if out.returncode != 0:
        raise SystemExit(f"bench child failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _overhead(result: dict, n: int) -> float:
    per = [(f - p) / n * 1000 for f, p in zip(result["flow_s"], result["plain_s"])]
    return statistics.median(per)


def orchestration(n: int, repeats: int) -> dict:
    base = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "WARNING",
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}
    base.pop("PREFECT_API_URL", None)
    with tempfile.TemporaryDirectory() as home:
        eph = _child(["--worker-tasks", str(n), "--repeats", str(repeats)], {**base, "PREFECT_HOME": home})
    with tempfile.TemporaryDirectory() as home:
        port = _free_port()
        env = {**base, "PREFECT_HOME": home}
        server = subprocess.Popen([str(Path(sys.executable).with_name("prefect")), "server", "start", "--host", "127.0.0.1",
                                   "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            import urllib.request

            t0 = time.perf_counter()
            for _ in range(240):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2)
                    break
                except OSError:
                    time.sleep(0.5)
            server_start = time.perf_counter() - t0
            srv = _child(["--worker-tasks", str(n), "--repeats", str(repeats)],
                         {**env, "PREFECT_API_URL": f"http://127.0.0.1:{port}/api"})
        finally:
            server.terminate()
            server.wait(timeout=30)
    return {
        "tasks": n, "repeats": repeats,
        "ms_per_task_ephemeral": round(_overhead(eph, n), 1),
        "ms_per_task_server": round(_overhead(srv, n), 1),
        "flow_s_ephemeral_median": round(statistics.median(eph["flow_s"]), 2),
        "flow_s_server_median": round(statistics.median(srv["flow_s"]), 2),
        "ephemeral_api_start_s": round(eph["start_s"], 1),
        "server_start_s": round(server_start, 1),
    }


def _seed_history(job: str, files: int) -> None:
    """Give the job's ledger ``files`` earlier scored files (a deployment's months of hourly runs)."""
    from tasks.ledger import FileLedger, LedgerEntry

    entries = []
    for i in range(files):
        digest = f"{i:064x}"
        entries.append(LedgerEntry(sha256=digest, path=f"/old/inbox/{i}.parquet", size=1, status="claimed", owner="h:1:x"))
        entries.append(LedgerEntry(sha256=digest, path=f"/old/inbox/{i}.parquet", size=1, status="scored",
                                   output=f"/old/scores/{i}.parquet", rows=100000, model="bench-score:0"))
    FileLedger(job)._append(entries)


def _scoring_worker(rows: int, repeats: int, history: int) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    import flows.fraud as F
    from flows.fraud.cli import main as fraud_main
    from flows.fraud.steps import score_inbox_file
    from infra.prefect_env import prefect_cli_settings
    from infra.registry import ModelRegistry
    from infra.store import sha256_file
    from solutions.fraud.synthetic import generate_transactions
    from tasks.ledger import InboxFile
    from tasks.worker_models import clear_loaded_models

    with prefect_cli_settings():
        fraud_main(["train", "--n-accounts", "300", "--n-terminals", "150", "--n-days", "40", "--max-epochs", "1",
                "--seq-len", "8", "--no-baseline", "--model", "bench-score"])
        ref = ModelRegistry().resolve("bench-score")
        spec = ref.spec
        # training set this (main) thread's intra-op threads to the usable cores; the flow's
        # worker threads start with OMP_NUM_THREADS=1: score with one thread on both sides
        torch.set_num_threads(1)
        work = Path(os.environ["INDUSFLOW_HOME"])
        if history:
            _seed_history("fraud-batch-score", history)
        df = generate_transactions(n_accounts=max(50, rows // 18), n_terminals=max(30, rows // 40), n_days=10, seed=9)
        df = df.drop(columns=["label", "scenario"], errors="ignore").head(rows)
        flow_s, direct_s = [], []

        def run_flow(r: int) -> None:
            inbox = work / f"inbox-{r}"
            inbox.mkdir()
            df.assign(amount=df["amount"] + r * 1e-6).to_parquet(inbox / "batch.parquet", index=False)  # new content
            clear_loaded_models()
            t0 = time.perf_counter()
            result = F.fraud_batch_score(inbox=str(inbox), model=spec, settle_seconds=0)
            flow_s.append(time.perf_counter() - t0)
            assert result.scored == 1, result

        def run_direct(r: int) -> None:
            path = work / f"direct-{r}" / "batch.parquet"
            path.parent.mkdir()
            df.assign(amount=df["amount"] + r * 1e-6 + 5e-7).to_parquet(path, index=False)
            file = InboxFile(path=str(path), sha256=sha256_file(path), size=path.stat().st_size)
            clear_loaded_models()
            t0 = time.perf_counter()
            scored = score_inbox_file(file, model=ref, columns={}, accounts=None, out_dir=str(path.parent), csv=False)
            direct_s.append(time.perf_counter() - t0)
            assert scored.rows == len(df)

        for r in range(repeats):  # alternate the order so neither side always runs first
            for step in ((run_flow, run_direct) if r % 2 == 0 else (run_direct, run_flow)):
                step(r)
    print(json.dumps({"rows": len(df), "flow_s": flow_s, "direct_s": direct_s}))


def scoring(rows: int, repeats: int, history: int = 0) -> dict:
    with tempfile.TemporaryDirectory() as home, tempfile.TemporaryDirectory() as phome:
        env = {**os.environ, "INDUSFLOW_HOME": home, "PREFECT_HOME": phome, "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
               "PREFECT_LOGGING_LEVEL": "WARNING", "INDUSFLOW_LOG_LEVEL": "WARNING",
               "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}
        env.pop("PREFECT_API_URL", None)
        res = _child(["--worker-score", str(rows), "--repeats", str(repeats), "--history", str(history)], env)
    flow = statistics.median(res["flow_s"])
    direct = statistics.median(res["direct_s"])
    return {
        "score_rows": res["rows"],
        "score_rows_per_s_flow": round(res["rows"] / flow, 1),
        "score_rows_per_s_direct": round(res["rows"] / direct, 1),
        "score_ratio": round(direct / flow, 3),
        "ledger_history_files": history,
        # per-repeat times, so the spread of this noisy figure is visible beside its median
        "score_flow_s": [round(x, 3) for x in res["flow_s"]],
        "score_direct_s": [round(x, 3) for x in res["direct_s"]],
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=50)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rows", type=int, default=100000)
    p.add_argument("--part", choices=("all", "tasks", "scoring"), default="all",
                   help="measure the orchestration overhead, the batch-scoring ratio, or both")
    p.add_argument("--history", type=int, default=0,
                   help="files the batch job's ledger already holds before the timed runs (e.g. 20000: "
                        "two years of hourly single-file runs); the flow's fixed cost must not grow with it")
    p.add_argument("--worker-tasks", type=int, help=argparse.SUPPRESS)
    p.add_argument("--worker-score", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker_tasks:
        _tasks_worker(a.worker_tasks, a.repeats)
        return
    if a.worker_score:
        _scoring_worker(a.worker_score, a.repeats, a.history)
        return
    figures = {**(orchestration(a.tasks, a.repeats) if a.part in ("all", "tasks") else {}),
               **(scoring(a.rows, a.repeats, a.history) if a.part in ("all", "scoring") else {})}
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
