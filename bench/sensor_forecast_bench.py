"""Sensor forecasting on the NASA C-MAPSS training file, split by engine.

The engines are split as the sensor flows split them (``SplitConfig``: seed 0, 20% held out):
each sensor's method is chosen on the training engines' last H cycles (forecast from the cycles
before), then every candidate, the naive and seasonal-naive baselines and the per-sensor choice
forecast the held-out engines' last H cycles from their earlier ones. Reported per horizon step:
MASE (scaled by each series' in-sample seasonal-naive error) and the share of truths inside the
prediction interval (``--level``, 80% by default), for each interval kind asked
(``--intervals model conformal``). Exactly what ``python -m flows.sensor forecast-train`` runs
(:func:`solutions.sensor.forecast_evaluate.evaluate_forecasters`).

Usage:
    python bench/sensor_forecast_bench.py --cmapss-dir /work/shared/data/cmapss [--horizon 10]
        [--intervals model conformal] [--out bench/results/sensor_forecast_DATE.jsonl]

Prints one JSON line per interval kind (and appends it to ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd

from solutions.sensor import forecast_evaluate as FE
from solutions.sensor.cmapss import load_cmapss
from solutions.sensor.config import SplitConfig
from solutions.sensor.forecast_config import ForecastConfig

#: the pool of each interval kind: conformal refits each model on 2 past windows (3x the time), so
#: AutoARIMA (the slowest by far) runs with the models' own intervals only
POOLS = {"model": ("naive", "seasonal_naive", "auto_ets", "auto_arima", "auto_theta"),
         "conformal": ("naive", "seasonal_naive", "auto_ets", "auto_theta")}


def run(grid: Any, train: list[str], test: list[str], cfg: ForecastConfig) -> dict[str, Any]:
    started = time.perf_counter()
    ev = FE.evaluate_forecasters(grid, train, test, cfg)
    per_h = ev.horizon_table()
    overall = FE.summary(ev.test).set_index("method")
    # the chosen methods' own intervals, before the rescaling fitted on the training engines
    pairs = pd.DataFrame({"sensor": list(ev.forecaster.methods), "method": list(ev.forecaster.methods.values())})
    raw = FE.summary(ev.test.merge(pairs, on=["sensor", "method"]).assign(method="chosen_unscaled"), "h")
    return {
        "intervals": cfg.intervals, "candidates": list(cfg.candidates), "seconds": round(time.perf_counter() - started, 1),
        "series": {"train": ev.series[0], "held_out": ev.series[1], "short": ev.short},
        "skipped": ev.skipped, "chosen": ev.forecaster.methods,
        "overall": {m: {"mase": round(float(r["mase"]), 4), "coverage": round(float(r["coverage"]), 4)}
                    for m, r in overall.iterrows()},
        "per_horizon": {col: [round(float(v), 4) for v in per_h[col]] for col in per_h.columns if col != "h"},
        "chosen_unscaled_coverage": [round(float(v), 4) for v in raw["coverage"]],
        "widths": ev.forecaster.widths,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cmapss-dir", default="/work/shared/data/cmapss")
    ap.add_argument("--subset", default="FD001")
    ap.add_argument("--horizon", type=int, default=10)
    ap.add_argument("--level", type=int, default=80)
    ap.add_argument("--history", type=int, default=ForecastConfig().history)
    ap.add_argument("--candidates", nargs="+", default=None, help="the pool (default: per interval kind, POOLS)")
    ap.add_argument("--intervals", nargs="+", default=["model", "conformal"], choices=sorted(POOLS))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    folder = Path(args.cmapss_dir)
    # the training file alone: its engines are split (as the flows split them when no test_/RUL_ files are there)
    grid = load_cmapss(folder, args.subset)[0]
    grid = grid.loc[grid["set"] == "train"].reset_index(drop=True)
    from solutions.sensor.pipeline import split_assets

    splits = split_assets(grid, SplitConfig())
    train, test = splits["train"] + splits["val"], splits["test"]
    for kind in args.intervals:  # one line per interval kind, written as soon as it is measured
        cfg = ForecastConfig(horizon=args.horizon, level=args.level, history=args.history, intervals=kind,
                             candidates=tuple(args.candidates or POOLS[kind]))
        line = {
            "bench": "sensor_forecast", "data": f"{args.subset} train file, {len(train)} training / {len(test)} "
            "held-out engines (SplitConfig seed 0)", "horizon": args.horizon, "level": args.level,
            "history": args.history, "season_length": 1,
            "note": "C-MAPSS cycles have no season: seasonal naive (season 1) is the naive forecast",
            **run(grid, train, test, cfg), "loadavg_after": os.getloadavg(), "cpus": os.cpu_count(),
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        text = json.dumps(line)
        print(text, flush=True)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            with args.out.open("a") as handle:
                handle.write(text + "\n")


if __name__ == "__main__":
    main()
