"""Which ASGI stack serves the fraud model: FastAPI + uvicorn or LitServe? Prints one JSON line.

The same small registered fraud sequence model (trained briefly on synthetic transactions,
registered in a throwaway home, loaded back through the registry) behind both stacks, with the
same request (``{"rows": [<model inputs of a transaction>...]}``), the same decode, forward and
encode code, one server process each, one torch thread, closed-loop loopback clients in this
process. Stacks: FastAPI + uvicorn with the model called inline on the event loop, or in a worker
thread (our :class:`~infra.serving.batching.DynamicBatcher` with batch size 1), LitServe
(``LitAPI``; its inference worker is a separate process fed through queues), and both with
dynamic batching on (at most 16 requests, 2 ms wait: our batcher, LitServe's own). Only the stack differs; authentication, limits and audit are not
part of this comparison (they are the same middleware whichever stack runs them).

Usage: ``python bench/serve_stack_bench.py [--seconds 4]``
"""

# No ``from __future__ import annotations`` here: FastAPI and LitServe read the annotations of
# route functions and ``decode_request`` at run time, and the FastAPI route is defined locally.
import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import litserve as ls
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from loadgen import free_port, spawn_server, stop_server

MODEL = "fraud-seq"


# ------------------------------------------------------------------------------------
# the model, the rows, and the shared decode/forward/encode


def prepare(home: Path) -> None:
    """Train a tiny fraud model for a few steps, register it under ``home``, write sample rows."""
    import torch

    from infra.registry import ModelRegistry
    from infra.tables import assign_periods, time_split
    from solutions.fraud import pipeline as P
    from solutions.fraud.config import SequenceModelConfig
    from solutions.fraud.synthetic import generate_transactions

    torch.manual_seed(0)
    df = generate_transactions(n_accounts=200, n_terminals=60, n_days=28, fraud_rate=0.03, seed=1)
    split = time_split(df["timestamp"], train_days=14, val_days=3, delay_days=7, test_days=3)
    feats = P.build_features(df, assign_periods(df["timestamp"], split), 7)
    cfg = SequenceModelConfig()
    setup = P.sequence_setup(df, feats, cfg, periods=("train", "test"))
    model = P.build_model(setup.preprocessor, cfg, pos_weight=3.0)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    model.train()
    for i, batch in enumerate(setup.datamodule.train_dataloader()):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(batch).float(), batch["y"])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i >= 20:
            break
    registry = ModelRegistry(home / "registry")
    ref = registry.register(MODEL, model.state_dict(), params=P.model_params(model, setup.preprocessor, cfg),
                            metrics={"test/auprc": 0.0}, primary_metric="test/auprc")
    registry.set_alias(MODEL, "champion", ref.version)
    loader = setup.datamodule.test_dataloader() if hasattr(setup.datamodule, "test_dataloader") else None
    write_rows(home, {k: v for k, v in next(iter(loader)).items() if k != "y"})


def write_rows(home: Path, batch: dict[str, Any]) -> None:
    """The network's input tensors of (at most) 256 rows as the request rows both stacks decode
    (``home/rows.json``: per row, each input as nested lists; the inputs' dtypes)."""
    n = min(256, len(next(iter(batch.values()))))
    rows = [{k: v[i].tolist() for k, v in batch.items()} for i in range(n)]
    dtypes = {k: str(v.dtype).removeprefix("torch.") for k, v in batch.items()}
    (home / "rows.json").write_text(json.dumps({"rows": rows, "dtypes": dtypes}))


class FraudPredictor:
    """Decode rows, run the registered champion's network on the served runtime (ONNX Runtime where
    :func:`~solutions.fraud.online_model.onnx_runtime` can, else torch eager), encode scores (shared
    by both stacks)."""

    def __init__(self, home: Path) -> None:
        import torch

        from infra.registry import ModelRegistry
        from solutions.fraud import pipeline as P
        from solutions.fraud.online_model import OnlineFraudModel

        torch.set_num_threads(1)
        registry = ModelRegistry(home / "registry")
        ref = registry.get(MODEL)
        self.version = ref.version
        net, pre, cfg = P.model_from_params(ref.params, registry.load_state_dict(ref))
        self.model = OnlineFraudModel.from_registry(net, pre, cfg.seq_len, ref.name, ref.version, ref.params)
        self.dtypes = {k: np.dtype(v) for k, v in json.loads((home / "rows.json").read_text())["dtypes"].items()}
        self.torch = torch

    def __call__(self, rows: list[dict[str, Any]]) -> list[float]:
        # through numpy: half the time of torch.tensor on nested lists (2.0 against 3.8 ms for 256 rows)
        batch = {k: self.torch.from_numpy(np.asarray([r[k] for r in rows], dtype=dt)) for k, dt in self.dtypes.items()}
        return self.model.network_probabilities(batch).tolist()


# ------------------------------------------------------------------------------------
# the two servers (each run in its own process by this script)


def serve_fastapi(home: Path, port: int, batch: int) -> None:
    import uvicorn
    from fastapi import FastAPI, Request

    from infra.serving.batching import DynamicBatcher

    predictor = FraudPredictor(home)
    app = FastAPI()

    def score_batch(items: list[list[dict[str, Any]]]) -> list[list[float]]:
        scores = predictor([r for rows in items for r in rows])
        out, at = [], 0
        for rows in items:
            out.append(scores[at:at + len(rows)])
            at += len(rows)
        return out

    batcher = DynamicBatcher(score_batch, max_batch_size=max(batch, 1), max_wait_ms=2.0 if batch > 1 else 0.0)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/predict")
    async def predict(request: Request) -> dict[str, Any]:
        body = await request.json()
        if batch == 0:  # inline on the event loop
            scores = predictor(body["rows"])
        else:  # in the batcher's worker thread, alone (batch 1) or with concurrent requests
            [scores] = await batcher.submit([body["rows"]])
        return {"scores": scores, "model_version": predictor.version}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


class FraudLitAPI(ls.LitAPI):
    """The fraud predictor as a LitServe API (module level: LitServe pickles it into its worker)."""

    def __init__(self, home: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.home = home

    def setup(self, device: str) -> None:
        self.predictor = FraudPredictor(Path(self.home))

    def decode_request(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        return request["rows"]

    def batch(self, inputs: list[list[dict[str, Any]]]) -> tuple[list[dict[str, Any]], list[int]]:
        return [r for rows in inputs for r in rows], [len(rows) for rows in inputs]

    def unbatch(self, output: tuple[list[float], list[int]]) -> list[list[float]]:
        scores, sizes = output
        out, at = [], 0
        for n in sizes:
            out.append(scores[at:at + n])
            at += n
        return out

    def predict(self, x: Any) -> Any:
        if isinstance(x, tuple):  # batched: (rows of all requests, sizes)
            return self.predictor(x[0]), x[1]
        return self.predictor(x)

    def encode_response(self, output: list[float]) -> dict[str, Any]:
        return {"scores": output, "model_version": self.predictor.version}


def serve_litserve(home: Path, port: int, batch: int) -> None:
    api = FraudLitAPI(str(home), max_batch_size=batch, batch_timeout=0.002 if batch > 1 else 0.0)
    server = ls.LitServer(api, accelerator="cpu", devices=1, workers_per_device=1, timeout=30)
    server.run(host="127.0.0.1", port=port, num_api_servers=1, generate_client_file=False, log_level="warning")


# ------------------------------------------------------------------------------------
# what our HTTP layer costs (in process, no sockets: only the ASGI stack differs)


def framework_overhead(requests: int = 1500, repeats: int = 3) -> dict[str, Any]:
    """Microseconds per request of the same trivial route in a bare FastAPI app and behind the
    project's layer (IP allow-list, body limit, timeout, API key + scope + rate limit, row check,
    audit line, metrics), interleaved, medians of ``repeats``."""
    import statistics
    from typing import Annotated

    import httpx
    from fastapi import APIRouter, Depends, FastAPI, Request

    from flows.serve.app import create_app
    from infra.home import HomeLayout
    from infra.serving.audit import record_audit
    from infra.serving.auth import Principal, require_scope
    from infra.serving.quotas import check_rows
    from infra.serving.runtime import Vertical, key_store
    from infra.settings import ServeSettings

    body = {"rows": [{"account_id": "A1", "x": 1.0}]}
    bare = FastAPI()

    @bare.post("/v1/x")
    async def bare_route(payload: dict[str, Any]) -> dict[str, Any]:
        return {"scores": [0.5] * len(payload["rows"]), "model_version": 1}

    router = APIRouter()

    @router.post("/v1/x")
    async def guarded_route(payload: dict[str, Any], request: Request,
                            principal: Annotated[Principal, Depends(require_scope("x:score"))]) -> dict[str, Any]:
        check_rows(request, len(payload["rows"]))
        record_audit(request, model="x", model_version=1, rows=len(payload["rows"]), decisions={"flagged": 0},
                     subjects=[r["account_id"] for r in payload["rows"]])
        return {"scores": [0.5] * len(payload["rows"]), "model_version": 1}

    with tempfile.TemporaryDirectory(prefix="serve-overhead-") as tmp:
        layout = HomeLayout(Path(tmp))
        key, _ = key_store(layout).add("bench", ["x:score"])
        guarded = create_app(ServeSettings(default_rate_limit="100000000/minute", ip_allow_list="127.0.0.0/8"),
                             verticals=[Vertical("x", router)], layout=layout)

        async def run(app: Any) -> float:
            transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1",
                                         headers={"X-API-Key": key}) as client:
                for _ in range(50):
                    await client.post("/v1/x", json=body)
                t0 = time.perf_counter()
                for _ in range(requests):
                    r = await client.post("/v1/x", json=body)
                assert r.status_code == 200, r.text
                return (time.perf_counter() - t0) / requests * 1e6

        times: dict[str, list[float]] = {"bare": [], "guarded": []}
        for _ in range(repeats):
            times["bare"].append(asyncio.run(run(bare)))
            times["guarded"].append(asyncio.run(run(guarded)))
    b, g = statistics.median(times["bare"]), statistics.median(times["guarded"])
    return {"bare_fastapi_us_per_request": round(b, 1), "with_our_layer_us_per_request": round(g, 1),
            "added_us_per_request": round(g - b, 1), "requests": requests, "repeats": repeats}


# ------------------------------------------------------------------------------------
# the measurement


def start(stack: str, home: Path, batch: int = 1) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    url = f"http://127.0.0.1:{port}"
    proc = spawn_server([sys.executable, __file__, "--serve", stack, "--home", str(home), "--port", str(port),
                         "--batch", str(batch)], env=env, cwd=ROOT, log=home / f"{stack}-{batch}-{port}.log",
                        ready_url=f"{url}/health", timeout_s=120)
    return proc, url


def measure(url: str, rows: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    from loadgen import closed_loop

    single = lambda i: {"rows": [rows[i % len(rows)]]}
    many = lambda i: {"rows": rows[:256]}
    out = {}
    for name, make, conc, n in (("c1_single", single, 1, 1), ("c16_single", single, 16, 1),
                                ("c16_rows256", many, 16, len(rows[:256]))):
        out[name] = asyncio.run(closed_loop(f"{url}/predict", make, concurrency=conc, seconds=seconds,
                                            rows_per_request=n))
    return out


def ratio(a: float, b: float) -> float | None:
    """a / b, or None when either side completed nothing in its window."""
    return round(a / b, 2) if a > 0 and b > 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per phase")
    parser.add_argument("--serve", choices=["fastapi", "litserve"], help=argparse.SUPPRESS)
    parser.add_argument("--home", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--overhead-only", action="store_true", help="only the in-process cost of our HTTP layer")
    args = parser.parse_args()
    if args.serve == "fastapi":
        serve_fastapi(args.home, args.port, args.batch)
        return
    if args.serve == "litserve":
        serve_litserve(args.home, args.port, args.batch)
        return

    if args.overhead_only:
        print(json.dumps({"bench": "serve_stack", "our_http_layer": framework_overhead()}))
        return
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="serve-stack-") as tmp:
        home = Path(tmp)
        prepare(home)
        rows = json.loads((home / "rows.json").read_text())["rows"]
        results: dict[str, Any] = {}
        for label, stack, batch in (("fastapi_uvicorn", "fastapi", 0), ("fastapi_worker_thread", "fastapi", 1),
                                    ("litserve", "litserve", 1), ("fastapi_batch16", "fastapi", 16),
                                    ("litserve_batch16", "litserve", 16)):
            t0 = time.perf_counter()
            proc, url = start(stack, home, batch)
            startup = time.perf_counter() - t0
            try:
                results[label] = {"startup_s": round(startup, 2), **measure(url, rows, args.seconds)}
            finally:
                stop_server(proc)
    import fastapi
    import uvicorn

    ratios = {
        f"{a}/{b}": {phase: ratio(results[a][phase]["req_per_s"], results[b][phase]["req_per_s"])
                     for phase in ("c1_single", "c16_single", "c16_rows256")}
        for a, b in (("fastapi_uvicorn", "litserve"), ("fastapi_worker_thread", "litserve"),
                     ("fastapi_batch16", "litserve_batch16"))
    }
    overhead = framework_overhead()
    print(json.dumps({
        "bench": "serve_stack", "our_http_layer": overhead,
        "load_avg_1m": {"before": round(load_before, 1), "after": round(os.getloadavg()[0], 1)},
        "cores": os.cpu_count(), "seconds_per_phase": args.seconds,
        "versions": {"fastapi": fastapi.__version__, "uvicorn": uvicorn.__version__,
                     "litserve": ls.__version__},
        "req_per_s_ratios": ratios, **results,
    }))


if __name__ == "__main__":
    main()
