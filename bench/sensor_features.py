"""Gradient-boosting candidates on degradation features, in the engine-split CV of ``sensor_cv.py``,
without training any network: what each feature group and each learner does, and a stack of the
learners under a ridge meta-learner fitted out of fold. Prints a markdown table and one JSON line.

Same folds, validation blocks and held-out cuts as ``bench/sensor_cv.py`` (5 engine folds of the
100 ``train_FD001.txt`` engines, each held-out engine cut at 4 random points, last window scored,
RUL cap 125). Per fold, ``--cross-fit K`` members as ``sensor-train`` trains them: member ``i``
trains on the fold's non-held-out engines outside validation block ``i`` (12 engines, 10 random
cuts each) and predicts its own block out of fold. A candidate is the mean of its K members; the
stack weighs the candidates with non-negative ridge weights fitted on the pooled out-of-fold
block predictions, never on the held-out engines; its validation RMSE is nested (each block scored
by weights fitted on the other blocks).

Variants (``--variants``): ``summary`` (the old baseline's 7 window statistics per channel),
``all`` (every degradation group, :mod:`solutions.sensor.degradation`) and ``no-<group>`` (all but
that group: the group's effect). Learners (``--learners``): ``hgb`` (scikit-learn), ``lightgbm``,
``xgboost`` (the ``boost`` extra).

Usage (a few minutes per variant and learner on one core)::

    nice -n 5 python bench/sensor_features.py --split-seeds 0 1 --seeds 0 --variants all no-age \\
        --learners lightgbm --out-dir bench/results/sensor_cv_features/ablation
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def variant_groups(name: str) -> tuple[str, ...] | None:
    """The degradation groups of a variant name (None: the old summary features)."""
    from solutions.sensor.degradation import GROUPS

    if name == "summary":
        return None
    if name == "all":
        return GROUPS
    if name.startswith("no-") and name[3:] in GROUPS:
        return tuple(g for g in GROUPS if g != name[3:])
    if name.startswith("only-"):
        return tuple(g for g in GROUPS if g in name[5:].split("+"))
    raise SystemExit(f"unknown variant {name!r}: summary, all, no-<group> or only-<group>+<group> ({GROUPS})")


def fit_gbm(train: Any, seed: int, learner: str, groups: tuple[str, ...] | None, max_windows: int) -> Any:
    """One GBM on every k-th training window (about ``max_windows``, as ``sensor-train`` fits it)."""
    from solutions.sensor.baseline import WindowGBM

    step = max(1, len(train) // max_windows) if max_windows else 1
    return WindowGBM(random_state=seed, learner=learner, features=groups).fit(
        train.x[::step], train.rul[::step], train.fail[::step], train.end_step[::step], classify=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cmapss-dir", default=str(Path(__file__).resolve().parents[2] / "shared/data/cmapss"))
    parser.add_argument("--subset", default="FD001")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--split-seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--variants", nargs="+", default=["all"])
    parser.add_argument("--learners", nargs="+", default=["hgb"], choices=["hgb", "lightgbm", "xgboost"])
    parser.add_argument("--cross-fit", type=int, default=3, metavar="K")
    parser.add_argument("--max-windows", type=int, default=4000,
                        help="Fit each GBM on every k-th training window, about this many (the flow's ~4000; 0: all).")
    parser.add_argument("--out-dir", default=None)
    args = parser.parse_args()
    import numpy as np

    from solutions.sensor import crossval as CV
    from solutions.sensor import schema as S
    from solutions.sensor.cmapss import load_cmapss
    from solutions.sensor.config import SensorConfig, SensorSource
    from solutions.sensor.data import window_config
    from solutions.sensor.stack import fit_stack, nested_stack

    started = time.perf_counter()
    cfg = SensorConfig()
    wcfg = window_config(SensorSource(cmapss_dir=args.cmapss_dir, subset=args.subset), cfg)
    grid, _ = load_cmapss(Path(args.cmapss_dir), args.subset)
    grid = grid.loc[grid[S.SET] != "test"]
    assets = CV.training_assets(grid)
    out_dir = Path(args.out_dir) if args.out_dir else None
    rows: list[dict[str, Any]] = []
    for split_seed in args.split_seeds:
        folds = CV.engine_folds(assets, args.folds, split_seed)
        for fold in range(args.folds):
            blocks = [CV.fold_data(grid, sp, cfg, wcfg, seed=fold).data for sp in
                      CV.cross_fit_splits(assets, folds[fold], cfg.split.val_fraction, args.cross_fit, seed=fold)]
            test, truth_oof = blocks[0].test_last, np.concatenate([b.rul_val.rul for b in blocks])
            for seed in args.seeds:
                base = {"split": split_seed, "fold": fold, "seed": seed}
                cands_oof, cands_test = {}, {}
                for variant in args.variants:
                    for learner in args.learners:
                        t0 = time.perf_counter()
                        members = [fit_gbm(b.train, seed * 100 + k, learner, variant_groups(variant), args.max_windows)
                                   for k, b in enumerate(blocks)]
                        oof = np.concatenate([m.predict_rul(b.rul_val.x, b.rul_val.end_step)
                                              for m, b in zip(members, blocks, strict=True)])
                        pred = np.mean([m.predict_rul(test.x, test.end_step) for m in members], axis=0)
                        name = f"{variant}/{learner}"
                        cands_oof[name], cands_test[name] = oof, pred
                        rows.append({**base, "model": name, "val_rmse": round(float(np.sqrt(np.mean((oof - truth_oof) ** 2))), 3),
                                     **CV.rul_scores(blocks[0], pred), "seconds": round(time.perf_counter() - t0, 1)})
                        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
                if len(cands_oof) > 1:  # validation RMSE nested: each block by weights fitted on the others
                    block = np.concatenate([np.full(len(b.rul_val.rul), k) for k, b in enumerate(blocks)])
                    stack, nested = nested_stack(cands_oof, truth_oof, block) if len(blocks) > 1 else (
                        fit_stack(cands_oof, truth_oof), np.full(len(truth_oof), np.nan))
                    rows.append({**base, "model": "stack", "weights": stack.rounded(),
                                 "val_rmse": round(float(np.sqrt(np.mean((nested - truth_oof) ** 2))), 3),
                                 **CV.rul_scores(blocks[0], stack.predict(cands_test))})
                    mean_oof = np.mean(list(cands_oof.values()), axis=0)
                    rows.append({**base, "model": "mean", "val_rmse": round(float(np.sqrt(np.mean((mean_oof - truth_oof) ** 2))), 3),
                                 **CV.rul_scores(blocks[0], np.mean(list(cands_test.values()), axis=0))})
                    print(json.dumps(rows[-2]), file=sys.stderr, flush=True)
    metrics = ("rmse", "phm08", "val_rmse")
    summary = CV.summarize(rows, metrics)
    table = CV.render_table(summary, metrics)
    print(table)
    result = {"bench": "sensor_features", "subset": args.subset, "split_seeds": args.split_seeds, "seeds": args.seeds,
              "cross_fit": args.cross_fit, "seconds": round(time.perf_counter() - started, 1),
              "summary": {r["model"]: {c: CV.finite(r[c]) for c in summary.columns if c != "model"}
                          for _, r in summary.iterrows()}}
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (out_dir / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
        (out_dir / "table.md").write_text(table + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
