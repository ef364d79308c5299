"""Compression benchmark; prints one JSON line.

Latency (p50 per batch) and throughput of the fraud sequence model as fp32 PyTorch,
dynamic-INT8 PyTorch and fp32 onnxruntime, on the same inputs (test-period sequences of
seeded synthetic data) at batch sizes 1, 32 and 256, with the speed-up ratios against
fp32, the file sizes and the output differences against fp32.

Usage: ``python bench/compress_bench.py [--model NAME[:VERSION]] [--accounts N] [--threads T]``
(``--model`` reads the registry under ``INDUSFLOW_HOME``; without it an untrained model of
the default size is used: latency does not depend on the weights).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _inputs(n_accounts: int, seq_len: int):
    from infra.tables import assign_periods, time_split
    from solutions.fraud import pipeline as P
    from solutions.fraud.config import SequenceModelConfig
    from solutions.fraud.synthetic import generate_transactions

    df = generate_transactions(n_accounts=n_accounts, n_terminals=max(50, n_accounts // 3), n_days=58)
    split = time_split(df["timestamp"], train_days=14, val_days=3, delay_days=7, test_days=7)
    periods = assign_periods(df["timestamp"], split)
    feats = P.build_features(df, periods, 7)
    cfg = SequenceModelConfig(seq_len=seq_len, batch_size=256)
    setup = P.sequence_setup(df, feats, cfg)
    return P, cfg, setup


def main(argv: list[str] | None = None) -> int:
    import numpy as np
    import torch

    import tasks.compress as C
    from infra.hardware import set_cpu_threads

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="registered fraud model NAME[:VERSION] (default: untrained default-size model)")
    parser.add_argument("--accounts", type=int, default=1000, help="synthetic accounts for the inputs (default %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for torch and onnxruntime (default %(default)s)")
    parser.add_argument("--iters", type=int, default=30, help="timed repeats per point (default %(default)s)")
    args = parser.parse_args(argv)
    set_cpu_threads(args.threads)

    if args.model:
        from infra.registry import ModelRegistry
        from solutions.fraud.model import build_module

        registry = ModelRegistry()
        ref = registry.resolve(args.model)
        model = C.load_variant(ref, registry, build_module)
        seq_len, source = int(ref.params["seq_len"]), ref.spec
        P, cfg, setup = _inputs(args.accounts, seq_len)
    else:
        P, cfg, setup = _inputs(args.accounts, 16)
        model = P.build_model(setup.preprocessor, cfg, 1.0).eval()
        source = "untrained FraudSequenceModel (default size)"
    model = model.cpu().eval()
    names = ["step_num", "step_cat", "ctx_num", "ctx_cat"]
    batch = next(iter(setup.datamodule.test_dataloader()))
    batch = {k: batch[k] for k in names}
    qmodel = C.quantize_dynamic_int8(model)
    tmp = Path(tempfile.mkdtemp(prefix="compress-bench-"))
    onnx_path, _ = C.export_onnx(model, {k: v[:2] for k, v in batch.items()}, tmp / "m.onnx", input_names=names)
    session = C.onnx_session(onnx_path, threads=args.threads)
    sizes = {
        "fp32": C.save_state(model.state_dict(), tmp / "fp32.safetensors"),
        "int8": C.save_state(C.int8_state_dict(qmodel), tmp / "int8.safetensors"),
        "onnx": C.file_size(onnx_path),
    }
    with torch.inference_mode():
        ref_out = C.call_model(model, batch).numpy()
        int8_diff = float(np.max(np.abs(C.call_model(qmodel, batch).numpy() - ref_out)))
    onnx_diff = float(np.max(np.abs(session.run(None, C.onnx_feed(batch, names))[0] - ref_out)))

    points = []
    for bs in (1, 32, 256):
        b = {k: v[:bs] for k, v in batch.items()}
        if len(b[names[0]]) < bs:
            continue
        row = {"batch": bs}
        # interleave the three engines so drifting machine load hits them alike
        lat = {"fp32": [], "int8": [], "onnx": []}
        for _ in range(3):
            lat["fp32"].append(C.torch_latency(model, b, iters=args.iters // 3 or 1, warmup=2))
            lat["int8"].append(C.torch_latency(qmodel, b, iters=args.iters // 3 or 1, warmup=2))
            lat["onnx"].append(C.onnx_latency(session, b, names, iters=args.iters // 3 or 1, warmup=2))
        for engine, runs in lat.items():
            p50 = float(np.median([r.p50_ms for r in runs]))
            row[f"{engine}_p50_ms"] = round(p50, 4)
            row[f"{engine}_samples_per_s"] = round(bs / (p50 / 1e3), 1)
        row["int8_speedup"] = round(row["fp32_p50_ms"] / row["int8_p50_ms"], 3)
        row["onnx_speedup"] = round(row["fp32_p50_ms"] / row["onnx_p50_ms"], 3)
        points.append(row)

    out = {
        "bench": "compress",
        "model": source,
        "params": C.param_count(model),
        "seq_len": int(batch["step_num"].shape[1]),
        "threads": args.threads,
        "torch": torch.__version__,
        "onnxruntime": __import__("onnxruntime").__version__,
        "size_bytes": sizes,
        "int8_size_ratio": round(sizes["fp32"] / sizes["int8"], 3),
        "int8_max_abs_diff_logit": int8_diff,
        "onnx_max_abs_diff_logit": onnx_diff,
        "points": points,
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
