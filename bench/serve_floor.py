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
4. **Features free** (``bench/serve_bound.py``): the same app (keys, quotas, body checks, audit,
   batcher, score log, response) serving a fraud predictor that keeps only what a stateful scorer
   pays whatever its features: validation, the ids' owners, the model on real inputs computed once,
   and each row and claim written to RocksDB. Its rate bounds what any feature design can reach with
   this app, model and store (``features_free/floor``). Its phases follow the served ones in each
   round; after the rounds, single-transaction requests at 200/s on the served and the features-free
   server in turn (p99, the issue's other target).
5. **The peer, stateless** (issue 47): LitServe serving the same registered GRU, on the same
   runtime (:class:`serve_stack_bench.FraudPredictor`: ONNX Runtime where the server uses it), on
   precomputed input tensors: each request carries the network's inputs of 256 new transactions
   (computed once by the online state, as JSON lists), so LitServe decodes and runs the network and
   keeps no state. LitServe's own batching, at most as many requests as fill the server's
   ``batch_max_rows``. Same client, concurrency 1 and 16. Needs ``litserve`` (the
   ``serve-bench`` extra); skipped with a note without it.

The bare route's, the served and the features-free phases alternate in ``--rounds`` rounds (all up at once),
each round with the model's time measured again, so that each round's served / floor ratio compares
phases a minute apart (the machine's speed drifts more than that between sequential phases);
medians over the rounds are reported, each round beside them. The served server starts from an
empty state; ``--warm-seconds 60`` first fills it as a server running for a while has it (0.5-0.65M
transactions: past the label delay, the terminal windows have rows to count, and each account
holds a full sequence). There 256-row requests ran at a third of the fresh state's rate, and at about
half once the terminal windows read numpy columns (2026-12-07).

From these it prints the rate the parts allow at concurrency 1 (256 rows over the HTTP floor plus
the in-process parts; nothing else counted, so a ceiling), the time per row the validation and
state update would have to fit in for 20,000 rows/s once the HTTP floor and the model are paid,
and the ratios at concurrency 1 and 16: served / LitServe, and served / floor, where the floor is
the bare route plus the model (its input tensors and forward pass, ``in_process_ms_per_request.model``):
256 rows / (1 / the bare route's requests/s + the model's time).

Usage: ``OMP_NUM_THREADS=1 python bench/serve_floor.py [--seconds 5] [--requests 250] [--rounds 3]
[--warm-seconds 0] [--no-served] [--no-litserve]``
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

from loadgen import closed_loop, fixed_rate, free_port, spawn_server, stop_server

ROWS = 256
TARGET_ROWS_PER_S = 20_000
CONCURRENCY = (1, 16)
SINGLE_RATE = 200  # single-transaction requests/s of the p99 phase (issue 47: p99 <= 5 ms there)


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


class Servers:
    """The bare route (:func:`floor_app`), ``python -m flows.serve`` (batching on, as ``serve_bench.py``
    runs it) and the same app with its features free (``serve_bound.py``, in a home of its own with the
    same registered model), all up at once, so that their phases alternate (:func:`rounds`)."""

    def __init__(self, home: Path, served: bool) -> None:
        from serve_bench import served_env, start_server

        from infra.serving.auth import KeyStore
        from infra.settings import ServeSettings

        self.urls: dict[str, str] = {}
        self.keys: dict[str, str] = {}
        self.procs: list[Any] = []
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        try:
            self._spawn("floor", "--serve-floor", env, home)
            if served:
                self.keys["served"], _ = KeyStore(home / "serving" / "keys.json").add("bench", ["admin"])
                proc, self.urls["served"] = start_server(home, ServeSettings().batch_max_size)
                self.procs.append(proc)
                bound = home / "bound"
                shutil.copytree(home / "registry", bound / "registry")
                self.keys["features_free"], _ = KeyStore(bound / "serving" / "keys.json").add("bench", ["admin"])
                self._spawn("features_free", "--serve-bound", served_env(bound), bound)
        except BaseException:
            self.stop()  # no server outlives a failed start
            raise

    def _spawn(self, name: str, flag: str, env: dict[str, str], home: Path) -> None:
        port = free_port()
        self.urls[name] = f"http://127.0.0.1:{port}"
        self.procs.append(spawn_server([sys.executable, str(Path(__file__).resolve()), flag, str(port)],
                                       env=env, cwd=ROOT, log=home / f"{name}-server.log",
                                       ready_url=f"{self.urls[name]}/readyz"))

    def phase(self, tx: Any, name: str, conc: int, seconds: float) -> dict[str, Any]:
        """One closed-loop phase of 256-row requests of new transactions on server ``name``."""
        key = self.keys.get(name)
        return asyncio.run(closed_loop(f"{self.urls[name]}/v1/fraud/score", tx.feed(ROWS, seconds + 0.5),
                                       concurrency=conc, seconds=seconds, rows_per_request=ROWS,
                                       headers={"X-API-Key": key} if key else None))

    def stop(self) -> None:
        for proc in self.procs:
            stop_server(proc)


def model_ms(model: Any, inputs: Any, calls: int = 25) -> float:
    """Median ms of the model's part (input tensors and forward pass) on one request's inputs, now."""
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        model.predict(inputs)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def _ratio(phase: dict[str, Any] | None, floor_rows: float | None) -> float | None:
    """A phase's rows/s over the floor's."""
    return round(phase["rows_per_s"] / floor_rows, 3) if phase and floor_rows else None


def rounds(servers: Servers, tx: Any, model: Any, inputs: Any, n_rounds: int, seconds: float) -> list[dict[str, Any]]:
    """``n_rounds`` rounds; in each, the model's time, then per concurrency the bare route's phase and
    the served one right after it (``tx``: the served phases' transactions, one stream with the warm-up's),
    so each round's served / floor ratio is measured within a minute. On
    a shared machine one process ran up to 40% slower from one minute to the next (2026-12-07:
    13.0-18.5 ms for the same in-process request), so phases compared minutes apart moved the ratio."""
    from serve_bench import Transactions

    # their own streams: the served state's clock moves only with what it scores
    floor_tx, bound_tx = Transactions(), Transactions()
    out = []
    for _ in range(n_rounds):
        one: dict[str, Any] = {"model_ms": round(model_ms(model, inputs), 3)}
        for conc in CONCURRENCY:
            floor = servers.phase(floor_tx, "floor", conc, seconds)
            served = servers.phase(tx, "served", conc, seconds) if "served" in servers.urls else None
            bound = (servers.phase(bound_tx, "features_free", conc, seconds) if "features_free" in servers.urls
                     else None)
            floor_rows = (round(ROWS / (1.0 / floor["req_per_s"] + one["model_ms"] / 1000.0))
                          if floor["req_per_s"] else None)
            one[f"c{conc}"] = {"http_floor": floor, "served": served, "features_free": bound,
                               "floor_route_plus_model_rows_per_s": floor_rows,
                               "served/floor": _ratio(served, floor_rows),
                               "features_free/floor": _ratio(bound, floor_rows)}
        out.append(one)
    return out


def single_rows(servers: Servers, tx: Any, n_rounds: int, seconds: float) -> dict[str, Any]:
    """Single-transaction requests at :data:`SINGLE_RATE` per second (open loop), on the served server
    and the features-free one in turn, ``n_rounds`` times: p50/p99 per round and their medians."""
    from serve_bench import Transactions

    streams = {"served": tx, "features_free": Transactions()}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in streams}
    for _ in range(n_rounds):
        for name, stream in streams.items():
            r = asyncio.run(fixed_rate(f"{servers.urls[name]}/v1/fraud/score", stream.feed(1, seconds + 1),
                                       rate=SINGLE_RATE, seconds=seconds, rows_per_request=1,
                                       headers={"X-API-Key": servers.keys[name]}))
            runs[name].append({k: r[k] for k in ("p50_ms", "p99_ms", "status")})
    return {"rate": SINGLE_RATE, **{f"{k}_p99_ms": round(statistics.median(p["p99_ms"] or 0.0 for p in v), 2)
                                    for k, v in runs.items()}, "by_round": runs}


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


def medians(done: list[dict[str, Any]]) -> dict[str, Any]:
    """Per concurrency, the medians over the rounds: the bare route's requests/s, the served rows/s and
    latencies, the floor's rows/s, and the served / floor ratio (the median of each round's own)."""
    def med(values: list[Any]) -> float | None:
        kept = [v for v in values if v is not None]
        return round(statistics.median(kept), 3) if kept else None

    out: dict[str, Any] = {}
    for conc in CONCURRENCY:
        c = f"c{conc}"
        phases = [r[c] for r in done]
        served = [p["served"] for p in phases if p["served"]]
        bound = [p["features_free"] for p in phases if p.get("features_free")]
        out[c] = {"http_floor_req_per_s": med([p["http_floor"]["req_per_s"] for p in phases]),
                  "floor_route_plus_model_rows_per_s": med([p["floor_route_plus_model_rows_per_s"] for p in phases]),
                  "served_rows_per_s": med([p["rows_per_s"] for p in served]),
                  "served_p50_ms": med([p["p50_ms"] for p in served]),
                  "served_p99_ms": med([p["p99_ms"] for p in served]),
                  "served/floor": med([p["served/floor"] for p in phases]),
                  "served/floor_by_round": [p["served/floor"] for p in phases],
                  "features_free_rows_per_s": med([p["rows_per_s"] for p in bound]),
                  "features_free_p50_ms": med([p["p50_ms"] for p in bound]),
                  "features_free/floor": med([p.get("features_free/floor") for p in phases]),
                  "features_free/floor_by_round": [p.get("features_free/floor") for p in phases]}
    return out


def in_process(home: Path, model: Any, tx: Any, n: int, warmup: int = 50,
               ) -> tuple[dict[str, float], dict[str, float], float, Any]:
    """Median milliseconds per 256-row request of each part, as the server runs them (wall, and the
    thread's CPU: less sensitive to a loaded machine), and of committing the same changes as one
    append-only record (not part of the server's path). The server's GC thresholds are set meanwhile
    (a collection's pause lands in whichever part allocates). Last, the inputs of the last request (what
    :func:`model_ms` times again in each round)."""
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
            {k: round(statistics.median(v), 3) for k, v in cpu.items()}, round(statistics.median(append_only), 3),
            inputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per closed-loop phase")
    parser.add_argument("--requests", type=int, default=250, help="in-process requests measured (after 50 warm-up)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of the bare route's and the served phases, alternated (medians reported)")
    parser.add_argument("--warm-seconds", type=float, default=0.0,
                        help="256-row load at concurrency 16 sent to the served server before the rounds (not "
                             "measured): its state then holds what a server running for a while holds")
    parser.add_argument("--no-served", action="store_true", help="skip the served flows.serve phases")
    parser.add_argument("--no-litserve", action="store_true", help="skip the LitServe (stateless) phase")
    parser.add_argument("--serve-floor", type=int, metavar="PORT", help=argparse.SUPPRESS)  # the bare server itself
    parser.add_argument("--serve-bound", type=int, metavar="PORT", help=argparse.SUPPRESS)  # the features-free one
    args = parser.parse_args()
    if args.serve_floor:
        serve_floor(args.serve_floor)
        return
    if args.serve_bound:
        from serve_bound import serve_bound

        serve_bound(args.serve_bound)
        return

    import torch
    from model_path_bench import load_served
    from serve_bench import Transactions, register_model

    torch.set_num_threads(1)
    load_before = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="serve-floor-"))
    peer = None
    try:
        register_model(tmp)
        model = load_served(tmp)
        gc.collect()
        gc.freeze()  # the client's heap holds torch and the training run (see serve_bench.GcPauses)
        parts, cpu_parts, append_only_ms, inputs = in_process(tmp, model, Transactions(), args.requests)
        servers = Servers(tmp, served=not args.no_served)
        try:
            tx = Transactions()  # one stream of new transactions for the warm-up and the rounds
            warm_rows = (servers.phase(tx, "served", 16, args.warm_seconds)["requests"] * ROWS
                         if args.warm_seconds > 0 and "served" in servers.urls else 0)
            done = rounds(servers, tx, model, inputs, args.rounds, args.seconds)
            single = single_rows(servers, tx, args.rounds, 2 * args.seconds) if "served" in servers.urls else None
        finally:
            servers.stop()
        if not args.no_litserve:
            try:
                peer = litserve(tmp, model, args.seconds)
            except ImportError as exc:  # the serve-bench extra is not installed
                peer = {"skipped": f"{exc} (pip install litserve: the serve-bench extra)"}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    summary = medians(done)
    if peer and "skipped" not in peer:
        for conc in CONCURRENCY:
            c = f"c{conc}"
            ours, theirs = summary[c]["served_rows_per_s"], peer[c]["rows_per_s"]
            summary[c]["served/litserve"] = round(ours / theirs, 3) if ours and theirs else None
    floor_req_s = summary["c1"]["http_floor_req_per_s"]
    http_ms = 1000.0 / floor_req_s if floor_req_s else float("nan")
    in_ms = sum(parts.values())
    budget_ms = 1000.0 * ROWS / TARGET_ROWS_PER_S
    left_ms = budget_ms - http_ms - parts["model"]
    state_ms = parts["validate"] + parts["load_check"] + parts["apply"] + parts["commit"]
    print(json.dumps({
        "bench": "serve_floor", "cores": os.cpu_count(), "rows_per_request": ROWS, "rounds": args.rounds,
        "served_state_warmed_with_rows": warm_rows,
        "load_avg_1m": {"before": round(load_before, 1), "after": round(os.getloadavg()[0], 1)},
        "medians": summary,
        "in_process_ms_per_request": {**parts, "total": round(in_ms, 3)},
        "in_process_cpu_ms_per_request": {**cpu_parts, "total": round(sum(cpu_parts.values()), 3)},
        "commit_as_one_append_only_record_ms": append_only_ms,
        "model_runtime": "onnxruntime" if model.runtime is not None else "eager",
        "by_round": done,
        "single_transaction": single,
        "litserve_stateless": peer,
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
