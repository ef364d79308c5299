"""Fraud scoring and KB search latency while a knowledge-base upload is ingested as a ``rag-ingest``
flow run in a child process of the API (``process``). Prints one JSON line. (Its results of 2026-12-04
also measured the former ingest on a thread of the API process, ``thread``, which that comparison retired.)

A throwaway home with a tiny fraud model registered as champion (as in
``serve_bench.py``), the real server (``python -m flows.serve`` on 127.0.0.1, fraud + kb), then:
an idle phase (``--idle-seconds``) of single-transaction fraud scores and KB searches, one client
each, closed loop; then one upload of the 67 documents of ``shared/data/docs`` (read in place) to
the ``default`` collection, with the same two clients measuring while its job runs (at most
``--ingest-seconds``; the job's state, duration and counts are reported). p50/p99 per phase,
with the machine's load average (the cores may be shared with other work: read the load).

Usage: ``python bench/kb_ingest_latency.py [--ingest-seconds 300]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from loadgen import free_port, spawn_server, stop_server
from serve_bench import Transactions, register_model

DOCS = ROOT.parent / "shared" / "data" / "docs"
if not DOCS.is_dir():
    DOCS = Path("/work/shared/data/docs")
QUERIES = ["notice period", "password protected document", "quarterly revenue table", "Apache Tika test",
           "mail attachment", "Chinese text encoding", "slides presentation", "spreadsheet totals"]


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 1)


def summary(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), "p50_ms": pct(values, 0.50), "p99_ms": pct(values, 0.99),
            "max_ms": round(max(values) * 1000, 1) if values else None}


class Clients:
    """One closed-loop client scoring one transaction at a time, one searching the KB."""

    def __init__(self, url: str, key: str) -> None:
        self.url, self.key = url, key
        self.tx = Transactions()
        self.samples: dict[str, list[float]] = {"fraud": [], "kb_search": []}
        self.errors: dict[str, int] = {"fraud": 0, "kb_search": 0}
        self.error_kinds: dict[str, dict[str, int]] = {}
        self.stop = threading.Event()

    def _loop(self, kind: str) -> None:
        import httpx

        with httpx.Client(timeout=120, headers={"X-API-Key": self.key}) as c:
            i = 0
            while not self.stop.is_set():
                t0 = time.perf_counter()
                try:
                    if kind == "fraud":
                        r = c.post(f"{self.url}/v1/fraud/score", json=self.tx.body(1))
                    else:
                        r = c.post(f"{self.url}/v1/kb/search",
                                   json={"collection": "default", "query": QUERIES[i % len(QUERIES)], "top_k": 5})
                    status = r.status_code
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                elapsed = time.perf_counter() - t0
                if status == 200:
                    self.samples[kind].append(elapsed)
                else:
                    self.errors[kind] += 1
                    self.error_kinds.setdefault(kind, {}).setdefault(str(status), 0)
                    self.error_kinds[kind][str(status)] += 1
                i += 1
                time.sleep(0.05)  # ~20 requests/s per client at most: a steady probe, not a load test

    def run(self, until: Any) -> dict[str, Any]:
        """Measure until ``until()`` is true."""
        self.samples = {"fraud": [], "kb_search": []}
        self.errors = {"fraud": 0, "kb_search": 0}
        self.error_kinds: dict[str, dict[str, int]] = {}
        self.stop.clear()
        threads = [threading.Thread(target=self._loop, args=(k,), daemon=True) for k in self.samples]
        for t in threads:
            t.start()
        while not until():
            time.sleep(0.25)
        self.stop.set()
        for t in threads:
            t.join(timeout=130)
        return {k: summary(v) | {"errors": self.errors[k], "error_kinds": self.error_kinds.get(k, {})}
                for k, v in self.samples.items()}


def upload_all(url: str, key: str) -> dict[str, Any]:
    import httpx

    files = [("files", (p.name, p.read_bytes(), "application/octet-stream")) for p in sorted(DOCS.iterdir())
             if p.is_file()]
    r = httpx.post(f"{url}/v1/kb/documents", headers={"X-API-Key": key}, data={"collection": "default"},
                   files=files, timeout=300)
    r.raise_for_status()
    return r.json() | {"uploaded": len(files)}


def one_mode(mode: str, base: Path, args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    from infra.serving.auth import KeyStore

    home = Path(tempfile.mkdtemp(prefix=f"kb-latency-{mode}-"))
    shutil.rmtree(home)
    shutil.copytree(base, home)
    key, _ = KeyStore(home / "serving" / "keys.json").add("bench", ["admin"])
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k not in ("INDUSFLOW_SERVE_REDIS_URL", "PREFECT_API_URL")}
    env.update({"INDUSFLOW_HOME": str(home), "PYTHONPATH": str(ROOT), "INDUSFLOW_SERVE_SENSOR_MODEL": "",
                "INDUSFLOW_SERVE_DEFAULT_RATE_LIMIT": "10000000/minute", "INDUSFLOW_KB_COLLECTIONS": "default",
                "INDUSFLOW_KB_MAX_UPLOAD_FILES": "100",
                "INDUSFLOW_KB_MAX_UPLOAD_BYTES": str(64 * 1024 * 1024), "INDUSFLOW_KB_REQUEST_TIMEOUT_S": "600",
                "HF_HUB_OFFLINE": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    if args.embed_model:
        env["INDUSFLOW_EMBED_MODEL"] = args.embed_model
    t0 = time.perf_counter()
    proc = spawn_server([sys.executable, "-m", "flows.serve", "--port", str(port)], env=env, cwd=ROOT,
                        log=home / "server.log", ready_url=f"{url}/readyz")
    out: dict[str, Any] = {"ready_s": round(time.perf_counter() - t0, 1)}
    try:
        clients = Clients(url, key)
        # warm up: the embedder and Milvus of the KB, the fraud model's first batch
        with httpx.Client(timeout=300, headers={"X-API-Key": key}) as c:
            c.post(f"{url}/v1/kb/search", json={"collection": "default", "query": "warm up"}).raise_for_status()
            c.post(f"{url}/v1/fraud/score", json=clients.tx.body(1)).raise_for_status()
        idle_end = time.monotonic() + args.idle_seconds
        out["load_before"] = round(os.getloadavg()[0], 2)
        out["idle"] = clients.run(lambda: time.monotonic() > idle_end)
        t_up = time.monotonic()
        job = upload_all(url, key)
        out["upload_s"] = round(time.monotonic() - t_up, 1)
        out["uploaded_files"] = job["uploaded"]
        state: dict[str, Any] = {"job": job}
        deadline = time.monotonic() + args.ingest_seconds

        def finished() -> bool:
            if time.monotonic() > deadline:
                return True
            r = httpx.get(f"{url}/v1/kb/jobs/{job['job_id']}", headers={"X-API-Key": key}, timeout=120)
            if r.status_code == 200:
                state["job"] = r.json()
            return state["job"]["state"] in ("done", "failed")

        loads: list[float] = []
        sampler_stop = threading.Event()

        def sample_load() -> None:
            while not sampler_stop.wait(5):
                loads.append(os.getloadavg()[0])

        sampler = threading.Thread(target=sample_load, daemon=True)
        sampler.start()
        out["during_ingest"] = clients.run(finished)
        sampler_stop.set()
        final = state["job"]
        out["job"] = {"state": final["state"], "seconds": round(time.monotonic() - t_up, 1),
                      "counts": final.get("counts"), "flow_run_name": final.get("flow_run_name"),
                      "timed_out": final["state"] not in ("done", "failed")}
        out["load_during_mean"] = round(sum(loads) / len(loads), 2) if loads else None
        out["load_after"] = round(os.getloadavg()[0], 2)
    finally:
        stop_server(proc)
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle-seconds", type=float, default=15.0, help="the idle phase before the upload")
    parser.add_argument("--ingest-seconds", type=float, default=300.0, help="longest measured ingest phase")
    parser.add_argument("--embed-model", default=None, help="INDUSFLOW_EMBED_MODEL of the server (default: its own)")
    parser.add_argument("--keep", action="store_true", help="keep the homes (server logs, job records)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="kb-latency-base-"))
    started = time.time()
    try:
        register_model(base)
        results = {"bench": "kb_ingest_latency", "docs": len([p for p in DOCS.iterdir() if p.is_file()]),
                   "cpus": os.cpu_count(), "load_at_start": [round(x, 2) for x in os.getloadavg()]}
        results["process"] = one_mode("process", base, args)
        results["load_at_end"] = [round(x, 2) for x in os.getloadavg()]
        results["seconds"] = round(time.time() - started, 1)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(results, separators=(",", ":")))


if __name__ == "__main__":
    main()
