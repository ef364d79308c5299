"""Forecasting each asset's sensors H grid steps ahead, with prediction intervals (statsforecast).

The series are the columns of the aligned grid the other sensor flows use (one row per asset and
step): every sensor channel of every asset is one series. The models are statsforecast's fast
statistical ones (naive, seasonal naive, AutoETS, AutoARIMA, AutoTheta): each is fitted on one
series' own recent history when it forecasts, so "training" a forecaster means choosing, per
sensor, the candidate with the lowest MASE on the training assets' last H steps; the choice (a
:class:`Forecaster`, plain JSON) is what the registry stores. It is judged on held-out assets:
forecast their last H steps from the steps before and compare with the truth (MASE per horizon
step, scaled by the in-sample seasonal-naive error, and the share of truths inside the interval).

This module holds the registered forecaster and its use (:func:`forecast_grid`, limit alerts); the
grid's series are shaped in :mod:`~solutions.sensor.forecast_data`, the models run in
:mod:`~solutions.sensor.forecast_models`, and the choice is made and judged in
:mod:`~solutions.sensor.forecast_evaluate`. Batch scoring, the online route and the evaluation all
call :func:`~solutions.sensor.forecast_models.forecast_series`; alerts are the first step at which a
forecast (or its interval's bound) crosses a configured limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from infra.errors import DataValidationError
from solutions.sensor import schema as S
from solutions.sensor.forecast_config import ForecastConfig, LimitAlert
from solutions.sensor.forecast_data import describe_series, min_history, series_table, split_id
from solutions.sensor.forecast_models import band, forecast_series, widen


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
        where = describe_series(out.loc[bad, "unique_id"].iloc[0])
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



def alert_models(alerts: pd.DataFrame) -> list[LimitAlert]:
    """The rows of :func:`limit_alerts` as typed alerts."""
    return [LimitAlert(asset_id=str(r[S.ASSET]), sensor=str(r["sensor"]), limit_kind=r["limit_kind"],
                       limit=float(r["limit"]), step=int(r[S.STEP]), steps_ahead=int(r["steps_ahead"]),
                       value=float(r["value"])) for r in alerts.to_dict("records")]
