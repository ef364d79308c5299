"""Label efficiency: held-out RMSE with a share of the training assets labelled, fine-tuned
from the pre-trained encoder vs trained from scratch, over several seeds.

Each seed draws its own split by asset (held-out test assets, validation assets for early
stopping, training assets), pre-trains the masked-reconstruction encoder once on the
readings of every training and validation asset (no labels: the unlabelled trajectories),
then for each label fraction trains the CNN on the labelled share (nested: the 10% set is
inside the 25% set) twice: from the pre-trained encoder and from scratch, as
``sensor-train`` does. Scores: RMSE and PHM08 on the last window of each held-out asset's
random cuts (C-MAPSS test protocol). Runs go seed by seed (every cell gets its first seed
first) and are appended to ``--out-dir``; ``--resume`` continues an interrupted grid.

Data: a C-MAPSS training file (``--cmapss-dir``, the held-out engines come from it) or the
seeded synthetic fleet.

Usage::

    nice -n 10 python bench/sensor_label_efficiency.py --cmapss-dir ../shared/data/cmapss \\
        --fractions 0.1 0.25 1.0 --seeds 0 1 2 --out-dir bench/results
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cmapss-dir", default=None, help="C-MAPSS folder (default: the synthetic fleet).")
    parser.add_argument("--subset", default="FD001")
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.1, 0.25, 1.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--n-assets", type=int, default=None, help="Synthetic fleet size.")
    parser.add_argument("--max-epochs", type=int, default=None, help="Override the config's fine-tuning epochs.")
    parser.add_argument("--pretrain-epochs", type=int, default=None, help="Override the config's pre-training epochs.")
    parser.add_argument("--channels", type=int, default=None, help="Override the encoder's first conv width.")
    parser.add_argument("--stride", type=int, default=None, help="Override the training window stride.")
    parser.add_argument("--length", type=int, default=None, help="Override the window length.")
    parser.add_argument("--mode", choices=("progressive", "top"), default=None,
                        help="Override the fine-tuning schedule of the pre-trained runs.")
    parser.add_argument("--pretrain-data", choices=("train", "train+test"), default="train",
                        help="What the encoder is pre-trained on: the training and validation assets' readings, or "
                        "those plus the held-out assets' readings as cut for testing (unlabelled, as a C-MAPSS test "
                        "file gives them).")
    parser.add_argument("--variants", nargs="+", choices=("pretrained", "scratch"), default=["pretrained", "scratch"])
    parser.add_argument("--resume", action="store_true", help="Keep the runs already in --out-dir, run the rest.")
    parser.add_argument("--summarize-only", action="store_true", help="Only summarise the runs in --out-dir.")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out-dir", default=None)
    args = parser.parse_args()
    from bench.sensor_runs import bench_environment

    bench_environment(args.threads)

    from bench.sensor_runs import plot_curves, pretrain_encoder, train_cnn
    from solutions.sensor import crossval as CV
    from solutions.sensor import pipeline as P
    from solutions.sensor import schema as S
    from solutions.sensor.config import SensorConfig, SensorSource, SplitConfig
    from solutions.sensor.data import build_grid, window_config

    started = time.perf_counter()
    cfg = SensorConfig()
    if args.n_assets:
        cfg = cfg.model_copy(update={"fleet": cfg.fleet.model_copy(update={"n_assets": args.n_assets})})
    if args.max_epochs:
        cfg = cfg.model_copy(update={"finetune": cfg.finetune.model_copy(update={"max_epochs": args.max_epochs})})
    if args.pretrain_epochs:
        cfg = cfg.model_copy(update={"pretrain": cfg.pretrain.model_copy(update={"max_epochs": args.pretrain_epochs})})
    if args.channels:
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"channels": args.channels})})
    if args.mode:
        cfg = cfg.model_copy(update={"finetune": cfg.finetune.model_copy(update={"mode": args.mode})})
    source = SensorSource(cmapss_dir=args.cmapss_dir, subset=args.subset) if args.cmapss_dir else SensorSource()
    wcfg = window_config(source, cfg)
    if args.stride:
        wcfg = wcfg.model_copy(update={"stride": args.stride})
    if args.length:
        wcfg = wcfg.model_copy(update={"length": args.length})
    grid, _ = build_grid(source, cfg)
    grid = grid.loc[grid[S.SET] != "test"]  # C-MAPSS: the training file's engines only; test units stay unseen
    out_dir = Path(args.out_dir) if args.out_dir else Path(tempfile.mkdtemp(prefix="sensor-label-eff-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    runs_file, curves_file = out_dir / "sensor_label_efficiency_runs.jsonl", out_dir / "sensor_label_efficiency_curves.jsonl"
    if not (args.resume or args.summarize_only):
        runs_file.unlink(missing_ok=True)
        curves_file.unlink(missing_ok=True)
    rows = [json.loads(line) for line in runs_file.read_text().splitlines()] if runs_file.exists() else []
    curves = [json.loads(line) for line in curves_file.read_text().splitlines()] if curves_file.exists() else []
    done = {(r["seed"], r["label_fraction"], r["pretrained"]) for r in rows}

    def keep(record: dict[str, Any], target: Path) -> None:
        with open(target, "a") as handle:
            handle.write(json.dumps(record) + "\n")

    wanted = [v == "pretrained" for v in args.variants]
    for seed in [] if args.summarize_only else args.seeds:
        todo = [(f, pre) for f in args.fractions for pre in wanted if (seed, f, pre) not in done]
        if not todo:
            continue
        splits = P.split_assets(grid, SplitConfig(val_fraction=cfg.split.val_fraction,
                                                  test_fraction=cfg.split.test_fraction, seed=seed))
        t0 = time.perf_counter()
        fd = CV.fold_data(grid, splits, cfg, wcfg, seed=seed)  # normaliser of the training + validation assets
        extra = fd.data.test_cut_grid if args.pretrain_data == "train+test" else None
        encoder = pretrain_encoder(grid, splits, fd.normalizer, cfg, wcfg, f"le-pre-{seed}", extra) \
            if any(pre for _, pre in todo) else None
        pre_s = round(time.perf_counter() - t0, 1)
        for frac in args.fractions:
            labelled = P.labelled_assets(grid, splits["train"], frac, seed)
            data = CV.fold_data(grid, splits, cfg, wcfg, labelled=labelled, seed=seed).data
            for pretrained in wanted:
                if (seed, frac, pretrained) in done:
                    continue
                run = train_cnn(data, len(fd.normalizer.channels_), cfg, wcfg, seed, f"le-{seed}-{frac}-{int(pretrained)}",
                                encoder if pretrained else None)
                row = {"seed": seed, "label_fraction": frac, "labelled_assets": len(labelled),
                       "train_assets": len(splits["train"]), "test_assets": len(splits["test"]),
                       "pretrained": pretrained, "pretrain_data": args.pretrain_data if pretrained else None,
                       **CV.rul_scores(data, run.last, run.every),
                       "epochs": len(run.val_rmse), "best_epoch": run.best_epoch, "seconds": run.seconds,
                       "pretrain_seconds": pre_s}
                curve = {"seed": seed, "label_fraction": frac, "model": "pre-trained" if pretrained else "scratch",
                         "val_rmse": run.val_rmse, "best_epoch": run.best_epoch}
                keep(row, runs_file)
                keep(curve, curves_file)
                rows.append(row)
                curves.append(curve)
                print(json.dumps(row), file=sys.stderr, flush=True)

    for r in rows:
        seen = " (+ held-out readings)" if r.get("pretrain_data") == "train+test" else ""
        r["model"] = f"{r['label_fraction']:.0%} labelled, " + (f"pre-trained{seen}" if r["pretrained"] else "scratch")
    metrics = ("rmse", "phm08")
    summary = CV.summarize(sorted(rows, key=lambda r: (r["label_fraction"], not r["pretrained"])), metrics)
    table = CV.render_table(summary, metrics)
    png = plot_curves(curves, cfg.finetune.smoothing, out_dir / "sensor_label_efficiency_val_curves.png",
                      group="label_fraction") if curves else None
    print(table)
    result = {
        "bench": "sensor_label_efficiency", "source": source.describe(), "fractions": args.fractions,
        "seeds": sorted({r["seed"] for r in rows}),
        "summary": {r["model"]: {"rmse": round(float(r["rmse_mean"]), 3), "rmse_std": CV.finite(r["rmse_std"]),
                                 "phm08": round(float(r["phm08_mean"]), 3), "phm08_std": CV.finite(r["phm08_std"]),
                                 "runs": int(r["rmse_count"])} for _, r in summary.iterrows()},
        "recipe": {"finetune": cfg.finetune.model_dump(), "model": cfg.model.model_dump(),
                   "pretrain": cfg.pretrain.model_dump(), "window": wcfg.model_dump()},
        "curves_png": str(png) if png else None, "seconds": round(time.perf_counter() - started, 1),
    }
    (out_dir / "sensor_label_efficiency.json").write_text(json.dumps({**result, "runs": rows}, indent=1) + "\n")
    (out_dir / "sensor_label_efficiency.md").write_text(table + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
