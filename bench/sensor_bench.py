"""Sensor benchmarks; prints one JSON line.

(a) alignment throughput: readings/s of cleaning + aligning a long table of about 1M
    readings (the synthetic fleet's multi-rate sensors) onto one grid per asset;
(b) training throughput (samples/s) of the generic train task vs a plain PyTorch loop on
    the same model, windows and batch size (interleaved repeats, medians, ratio).

Usage: ``python bench/sensor_bench.py [--readings N] [--repeats R] [--epochs E]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def alignment(n_readings: int) -> tuple[dict, object]:
    from solutions.sensor.align import align_readings, clean_events, clean_readings
    from solutions.sensor.config import AlignConfig, SyntheticFleetConfig
    from solutions.sensor.synthetic import generate_fleet

    per_asset = 7500  # readings per asset, a little below the default fleet's mean
    n_assets = max(4, -(-n_readings // per_asset))
    readings, events = generate_fleet(SyntheticFleetConfig(n_assets=n_assets, seed=11))
    readings = readings.iloc[:n_readings]
    events = events[events["asset_id"].isin(readings["asset_id"].unique())]
    cfg = AlignConfig()
    t0 = time.perf_counter()
    clean, report = clean_readings(readings, cfg)
    grid, report = align_readings(clean, clean_events(events), cfg, report)
    seconds = time.perf_counter() - t0
    return {
        "align_readings": len(readings),
        "align_assets": int(grid["asset_id"].nunique()),
        "align_grid_rows": len(grid),
        "align_seconds": round(seconds, 3),
        "align_readings_per_s": round(len(readings) / seconds),
    }, grid


def sensor_setup(grid):
    """The default sensor config's labelled windows of ``grid`` and a data module over them:
    ``(P, cfg, norm, data, dm)``; a fresh model: ``P.build_predictor(len(norm.channels_), cfg.model,
    cfg.window, 2e-3, data.train.fail)``."""
    from solutions.sensor import pipeline as P
    from solutions.sensor.config import SensorConfig
    from solutions.sensor.model import WindowDataModule
    from solutions.sensor.schema import BadReadingReport

    cfg = SensorConfig()
    splits = P.split_assets(grid, cfg.split)
    norm = P.fit_normalizer(grid, splits["train"] + splits["val"], cfg.window, "op_")
    labelled = P.labelled_assets(grid, splits["train"], 1.0)
    data = P.supervised_windows(grid, splits, labelled, norm, cfg.window, BadReadingReport())
    dm = WindowDataModule((data.train.x, data.train.rul, data.train.fail), (data.val.x, data.val.rul, data.val.fail),
                          cfg.finetune.batch_size)
    return P, cfg, norm, data, dm


def throughput(grid, repeats: int, epochs: int) -> dict:
    import torch

    from infra.hardware import set_cpu_threads
    from tasks.train import TrainSpec, train_model

    P, cfg, norm, data, dm = sensor_setup(grid)
    bs = cfg.finetune.batch_size

    def task_rate(r: int) -> float:
        model = P.build_predictor(len(norm.channels_), cfg.model, cfg.window, 2e-3, data.train.fail)
        res = train_model(model, dm, TrainSpec(run_key=f"bench-sensor-{os.getpid()}-{r}", max_epochs=epochs, patience=99,
                                               monitor="val/rmse", fresh=True))
        return res.samples_per_s, res.samples_per_cpu_s

    def plain_rate(r: int, batches: int | None = None) -> float:
        set_cpu_threads()
        torch.manual_seed(0)
        model = P.build_predictor(len(norm.channels_), cfg.model, cfg.window, 2e-3, data.train.fail)
        opt = model.configure_optimizers()
        loader = dm.train_dataloader()
        seen, seconds, cpu = 0, 0.0, 0.0
        for _ in range(epochs if batches is None else 1):
            model.train()
            t0, c0 = time.perf_counter(), time.process_time()
            for i, batch in enumerate(loader):
                if batches is not None and i >= batches:
                    break
                loss = _loss(model, batch)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                seen += len(batch[0])
            seconds += time.perf_counter() - t0
            cpu += time.process_time() - c0
        return seen / seconds, seen / cpu

    plain_rate(-1, batches=2)  # warm-up: one-time kernel and allocator set-up out of the first measure
    task_rates, plain_rates, ratios, cpu_ratios = [], [], [], []
    for r in range(repeats):
        # side by side, the order alternating so that neither side always runs first
        if r % 2 == 0:
            t_rate, t_cpu = task_rate(r)
            p_rate, p_cpu = plain_rate(r)
        else:
            p_rate, p_cpu = plain_rate(r)
            t_rate, t_cpu = task_rate(r)
        task_rates.append(t_rate)
        plain_rates.append(p_rate)
        ratios.append(t_rate / p_rate)
        cpu_ratios.append(t_cpu / p_cpu)  # samples per CPU second: robust when other jobs load the cores
    t, p = statistics.median(task_rates), statistics.median(plain_rates)
    return {
        "train_windows": len(data.train),
        "batch_size": bs,
        "epochs": epochs,
        "task_samples_per_s": round(t, 1),
        "plain_samples_per_s": round(p, 1),
        "throughput_ratio": round(statistics.median(ratios), 3),
        "throughput_ratios": [round(x, 3) for x in ratios],
        "cpu_throughput_ratio": round(statistics.median(cpu_ratios), 3),
        "cpu_throughput_ratios": [round(x, 3) for x in cpu_ratios],
        "repeats": repeats,
        "threads": torch.get_num_threads(),
    }


def _loss(model, batch):
    import torch.nn.functional as F

    x, rul, fail = batch
    pred, logit = model(x)
    return F.mse_loss(pred, rul / model.hparams.rul_cap) + model.hparams.fail_weight * F.binary_cross_entropy_with_logits(
        logit, fail, pos_weight=__import__("torch").tensor(model.hparams.pos_weight)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readings", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("INDUSFLOW_HOME", tempfile.mkdtemp(prefix="bench-sensor-"))
    import tasks.train
    tasks.train.PROGRESS_BAR = False  # time the training, not the bar
    import logging

    logging.disable(logging.WARNING)
    result, grid = alignment(args.readings)
    result.update(throughput(grid, args.repeats, args.epochs))
    result["load_avg_1min"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
