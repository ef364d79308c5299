"""Post-hoc analysis of a cross-fitted ``bench/sensor_cv.py --cross-fit K`` run: how the
registered model's held-out RMSE moves with the number of cross-fitted members (the first k of
the K, k = 2..K) and with the weight between the CNN and the GBM candidates.

Every figure re-uses the run's saved predictions (``sensor_cv_predictions.jsonl``, one line per
fold and member: the member CNN's and its block's GBM's predictions on the held-out cuts and on
its own validation block); nothing is trained. For each fold and k:

- ``cnn_k`` / ``gbm_k`` / ``mean_k``: the mean of the first k CNNs, of their GBMs, and of the two;
- ``registered_k``: the one of the three with the lowest pooled out-of-fold validation RMSE
  (``sensor train``'s choice with k members and k blocks);
- ``weighted_k``: the CNN weight ``w`` in ``w * cnn + (1 - w) * gbm`` chosen on the same pooled
  out-of-fold predictions (grid of 0.05), scored held out.

Usage:
    python bench/sensor_blend.py --run-dir DIR [DIR ...]

Prints one JSON line: per run and candidate, the mean and sd over folds of the held-out RMSE
and PHM08 score, and each fold's chosen weight.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from solutions.sensor.candidates import BASELINE, CNN, ENSEMBLE, choose_on_validation
from solutions.sensor.evaluate import rmse as rmse_of
from solutions.sensor.metrics import phm08_score

WEIGHTS = np.round(np.arange(0.0, 1.0001, 0.05), 2)
#: sensor train's candidate names -> this script's
NAMES = {CNN: "cnn", BASELINE: "gbm", ENSEMBLE: "mean"}


def rmse(y: np.ndarray, p: np.ndarray) -> float:
    """RMSE over the rows with a known truth."""
    known = ~np.isnan(y)
    return rmse_of(y[known], p[known])


def fold_rows(members: list[dict[str, Any]], k: int) -> dict[str, Any]:
    """The candidates of one fold with its first ``k`` members: held-out RMSE / PHM08 per
    candidate, the registered choice and the out-of-fold weight."""
    use = members[:k]
    truth = np.asarray(use[0]["truth_last"], dtype="float64")
    for m in use[1:]:
        if m["truth_last"] != use[0]["truth_last"]:
            raise ValueError(f"fold {m['fold']}: members disagree on the held-out cuts")
    cnn = np.mean([m["last"] for m in use], axis=0)
    gbm = np.mean([m["gbm_last"] for m in use], axis=0)
    val_truth = np.concatenate([m["truth_val"] for m in use]).astype("float64")
    val_cnn = np.concatenate([m["val"] for m in use]).astype("float64")
    val_gbm = np.concatenate([m["gbm_val"] for m in use]).astype("float64")
    test = {"cnn": cnn, "gbm": gbm, "mean": (cnn + gbm) / 2}
    choice = choose_on_validation(val_truth, val_cnn, val_gbm)  # sensor train's own choice
    chosen = NAMES[choice.winner]
    by_weight = [rmse(val_truth, w * val_cnn + (1 - w) * val_gbm) for w in WEIGHTS]
    w = float(WEIGHTS[int(np.argmin(by_weight))])
    test["registered"] = test[chosen]
    test["weighted"] = w * cnn + (1 - w) * gbm
    out = {f"{name}_{k}": {"rmse": rmse(truth, p), "phm08": phm08_score(truth, p)} for name, p in test.items()}
    out[f"registered_{k}"]["chosen"] = chosen
    out[f"weighted_{k}"]["w"] = w
    out[f"registered_{k}"]["estimate"] = choice.val_rmse[choice.winner]
    return out


def load_folds(run_dir: Path) -> dict[int, list[dict[str, Any]]]:
    """A cross-fitted run's saved predictions: per fold, its members' lines in seed order."""
    lines = [json.loads(line) for line in (run_dir / "sensor_cv_predictions.jsonl").read_text().splitlines()]
    lines = [r for r in lines if r.get("variant") == "xfit"]
    if not lines:
        raise SystemExit(f"{run_dir}: no cross-fitted predictions (run bench/sensor_cv.py --cross-fit K)")
    folds: dict[int, list[dict[str, Any]]] = {}
    for r in sorted(lines, key=lambda r: (r["fold"], r["seed"])):
        folds.setdefault(r["fold"], []).append(r)
    return folds


def summarize(run_dir: Path) -> dict[str, Any]:
    folds = load_folds(run_dir)
    most = min(len(m) for m in folds.values())
    per_fold = {fold: {} for fold in folds}
    for fold, members in folds.items():
        for k in range(2, most + 1):
            per_fold[fold].update(fold_rows(members, k))
    names = list(next(iter(per_fold.values())))
    table: dict[str, Any] = {}
    for name in names:
        values = [per_fold[f][name] for f in folds]
        row = {m: {"mean": round(float(np.mean([v[m] for v in values])), 3),
                   "sd": round(float(np.std([v[m] for v in values], ddof=1)), 3) if len(values) > 1 else None}
               for m in ("rmse", "phm08")}
        for extra in ("w", "chosen", "estimate"):
            if extra in values[0]:
                row[extra] = [round(v[extra], 3) if isinstance(v[extra], float) else v[extra] for v in values]
        table[name] = row
    return {"run": str(run_dir), "folds": len(folds), "members": most, "candidates": table}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", nargs="+", required=True, type=Path,
                        help="Output folder(s) of bench/sensor_cv.py --cross-fit K runs.")
    args = parser.parse_args(argv)
    runs = [summarize(d) for d in args.run_dir]
    for run in runs:
        print(f"\n{run['run']}: {run['folds']} folds, {run['members']} members", file=sys.stderr)
        for name, row in run["candidates"].items():
            extra = f"  w={row['w']}" if "w" in row else f"  chosen={row['chosen']}" if "chosen" in row else ""
            print(f"  {name:14s} RMSE {row['rmse']['mean']:6.2f} ± {row['rmse']['sd'] or 0:4.2f}   "
                  f"PHM08 {row['phm08']['mean']:7.1f}{extra}", file=sys.stderr)
    print(json.dumps({"bench": "sensor_blend", "runs": runs}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
