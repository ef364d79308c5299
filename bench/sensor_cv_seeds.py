"""Seed sweep of the cross-fitted engine-split CV: one table over ``bench/sensor_cv.py --cross-fit K``
runs that differ only in ``--train-seed`` (each its own ``--out-dir``), on one fold split or more.

Per candidate (the ``xfit_*`` rows) and split: the mean over folds of each seed's run, then the mean
± sd of that over seeds (the seed noise of a CV figure); "both" averages a seed's two splits (its
10-fold mean) first. Beside it the spread over every fold x seed, the paired difference from the GBM
bag (same fold, same seed: the comparison the default rests on; a second table averages it over the
seeds per fold and gives its standard error over the folds) and the validation estimate's bias
(held-out minus validation RMSE of what the flow registers).

Usage::

    python bench/sensor_cv_seeds.py --runs split0/seed0=DIR split0/seed3=DIR ... [--out README_table.md]

Each ``DIR`` holds a ``sensor_cv_runs.jsonl``; the label is ``<split>/<seed>``.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

CANDIDATES = ("xfit_cnn_mean", "xfit_gbm_mean", "xfit_ensemble", "xfit_stack", "xfit_registered")
GBM = "xfit_gbm_mean"


def load(runs: list[str]) -> dict[tuple[str, str], list[dict]]:
    """``{(split, seed): rows}`` of each completed run (its folds' cross-fitted rows, seed -1)."""
    out = {}
    for spec in runs:
        label, _, folder = spec.partition("=")
        split, _, seed = label.partition("/")
        rows = [json.loads(line) for line in (Path(folder) / "sensor_cv_runs.jsonl").read_text().splitlines()]
        out[(split, seed)] = [r for r in rows if r.get("seed") == -1 and r["model"] in CANDIDATES]
    return out


def fold_means(runs: dict[tuple[str, str], list[dict]], model: str, key: str = "rmse") -> dict[tuple[str, str], float]:
    """Each run's mean of ``key`` over its folds, for ``model``."""
    return {run: float(np.mean([r[key] for r in rows if r["model"] == model])) for run, rows in runs.items()}


def ms(values: list[float], digits: int = 2) -> str:
    """``mean ± sd (n)`` (sd over the values, ddof 1)."""
    v = np.asarray(values, dtype=float)
    sd = f"{v.std(ddof=1):.{digits}f}" if len(v) > 1 else "-"
    return f"{v.mean():.{digits}f} ± {sd} ({len(v)})"


def table(runs: dict[tuple[str, str], list[dict]]) -> str:
    """The markdown table: one line per candidate."""
    splits = sorted({s for s, _ in runs})
    seeds = sorted({seed for _, seed in runs}, key=int)
    whole = [seed for seed in seeds if all((s, seed) in runs for s in splits)]  # seeds run on every split
    folds = len({r["fold"] for rows in runs.values() for r in rows})
    head = ["candidate", *(f"{s}: mean ± sd over seeds (n)" for s in splits),
            f"both: mean ± sd over seeds (n; {len(splits) * folds} folds each)", "sd over folds x seeds",
            "paired minus GBM bag: mean, folds x seeds below it", "PHM08 (both)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    gbm = {run: {r["fold"]: r["rmse"] for r in rows if r["model"] == GBM} for run, rows in runs.items()}
    for model in CANDIDATES:
        per_run = fold_means(runs, model)
        phm = fold_means(runs, model, "phm08")
        cells = [ms([per_run[(s, seed)] for seed in seeds if (s, seed) in runs]) for s in splits]
        cells.append(ms([np.mean([per_run[(s, seed)] for s in splits]) for seed in whole]))
        every = [r["rmse"] for rows in runs.values() for r in rows if r["model"] == model]
        cells.append(f"{np.std(every, ddof=1):.2f} ({len(every)})")
        diff = [r["rmse"] - gbm[run][r["fold"]] for run, rows in runs.items() for r in rows if r["model"] == model]
        cells.append("-" if model == GBM else f"{np.mean(diff):+.2f}, {sum(d < 0 for d in diff)}/{len(diff)}")
        cells.append(f"{np.mean([phm[(s, seed)] for s in splits for seed in whole]):.0f}")
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def bias(runs: dict[tuple[str, str], list[dict]]) -> str:
    """The registered candidate's validation estimate against its held-out RMSE, per split, and what
    it chose over every fold x seed."""
    lines = ["| split | estimate (val RMSE) | held out | held out minus estimate: mean ± sd over seeds (n) |",
             "|---|---|---|---|"]
    by_split: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for (split, _), rows in sorted(runs.items()):
        reg = [r for r in rows if r["model"] == "xfit_registered"]
        by_split[split].append((float(np.mean([r["val_estimate"] for r in reg])), float(np.mean([r["rmse"] for r in reg]))))
    for split, pairs in sorted(by_split.items()):
        est, held = np.array(pairs).T
        lines.append(f"| {split} | {ms(list(est))} | {ms(list(held))} | {ms(list(held - est))} |")
    chosen: dict[str, int] = defaultdict(int)
    for rows in runs.values():
        for r in rows:
            if r["model"] == "xfit_registered":
                chosen[r["chosen"]] += 1
    return "\n".join(lines) + "\n\nChosen (folds x seeds): " + ", ".join(f"{k} {v}" for k, v in sorted(chosen.items()))


def paired(runs: dict[tuple[str, str], list[dict]]) -> str:
    """Each candidate minus the GBM bag on the same fold, averaged over the seeds first (the seeds
    share the folds), then the mean, sd and standard error over the folds of every split, and t."""
    lines = ["| candidate minus GBM bag | mean over folds | sd over folds (n) | standard error | t |",
             "|---|---|---|---|---|"]
    for model in CANDIDATES:
        if model == GBM:
            continue
        per_fold: dict[tuple[str, int], list[float]] = defaultdict(list)
        for (split, _), rows in runs.items():
            gbm = {r["fold"]: r["rmse"] for r in rows if r["model"] == GBM}
            for r in rows:
                if r["model"] == model:
                    per_fold[(split, r["fold"])].append(r["rmse"] - gbm[r["fold"]])
        d = np.array([np.mean(v) for v in per_fold.values()])
        se = d.std(ddof=1) / np.sqrt(len(d))
        lines.append(f"| {model} | {d.mean():+.2f} | {d.std(ddof=1):.2f} ({len(d)}) | {se:.2f} | {d.mean() / se:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", required=True, help="<split>/<seed>=DIR, one per sensor_cv.py run.")
    parser.add_argument("--out", default=None, help="Also write the tables to this markdown file.")
    args = parser.parse_args()
    runs = {run: rows for run, rows in load(args.runs).items() if rows}
    text = table(runs) + "\n\n" + paired(runs) + "\n\n" + bias(runs) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
