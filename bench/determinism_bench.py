"""The cost of deterministic training; prints one JSON line.

Trains the fraud sequence model (GRU) and the sensor RUL model (1D-CNN) through the
generic train task with ``deterministic`` on and off, interleaved (on, off, on, off, ...),
and reports the median training throughput (samples/s of training batches) of each mode
and their ratio (deterministic / not). It also checks what determinism buys: the weights'
hashes of the repeated deterministic runs (all equal when reproducible).

Usage: ``python bench/determinism_bench.py [--repeats R] [--epochs E] [--threads T]``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _hash(module) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def fraud_case():
    """(build model, datamodule, seed) of a small synthetic fraud set."""
    from infra.tables import assign_periods, time_split
    from solutions.fraud import pipeline as P
    from solutions.fraud import schema as S
    from solutions.fraud.config import SequenceModelConfig
    from solutions.fraud.synthetic import generate_transactions

    df = generate_transactions(n_accounts=600, n_terminals=300, n_days=40, fraud_rate=0.02, seed=1)
    bounds = time_split(df[S.TIMESTAMP], train_days=14, delay_days=7, test_days=7, val_days=3)
    feats = P.build_features(df, assign_periods(df[S.TIMESTAMP], bounds), 7)
    cfg = SequenceModelConfig(seq_len=16)
    setup = P.sequence_setup(df, feats, cfg)
    return (lambda: P.build_model(setup.preprocessor, cfg, 3.0)), setup.datamodule, "val/loss", cfg.seed


def sensor_case():
    """(build model, datamodule, seed) of the synthetic sensor fleet."""
    from solutions.sensor import pipeline as P
    from solutions.sensor.config import SensorConfig, SyntheticFleetConfig
    from solutions.sensor.data import fleet_events, fleet_readings, readings_plan
    from solutions.sensor.model import WindowDataModule
    from solutions.sensor.schema import BadReadingReport

    cfg = SensorConfig(fleet=SyntheticFleetConfig(n_assets=24, seed=5))
    with tempfile.TemporaryDirectory() as tmp:
        readings, events = Path(tmp, "r.parquet"), Path(tmp, "e.parquet")
        fleet_readings(cfg.fleet).to_parquet(readings)
        fleet_events(cfg.fleet).to_parquet(events)
        grid, _ = readings_plan(readings, events, {}, cfg.align).build()
    splits = P.split_assets(grid, cfg.split)
    norm = P.fit_normalizer(grid, splits["train"] + splits["val"], cfg.window, "op_")
    labelled = P.labelled_assets(grid, splits["train"], 1.0)
    data = P.supervised_windows(grid, splits, labelled, norm, cfg.window, BadReadingReport())
    dm = WindowDataModule((data.train.x, data.train.rul, data.train.fail), (data.val.x, data.val.rul, data.val.fail),
                          cfg.finetune.batch_size, seed=cfg.finetune.seed)
    build = lambda: P.build_predictor(len(norm.channels_), cfg.model, cfg.window, 2e-3, data.train.fail,
                                      seed=cfg.finetune.seed)
    return build, dm, "val/rmse", cfg.finetune.seed


def measure(name: str, case, repeats: int, epochs: int, threads: int) -> dict:
    from infra.compute import HardwareRequest, resolve_training
    from tasks.train import TrainSpec, train_model

    build, dm, monitor, seed = case()
    rates: dict[bool, list[float]] = {True: [], False: []}
    hashes: dict[bool, list[str]] = {True: [], False: []}
    for r in range(repeats):
        for deterministic in (True, False):
            hw = resolve_training(request=HardwareRequest(accelerator="cpu", devices=1, num_threads=threads,
                                                          deterministic=deterministic))
            model = build()
            res = train_model(model, dm, TrainSpec(run_key=f"bench-det-{name}-{os.getpid()}-{r}-{deterministic}",
                                                   max_epochs=epochs, patience=99, monitor=monitor, seed=seed,
                                                   hardware=hw, fresh=True))
            rates[deterministic].append(res.samples_per_s)
            hashes[deterministic].append(_hash(model))
    on, off = statistics.median(rates[True]), statistics.median(rates[False])
    return {
        f"{name}_det_samples_per_s": round(on, 1),
        f"{name}_nondet_samples_per_s": round(off, 1),
        f"{name}_det_over_nondet": round(on / off, 3),
        f"{name}_det_weight_hashes_equal": len(set(hashes[True])) == 1,
        f"{name}_nondet_weight_hashes_equal": len(set(hashes[False])) == 1,
        f"{name}_det_hash": hashes[True][0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", choices=["fraud", "sensor"], default=None)
    args = parser.parse_args()
    import tasks.train
    tasks.train.PROGRESS_BAR = False  # time the training, not the bar
    home = tempfile.mkdtemp(prefix="indusflow-bench-det-")
    os.environ["INDUSFLOW_HOME"] = home
    import logging

    logging.disable(logging.INFO)
    out = {"repeats": args.repeats, "epochs": args.epochs, "threads": args.threads}
    for name, case in (("fraud", fraud_case), ("sensor", sensor_case)):
        if args.only in (None, name):
            out.update(measure(name, case, args.repeats, args.epochs, args.threads))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
