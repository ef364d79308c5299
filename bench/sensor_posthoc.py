"""Two post-hoc fixes of the registered sensor model, scored on a cross-fitted
``bench/sensor_cv.py --cross-fit K`` run's saved predictions (nothing is trained):

- **Recalibration**: a map from the registered candidate's predicted RUL to the truth, fitted on
  the pooled out-of-fold validation predictions (the same ones ``sensor train`` chooses the
  candidate on): ``linear`` (least squares, clipped to [0, cap]) and ``isotonic``.
- **The last K windows**: each held-out cut at cycle c is predicted from the windows ending at
  c, c-1, ..., c-K+1 of its engine, each shifted back to c (``p(c-j) - j``), combined by ``mean``,
  ``median``, or ``capaware`` (only windows predicted below cap - 5 are shifted; a unit whose last
  window is predicted there keeps it).

The registered candidate is ``sensor train``'s own choice (:func:`choose_on_validation`) among
the CNN bag, the GBM bag and their mean. Needs a run made after the held-out engines' every-window
predictions were saved (``every`` in ``sensor_cv_predictions.jsonl``) for the second analysis.

Usage:
    python bench/sensor_posthoc.py --run-dir DIR [DIR ...] [--windows 1 3 5 10 20]

Prints one JSON line: per run and variant, the held-out RMSE's mean and sd over folds and its
value per fold.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sensor_blend import load_folds, rmse

from solutions.sensor.candidates import BASELINE, CNN, ENSEMBLE, choose_on_validation

#: the RUL cap of the protocol (bench/sensor_cv.py, FD001)
CAP = 125.0
MARGIN = 5.0


def pooled_validation(members: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The blocks' out-of-fold validation truth, CNN and GBM predictions, pooled."""
    return tuple(np.concatenate([m[key] for m in members]).astype("float64")
                 for key in ("truth_val", "val", "gbm_val"))


def registered(members: list[dict[str, Any]], key_cnn: str, key_gbm: str) -> tuple[str, np.ndarray]:
    """``sensor train``'s choice on the pooled out-of-fold validation predictions, and that
    candidate's held-out predictions under ``key_cnn``/``key_gbm`` (the members' mean)."""
    winner = choose_on_validation(*pooled_validation(members)).winner
    cnn = np.mean([m[key_cnn] for m in members], axis=0)
    gbm = np.mean([m[key_gbm] for m in members], axis=0)
    return winner, {CNN: cnn, BASELINE: gbm, ENSEMBLE: (cnn + gbm) / 2}[winner]


def recalibrated(members: list[dict[str, Any]]) -> dict[str, float]:
    from sklearn.isotonic import IsotonicRegression

    truth = np.asarray(members[0]["truth_last"], dtype="float64")
    winner, test = registered(members, "last", "gbm_last")
    val_truth, val_cnn, val_gbm = pooled_validation(members)
    val = {CNN: val_cnn, BASELINE: val_gbm, ENSEMBLE: (val_cnn + val_gbm) / 2}[winner]
    known = ~np.isnan(val_truth)
    slope, intercept = np.polyfit(val[known], val_truth[known], 1)
    iso = IsotonicRegression(out_of_bounds="clip").fit(val[known], val_truth[known])
    return {"registered": rmse(truth, test), "linear": rmse(truth, np.clip(intercept + slope * test, 0, CAP)),
            "isotonic": rmse(truth, iso.predict(test))}


def last_windows(members: list[dict[str, Any]], windows: list[int]) -> dict[str, float]:
    first = members[0]
    if "every" not in first:
        raise SystemExit("this run saved no every-window predictions (re-run bench/sensor_cv.py --cross-fit K)")
    truth = np.asarray(first["truth_last"], dtype="float64")
    _, last = registered(members, "last", "gbm_last")
    _, every = registered(members, "every", "gbm_every")
    where = {(a, int(s)): i for i, (a, s) in enumerate(zip(first["every_asset"], first["every_end_step"], strict=True))}
    out: dict[str, float] = {}
    for k in windows:
        for mode in ("mean", "median", "capaware"):
            est = []
            for unit, cycle, p0 in zip(first["test_units"], first["last_end_step"], last, strict=True):
                engine = unit.split("@")[0]
                shifted = []
                for j in range(k):
                    i = where.get((engine, int(cycle) - j))
                    if i is None:
                        break
                    if j == 0 and abs(every[i] - p0) > 1e-3:
                        raise ValueError(f"{unit}: its last window's prediction differs in the every-window set")
                    if mode != "capaware" or every[i] <= CAP - MARGIN:
                        shifted.append(every[i] - j)
                if (mode == "capaware" and p0 > CAP - MARGIN) or not shifted:
                    shifted = [p0]
                est.append(float(np.median(shifted) if mode == "median" else np.mean(shifted)))
            out[f"last{k}_{mode}"] = rmse(truth, np.clip(np.asarray(est), 0, CAP))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", nargs="+", required=True, type=Path,
                        help="Output folder(s) of bench/sensor_cv.py --cross-fit K runs.")
    parser.add_argument("--windows", nargs="+", type=int, default=[1, 3, 5, 10, 20],
                        help="K: how many last windows of each held-out cut to combine.")
    args = parser.parse_args(argv)
    runs = []
    for run_dir in args.run_dir:
        per_fold = {fold: {**recalibrated(ms), **last_windows(ms, args.windows)}
                    for fold, ms in load_folds(run_dir).items()}
        table = {}
        for name in next(iter(per_fold.values())):
            values = [per_fold[f][name] for f in sorted(per_fold)]
            table[name] = {"mean": round(float(np.mean(values)), 3),
                           "sd": round(float(np.std(values, ddof=1)), 3) if len(values) > 1 else None,
                           "folds": [round(v, 2) for v in values]}
        runs.append({"run": str(run_dir), "rmse": table})
        print(f"\n{run_dir}", file=sys.stderr)
        for name, row in table.items():
            print(f"  {name:20s} RMSE {row['mean']:6.2f} ± {row['sd'] or 0:4.2f}", file=sys.stderr)
    print(json.dumps({"bench": "sensor_posthoc", "runs": runs}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
