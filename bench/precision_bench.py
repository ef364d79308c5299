"""bf16-mixed against fp32 training of the fraud and sensor models: time and validation metric.

Each model trains through the generic train task (``tasks.train.train_model``, as the flows train
it) on the same data, seed and epochs, once per precision; the fraud model reports val/auprc, the
sensor model val/rmse (RUL cycles). Prints one JSON line. Made for a GPU (``bench/gpu_check.sh``
runs it); ``--accelerator cpu`` runs the same comparison on the CPU (bf16 autocast there).

Usage: ``python bench/precision_bench.py [--accelerator cuda] [--epochs 3] [--accounts 1500]
[--readings 300000] [--precisions 32-true bf16-mixed]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fraud_bench import fraud_setup  # bench/ is on the path above
from sensor_bench import alignment, sensor_setup


def _train(model, dm, key: str, hw, epochs: int, monitor: str, mode: str) -> dict:
    from tasks.train import TrainSpec, train_model

    started = time.perf_counter()
    result = train_model(model, dm, TrainSpec(run_key=key, max_epochs=epochs, patience=99, monitor=monitor,
                                              mode=mode, fresh=True, hardware=hw))
    return {
        "precision": result.precision,
        "seconds": round(time.perf_counter() - started, 2),
        "train_seconds": round(result.train_seconds, 2),
        "samples_per_s": round(result.samples_per_s or 0.0, 1),
        monitor: round(result.metrics[monitor], 4),
    }


def compare(accelerator: str, precisions: list[str], epochs: int, accounts: int, readings: int) -> dict:
    from infra.resources import TrainerArgs

    fraud_P, fraud_cfg, fraud, pos_weight = fraud_setup(accounts)
    _, grid = alignment(readings)
    sensor_P, sensor_cfg, norm, data, sensor_dm = sensor_setup(grid)
    out: dict = {"accelerator": accelerator, "epochs": epochs, "fraud": {}, "sensor": {}}
    for precision in precisions:
        hw = TrainerArgs(accelerator=accelerator, devices=1, strategy="auto", precision=precision, deterministic=False)
        model = fraud_P.build_model(fraud.preprocessor, fraud_cfg, pos_weight)
        out["fraud"][precision] = _train(model, fraud.datamodule, f"precision-fraud-{precision}", hw, epochs,
                                         "val/auprc", "max")
        model = sensor_P.build_predictor(len(norm.channels_), sensor_cfg.model, sensor_cfg.window, 2e-3, data.train.fail)
        out["sensor"][precision] = _train(model, sensor_dm, f"precision-sensor-{precision}", hw, epochs,
                                          "val/rmse", "min")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator", default="cuda")
    parser.add_argument("--precisions", nargs="+", default=["32-true", "bf16-mixed"])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--accounts", type=int, default=1500, help="synthetic fraud accounts")
    parser.add_argument("--readings", type=int, default=300_000, help="synthetic sensor readings")
    args = parser.parse_args()
    os.environ.setdefault("INDUSFLOW_HOME", tempfile.mkdtemp(prefix="bench-precision-"))
    import tasks.train
    tasks.train.PROGRESS_BAR = False  # time the training, not the bar
    import logging

    logging.disable(logging.WARNING)
    result = {"bench": "precision", **compare(args.accelerator, args.precisions, args.epochs, args.accounts,
                                              args.readings)}
    result["load_avg_1min"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
