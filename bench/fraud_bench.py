"""Fraud benchmarks; prints one JSON line.

(a) training throughput (samples/s) of the generic train task vs a plain PyTorch loop on
    the same model, data and batch size (interleaved repeats, medians, ratio);
(b) wall time of the ``fraud-train`` flow vs the same plain functions called without
    Prefect (each on a fresh home so nothing is reused), with the Prefect API already
    running; the API's cold start is reported separately.

Usage: ``python bench/fraud_bench.py [--accounts N] [--repeats R] [--skip-flow]``
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


def fraud_setup(n_accounts: int):
    import numpy as np

    from infra.tables import assign_periods, time_split
    from solutions.fraud import pipeline as P
    from solutions.fraud.config import SequenceModelConfig
    from solutions.fraud.synthetic import generate_transactions

    df = generate_transactions(n_accounts=n_accounts, n_terminals=max(50, n_accounts // 3), n_days=58)
    split = time_split(df["timestamp"], train_days=14, val_days=3, delay_days=7, test_days=7)
    periods = assign_periods(df["timestamp"], split)
    feats = P.build_features(df, periods, 7)
    cfg = SequenceModelConfig()
    setup = P.sequence_setup(df, feats, cfg)
    labels = df.loc[periods == "train", "label"].to_numpy(dtype="float64")
    return P, cfg, setup, float(np.sqrt((len(labels) - labels.sum()) / max(labels.sum(), 1)))


def throughput(n_accounts: int, repeats: int, epochs: int = 2) -> dict:
    """Median of per-repeat ratios task/plain (each repeat runs both, in alternating order)."""
    import torch

    from infra.hardware import set_cpu_threads
    from tasks.train import TrainSpec, train_model

    P, cfg, setup, pos_weight = fraud_setup(n_accounts)
    n_train = len(setup.datamodule.splits["train"])
    def task_rate(r: int) -> float:
        # the train task (Lightning: checkpointing, early stopping, curves, logging included)
        model = P.build_model(setup.preprocessor, cfg, pos_weight)
        res = train_model(model, setup.datamodule, TrainSpec(run_key=f"bench-{os.getpid()}-{r}", max_epochs=epochs,
                                                             patience=99, monitor="val/loss", fresh=True))
        return res.samples_per_s, res.samples_per_cpu_s

    def plain_rate(r: int, batches: int | None = None) -> float:
        # a plain PyTorch loop over the same loader, model and optimiser
        set_cpu_threads()
        torch.manual_seed(0)
        model = P.build_model(setup.preprocessor, cfg, pos_weight)
        opt = model.configure_optimizers()
        loader = setup.datamodule.train_dataloader()
        seen, seconds, cpu = 0, 0.0, 0.0
        for _ in range(epochs if batches is None else 1):
            model.train()
            t0, c0 = time.perf_counter(), time.process_time()
            for i, batch in enumerate(loader):
                if batches is not None and i >= batches:
                    break
                loss = model._loss(model(batch).float(), batch["y"])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                seen += len(batch["y"])
            seconds += time.perf_counter() - t0
            cpu += time.process_time() - c0
        return seen / seconds, seen / cpu

    plain_rate(-1, batches=3)  # warm-up: one-time kernel and allocator set-up out of the first measure
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
        "train_rows": n_train,
        "batch_size": cfg.batch_size,
        "task_samples_per_s": round(t, 1),
        "plain_samples_per_s": round(p, 1),
        "throughput_ratio": round(statistics.median(ratios), 3),
        "throughput_ratios": [round(x, 3) for x in ratios],
        "cpu_throughput_ratio": round(statistics.median(cpu_ratios), 3),
        "cpu_throughput_ratios": [round(x, 3) for x in cpu_ratios],
        "repeats": repeats,
        "epochs": epochs,
    }


class _Plain:
    """A Prefect task stripped to its plain function (``with_options`` kept for wiring)."""

    def __init__(self, task) -> None:
        self.fn = task.fn

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def with_options(self, **_):
        return self


def flow_overhead(n_accounts: int) -> dict:
    from prefect import Task, flow

    import flows.fraud as F
    import flows.fraud.steps as fraud_steps
    import flows.fraud.train as fraud_train_module
    from infra.prefect_env import prefect_cli_settings
    from solutions.fraud.config import FraudTrainConfig, SyntheticDataConfig

    config = FraudTrainConfig(data=SyntheticDataConfig(n_accounts=n_accounts, n_terminals=max(50, n_accounts // 3)))

    @flow(name="bench-warmup")
    def warmup() -> int:
        return 1

    with prefect_cli_settings():
        t0 = time.perf_counter()
        warmup()  # starts the ephemeral API once
        cold = time.perf_counter() - t0
        os.environ["INDUSFLOW_HOME"] = tempfile.mkdtemp(prefix="bench-flow-")
        t0 = time.perf_counter()
        F.fraud_train(config=config)
        flow_s = time.perf_counter() - t0

    modules = (fraud_train_module, fraud_steps)  # the flow's and its steps' task references
    saved = {(m, n): getattr(m, n) for m in modules for n in dir(m) if isinstance(getattr(m, n), Task)}
    for (m, n), value in saved.items():
        setattr(m, n, _Plain(value))
    try:
        os.environ["INDUSFLOW_HOME"] = tempfile.mkdtemp(prefix="bench-plain-")
        t0 = time.perf_counter()
        F.fraud_train.fn(config=config)
        plain_s = time.perf_counter() - t0
    finally:
        for (m, n), value in saved.items():
            setattr(m, n, value)
    return {
        "flow_seconds": round(flow_s, 2),
        "plain_seconds": round(plain_s, 2),
        "flow_ratio": round(flow_s / plain_s, 3),
        "flow_ratio_target": 1.15,
        "prefect_api_cold_start_seconds": round(cold, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accounts", type=int, default=3000, help="synthetic accounts (default: the flow's default)")
    parser.add_argument("--throughput-accounts", type=int, default=1500, help="accounts for part (a)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats for part (a)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per training in part (a)")
    parser.add_argument("--skip-flow", action="store_true", help="only part (a)")
    args = parser.parse_args()
    import tasks.train
    tasks.train.PROGRESS_BAR = False  # time the training, not the bar
    os.environ["INDUSFLOW_HOME"] = tempfile.mkdtemp(prefix="bench-home-")
    from infra.hardware import usable_cpus

    out = {"bench": "fraud", "cpus": usable_cpus(), **throughput(args.throughput_accounts, args.repeats, args.epochs)}
    if not args.skip_flow:
        out.update(flow_overhead(args.accounts))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
