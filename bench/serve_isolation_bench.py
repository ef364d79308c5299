"""Route isolation under slow knowledge-base asks (issue 46): each route's p99 while 45 asks wait
on a slow LLM.

A real ``python -m flows.serve`` (fraud labels, registry approvals, the knowledge base) on
127.0.0.1, a fake OpenAI-compatible chat endpoint on 127.0.0.1 that answers after ``--llm-s``
seconds, one document uploaded and indexed. Every route is called once first (untimed: first
calls import torch, Prefect, the embedder). Then, at once: ``--asks`` non-streamed
``/v1/kb/ask`` from one read key (the review's attack: the whole worker pool), and for
``--seconds`` a fixed rate of ``/v1/fraud/labels``, ``/v1/registry/approvals`` and another
user's ``/v1/kb/collections``. Bounded: a fixed number of asks, a fixed time, loopback only; the
server and the fake LLM are stopped at the end.

``--root`` runs the server from another checkout (main's code: the "before" numbers). Prints
one JSON line: per route its requests, statuses, p50/p99 (ms), and the machine's load average.

    PYTHONPATH=. .venv/bin/python bench/serve_isolation_bench.py [--root /path/to/main]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loadgen import free_port, spawn_server, stop_server, summary

ROOT = Path(__file__).resolve().parents[1]
DOC = ("Harbourview warehouse lease.\n\nClause 14 of the Harbourview lease says the tenant must give a notice "
       "period of ninety-seven days before leaving the warehouse.\n")


def fake_llm(delay_s: float) -> ThreadingHTTPServer:
    """An OpenAI-compatible chat endpoint on 127.0.0.1 answering every request after ``delay_s``."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            time.sleep(delay_s)
            payload = json.dumps({"choices": [{"message": {"content": "Ninety-seven days [1]."}}]}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def add_keys(home: Path) -> dict[str, str]:
    """The bench's API keys (written with this checkout's key store; the file format is shared)."""
    from infra.home import HomeLayout
    from infra.serving.runtime import key_store

    store = key_store(HomeLayout(home))
    add = lambda name, scopes: store.add(name, scopes, "100000/minute")[0]
    return {"asker": add("asker", ["kb:docs:read"]), "writer": add("writer", ["kb:docs:write", "kb:docs:read"]),
            "reader": add("other user", ["kb:docs:read"]), "labeller": add("labeller", ["fraud:label"]),
            "approver": add("approver", ["registry:approve"])}


async def index_document(url: str, key: str, timeout_s: float = 300) -> None:
    async with aiohttp.ClientSession() as client:
        form = aiohttp.FormData()
        form.add_field("collection", "docs")
        form.add_field("files", DOC.encode(), filename="lease.txt", content_type="text/plain")
        async with client.post(f"{url}/v1/kb/documents", data=form, headers={"X-API-Key": key}) as r:
            assert r.status == 202, await r.text()
            job = (await r.json())["job_id"]
        deadline = time.monotonic() + timeout_s
        while True:
            async with client.get(f"{url}/v1/kb/jobs/{job}", headers={"X-API-Key": key}) as r:
                state = (await r.json())["state"]
            if state in ("done", "failed"):
                assert state == "done", f"ingest job {state}"
                return
            assert time.monotonic() < deadline, "the ingest job did not finish"
            await asyncio.sleep(0.5)


async def timed(client: aiohttp.ClientSession, method: str, url: str, key: str, body: Any = None) -> tuple[int, float]:
    start = time.perf_counter()
    try:
        async with client.request(method, url, json=body, headers={"X-API-Key": key},
                                  timeout=aiohttp.ClientTimeout(total=60)) as r:
            await r.read()
            status = r.status
    except (aiohttp.ClientError, TimeoutError):
        status = 599
    return status, time.perf_counter() - start


async def load(url: str, keys: dict[str, str], asks: int, seconds: float, rate: float) -> dict[str, Any]:
    label = {"labels": [{"transaction_id": "tx-1", "account_id": "A1", "terminal_id": "T1",
                         "timestamp": "2025-03-01T10:00:00", "label": 1}]}
    routes = {
        "labels": ("POST", f"{url}/v1/fraud/labels", keys["labeller"], label),
        "approvals": ("GET", f"{url}/v1/registry/approvals", keys["approver"], None),
        "collections": ("GET", f"{url}/v1/kb/collections", keys["reader"], None),
    }
    results: dict[str, list[tuple[int, float]]] = {name: [] for name in ["ask", *routes]}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as client:
        async def ask(i: int) -> None:
            results["ask"].append(await timed(client, "POST", f"{url}/v1/kb/ask", keys["asker"],
                                              {"collection": "docs", "question": f"What notice period? ({i})"}))

        async def steady(name: str) -> None:
            method, target, key, body = routes[name]
            pending = []
            for _i in range(int(seconds * rate)):
                pending.append(asyncio.create_task(timed(client, method, target, key, body)))
                await asyncio.sleep(1 / rate)
            results[name].extend(await asyncio.gather(*pending))

        # warm-up, untimed: each route once (first calls import torch, Prefect, the embedder...)
        for method, target, key, body in routes.values():
            await timed(client, method, target, key, body)
        await timed(client, "POST", f"{url}/v1/kb/ask", keys["reader"], {"collection": "docs", "question": "warm-up"})
        ask_tasks = [asyncio.create_task(ask(i)) for i in range(asks)]
        await asyncio.sleep(0.5)  # the asks are in before the other routes are timed
        await asyncio.gather(*(steady(name) for name in routes))
        await asyncio.gather(*ask_tasks)
    out = {}
    for name, got in results.items():
        s = summary([lat for _, lat in got], Counter(status for status, _ in got), seconds, 1)
        out[name] = {k: s[k] for k in ("requests", "p50_ms", "p99_ms", "status")}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="checkout whose server runs (default: this one)")
    parser.add_argument("--asks", type=int, default=45)
    parser.add_argument("--llm-s", type=float, default=15.0, help="the fake LLM's answer time")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the other routes are timed")
    parser.add_argument("--rate", type=float, default=2.0, help="requests/s of each other route")
    args = parser.parse_args()
    llm = fake_llm(args.llm_s)
    with tempfile.TemporaryDirectory(prefix="isolation-bench-") as tmp:
        home = Path(tmp) / "home"
        keys = add_keys(home)
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("INDUSFLOW_")}
        env.update({"INDUSFLOW_HOME": str(home), "PYTHONPATH": str(args.root.resolve()), "OMP_NUM_THREADS": "1",
                    "HF_HUB_OFFLINE": "1", "INDUSFLOW_SERVE_SENSOR_MODEL": "", "INDUSFLOW_KB_COLLECTIONS": "docs",
                    "INDUSFLOW_LLM_URL": f"http://127.0.0.1:{llm.server_address[1]}/v1",
                    "INDUSFLOW_LLM_MODEL": "fake-chat"})
        url = f"http://127.0.0.1:{port}"
        proc = spawn_server([sys.executable, "-m", "flows.serve", "--port", str(port)], env=env, cwd=args.root,
                            log=Path(tmp) / "server.log", ready_url=f"{url}/healthz")
        try:
            asyncio.run(index_document(url, keys["writer"]))
            routes = asyncio.run(load(url, keys, args.asks, args.seconds, args.rate))
        finally:
            stop_server(proc)
            llm.shutdown()
    print(json.dumps({"bench": "serve_isolation", "root": str(args.root), "asks": args.asks, "llm_s": args.llm_s,
                      "seconds": args.seconds, "rate_per_route": args.rate, "routes": routes,
                      "loadavg": Path("/proc/loadavg").read_text().split()[:3]}))


if __name__ == "__main__":
    main()
