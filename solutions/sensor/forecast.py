"""Forecasting each asset's sensors H grid steps ahead, with prediction intervals (statsforecast).

The series are the columns of the aligned grid the other sensor flows use (one row per asset and
step): every sensor channel of every asset is one series. The models are statsforecast's fast
statistical ones (naive, seasonal naive, AutoETS, AutoARIMA, AutoTheta): each is fitted on one
series' own recent history when it forecasts, so "training" a forecaster means choosing, per
sensor, the candidate with the lowest MASE on the training assets' last H steps; the choice (a
:class:`Forecaster`, plain JSON) is what the registry stores. It is judged on held-out assets:
forecast their last H steps from the steps before and compare with the truth (MASE per horizon
step, scaled by the in-sample seasonal-naive error, and the share of truths inside the interval).

Batch scoring, the online route and the evaluation all call :func:`forecast_series`; alerts are
the first step at which a forecast (or its interval's bound) crosses a configured limit.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from infra.errors import DataValidationError
from solutions.sensor import schema as S
from solutions.sensor.forecast_config import ForecastConfig, LimitAlert

log = logging.getLogger(__name__)

PRIMARY_METRIC = "test/mase"
#: the per-sensor choice, as a method name in the score tables
CHOSEN = "chosen"
BASELINES = ("naive", "seasonal_naive")
#: past windows statsforecast's conformal intervals are calibrated on (each H steps)
CONFORMAL_WINDOWS = 2
_SEP = "\x1f"
_NOT_SENSORS = {S.ASSET, S.STEP, *S.LABEL_COLUMNS}


# ------------------------------------------------------------------------------------
# grid -> series


def sensor_channels(grid: pd.DataFrame, op_prefix: str = "op_", wanted: Sequence[str] | None = None,
                    ) -> tuple[list[str], dict[str, str]]:
    """The grid columns to forecast and, for the columns left out, why.

    Default: every numeric column that is not a key, a label, a gap flag or an operating setting
    (``op_prefix``, and C-MAPSS's ``op_setting_*``), and that varies (a constant column has no
    scale to judge a forecast by). ``wanted`` names them instead.

    Raises:
        DataValidationError: a wanted column the grid does not have, or no column left.
    """
    numeric = [str(c) for c in grid.columns if c not in _NOT_SENSORS and not str(c).startswith(S.GAP_PREFIX)
               and pd.api.types.is_numeric_dtype(grid[c]) and not pd.api.types.is_bool_dtype(grid[c])]
    skipped: dict[str, str] = {}
    if wanted:
        absent = [c for c in wanted if c not in numeric]
        if absent:
            raise DataValidationError(f"no sensor column(s) {absent} to forecast; the grid has {numeric}",
                                      column=absent[0])
        pool = list(dict.fromkeys(wanted))
    else:
        pool = []
        for c in numeric:
            if c.startswith((op_prefix, "op_setting_")):
                skipped[c] = "operating setting"
            else:
                pool.append(c)
    channels = []
    for c in pool:
        spread = np.nanstd(grid[c].to_numpy(dtype="float64")) if grid[c].notna().any() else np.nan
        if not np.isfinite(spread) or spread == 0:
            skipped[c] = "no reading" if not np.isfinite(spread) else "constant"
        else:
            channels.append(c)
    if not channels:
        raise DataValidationError(f"no sensor column varies, nothing to forecast (left out: {skipped})")
    return channels, skipped


def min_history(cfg: ForecastConfig) -> int:
    """Fewest steps a series needs: a seasonal difference for the MASE scale, and with conformal
    intervals the past windows they are calibrated on (plus one step to fit on)."""
    need = max(3, cfg.season_length + 2)
    if cfg.intervals == "conformal":
        need = max(need, (CONFORMAL_WINDOWS + 1) * cfg.horizon + 1)
    return need


@dataclass(frozen=True)
class SeriesTable:
    """Long-format series: ``unique_id`` (asset and sensor), ``ds`` (grid step), ``y``.

    Attributes:
        history: what the models are fitted on (per series, the last ``history`` steps before the truth).
        truth: the held-out last steps of each series (empty when nothing is held out).
        short: series left out for having fewer steps than the models need.
    """

    history: pd.DataFrame
    truth: pd.DataFrame
    short: int = 0


def series_id(asset: str, sensor: str) -> str:
    return f"{asset}{_SEP}{sensor}"


def split_id(ids: pd.Series) -> tuple[pd.Series, pd.Series]:
    """(asset, sensor) of each ``unique_id``."""
    parts = ids.astype(str).str.split(_SEP, n=1)
    return parts.str[0], parts.str[1]


def series_table(grid: pd.DataFrame, channels: Sequence[str], history: int, hold_out: int = 0,
                 min_steps: int = 3) -> SeriesTable:
    """Each asset's channels as series: gaps carried forward (then back) within the asset, the last
    ``hold_out`` steps kept apart as the truth, at most ``history`` steps before them fitted on."""
    grid = grid.sort_values([S.ASSET, S.STEP])
    frames, truths, short = [], [], 0
    for asset, g in grid.groupby(S.ASSET, sort=True, observed=True):
        # steps a grid sent as rows may skip are put back, carrying the last value forward
        steps = np.arange(int(g[S.STEP].min()), int(g[S.STEP].max()) + 1, dtype="int64")
        values = g.set_index(S.STEP)[list(channels)].reindex(steps).ffill().bfill()
        cut = len(steps) - hold_out
        for c in channels:
            y = values[c].to_numpy(dtype="float64")
            if cut < min_steps or np.isnan(y).any():
                short += 1
                continue
            start = max(0, cut - history)
            uid = series_id(str(asset), c)
            frames.append(pd.DataFrame({"unique_id": uid, "ds": steps[start:cut], "y": y[start:cut]}))
            if hold_out:
                truths.append(pd.DataFrame({"unique_id": uid, "ds": steps[cut:], "y": y[cut:]}))
    empty = pd.DataFrame({"unique_id": pd.Series(dtype=str), "ds": pd.Series(dtype="int64"),
                          "y": pd.Series(dtype="float64")})
    hist = pd.concat(frames, ignore_index=True) if frames else empty
    truth = pd.concat(truths, ignore_index=True) if truths else empty.copy()
    return SeriesTable(hist, truth, short)


# ------------------------------------------------------------------------------------
# the models


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


# ------------------------------------------------------------------------------------
# judging forecasts


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


# ------------------------------------------------------------------------------------
# a registered forecaster


@dataclass(frozen=True)
class Forecaster:
    """What a registered forecaster is: per sensor its method, and how it forecasts.

    Stored as the version's params (JSON); rebuilt with :meth:`from_params`."""

    methods: dict[str, str]
    horizon: int
    level: int
    season_length: int
    intervals: str
    history: int
    upper_limits: dict[str, float] = field(default_factory=dict)
    lower_limits: dict[str, float] = field(default_factory=dict)
    alert_on: str = "bound"
    #: per sensor, the interval's scale factor for each step ahead (:func:`interval_widths`; none: 1)
    widths: dict[str, list[float]] = field(default_factory=dict)

    @property
    def sensors(self) -> list[str]:
        return list(self.methods)

    def config(self) -> ForecastConfig:
        """The settings the models are built with."""
        return ForecastConfig(horizon=self.horizon, level=self.level, season_length=self.season_length,
                              intervals=self.intervals, history=self.history,  # type: ignore[arg-type]
                              upper_limits=self.upper_limits, lower_limits=self.lower_limits,
                              alert_on=self.alert_on)  # type: ignore[arg-type]

    def with_limits(self, upper: Mapping[str, float] | None, lower: Mapping[str, float] | None,
                    alert_on: str | None = None) -> Forecaster:
        """The same forecaster with other alarm limits (given ones replace the registered ones)."""
        return Forecaster(self.methods, self.horizon, self.level, self.season_length, self.intervals, self.history,
                          dict(upper) if upper else self.upper_limits, dict(lower) if lower else self.lower_limits,
                          alert_on or self.alert_on, self.widths)

    def to_params(self) -> dict[str, Any]:
        from statsforecast import __version__

        return {"architecture": "statsforecast", "library": f"statsforecast {__version__}",
                "methods": dict(self.methods), "horizon": self.horizon, "level": self.level,
                "season_length": self.season_length, "intervals": self.intervals, "history": self.history,
                "upper_limits": dict(self.upper_limits), "lower_limits": dict(self.lower_limits),
                "alert_on": self.alert_on, "widths": {k: list(v) for k, v in self.widths.items()}}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Forecaster:
        if params.get("architecture") != "statsforecast":
            raise ValueError(f"not a registered forecaster (architecture {params.get('architecture')!r})")
        return cls({str(k): str(v) for k, v in params["methods"].items()}, int(params["horizon"]),
                   int(params["level"]), int(params["season_length"]), str(params["intervals"]),
                   int(params["history"]), {k: float(v) for k, v in params.get("upper_limits", {}).items()},
                   {k: float(v) for k, v in params.get("lower_limits", {}).items()},
                   str(params.get("alert_on", "bound")),
                   {str(k): [float(x) for x in v] for k, v in params.get("widths", {}).items()})


def forecast_grid(forecaster: Forecaster, grid: pd.DataFrame) -> pd.DataFrame:
    """The next H steps of each sensor of each asset of ``grid``: ``asset_id``, ``sensor``, ``step``
    (the grid step forecast), ``steps_ahead`` (1..H), ``forecast``, ``lower``, ``upper``, ``method``.

    Raises:
        DataValidationError: the grid lacks a sensor the forecaster forecasts, or no asset has
            enough steps.
    """
    missing = [c for c in forecaster.sensors if c not in grid.columns]
    if missing:
        raise DataValidationError(f"the grid lacks sensor(s) {missing} the forecaster forecasts "
                                  f"({forecaster.sensors})", column=missing[0])
    cfg = forecaster.config()
    table = series_table(grid, forecaster.sensors, cfg.history, min_steps=min_history(cfg))
    if table.history.empty:
        raise DataValidationError(f"no asset has the {min_history(cfg)} steps of readings a forecast needs")
    parts = []
    for method in dict.fromkeys(forecaster.methods.values()):
        own = [s for s, m in forecaster.methods.items() if m == method]
        _, sensor = split_id(table.history["unique_id"])
        fc = forecast_series(table.history.loc[sensor.isin(own).to_numpy()], [method], cfg)
        lo, hi = band(method, cfg.level)
        parts.append(fc.rename(columns={method: "forecast", lo: "lower", hi: "upper"}).assign(method=method))
    out = pd.concat(parts, ignore_index=True)
    bad = ~np.isfinite(out[["forecast", "lower", "upper"]].to_numpy(dtype="float64")).all(axis=1)
    if bad.any():
        where = out.loc[bad, "unique_id"].iloc[0].replace(_SEP, ", sensor ")
        raise DataValidationError(f"the forecasts of {out.loc[bad, 'unique_id'].nunique()} series are not finite "
                                  f"numbers (e.g. asset {where}): their readings are too large to model")
    asset, sensor = split_id(out["unique_id"])
    last = table.history.groupby("unique_id")["ds"].max()
    result = pd.DataFrame({
        S.ASSET: asset.to_numpy(), "sensor": sensor.to_numpy(), S.STEP: out["ds"].to_numpy(dtype="int64"),
        "steps_ahead": (out["ds"] - out["unique_id"].map(last)).to_numpy(dtype="int64"),
        "forecast": out["forecast"].to_numpy(dtype="float64"), "lower": out["lower"].to_numpy(dtype="float64"),
        "upper": out["upper"].to_numpy(dtype="float64"), "method": out["method"].to_numpy(),
    })
    if forecaster.widths:
        result["lower"], result["upper"] = widen(result["lower"].to_numpy(), result["upper"].to_numpy(),
                                                 result["sensor"].to_numpy(), result["steps_ahead"].to_numpy(),
                                                 forecaster.widths)
    return result.sort_values([S.ASSET, "sensor", S.STEP]).reset_index(drop=True)


def limit_alerts(table: pd.DataFrame, upper: Mapping[str, float], lower: Mapping[str, float],
                 alert_on: str = "bound") -> pd.DataFrame:
    """The first forecast step of each asset and sensor that crosses a limit within the horizon:
    ``asset_id``, ``sensor``, ``limit_kind`` (upper/lower), ``limit``, ``step``, ``steps_ahead`` and
    ``value`` (the forecast, or with ``alert_on="bound"`` the interval's bound, that crossed)."""
    columns = [S.ASSET, "sensor", "limit_kind", "limit", S.STEP, "steps_ahead", "value"]
    found = []
    for kind, limits in (("upper", upper), ("lower", lower)):
        for sensor, limit in limits.items():
            rows = table.loc[table["sensor"] == sensor]
            value = rows["forecast"] if alert_on == "mean" else rows["upper" if kind == "upper" else "lower"]
            crossed = rows.loc[(value > limit) if kind == "upper" else (value < limit)]
            if crossed.empty:
                continue
            first = crossed.sort_values("steps_ahead").groupby(S.ASSET, sort=True).head(1)
            found.append(pd.DataFrame({
                S.ASSET: first[S.ASSET].to_numpy(), "sensor": sensor, "limit_kind": kind, "limit": float(limit),
                S.STEP: first[S.STEP].to_numpy(), "steps_ahead": first["steps_ahead"].to_numpy(),
                "value": value.loc[first.index].to_numpy(dtype="float64"),
            }))
    if not found:
        return pd.DataFrame({c: pd.Series(dtype=object if c in (S.ASSET, "sensor", "limit_kind") else "float64")
                             for c in columns})
    return pd.concat(found, ignore_index=True).sort_values([S.ASSET, "sensor", "limit_kind"]).reset_index(drop=True)


# ------------------------------------------------------------------------------------
# choosing and judging a forecaster (the training run)


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


def alert_models(alerts: pd.DataFrame) -> list[LimitAlert]:
    """The rows of :func:`limit_alerts` as typed alerts."""
    return [LimitAlert(asset_id=str(r[S.ASSET]), sensor=str(r["sensor"]), limit_kind=r["limit_kind"],
                       limit=float(r["limit"]), step=int(r[S.STEP]), steps_ahead=int(r["steps_ahead"]),
                       value=float(r["value"])) for r in alerts.to_dict("records")]
