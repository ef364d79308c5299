"""Reports of sensor forecasting: the per-horizon table of a training run, the alerts of a
forecast run, and the plot operators read (history, forecast and interval against the limits)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from solutions.sensor import schema as S
from solutions.sensor.forecast import Forecaster
from solutions.sensor.forecast_evaluate import ForecastEvaluation
from solutions.sensor.forecast_models import CHOSEN


def render_evaluation(ev: ForecastEvaluation, title: str) -> str:
    """Markdown: test MASE and interval coverage per horizon step for the choice and the baselines,
    and each sensor's chosen method."""
    f = ev.forecaster
    table = ev.horizon_table()
    methods = [c.split("/")[0] for c in table.columns if c.endswith("/mase")]
    head = "| h | " + " | ".join(f"{m} MASE | {m} cover" for m in methods) + " |"
    rule = "|---|" + "---|---|" * len(methods)
    rows = [f"| {int(r['h'])} | " + " | ".join(f"{r[f'{m}/mase']:.3f} | {r[f'{m}/coverage']:.0%}" for m in methods)
            + " |" for _, r in table.iterrows()]
    overall = ev.metrics()
    chosen = ", ".join(f"{s}: {m}" for s, m in f.methods.items())
    skipped = ", ".join(f"{c} ({why})" for c, why in ev.skipped.items()) or "none"
    return "\n".join([
        f"# {title}", "",
        (f"Held-out assets' last {f.horizon} steps forecast from the steps before; MASE is scaled by each "
        f"series' in-sample seasonal-naive error (season {f.season_length}); *cover*: share of truths inside the "
        f"{f.level}% interval ({f.intervals} intervals). `{CHOSEN}`: each sensor's method chosen on the training "
        "assets" + (", its interval rescaled per sensor and step ahead on their last H steps." if f.widths else ".")),
        "",
        (f"Test MASE {overall.get('test/mase', np.nan):.3f} (naive {overall.get('test/mase_naive', np.nan):.3f}), "
        f"coverage {overall.get('test/coverage', np.nan):.0%}; series: {ev.series[0]} training, "
        f"{ev.series[1]} held out, {ev.short} too short."), "",
        head, rule, *rows, "", f"Chosen methods: {chosen}", "", f"Not forecast: {skipped}", "",
    ])


def render_alerts(alerts: pd.DataFrame, limit: int = 50) -> str:
    """Markdown table of limit crossings (the first ``limit`` rows)."""
    if alerts.empty:
        return "No forecast crosses a configured limit within the horizon.\n"
    lines = ["| asset | sensor | limit | first step | steps ahead | value |", "|---|---|---|---|---|---|"]
    for r in alerts.head(limit).to_dict("records"):
        lines.append(f"| {r[S.ASSET]} | {r['sensor']} | {r['limit_kind']} {r['limit']:g} | {int(r[S.STEP])} | "
                     f"{int(r['steps_ahead'])} | {r['value']:.4g} |")
    more = f"\n{len(alerts) - limit} more in the alerts file.\n" if len(alerts) > limit else "\n"
    return "\n".join(lines) + more


def plot_assets(table: pd.DataFrame, alerts: pd.DataFrame, count: int) -> list[str]:
    """The assets to draw: those with alerts first, then the others in order."""
    alerted = list(dict.fromkeys(alerts[S.ASSET].astype(str))) if not alerts.empty else []
    rest = [a for a in dict.fromkeys(table[S.ASSET].astype(str)) if a not in alerted]
    return (alerted + rest)[:count]


def plot_forecasts(grid: pd.DataFrame, table: pd.DataFrame, assets: Sequence[str], sensors: Sequence[str],
                   path: Path, forecaster: Forecaster, history: int = 60,
                   truth: pd.DataFrame | None = None) -> Path:
    """One panel per (asset, sensor): the last ``history`` steps, the forecast and its interval, the
    limits as dashed lines, and (``truth``: a grid of the held-out steps) what really came."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, cols = max(1, len(assets)), max(1, len(sensors))
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.4 * rows), squeeze=False)
    limits: Mapping[str, Mapping[str, float]] = {"upper": forecaster.upper_limits, "lower": forecaster.lower_limits}
    for i, asset in enumerate(assets):
        past = grid.loc[grid[S.ASSET].astype(str) == asset].sort_values(S.STEP).tail(history)
        fut = table.loc[table[S.ASSET].astype(str) == asset]
        for j, sensor in enumerate(sensors):
            ax = axes[i][j]
            ax.plot(past[S.STEP], past[sensor], color="0.3", lw=1, label="history")
            f = fut.loc[fut["sensor"] == sensor]
            ax.plot(f[S.STEP], f["forecast"], color="tab:blue", lw=1.5, label="forecast")
            ax.fill_between(f[S.STEP], f["lower"], f["upper"], color="tab:blue", alpha=0.25,
                            label=f"{forecaster.level}% interval")
            if truth is not None:
                t = truth.loc[truth[S.ASSET].astype(str) == asset]
                ax.plot(t[S.STEP], t[sensor], color="tab:green", lw=1, ls=":", label="truth")
            for kind, color in (("upper", "tab:red"), ("lower", "tab:orange")):
                if sensor in limits[kind]:
                    ax.axhline(limits[kind][sensor], color=color, ls="--", lw=1, label=f"{kind} limit")
            ax.set_title(f"{asset} · {sensor}", fontsize=8)
            ax.tick_params(labelsize=7)
    axes[0][0].legend(fontsize=6, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_sensors(forecaster: Forecaster, alerts: pd.DataFrame, count: int = 3) -> list[str]:
    """The sensors to draw: those with a limit or an alert first, then the forecaster's order."""
    limited = [*alerts["sensor"].astype(str)] if not alerts.empty else []
    limited += [*forecaster.upper_limits, *forecaster.lower_limits]
    ordered = [s for s in dict.fromkeys(limited) if s in forecaster.methods]
    return (ordered + [s for s in forecaster.sensors if s not in ordered])[:count]
