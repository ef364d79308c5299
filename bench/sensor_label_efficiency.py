"""Label efficiency on the synthetic fleet: test RMSE with 5%, 20% and 100% of the
training assets labelled, fine-tuned from the pre-trained encoder vs trained from scratch.

Uses the same plain steps as ``flows.sensor`` (no Prefect): one pre-training, then one
fine-tuning and one from-scratch run per label fraction and seed, all on the same split
and test cuts. Prints a markdown table and one JSON line.

Usage: ``python bench/sensor_label_efficiency.py [--fractions 0.05 0.2 1.0] [--seeds 0]``
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.05, 0.2, 1.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--n-assets", type=int, default=None)
    args = parser.parse_args()
    os.environ.setdefault("INDUSFLOW_HOME", tempfile.mkdtemp(prefix="bench-label-eff-"))
    os.environ.setdefault("INDUSFLOW_TRAIN_PROGRESS_BAR", "false")
    logging.disable(logging.WARNING)

    import numpy as np

    from solutions.sensor import pipeline as P
    from solutions.sensor.align import align_readings, clean_events, clean_readings
    from solutions.sensor.config import SensorConfig
    from solutions.sensor.model import WindowDataModule, predict
    from solutions.sensor.synthetic import generate_fleet
    from tasks.finetune import finetune_model
    from tasks.train import TrainSpec, train_model

    cfg = SensorConfig()
    if args.n_assets:
        cfg = cfg.model_copy(update={"fleet": cfg.fleet.model_copy(update={"n_assets": args.n_assets})})
    readings, events = generate_fleet(cfg.fleet)
    clean, report = clean_readings(readings, cfg.align)
    grid, report = align_readings(clean, clean_events(events), cfg.align, report)
    splits = P.split_assets(grid, cfg.split)
    wcfg = cfg.window
    norm = P.fit_normalizer(grid, splits["train"] + splits["val"], wcfg, cfg.align.op_prefix)
    t0 = time.perf_counter()
    tr, va = P.pretrain_windows(grid, splits, norm, wcfg, cfg.pretrain.stride)
    pre = P.build_pretrainer(len(norm.channels_), cfg.model, cfg.pretrain)
    pre_res = train_model(pre, WindowDataModule((tr.x,), (va.x,), cfg.pretrain.batch_size),
                          TrainSpec(run_key="le-pre", max_epochs=cfg.pretrain.max_epochs, patience=cfg.pretrain.patience, monitor="val/loss"))
    pre_s = time.perf_counter() - t0
    state = pre.state_dict()
    ft = cfg.finetune
    rows = []
    for seed in args.seeds:
        for frac in args.fractions:
            labelled = P.labelled_assets(grid, splits["train"], frac, seed)
            data = P.supervised_windows(grid, splits, labelled, norm, wcfg, report)
            for pretrained in (True, False):
                model = P.build_predictor(len(norm.channels_), cfg.model, wcfg, ft.lr, data.train.fail)
                dm = WindowDataModule((data.train.x, data.train.rul, data.train.fail), (data.val.x, data.val.rul, data.val.fail),
                                      ft.batch_size, ft.min_samples_per_epoch, seed)
                spec = TrainSpec(run_key=f"le-{seed}-{frac}-{int(pretrained)}", max_epochs=ft.max_epochs, patience=ft.patience,
                                 monitor="val/rmse", mode="min", seed=seed)
                t1 = time.perf_counter()
                if pretrained:
                    model.load_encoder(state)
                    finetune_model(model, dm, spec, mode="progressive", groups=("heads", "encoder.proj", "encoder.convs"),
                                   every_n_epochs=ft.unfreeze_every)
                else:
                    train_model(model, dm, spec)
                pred, _ = predict(model, data.test_last.x)
                rmse = float(np.sqrt(np.mean((pred - data.test_last.rul) ** 2)))
                rows.append({"seed": seed, "label_fraction": frac, "labelled_assets": len(labelled), "pretrained": pretrained,
                             "test_rmse": round(rmse, 2), "seconds": round(time.perf_counter() - t1, 1)})
                print(rows[-1], file=sys.stderr, flush=True)
    print("| labelled | assets | pre-trained RMSE | scratch RMSE |\n|---|---|---|---|")
    for frac in args.fractions:
        sel = [r for r in rows if r["label_fraction"] == frac]
        p = np.mean([r["test_rmse"] for r in sel if r["pretrained"]])
        s = np.mean([r["test_rmse"] for r in sel if not r["pretrained"]])
        print(f"| {frac:.0%} | {sel[0]['labelled_assets']} | {p:.2f} | {s:.2f} |")
    print(json.dumps({"test_units": len(data.test_last), "pretrain_seconds": round(pre_s, 1),
                      "pretrain_best_val_loss": pre_res.best_score, "runs": rows}))


if __name__ == "__main__":
    main()
