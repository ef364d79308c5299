"""What one 256-row fraud request costs, part by part, against 20,000 rows/s. Prints one JSON line.

``bench/serve_bench.py`` measures the served rate; this bench says where a 256-row request's time
goes and what rate the parts allow, on the same machine, model and request bodies:

1. **HTTP floor**: a bare FastAPI route on uvicorn, with the server's own protocol class
   (:class:`infra.serving.protocol.GuardedHttpProtocol`) and event loop, that parses the request
   body and answers 256 results with orjson (no keys, state, model or audit), loaded by the same
   closed-loop aiohttp clients at concurrency 1 and 16 (``bench/loadgen.py``). Its time per
   request includes the client's, which shares the 2 cores.
2. **In process**, medians per 256-row request over ``--requests`` new requests (after a warm-up):
   validation (:func:`validate_rows`), the state update (load, transaction-owner and order
   check, :meth:`apply` and the owners' claims, the state store's commit with the scores and claims) and the model (its input tensors and
   forward pass: :meth:`OnlineFraudModel.predict`). Beside them, for comparison only, the time to
   commit the same changes as one append-only record in a SQLite file with the same settings
   (what a log-structured state store would pay inside the request).
3. **Served**: ``python -m flows.serve`` (batching on, as ``serve_bench.py`` runs it) at
   concurrency 1 and 16 with 256-row requests, for the side-by-side figure.
4. **The peer, stateless** (issue 47): LitServe serving the same registered GRU, on the same
   runtime (:class:`serve_stack_bench.FraudPredictor`: ONNX Runtime where the server uses it), on
   precomputed input tensors: each request carries the network's inputs of 256 new transactions
   (computed once by the online state, as JSON lists), so LitServe decodes and runs the network and
   keeps no state. LitServe's own batching, at most as many requests as fill the server's
   ``batch_max_rows``. Same client, concurrency 1 and 16. Needs ``litserve`` (the
   ``serve-bench`` extra); skipped with a note without it.

From these it prints the rate the parts allow at concurrency 1 (256 rows over the HTTP floor plus
the in-process parts; nothing else counted, so a ceiling), the time per row the validation and
state update would have to fit in for 20,000 rows/s once the HTTP floor and the model are paid,
and the ratios at concurrency 1 and 16: served / LitServe, and served / floor, where the floor is
the bare route plus the model (its input tensors and forward pass, ``in_process_ms_per_request.model``):
256 rows / (1 / the bare route's requests/s + the model's time).

Usage: ``OMP_NUM_THREADS=1 python bench/serve_floor.py [--seconds 5] [--requests 250] [--no-served] [--no-litserve]``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, Response

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from loadgen import closed_loop, free_port, spawn_server, stop_server

ROWS = 256
TARGET_ROWS_PER_S = 20_000
CONCURRENCY = (1, 16)


def floor_app() -> Any:
    """The bare route: parse the body, answer one result per row (the served answer's shape)."""
    import orjson

    app = FastAPI()

    @app.get("/readyz")
    async def ready() -> dict[str, bool]:
        return {"ready": True}

    @app.post("/v1/fraud/score")
    async def score(request: Request) -> Response:
        body = orjson.loads(await request.body())
        results = [{"transaction_id": str(row.get("transaction_id")), "score": 0.5, "flagged": False,
                    "threshold": 0.5, "model": "floor", "model_version": 1} for row in body["transactions"]]
        return Response(orjson.dumps({"model": "floor", "model_version": 1, "threshold": 0.5, "results": results}),
                        media_type="application/json")

    return app


def serve_floor(port: int) -> None:
    """Run :func:`floor_app` as ``flows.serve`` runs its app (same HTTP protocol class)."""
    import uvicorn

    from infra.serving.protocol import GuardedHttpProtocol

    uvicorn.run("serve_floor:floor_app", factory=True, host="127.0.0.1", port=port, log_level="warning",
                http=GuardedHttpProtocol, app_dir=str(Path(__file__).resolve().parent))


def http_floor(tx: Any, seconds: float) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    log = Path(tempfile.mkdtemp(prefix="serve-floor-")) / "server.log"
    proc = spawn_server([sys.executable, str(Path(__file__).resolve()), "--serve-floor", str(port)], env=env,
                        cwd=ROOT, log=log, ready_url=f"{url}/readyz")
    try:
        return {f"c{conc}": asyncio.run(closed_loop(f"{url}/v1/fraud/score", tx.feed(ROWS, seconds + 0.5),
                                                    concurrency=conc, seconds=seconds, rows_per_request=ROWS))
                for conc in CONCURRENCY}
    finally:
        stop_server(proc)
        shutil.rmtree(log.parent, ignore_errors=True)


def served(home: Path, seconds: float) -> dict[str, Any]:
    """``python -m flows.serve`` (batching on, as ``serve_bench.py`` runs it), 256-row requests of new
    transactions at each concurrency."""
    from serve_bench import Transactions, start_server

    from infra.serving.auth import KeyStore
    from infra.settings import ServeSettings

    key, _ = KeyStore(home / "serving" / "keys.json").add("bench", ["admin"])
    proc, url = start_server(home, ServeSettings().batch_max_size)
    try:
        tx = Transactions()
        return {f"c{conc}": asyncio.run(closed_loop(f"{url}/v1/fraud/score", tx.feed(ROWS, seconds + 0.5),
                                                    concurrency=conc, seconds=seconds, rows_per_request=ROWS,
                                                    headers={"X-API-Key": key}))
                for conc in CONCURRENCY}
    finally:
        stop_server(proc)


def litserve(home: Path, model: Any, seconds: float) -> dict[str, Any]:
    """LitServe serving the same registered network stateless, on the input tensors of 256 new
    transactions (as the online state computed them after 40 earlier requests), same client."""
    import orjson
    import serve_stack_bench as stack
    from model_path_bench import real_inputs

    from infra.serving.runtime import ServeTuning

    stack.write_rows(home, real_inputs(model, home / "litserve"))
    body = orjson.dumps({"rows": orjson.loads((home / "rows.json").read_bytes())["rows"]})
    batch = max(1, ServeTuning().batch_max_rows // ROWS)
    proc, url = stack.start("litserve", home, batch)
    try:
        out: dict[str, Any] = {"max_batch_size": batch, "request_bytes": len(body),
                               "runtime": "onnxruntime" if model.runtime is not None else "eager"}
        for conc in CONCURRENCY:
            out[f"c{conc}"] = asyncio.run(closed_loop(f"{url}/predict", lambda i: body, concurrency=conc,
                                                      seconds=seconds, rows_per_request=ROWS))
        return out
    finally:
        stop_server(proc)


def ratios(served_phases: dict[str, Any] | None, peer: dict[str, Any] | None, floor_rows_per_s: dict[str, float],
           ) -> dict[str, dict[str, float | None]]:
    """served / LitServe and served / floor rows/s at each concurrency (None: a side not measured)."""
    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a and b else None

    out: dict[str, dict[str, float | None]] = {"served/litserve": {}, "served/floor": {}}
    for conc in CONCURRENCY:
        c = f"c{conc}"
        ours = served_phases[c]["rows_per_s"] if served_phases else None
        out["served/litserve"][c] = ratio(ours, peer[c]["rows_per_s"] if peer else None)
        out["served/floor"][c] = ratio(ours, floor_rows_per_s.get(c))
    return out


def in_process(home: Path, model: Any, tx: Any, n: int, warmup: int = 50,
               ) -> tuple[dict[str, float], dict[str, float], float]:
    """Median milliseconds per 256-row request of each part, as the server runs them (wall, and the
    thread's CPU: less sensitive to a loaded machine), and of committing the same changes as one
    append-only record (not part of the server's path). The server's GC thresholds are set meanwhile
    (a collection's pause lands in whichever part allocates)."""
    import orjson

    from flows.serve.app import GC_THRESHOLDS
    from infra.online_state import open_state_store
    from solutions.fraud.online import OnlineFraudState, validate_rows

    state = OnlineFraudState.for_model(open_state_store(home / "floor-state"), history_len=255)
    parts: dict[str, list[float]] = {k: [] for k in ("validate", "load_check", "apply", "model", "commit")}
    cpu: dict[str, list[float]] = {k: [] for k in parts}
    append_only: list[float] = []
    gc_before = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    side = sqlite3.connect(str(home / "floor-journal.sqlite"), isolation_level=None)
    side.execute("PRAGMA journal_mode=WAL")
    side.execute("PRAGMA synchronous=NORMAL")
    side.execute("CREATE TABLE journal (id INTEGER PRIMARY KEY, doc BLOB NOT NULL)")
    try:
        for i in range(warmup + n):
            body = tx.body(ROWS)["transactions"]
            t0, c0 = time.perf_counter(), time.thread_time()
            rows = validate_rows(body)
            t1, c1 = time.perf_counter(), time.thread_time()
            owners = [f"owner-{a}" for a in rows.accounts]  # the server: a keyed hash of the account
            with state.update() as batch:
                batch.load(rows.accounts, [])
                assert batch.owner_conflict(rows, owners) is None
                batch.check(rows)
                t2, c2 = time.perf_counter(), time.thread_time()
                inputs = batch.apply(rows, model.delay_days, keep=model.seq_len)
                batch.claim(rows, owners, model.delay_days)
                t3, c3 = time.perf_counter(), time.thread_time()
                scores = model.predict(inputs)
                t4, c4 = time.perf_counter(), time.thread_time()
                batch.record_scores(scores.tolist(), model.version)
            t5, c5 = time.perf_counter(), time.thread_time()  # the journal written and committed on leaving the block
            # the same changes as one append-only record instead (same pragmas, own file): what a
            # log-structured store would pay inside the request, before compacting in the background
            journal = batch.journal()
            t6 = time.perf_counter()
            side.execute("BEGIN IMMEDIATE")
            side.execute("INSERT INTO journal (doc) VALUES (?)", (orjson.dumps(
                {"rows": journal.account_rows, "accounts": journal.accounts, "terminal_rows": journal.terminal_rows,
                 "cut": journal.account_cut, "dropped": journal.dropped}),))
            side.execute("COMMIT")
            t7 = time.perf_counter()
            if i >= warmup:
                for key, dt_s in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True):
                    parts[key].append(dt_s * 1000)
                for key, dt_s in zip(cpu, (c1 - c0, c2 - c1, c3 - c2, c4 - c3, c5 - c4), strict=True):
                    cpu[key].append(dt_s * 1000)
                append_only.append((t7 - t6) * 1000)
    finally:
        gc.set_threshold(*gc_before)
        state.store.close()
        side.close()
    return ({k: round(statistics.median(v), 3) for k, v in parts.items()},
            {k: round(statistics.median(v), 3) for k, v in cpu.items()}, round(statistics.median(append_only), 3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per closed-loop phase")
    parser.add_argument("--requests", type=int, default=250, help="in-process requests measured (after 50 warm-up)")
    parser.add_argument("--no-served", action="store_true", help="skip the served flows.serve phase")
    parser.add_argument("--no-litserve", action="store_true", help="skip the LitServe (stateless) phase")
    parser.add_argument("--serve-floor", type=int, metavar="PORT", help=argparse.SUPPRESS)  # the bare server itself
    args = parser.parse_args()
    if args.serve_floor:
        serve_floor(args.serve_floor)
        return

    import torch
    from model_path_bench import load_served
    from serve_bench import Transactions, register_model

    torch.set_num_threads(1)
    load_before = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="serve-floor-"))
    served_phases = peer = None
    try:
        register_model(tmp)
        model = load_served(tmp)
        gc.collect()
        gc.freeze()  # the client's heap holds torch and the training run (see serve_bench.GcPauses)
        floor = http_floor(Transactions(), args.seconds)
        parts, cpu_parts, append_only_ms = in_process(tmp, model, Transactions(), args.requests)
        if not args.no_served:
            served_phases = served(tmp, args.seconds)
        if not args.no_litserve:
            try:
                peer = litserve(tmp, model, args.seconds)
            except ImportError as exc:  # the serve-bench extra is not installed
                peer = {"skipped": f"{exc} (pip install litserve: the serve-bench extra)"}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    http_ms = 1000.0 / floor["c1"]["req_per_s"] if floor["c1"]["req_per_s"] else float("nan")
    floor_rows_per_s = {f"c{conc}": round(ROWS / (1.0 / floor[f"c{conc}"]["req_per_s"] + parts["model"] / 1000.0))
                        for conc in CONCURRENCY if floor[f"c{conc}"]["req_per_s"]}
    in_ms = sum(parts.values())
    budget_ms = 1000.0 * ROWS / TARGET_ROWS_PER_S
    left_ms = budget_ms - http_ms - parts["model"]
    state_ms = parts["validate"] + parts["load_check"] + parts["apply"] + parts["commit"]
    print(json.dumps({
        "bench": "serve_floor", "cores": os.cpu_count(), "rows_per_request": ROWS,
        "load_avg_1m": {"before": round(load_before, 1), "after": round(os.getloadavg()[0], 1)},
        "http_floor": floor,
        "in_process_ms_per_request": {**parts, "total": round(in_ms, 3)},
        "in_process_cpu_ms_per_request": {**cpu_parts, "total": round(sum(cpu_parts.values()), 3)},
        "commit_as_one_append_only_record_ms": append_only_ms,
        "model_runtime": "onnxruntime" if model.runtime is not None else "eager",
        "served": served_phases,
        "litserve_stateless": peer,
        "floor_route_plus_model_rows_per_s": floor_rows_per_s,
        "ratios": ratios(served_phases, peer if peer and "skipped" not in peer else None, floor_rows_per_s),
        "ceiling_c1_rows_per_s": round(ROWS / ((http_ms + in_ms) / 1000.0)),
        "target": {"rows_per_s": TARGET_ROWS_PER_S, "ms_per_request": budget_ms,
                   "http_floor_ms": round(http_ms, 3), "model_ms": parts["model"],
                   "left_for_validation_and_state_ms": round(left_ms, 3),
                   "validation_and_state_ms": round(state_ms, 3),
                   "us_per_row_allowed": round(1000.0 * left_ms / ROWS, 2),
                   "us_per_row_measured": round(1000.0 * state_ms / ROWS, 2)},
    }))


if __name__ == "__main__":
    main()
