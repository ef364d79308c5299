"""``POST /v1/sensor/forecast``: the registered forecaster's next H steps of each sensor of each
asset in a request, with prediction intervals, and the alarm limits the forecasts cross.

A request carries recent readings in the formats of ``/v1/sensor/predict`` (long-format
``readings`` or aligned ``grid`` rows); they are aligned by the batch path's functions and
forecast by :func:`solutions.sensor.forecast.forecast_grid`, as ``python -m flows.sensor forecast``
forecasts a file. The models are fitted on each series when it is forecast (statistical models,
a few ms to a few hundred ms per series). :class:`ForecastPredictor` is the forecaster in four
methods; :class:`~infra.serving.model_route.ModelRoute` serves it as it serves the other models
(its batcher's thread runs the forecasts, a request that fails fails alone; breaker, reload, audit).

Served when the registry holds ``INDUSFLOW_SERVE_SENSOR_FORECAST_MODEL`` (default
``sensor-forecast``) as the server starts; same scope as the sensor predictions.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

import pandas as pd
from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from flows.serve.sensor import SCOPE, SensorPredictRequest, check_request_size, request_grid
from infra.errors import DataValidationError
from infra.registry import ModelRef
from infra.serving.auth import Principal, require_scope
from infra.serving.model_route import ModelRoute
from infra.serving.predictor import Answer, Audit, Encoded, Predictor, Rows
from infra.serving.runtime import Services, Vertical
from solutions.sensor import schema as S
from solutions.sensor.forecast_config import KIND, LimitAlert

if TYPE_CHECKING:
    from solutions.sensor.forecast import Forecaster

log = logging.getLogger(__name__)


class SensorForecastRequest(SensorPredictRequest):
    """Recent readings (``readings`` or ``grid``, as for ``/v1/sensor/predict``) and, optionally,
    alarm limits that replace the forecaster's registered ones."""

    upper_limits: dict[str, float] | None = Field(
        default=None, description='Alert when a forecast goes above the limit within the horizon, e.g. {"sensor_11": 48.2}.')
    lower_limits: dict[str, float] | None = Field(
        default=None, description="Alert when a forecast goes below the limit within the horizon.")


class ForecastPoint(BaseModel):
    """One forecast step."""

    step: int = Field(description="The grid step forecast.")
    steps_ahead: int = Field(description="Steps after the asset's last step in the request (1..H).")
    forecast: float
    lower: float = Field(description="Lower bound of the prediction interval.")
    upper: float = Field(description="Upper bound of the prediction interval.")


class SensorForecast(BaseModel):
    """The next H steps of one sensor of one asset."""

    asset_id: str
    sensor: str
    method: str = Field(description="The statsforecast model that forecasts this sensor.")
    points: list[ForecastPoint]


class SensorForecastResponse(BaseModel):
    """Forecasts per asset and sensor (sorted), and the limits they cross."""

    model: str
    model_version: int
    horizon: int
    level: int = Field(description="Prediction interval, in percent.")
    forecasts: list[SensorForecast]
    alerts: list[LimitAlert]


def load_forecaster(ref: ModelRef) -> Forecaster:
    """A registered forecaster (JSON params; nothing else is read)."""
    from solutions.sensor.forecast import Forecaster

    if ref.kind != KIND:
        raise ValueError(f"{ref.spec} is a {ref.kind} model, not a forecaster ({KIND})")
    return Forecaster.from_params(ref.params)


@dataclass(frozen=True)
class Forecasted:
    """One request's forecasts (:func:`~solutions.sensor.forecast.forecast_grid`'s table), the limit
    alerts they raise, and the forecaster with the request's limits."""

    table: pd.DataFrame
    alerts: pd.DataFrame
    forecaster: Forecaster


class ForecastPredictor(Predictor[SensorForecastRequest, "Forecaster", Forecasted]):
    """Forecast each sensor of each asset H steps ahead, with intervals and limit alerts."""

    path = "/v1/sensor/forecast"
    route_name = "forecast"
    tag = "sensor-forecast"
    response_model = SensorForecastResponse
    batchable = False  # each request fits its own series: side by side on the thread pool, not one batch thread

    def __init__(self, model_name: str, services: Services) -> None:
        super().__init__(model_name)
        self.services = services

    def setup(self, ref: ModelRef) -> Forecaster:
        return load_forecaster(ref)

    async def decode_request(self, body: SensorForecastRequest, request: Request,
                             principal: Annotated[Principal, Depends(require_scope(SCOPE))]) -> SensorForecastRequest:
        """The body (422 when invalid, 413 over the size limits)."""
        check_request_size(body, request, self.services)
        return body

    def predict(self, model: Forecaster, items: list[SensorForecastRequest],
                challenger: Forecaster | None = None) -> list[Forecasted | Exception]:
        """Each request aligned and forecast alone (the models are fitted per series: requests share
        no model call); a request whose readings cannot be forecast gets its error."""
        from solutions.sensor import forecast as F

        out: list[Forecasted | Exception] = []
        for body in items:
            forecaster = model.with_limits(body.upper_limits, body.lower_limits)
            try:
                table = F.forecast_grid(forecaster, request_grid(body)[0])
            except (DataValidationError, ValueError) as exc:  # the request's content (e.g. its column mapping)
                out.append(exc)
                continue
            alerts = F.limit_alerts(table, forecaster.upper_limits, forecaster.lower_limits, forecaster.alert_on)
            out.append(Forecasted(table, alerts, forecaster))
        return out

    def encode_response(self, decoded: SensorForecastRequest, answer: Answer[Forecasted]) -> Encoded:
        """Forecasts per asset and sensor (sorted), and the limits they cross."""
        from solutions.sensor.forecast import alert_models

        ref, result = answer.ref, answer.output
        assert not isinstance(result, Exception)
        alerts = alert_models(result.alerts)
        forecasts = [
            SensorForecast(asset_id=str(asset), sensor=str(sensor), method=str(g["method"].iloc[0]),
                           points=[ForecastPoint(step=int(r[S.STEP]), steps_ahead=int(r["steps_ahead"]),
                                                 forecast=float(r["forecast"]), lower=float(r["lower"]),
                                                 upper=float(r["upper"])) for r in g.to_dict("records")])
            for (asset, sensor), g in result.table.groupby([S.ASSET, "sensor"], sort=True)
        ]
        forecaster = result.forecaster
        return Encoded(SensorForecastResponse(model=ref.name, model_version=ref.version, horizon=forecaster.horizon,
                                              level=forecaster.level, forecasts=forecasts, alerts=alerts),
                       Audit(len(decoded.rows), {"alert": len(alerts), "forecast": len(forecasts)},
                             sorted({f.asset_id for f in forecasts})))

    def rows(self, output: Forecasted) -> Rows:
        """The forecast points, counted in the batch metrics; a forecast is not a score: kept out of the
        score log (and there is no challenger)."""
        assets = output.table[S.ASSET].astype(str).tolist()
        return Rows(subjects=assets, ids=assets, scores=output.table["forecast"].to_numpy(float), logged=False)


def build(services: Services) -> Vertical | None:
    """The forecast route (None: no forecaster configured or registered)."""
    name = services.settings.sensor_forecast_model
    if not name:
        return None
    if name not in services.registry.models():
        log.info("serving: no forecaster %s registered, /v1/sensor/forecast is not served (train one with "
                 "`python -m flows.sensor forecast-train` and restart)", name)
        return None
    route = ModelRoute(services, ForecastPredictor(name, services))
    router = APIRouter(tags=["sensor"])
    route.mount(router)
    return Vertical("sensor-forecast", router, [route.slot], on_stop=route.close)
