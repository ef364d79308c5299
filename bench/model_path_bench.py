"""The served fraud GRU's forward pass on three paths: torch eager, torch.compile, ONNX Runtime.
Prints one JSON line.

Issue 47 serves the fraud model on the fastest path that keeps 1e-5 against batch scoring. This
bench builds the served model as ``bench/serve_floor.py`` does (``serve_bench.register_model``: the
tiny GRU trained a few steps and registered; loaded back through the registry and
:class:`solutions.fraud.online.OnlineFraudModel`), computes real inputs of new transactions through
the online state (``serve_bench``'s request stream, :meth:`OnlineFraudModel.tensors`), and times
the network's forward pass plus the sigmoid at batch sizes 1, 16, 64 and 256:

* ``eager``: ``torch.inference_mode()`` and the module, as :meth:`OnlineFraudModel.predict` runs it;
* ``compile``: ``torch.compile`` of the same module (default backend, ``dynamic=False``: one graph
  per batch size, compiled before timing; the compile seconds are reported);
* ``onnxruntime``: exported by :func:`infra.onnx.export_onnx` (dynamic batch axis), run by
  :func:`infra.onnx.onnx_session` with the same thread count as torch.

Each path's probabilities are compared with eager's on the same inputs (max absolute difference;
the serving path must keep 1e-5 against batch scoring). Calls are interleaved path by path in
``--rounds`` rounds so that the machine's load falls on all of them alike; the median is over all
timed calls, of the wall time and of the calling thread's CPU time (with one intra-op thread the
work runs on it; on a busy machine the CPU time is the figure the scheduler's delays leave alone).

Usage: ``OMP_NUM_THREADS=1 nice -n 10 python bench/model_path_bench.py [--calls 100] [--rounds 3] [--threads 1]``
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

BATCHES = (1, 16, 64, 256)


def served_model(home: Path) -> Any:
    """The served model, registered and loaded back as the server does."""
    from serve_bench import register_model

    register_model(home)
    return load_served(home)


def load_served(home: Path) -> Any:
    """The model ``serve_bench.register_model`` registered under ``home``, loaded back as the server
    loads it (its network on the served runtime: :func:`solutions.fraud.online_model.onnx_runtime`)."""
    from serve_bench import MODEL

    from infra.registry import ModelRegistry
    from solutions.fraud import pipeline as P
    from solutions.fraud.online import OnlineFraudModel

    registry = ModelRegistry(home / "registry")
    ref = registry.get(MODEL)
    net, pre, cfg = P.model_from_params(ref.params, registry.load_state_dict(ref))
    net.eval()
    return OnlineFraudModel.from_registry(net, pre, cfg.seq_len, ref.name, ref.version, ref.params)


def real_row_inputs(model: Any, home: Path, warm_requests: int = 40) -> list[Any]:
    """The model's inputs (:class:`~solutions.fraud.online_model.RowInputs`) of one 256-row request of
    new transactions, after ``warm_requests`` earlier ones filled the accounts' histories."""
    from serve_bench import Transactions

    from infra.online_state import open_state_store
    from solutions.fraud.online import OnlineFraudState, validate_rows

    tx = Transactions()
    state = OnlineFraudState.for_model(open_state_store(home / "state"), history_len=255)
    try:
        for _ in range(warm_requests + 1):
            rows = validate_rows(tx.body(256)["transactions"])
            with state.update() as batch:
                batch.load(rows.accounts, [])
                batch.check(rows)
                inputs = batch.apply(rows, model.delay_days, keep=model.seq_len)
    finally:
        state.store.close()
    return list(inputs)


def real_inputs(model: Any, home: Path, warm_requests: int = 40) -> dict[str, Any]:
    """The model's tensors of :func:`real_row_inputs`."""
    return model.tensors(real_row_inputs(model, home, warm_requests))


def _time(fn: Callable[[], Any], calls: int) -> tuple[list[float], list[float]]:
    """Wall and calling-thread CPU milliseconds of each call (one intra-op thread: the work runs on it)."""
    wall, cpu = [], []
    for _ in range(calls):
        t0, c0 = time.perf_counter(), time.thread_time()
        fn()
        c1, t1 = time.thread_time(), time.perf_counter()
        wall.append((t1 - t0) * 1000)
        cpu.append((c1 - c0) * 1000)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100, help="timed calls per path, batch size and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch and onnxruntime intra-op threads")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args()

    import torch

    from infra.onnx import export_onnx, onnx_feed, onnx_session

    torch.set_num_threads(args.threads)
    loadavg_before = Path("/proc/loadavg").read_text().strip()
    home = Path(tempfile.mkdtemp(prefix="model-path-bench-"))
    try:
        model = served_model(home)
        full = real_inputs(model, home)
        net = model.net.to(args.device)
        names = list(full)
        batches = {b: {k: v[:b].contiguous() for k, v in full.items()} for b in BATCHES}
        on_dev = {b: {k: v.to(args.device) for k, v in t.items()} for b, t in batches.items()}

        def eager(b: int) -> np.ndarray:
            with torch.inference_mode():
                return torch.sigmoid(net(on_dev[b]).float()).cpu().numpy().astype("float64")

        paths: dict[str, Callable[[int], np.ndarray]] = {"eager": eager}
        notes: dict[str, Any] = {}

        try:
            compiled = torch.compile(net, dynamic=False)
            t0 = time.perf_counter()
            with torch.inference_mode():
                for b in BATCHES:
                    compiled(on_dev[b])

            def compiled_path(b: int) -> np.ndarray:
                with torch.inference_mode():
                    return torch.sigmoid(compiled(on_dev[b]).float()).cpu().numpy().astype("float64")

            paths["compile"] = compiled_path
            notes["compile_s"] = round(time.perf_counter() - t0, 1)
        except Exception as exc:  # noqa: BLE001 (any compile failure is the finding: reported in the row, not hidden)
            notes["compile_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            traceback.print_exc(file=sys.stderr)

        onnx_path, onnx_names = export_onnx(model.net.cpu(), batches[16], home / "fraud.onnx", input_names=names)
        net.to(args.device)
        session = onnx_session(onnx_path, threads=args.threads, device=args.device)
        feeds = {b: onnx_feed(batches[b], onnx_names) for b in BATCHES}

        def ort(b: int) -> np.ndarray:
            logits = session.run(None, feeds[b])[0]
            return 1.0 / (1.0 + np.exp(-logits.astype("float64")))

        paths["onnxruntime"] = ort

        reference = {b: eager(b) for b in BATCHES}
        diff = {p: {b: float(np.max(np.abs(fn(b) - reference[b]))) for b in BATCHES} for p, fn in paths.items()}
        times: dict[str, dict[int, list[float]]] = {p: {b: [] for b in BATCHES} for p in paths}
        cpu: dict[str, dict[int, list[float]]] = {p: {b: [] for b in BATCHES} for p in paths}
        for _ in range(args.rounds):
            for b in BATCHES:
                for p, fn in paths.items():
                    _time(lambda fn=fn, b=b: fn(b), 10)  # warm
                    wall_ms, cpu_ms = _time(lambda fn=fn, b=b: fn(b), args.calls)
                    times[p][b] += wall_ms
                    cpu[p][b] += cpu_ms
        rows = {p: {str(b): {"median_ms": round(statistics.median(times[p][b]), 4),
                             "cpu_median_ms": round(statistics.median(cpu[p][b]), 4),
                             "us_per_row": round(1000 * statistics.median(times[p][b]) / b, 2),
                             "max_abs_diff_vs_eager": diff[p][b]} for b in BATCHES} for p in paths}
    finally:
        shutil.rmtree(home, ignore_errors=True)
    print(json.dumps({
        "bench": "model_path", "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": args.device, "cores": os.cpu_count(), "threads": args.threads, "torch": torch.__version__,
        "onnxruntime": __import__("onnxruntime").__version__, "seq_len": model.seq_len,
        "input_shapes_256": {k: list(v.shape) for k, v in full.items()},
        "calls_per_cell": args.calls * args.rounds, "notes": notes, "paths": rows,
        "loadavg": {"before": loadavg_before, "after": Path("/proc/loadavg").read_text().strip()},
    }))


if __name__ == "__main__":
    main()
