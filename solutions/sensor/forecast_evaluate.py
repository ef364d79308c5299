"""Choosing and judging a forecaster (the training run): each candidate's forecasts scored by
MASE per horizon step (scaled by the in-sample seasonal-naive error) and interval coverage, the
per-sensor choice made on the training assets' last H steps and judged on held-out assets."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from infra.errors import DataValidationError
from solutions.sensor import schema as S
from solutions.sensor.forecast import Forecaster
from solutions.sensor.forecast_config import ForecastConfig
from solutions.sensor.forecast_data import SeriesTable, min_history, sensor_channels, series_table, split_id
from solutions.sensor.forecast_models import (
    CHOSEN,
    band,
    forecast_series,
    interval_widths,
    widen_chosen,
    with_chosen,
)

log = logging.getLogger(__name__)

PRIMARY_METRIC = "test/mase"
BASELINES = ("naive", "seasonal_naive")


def mase_scale(history: pd.DataFrame, season_length: int) -> pd.Series:
    """Per series, the in-sample mean absolute seasonal difference (the seasonal-naive one-step
    error MASE divides by); NaN where it is zero (the series never changed)."""
    y = history.sort_values(["unique_id", "ds"])
    diff = (y["y"] - y.groupby("unique_id", sort=False)["y"].shift(season_length)).abs()
    scale = diff.groupby(y["unique_id"], sort=False).mean()
    return scale.where(scale > 0)


def score_forecasts(table: SeriesTable, forecasts: pd.DataFrame, methods: Iterable[str], cfg: ForecastConfig,
                    ) -> pd.DataFrame:
    """Per method, sensor and horizon step (1..H): MASE, interval coverage and the series counted.

    The error of each forecast step is divided by its series' :func:`mase_scale`; a series that never
    changed before its held-out steps has no scale and is left out.
    """
    scale = mase_scale(table.history, cfg.season_length)
    last = table.history.groupby("unique_id")["ds"].max()
    merged = table.truth.merge(forecasts, on=["unique_id", "ds"], how="inner")
    merged["h"] = merged["ds"] - merged["unique_id"].map(last)
    merged["scale"] = merged["unique_id"].map(scale)
    merged = merged.loc[merged["scale"].notna()]
    _, merged["sensor"] = split_id(merged["unique_id"])
    parts = []
    for method in dict.fromkeys(methods):
        lo, hi = band(method, cfg.level)
        y = merged["y"].to_numpy()
        part = pd.DataFrame({
            "method": method, "sensor": merged["sensor"].to_numpy(), "h": merged["h"].to_numpy(dtype="int64"),
            "scaled_error": np.abs(y - merged[method].to_numpy()) / merged["scale"].to_numpy(),
            "covered": (merged[lo].to_numpy() <= y) & (y <= merged[hi].to_numpy()),
        })
        parts.append(part)
    rows = pd.concat(parts, ignore_index=True)
    return (rows.groupby(["method", "sensor", "h"], sort=True)
            .agg(mase=("scaled_error", "mean"), coverage=("covered", "mean"), series=("covered", "size"))
            .reset_index())


def summary(scores: pd.DataFrame, by: str | None = None) -> pd.DataFrame:
    """MASE and coverage per method (and ``by``: ``h`` or ``sensor``), each series weighted alike."""
    keys = ["method"] + ([by] if by else [])
    w = scores.assign(e=scores["mase"] * scores["series"], c=scores["coverage"] * scores["series"])
    agg = w.groupby(keys, sort=True)[["e", "c", "series"]].sum()
    return pd.DataFrame({"mase": agg["e"] / agg["series"], "coverage": agg["c"] / agg["series"],
                         "series": agg["series"]}).reset_index()


def choose_methods(scores: pd.DataFrame, order: Sequence[str]) -> dict[str, str]:
    """Per sensor, the method with the lowest MASE over the horizon (ties: the first in ``order``)."""
    per = summary(scores, "sensor")
    rank = {m: i for i, m in enumerate(order)}
    per = per.assign(rank=per["method"].map(rank)).sort_values(["sensor", "mase", "rank"])
    return {str(s): str(g["method"].iloc[0]) for s, g in per.groupby("sensor", sort=True)}



@dataclass(frozen=True)
class ForecastEvaluation:
    """A forecaster chosen on the training assets and judged on held-out ones.

    Attributes:
        forecaster: the per-sensor choice (what gets registered).
        validation: :func:`score_forecasts` of every candidate on the training assets' last H steps.
        test: the same on the held-out assets, for every candidate, both baselines and the choice.
        skipped: columns not forecast, and why.
        series: (training, held-out) series used; ``short``: left out for too few steps.
    """

    forecaster: Forecaster
    validation: pd.DataFrame
    test: pd.DataFrame
    skipped: dict[str, str]
    series: tuple[int, int]
    short: int

    def metrics(self) -> dict[str, float]:
        """The registered metrics: the choice's test MASE (primary) and coverage, the baselines', the
        choice's validation MASE."""
        test = summary(self.test).set_index("method")
        val = summary(self.validation).set_index("method")
        chosen_val = summary(self.validation.merge(
            pd.DataFrame({"sensor": list(self.forecaster.methods), "method": list(self.forecaster.methods.values())}),
            on=["sensor", "method"]))
        out = {PRIMARY_METRIC: float(test.loc[CHOSEN, "mase"]), "test/coverage": float(test.loc[CHOSEN, "coverage"])}
        for method in test.index:
            if method != CHOSEN:
                out[f"test/mase_{method}"] = float(test.loc[method, "mase"])
                out[f"test/coverage_{method}"] = float(test.loc[method, "coverage"])
        out["val/mase"] = float((chosen_val["mase"] * chosen_val["series"]).sum() / chosen_val["series"].sum())
        out.update({f"val/mase_{m}": float(val.loc[m, "mase"]) for m in val.index})
        return {k: v for k, v in out.items() if np.isfinite(v)}

    def horizon_table(self) -> pd.DataFrame:
        """Test MASE and coverage per horizon step (rows) and method (columns ``<method>/mase``...)."""
        per = summary(self.test, "h").pivot(index="h", columns="method", values=["mase", "coverage"])
        per.columns = [f"{method}/{what}" for what, method in per.columns]
        return per[sorted(per.columns, key=lambda c: (c.split("/")[0] != CHOSEN, c))].reset_index()


def evaluate_forecasters(grid: pd.DataFrame, train_assets: Sequence[str], test_assets: Sequence[str],
                         cfg: ForecastConfig, op_prefix: str = "op_") -> ForecastEvaluation:
    """Choose each sensor's method on the training assets' last H steps (forecast from the steps
    before), then forecast the held-out assets' last H steps with every candidate, both baselines and
    the choice, and score them all (:func:`score_forecasts`)."""
    train = grid.loc[grid[S.ASSET].isin(list(train_assets))]
    held = grid.loc[grid[S.ASSET].isin(list(test_assets))]
    channels, skipped = sensor_channels(train, op_prefix, cfg.sensors)
    need = min_history(cfg)
    fit = series_table(train, channels, cfg.history, hold_out=cfg.horizon, min_steps=need)
    if fit.history.empty:
        raise DataValidationError(f"no training asset has {need + cfg.horizon} steps: too short for a horizon of "
                                  f"{cfg.horizon} (shorten --horizon)")
    log.info("forecast: choosing among %s for %d sensors on %d training series", list(cfg.candidates),
             len(channels), fit.history["unique_id"].nunique())
    fit_forecasts = forecast_series(fit.history, cfg.candidates, cfg)
    validation = score_forecasts(fit, fit_forecasts, cfg.candidates, cfg)
    methods = choose_methods(validation, cfg.candidates)
    missing = [c for c in channels if c not in methods]  # a sensor with no scale anywhere: the naive forecast
    methods.update(dict.fromkeys(missing, "naive"))
    methods = {c: methods[c] for c in channels}
    widths = interval_widths(fit, with_chosen(fit_forecasts, methods, cfg.level), CHOSEN, cfg) if cfg.calibrate else {}
    forecaster = Forecaster(methods, cfg.horizon, cfg.level, cfg.season_length, cfg.intervals, cfg.history,
                            dict(cfg.upper_limits), dict(cfg.lower_limits), cfg.alert_on, widths)
    held_out = series_table(held, channels, cfg.history, hold_out=cfg.horizon, min_steps=need)
    if held_out.history.empty:
        raise DataValidationError(f"no held-out asset has {need + cfg.horizon} steps to judge the forecasts on")
    pool = list(dict.fromkeys([*cfg.candidates, *BASELINES]))
    forecasts = widen_chosen(with_chosen(forecast_series(held_out.history, pool, cfg), forecaster.methods, cfg.level),
                             held_out.history, widths, cfg.level)
    test = score_forecasts(held_out, forecasts, [CHOSEN, *pool], cfg)
    return ForecastEvaluation(forecaster, validation, test, skipped,
                              (fit.history["unique_id"].nunique(), held_out.history["unique_id"].nunique()),
                              fit.short + held_out.short)


def rescore(forecaster: Forecaster, grid: pd.DataFrame, test_assets: Sequence[str]) -> float | None:
    """Another forecaster's (the champion's) test MASE on these held-out assets, or None when it
    forecasts a sensor they lack (it cannot be compared on them)."""
    held = grid.loc[grid[S.ASSET].isin(list(test_assets))]
    if any(c not in held.columns for c in forecaster.sensors):
        return None
    cfg = forecaster.config()
    table = series_table(held, forecaster.sensors, cfg.history, hold_out=cfg.horizon, min_steps=min_history(cfg))
    if table.history.empty:
        return None
    pool = list(dict.fromkeys(forecaster.methods.values()))
    forecasts = widen_chosen(with_chosen(forecast_series(table.history, pool, cfg), forecaster.methods, cfg.level),
                             table.history, forecaster.widths, cfg.level)
    scores = summary(score_forecasts(table, forecasts, [CHOSEN], cfg)).set_index("method")
    return float(scores.loc[CHOSEN, "mase"])
