"""The sensor GBM baseline fitted three ways on the folds of an earlier ``sensor_cv.py`` run, and
what each does to the candidate the flow registers. Prints one JSON line.

Per fold of the engine-split CV (same folds, validation engines, cuts and CNN predictions as the
run in ``--preds-dir``, which must have been run with the same ``--split-seed`` and
``--val-cuts``): the GBM as the flow fits it (every k-th training window, ~4,000), on every
training window (``full``), and a bag of three GBMs on the three interleaved ~4,000-window
subsets (``bag3``: mean of their predictions). ``reg_*`` is the flow's choice (3-CNN seed mean,
the GBM or their mean, on the fold's validation cuts) with that GBM, scored on the held-out engines.

Usage::

    python bench/sensor_gbm_variants.py --split-seed 0 --preds-dir DIR_OF_A_SENSOR_CV_RUN
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cmapss-dir", default=str(Path(__file__).resolve().parents[2] / "shared/data/cmapss"))
    parser.add_argument("--subset", default="FD001")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--split-seed", type=int, default=0)
    parser.add_argument("--val-cuts", type=int, default=10)
    parser.add_argument("--preds-dir", required=True, help="--out-dir of a sensor_cv.py run (sensor_cv_predictions.jsonl)")
    args = parser.parse_args()
    import numpy as np

    from solutions.sensor import candidates as CA
    from solutions.sensor import crossval as CV
    from solutions.sensor import schema as S
    from solutions.sensor.baseline import WindowGBM
    from solutions.sensor.cmapss import load_cmapss
    from solutions.sensor.config import SensorConfig, SensorSource
    from solutions.sensor.data import window_config

    cfg = SensorConfig()
    wcfg = window_config(SensorSource(cmapss_dir=args.cmapss_dir, subset=args.subset), cfg).model_copy(
        update={"val_cuts": args.val_cuts})
    grid, _ = load_cmapss(Path(args.cmapss_dir), args.subset)
    grid = grid.loc[grid[S.SET] != "test"]
    assets = CV.training_assets(grid)
    folds = CV.engine_folds(assets, args.folds, args.split_seed)
    preds: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for line in (Path(args.preds_dir) / "sensor_cv_predictions.jsonl").read_text().splitlines():
        record = json.loads(line)
        preds.setdefault((record["fold"], record["model"]), []).append(record)

    class Bag:
        def __init__(self, models: list[WindowGBM]) -> None:
            self.models = models

        def predict_rul(self, x: np.ndarray, steps: np.ndarray) -> np.ndarray:
            return np.mean([m.predict_rul(x, steps) for m in self.models], axis=0)

    out: dict[str, list[Any]] = {}
    for fold in range(args.folds):
        data = CV.fold_data(grid, CV.fold_splits(assets, folds[fold], cfg.split.val_fraction, seed=fold), cfg, wcfg,
                            seed=fold).data
        cnn = {k: np.mean([m[k] for m in preds[(fold, "cnn_scratch")]], axis=0) for k in ("last", "every", "val")}
        step = max(1, len(data.train) // 4000)
        tr = data.train
        t0 = time.perf_counter()
        fitted = {
            "default": WindowGBM(random_state=fold).fit(tr.x[::step], tr.rul[::step], tr.fail[::step], tr.end_step[::step]),
            "full": WindowGBM(random_state=fold).fit(tr.x, tr.rul, tr.fail, tr.end_step),
            "bag3": Bag([WindowGBM(random_state=fold * 10 + j).fit(tr.x[j % step::step], tr.rul[j % step::step],
                                                                   tr.fail[j % step::step], tr.end_step[j % step::step]) for j in range(3)]),
        }
        seconds = time.perf_counter() - t0
        for name, gbm in fitted.items():
            last, every, val = (gbm.predict_rul(part.x, part.end_step) for part in (data.test_last, data.test_all, data.rul_val))
            choice = CA.choose_on_validation(data.rul_val.rul, cnn["val"], val)
            pick = {CA.CNN: (cnn["last"], cnn["every"]), CA.BASELINE: (last, every),
                    CA.ENSEMBLE: (CV.ensemble(cnn["last"], last), CV.ensemble(cnn["every"], every))}[choice.winner]
            out.setdefault(f"gbm_{name}", []).append(CV.rul_scores(data, last, every)["rmse"])
            out.setdefault(f"reg_{name}", []).append(CV.rul_scores(data, *pick)["rmse"])
            out.setdefault(f"chosen_{name}", []).append(choice.winner)
        print(f"fold {fold}: {len(tr)} training windows, GBMs fitted in {seconds:.0f} s", file=sys.stderr, flush=True)
    summary = {k: ({"mean": round(float(np.mean(v)), 3), "sd": round(float(np.std(v, ddof=1)), 3)}
                   if not k.startswith("chosen") else v) for k, v in out.items()}
    print(json.dumps({"bench": "sensor_gbm_variants", "split_seed": args.split_seed, "preds_dir": args.preds_dir,
                      **summary}))


if __name__ == "__main__":
    main()
