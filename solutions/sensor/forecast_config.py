"""Settings of sensor forecasting (the next H grid steps of each sensor, with intervals).

A light module (pydantic only) so that ``python -m flows.sensor forecast --help`` reads the
flags without importing the forecasting library.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: ``ModelRef.kind`` of a registered forecaster: JSON params only (no weights, nothing unpickled)
KIND = "statsforecast"
#: the candidate pool: statsforecast models by our names
Method = Literal["naive", "seasonal_naive", "auto_ets", "auto_arima", "auto_theta"]


class ForecastConfig(BaseModel):
    """How sensors are forecast: horizon, interval, candidate models, limits that raise an alert."""

    model_config = ConfigDict(frozen=True)

    horizon: int = Field(default=10, ge=1, le=500, description="Grid steps forecast ahead (H).")
    level: int = Field(default=80, ge=50, le=99, description="Prediction interval, in percent.")
    season_length: int = Field(
        default=1, ge=1,
        description="Steps in one season (24 for a daily cycle of hourly steps); 1: no season, and the "
        "seasonal-naive baseline is the naive one.")
    candidates: tuple[Method, ...] = Field(
        default=("naive", "seasonal_naive", "auto_ets", "auto_arima"),
        description="Models tried for each sensor; the one with the lowest MASE on the training assets' "
        "last H steps forecasts that sensor.")
    intervals: Literal["model", "conformal"] = Field(
        default="model",
        description="model: each model's own predictive distribution; conformal: statsforecast's conformal "
        "intervals from each asset's own recent forecast errors (needs 3H steps of history).")
    calibrate: bool = Field(
        default=True,
        description="Rescale each sensor's interval per horizon step so that `level`% of the training assets' "
        "last-H truths fall inside it (the chosen model's own errors there; its intervals are kept as they are "
        "when off).")
    sensors: tuple[str, ...] | None = Field(
        default=None,
        description="Grid columns to forecast (default: every sensor column that varies; operating settings "
        "and gap flags excluded).")
    history: int = Field(default=100, ge=8, description="Most recent grid steps each asset's models are fitted on.")
    upper_limits: dict[str, float] = Field(
        default_factory=dict, description="Alarm limits sensor=VALUE: alert when a forecast goes above one within H.")
    lower_limits: dict[str, float] = Field(
        default_factory=dict, description="Alarm limits sensor=VALUE: alert when a forecast goes below one within H.")
    alert_on: Literal["bound", "mean"] = Field(
        default="bound",
        description="bound: alert when the interval's bound crosses the limit (early warning); mean: when the "
        "point forecast does.")
    model_name: str = Field(default="sensor-forecast", description="Registry name of the forecaster.")
    plot_assets: int = Field(default=3, ge=0, le=20, description="Assets drawn in the forecast plot.")

    @model_validator(mode="after")
    def _pool(self) -> ForecastConfig:
        if not self.candidates:
            raise ValueError("candidates: name at least one model")
        both = sorted(set(self.upper_limits) & set(self.lower_limits))
        for name in both:
            if self.lower_limits[name] >= self.upper_limits[name]:
                raise ValueError(f"limits of {name}: the lower one ({self.lower_limits[name]}) is not below the "
                                 f"upper one ({self.upper_limits[name]})")
        return self


class LimitAlert(BaseModel):
    """A forecast that crosses an alarm limit within the horizon (the first step it does)."""

    model_config = ConfigDict(frozen=True)

    asset_id: str
    sensor: str
    limit_kind: Literal["upper", "lower"]
    limit: float
    step: int = Field(description="The grid step forecast to cross the limit (the first one).")
    steps_ahead: int = Field(description="Steps after the asset's last step (1..H).")
    value: float = Field(description="What crossed: the interval's bound (alert_on=bound) or the forecast.")
