"""The statsforecast models, their forecasts of a :class:`SeriesTable`'s series, the per-sensor
choice (:data:`CHOSEN`) among them, and intervals rescaled to their calibrated width."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from solutions.sensor.forecast_config import ForecastConfig
from solutions.sensor.forecast_data import CONFORMAL_WINDOWS, SeriesTable, split_id

#: the per-sensor choice, as a method name in the score tables
CHOSEN = "chosen"


def make_models(methods: Iterable[str], cfg: ForecastConfig) -> list[Any]:
    """statsforecast models of the named methods, each under its own name (the output columns)."""
    from statsforecast.models import AutoARIMA, AutoETS, AutoTheta, Naive, SeasonalNaive
    from statsforecast.utils import ConformalIntervals

    m = cfg.season_length
    builders = {
        "naive": lambda pi: Naive(alias="naive", prediction_intervals=pi),
        "seasonal_naive": lambda pi: SeasonalNaive(season_length=m, alias="seasonal_naive", prediction_intervals=pi),
        "auto_ets": lambda pi: AutoETS(season_length=m, alias="auto_ets", prediction_intervals=pi),
        "auto_arima": lambda pi: AutoARIMA(season_length=m, alias="auto_arima", prediction_intervals=pi),
        "auto_theta": lambda pi: AutoTheta(season_length=m, alias="auto_theta", prediction_intervals=pi),
    }
    pi = ConformalIntervals(n_windows=CONFORMAL_WINDOWS, h=cfg.horizon) if cfg.intervals == "conformal" else None
    unknown = [name for name in methods if name not in builders]
    if unknown:
        raise ValueError(f"unknown forecasting method(s) {unknown}; known: {sorted(builders)}")
    return [builders[name](pi) for name in dict.fromkeys(methods)]


def forecast_series(history: pd.DataFrame, methods: Iterable[str], cfg: ForecastConfig) -> pd.DataFrame:
    """The next ``cfg.horizon`` steps of every series of ``history`` by every method: ``unique_id``,
    ``ds``, and per method ``<method>``, ``<method>-lo-<level>``, ``<method>-hi-<level>``.
    A model that fails on a series (e.g. too short for it) is replaced there by the naive one."""
    from statsforecast import StatsForecast

    methods = list(dict.fromkeys(methods))
    if history.empty:
        return pd.DataFrame(columns=["unique_id", "ds", *methods])
    fallback = make_models(["naive"], cfg)[0]
    sf = StatsForecast(models=make_models(methods, cfg), freq=1, n_jobs=1, fallback_model=fallback)
    with np.errstate(over="ignore", invalid="ignore"):  # absurd readings: non-finite forecasts, caught by the caller
        out = sf.forecast(df=history, h=cfg.horizon, level=[cfg.level])
    return out.reset_index(drop=True) if "unique_id" in out.columns else out.reset_index()


def band(method: str, level: int) -> tuple[str, str]:
    """Names of a method's interval columns."""
    return f"{method}-lo-{level}", f"{method}-hi-{level}"


def with_chosen(forecasts: pd.DataFrame, methods: Mapping[str, str], level: int) -> pd.DataFrame:
    """``forecasts`` plus the :data:`CHOSEN` columns: each row's sensor's method's forecast and interval."""
    out = forecasts.copy()
    _, sensor = split_id(out["unique_id"])
    lo_c, hi_c = band(CHOSEN, level)
    out[CHOSEN], out[lo_c], out[hi_c] = np.nan, np.nan, np.nan
    for name, method in methods.items():
        rows = (sensor == name).to_numpy()
        lo, hi = band(method, level)
        out.loc[rows, CHOSEN] = out.loc[rows, method]
        out.loc[rows, lo_c] = out.loc[rows, lo]
        out.loc[rows, hi_c] = out.loc[rows, hi]
    return out


def widen(lower: np.ndarray, upper: np.ndarray, sensor: np.ndarray, steps_ahead: np.ndarray,
          widths: Mapping[str, Sequence[float]]) -> tuple[np.ndarray, np.ndarray]:
    """Intervals rescaled about their centre by each sensor's factor for each step ahead (1 where
    ``widths`` has none)."""
    factor = np.ones(len(lower))
    for name, per_step in widths.items():
        rows = sensor == name
        idx = np.clip(steps_ahead[rows] - 1, 0, len(per_step) - 1)
        factor[rows] = np.asarray(per_step, dtype="float64")[idx]
    centre, half = (upper + lower) / 2, (upper - lower) / 2 * factor
    return centre - half, centre + half


def interval_widths(table: SeriesTable, forecasts: pd.DataFrame, method: str, cfg: ForecastConfig,
                    ) -> dict[str, list[float]]:
    """Per sensor and step ahead, the factor by which ``method``'s interval must be scaled for
    ``cfg.level``% of the held-out truths of ``table`` to fall inside it (the level-quantile of
    |truth - centre| / half-width); 1 where no truth or no width was seen."""
    lo, hi = band(method, cfg.level)
    merged = table.truth.merge(forecasts, on=["unique_id", "ds"], how="inner")
    last = table.history.groupby("unique_id")["ds"].max()
    h = (merged["ds"] - merged["unique_id"].map(last)).to_numpy()
    _, sensor = split_id(merged["unique_id"])
    half = ((merged[hi] - merged[lo]) / 2).to_numpy(dtype="float64")
    centre = ((merged[hi] + merged[lo]) / 2).to_numpy(dtype="float64")
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(half > 0, np.abs(merged["y"].to_numpy() - centre) / half, np.nan)
    q = pd.Series(ratio).groupby([sensor.to_numpy(), h]).quantile(cfg.level / 100)
    out = {}
    for name in sorted(set(sensor)):
        steps = [q.get((name, step), np.nan) for step in range(1, cfg.horizon + 1)]
        out[str(name)] = [float(v) if np.isfinite(v) and v > 0 else 1.0 for v in steps]
    return out


def widen_chosen(forecasts: pd.DataFrame, history: pd.DataFrame, widths: Mapping[str, Sequence[float]],
                 level: int) -> pd.DataFrame:
    """``forecasts`` with the :data:`CHOSEN` interval rescaled by :func:`widen`."""
    if not widths:
        return forecasts
    out = forecasts.copy()
    lo, hi = band(CHOSEN, level)
    last = history.groupby("unique_id")["ds"].max()
    _, sensor = split_id(out["unique_id"])
    steps = (out["ds"] - out["unique_id"].map(last)).to_numpy(dtype="int64")
    out[lo], out[hi] = widen(out[lo].to_numpy(dtype="float64"), out[hi].to_numpy(dtype="float64"),
                             sensor.to_numpy(), steps, widths)
    return out
