"""How long an upload of the knowledge-base API takes to be ingested: the first after the server starts,
then the next ones. Prints one JSON line.

The real server (``python -m flows.serve`` on 127.0.0.1, kb only) on a throwaway home, the packaged MiniLM
and Milvus Lite. When ``/readyz`` answers, the collection's documents are listed (what the KB page does when
it opens), then ``--wait-s`` later (a user picking a file; 0: the worst case) one small text file is uploaded
and its job polled until ``done``; then ``--more`` uploads one after the other.
Each figure is POST to ``done`` (seconds), with the job's own record split in two (whole seconds): created to
running (Prefect picks the run up, its process starts, imports and takes the collection's lock) and running to
done (the ingest, the embedder's load included). The server's own account of its Prefect runner's start (the
temporary server, then the runner and its deployments) is read from its log when the code logs it. The
load average before and after is part of the line: the cores may be shared, read the load.

Usage: ``python bench/kb_upload_bench.py [--wait-s 0] [--more 2] [--fresh-prefect-home]``;
``PYTHONPATH=/other/checkout python bench/kb_upload_bench.py`` measures another checkout's code.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from loadgen import free_port, spawn_server, stop_server

TEXT = ("Harbourview warehouse lease, version {n}.\n\nClause 14 of the Harbourview lease says the tenant must give "
        "a notice period of ninety-seven days before leaving the warehouse.\n")


def upload_until_done(url: str, key: str, n: int, timeout_s: float) -> dict[str, Any]:
    """One upload, polled until its job ends: seconds and the job's final state."""
    import httpx

    t0 = time.monotonic()
    with httpx.Client(timeout=120, headers={"X-API-Key": key}) as c:
        r = c.post(f"{url}/v1/kb/documents", data={"collection": "legal"},
                   files=[("files", (f"lease-{n}.txt", TEXT.format(n=n).encode(), "text/plain"))])
        r.raise_for_status()
        accepted_s = time.monotonic() - t0
        job = r.json()
        while job["state"] not in ("done", "failed") and time.monotonic() - t0 < timeout_s:
            time.sleep(0.25)
            job = c.get(f"{url}/v1/kb/jobs/{job['job_id']}").json()
    span = {k: dt.datetime.fromisoformat(job[k]) for k in ("created_at", "started_at", "finished_at") if job.get(k)}
    phases = {"to_running_s": (span["started_at"] - span["created_at"]).total_seconds(),
              "running_s": (span["finished_at"] - span["started_at"]).total_seconds()} if len(span) == 3 else {}
    return {"seconds": round(time.monotonic() - t0, 1), "accepted_s": round(accepted_s, 2), "state": job["state"],
            "error": job.get("error")} | phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wait-s", type=float, default=0.0, help="seconds between /readyz and the first upload")
    parser.add_argument("--more", type=int, default=2, help="uploads after the first, one after the other")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="the longest an upload is waited for")
    parser.add_argument("--fresh-prefect-home", action="store_true",
                        help="an empty PREFECT_HOME (Prefect's first start on a machine: its database migrations)")
    parser.add_argument("--keep", action="store_true", help="keep the home (its server.log, kb-jobs/runner.log)")
    args = parser.parse_args()

    from infra.serving.auth import KeyStore

    home = Path(tempfile.mkdtemp(prefix="kb-upload-bench-"))
    key, _ = KeyStore(home / "serving" / "keys.json").add("bench", ["admin"])
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k not in ("INDUSFLOW_SERVE_REDIS_URL", "PREFECT_API_URL")}
    env.update({"INDUSFLOW_HOME": str(home), "PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT)),
                "INDUSFLOW_SERVE_FRAUD_MODEL": "", "INDUSFLOW_SERVE_SENSOR_MODEL": "",
                "INDUSFLOW_KB_COLLECTIONS": "legal", "HF_HUB_OFFLINE": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    if args.fresh_prefect_home:
        env["PREFECT_HOME"] = str(home / "prefect")
    out: dict[str, Any] = {"code": env["PYTHONPATH"], "loadavg_before": Path("/proc/loadavg").read_text().strip()}
    t0 = time.monotonic()
    proc = spawn_server([sys.executable, "-m", "flows.serve", "--port", str(port)], env=env, cwd=ROOT,
                        log=home / "server.log", ready_url=f"{url}/readyz")
    out["ready_s"] = round(time.monotonic() - t0, 1)
    try:
        import httpx

        httpx.get(f"{url}/v1/kb/documents", params={"collection": "legal"}, headers={"X-API-Key": key},
                  timeout=120).raise_for_status()
        time.sleep(args.wait_s)
        out["wait_s"] = args.wait_s
        out["first"] = upload_until_done(url, key, 0, args.timeout_s)
        out["next"] = [upload_until_done(url, key, n, args.timeout_s) for n in range(1, args.more + 1)]
    finally:
        stop_server(proc)
        log = (home / "server.log").read_text(errors="replace")
        found = re.search(r"temporary server ([\d.]+) s, runner and deployments ([\d.]+) s", log)
        if found:
            out["runner_start"] = {"temporary_server_s": float(found[1]), "runner_s": float(found[2])}
        out["loadavg_after"] = Path("/proc/loadavg").read_text().strip()
        if args.keep:
            out["home"] = str(home)
        else:
            shutil.rmtree(home, ignore_errors=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
