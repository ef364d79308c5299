"""Quick one-fold sweep of the sensor 1D-CNN recipe (plain PyTorch loop, for diagnosis).

Trains the RUL/failure CNN of ``sensor-train`` (built by ``pipeline.build_predictor``) on
one engine fold of a C-MAPSS training file with a plain AdamW + cosine loop, and prints
per epoch the RMSE on (a seventh of) the training windows, on the validation engines and
on the held-out engines' cut test units (last window), as one JSON line; ``--gbm`` adds
the gradient-boosting baseline on the same fold. It is the fast tool behind the table in
``bench/results/sensor_cnn_sweep.md``; the honest figures are ``bench/sensor_cv.py``'s.

Usage (one run is ~30-120 s on one core)::

    nice -n 10 python bench/sensor_cnn_sweep.py --cmapss-dir ../shared/data/cmapss --norm batch --fail-weight 0.5
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cmapss-dir", default=str(Path(__file__).resolve().parents[2] / "shared/data/cmapss"))
    parser.add_argument("--subset", default="FD001")
    parser.add_argument("--fold", type=int, default=0, help="Which of 5 engine folds is held out.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--length", type=int, default=None, help="Window length (default: the config's).")
    parser.add_argument("--age", action="store_true", help="Add the age channel (steps since the first reading).")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--noise", type=float, default=None, help="Input noise std.")
    parser.add_argument("--channels", type=int, default=None)
    parser.add_argument("--dropout", type=float, default=None)
    parser.add_argument("--norm", choices=("batch", "none"), default=None)
    parser.add_argument("--pooling", choices=("mean", "meanmax", "meanlast"), default=None)
    parser.add_argument("--fail-weight", type=float, default=None)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--weight-decay", type=float, default=1e-4)
    parser.add_argument("--flatten", action="store_true",
                        help="Variant: project the flattened per-step features instead of pooling over time.")
    parser.add_argument("--ema", type=float, default=None, help="Score an exponential moving average of the weights.")
    parser.add_argument("--gbm", action="store_true", help="Also fit the GBM baseline on the fold.")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()

    import logging

    import numpy as np
    import torch

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)
    from solutions.sensor import crossval as CV
    from solutions.sensor import evaluate as E
    from solutions.sensor import pipeline as P
    from solutions.sensor.cmapss import load_cmapss
    from solutions.sensor.config import SensorConfig, SensorSource
    from solutions.sensor.data import window_config
    from solutions.sensor.model import lr_factor, recalibrate_batchnorm, rul_fail_loss

    cfg = SensorConfig()
    model_upd = {k: v for k, v in {"channels": args.channels, "dropout": args.dropout, "norm": args.norm,
                                    "pooling": args.pooling, "fail_weight": args.fail_weight}.items() if v is not None}
    ft_upd = {k: v for k, v in {"input_noise": args.noise, "lr": args.lr, "max_epochs": args.epochs}.items()
              if v is not None}
    cfg = cfg.model_copy(update={
        "model": cfg.model.model_copy(update=model_upd), "finetune": cfg.finetune.model_copy(update=ft_upd),
        "window": cfg.window.model_copy(update=({"length": args.length} if args.length else {})
                                        | ({"age_channel": True} if args.age else {}))})
    mcfg, ft = cfg.model, cfg.finetune
    wcfg = window_config(SensorSource(cmapss_dir=args.cmapss_dir, subset=args.subset), cfg)
    grid, _ = load_cmapss(Path(args.cmapss_dir), args.subset)
    assets = CV.training_assets(grid)
    folds = CV.engine_folds(assets, 5, 0)
    splits = CV.fold_splits(assets, folds[args.fold], cfg.split.val_fraction, seed=args.fold)
    fd = CV.fold_data(grid, splits, cfg, wcfg, seed=args.fold)
    data = fd.data
    out: dict = {"tag": args.tag, "fold": args.fold, "seed": args.seed, "window": wcfg.length,
                 "model": mcfg.model_dump(), "input_noise": ft.input_noise, "lr": ft.lr, "epochs": ft.max_epochs,
                 "weight_decay": args.weight_decay, "flatten": args.flatten, "age": args.age, "ema": args.ema}
    if args.gbm:
        gbm = E.fit_baseline(data.train, args.fold)
        out["gbm_val"] = float(np.sqrt(np.mean((gbm.predict_rul(data.val.x, data.val.end_step) - data.val.rul) ** 2)))
        out["gbm_test"] = CV.rul_scores(data, gbm.predict_rul(data.test_last.x, data.test_last.end_step))["rmse"]
    model = P.build_predictor(len(fd.normalizer.channels_), mcfg, wcfg, ft.lr, data.train.fail, ft, seed=args.seed)
    if args.flatten:
        enc = model.encoder
        enc.proj = torch.nn.Sequential(torch.nn.Dropout(mcfg.dropout),
                                       torch.nn.Linear(enc.step_dim * wcfg.length, mcfg.embedding_dim))
        enc.pool = lambda h: enc.proj(h.flatten(1))  # type: ignore[method-assign]
    opt = torch.optim.AdamW(model.parameters(), lr=ft.lr, weight_decay=args.weight_decay)
    trained = model
    if args.ema:
        from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

        ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(args.ema))
    x = torch.as_tensor(data.train.x)
    rul = torch.as_tensor(data.train.rul, dtype=torch.float32)
    fail = torch.as_tensor(data.train.fail, dtype=torch.float32)
    gen = torch.Generator().manual_seed(args.seed)
    per_epoch = len(x) // ft.batch_size
    total, step, cap = per_epoch * ft.max_epochs, 0, wcfg.rul_cap

    def rmse(windows: np.ndarray, truth: np.ndarray) -> float:
        scored = ema.module if args.ema else model
        scored.eval()
        with torch.no_grad():
            pred = (scored(torch.as_tensor(windows))[0].clamp(0, 1) * cap).numpy()
        return round(float(np.sqrt(np.mean((pred - truth) ** 2))), 2)

    started, history = time.perf_counter(), []
    for _ in range(ft.max_epochs):
        model.train()
        perm = torch.randperm(len(x), generator=gen)
        for i in range(per_epoch):
            idx = perm[i * ft.batch_size : (i + 1) * ft.batch_size]
            for group in opt.param_groups:
                group["lr"] = ft.lr * lr_factor(step, total, ft.lr_schedule)
            xb = x[idx] + ft.input_noise * torch.randn_like(x[idx]) if ft.input_noise > 0 else x[idx]
            pred, logit = model(xb)
            loss = rul_fail_loss(pred, logit, rul[idx], fail[idx], rul_cap=cap, fail_weight=mcfg.fail_weight,
                                 pos_weight=model.hparams.pos_weight)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if args.ema:
                ema.update_parameters(trained)
            step += 1
        if ft.input_noise > 0:
            recalibrate_batchnorm(model.encoder, x)
        history.append({"train": rmse(data.train.x[::7], data.train.rul[::7]), "val": rmse(data.val.x, data.val.rul),
                        "test": rmse(data.test_last.x, data.test_last.rul)})
    scored = ema.module if args.ema else model
    scored.eval()
    with torch.no_grad():
        out["test_pred"] = [round(float(v), 3) for v in scored(torch.as_tensor(data.test_last.x))[0].clamp(0, 1) * cap]
    out["test_truth"] = [float(v) for v in data.test_last.rul]
    best = min(history, key=lambda h: h["val"])
    out.update(curve=history, final=history[-1], at_best_val=best, seconds=round(time.perf_counter() - started, 1))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
