"""``POST /v1/sensor/forecast``: the registered forecaster's forecasts of a request's assets equal
the batch path's (``forecast_grid`` of the same grid), limits in the request raise alerts, the
route needs the sensor scope, a sensor the request lacks is a 422 naming it, and the route is not
served while no forecaster is registered."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from fastapi.testclient import TestClient

from flows.serve import sensor_forecast
from flows.serve.app import create_app
from infra.errors import DataValidationError
from infra.home import HomeLayout
from infra.registry import ModelRegistry
from infra.serving.runtime import ServeTuning, key_store
from infra.settings import ServeSettings
from solutions.sensor import forecast as F
from solutions.sensor import forecast_evaluate as FE
from solutions.sensor import schema as S
from solutions.sensor.align import align_readings, clean_readings
from solutions.sensor.config import AlignConfig, SyntheticFleetConfig
from solutions.sensor.forecast_config import KIND
from solutions.sensor.synthetic import generate_fleet
from tests.serve.sensor_helpers import jsonable

MODEL = "sensor-forecast"
FORECASTER = F.Forecaster({"temperature": "auto_ets", "current": "naive"}, horizon=4, level=80, season_length=1,
                          intervals="model", history=60, upper_limits={"temperature": 1e6})


def _readings() -> pd.DataFrame:
    readings, _ = generate_fleet(SyntheticFleetConfig(n_assets=4, min_life=40, max_life=50, fast_rate=4,
                                                      bad_reading_rate=0.0, seed=5))
    readings = readings.loc[readings[S.ASSET].isin(sorted(readings[S.ASSET].unique())[:2])].copy()
    readings[S.TIMESTAMP] = readings[S.TIMESTAMP].astype(str)  # as a JSON request carries it
    return readings


def _app(home: HomeLayout, register: bool = True) -> TestClient:
    registry = ModelRegistry(home.registry())
    if register:
        ref = registry.register(MODEL, {}, params=FORECASTER.to_params(), metrics={FE.PRIMARY_METRIC: 0.9},
                                primary_metric=FE.PRIMARY_METRIC, higher_is_better=False, kind=KIND)
        registry.set_alias(MODEL, "champion", ref.version)
    settings = ServeSettings(audit_salt="s", fraud_model="", sensor_model="", max_body_bytes=50_000_000)
    app = create_app(settings, build_verticals=[sensor_forecast.build], layout=home, registry=registry,
                     tuning=ServeTuning(reload_poll_s=0.2))
    return TestClient(app)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, str, str]]:
    home = HomeLayout(tmp_path_factory.mktemp("forecast-serve"))
    with _app(home) as c:
        deadline = time.monotonic() + 30
        while c.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, c.get("/readyz").json()
            time.sleep(0.05)
        key, _ = key_store(home).add("forecast-test", ["sensor:predict"])
        other, _ = key_store(home).add("fraud-only", ["fraud:score"])
        yield c, key, other


def _post(c: TestClient, key: str, body: dict) -> object:
    return c.post("/v1/sensor/forecast", json=body, headers={"X-API-Key": key})


def test_readings_forecast_as_the_batch_path_forecasts_their_grid(client) -> None:
    c, key, _ = client
    readings = _readings()
    response = _post(c, key, {"readings": jsonable(readings)})
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["model"], body["model_version"], body["horizon"], body["level"]) == (MODEL, 1, 4, 80)
    clean, report = clean_readings(readings, AlignConfig(), "request")
    grid, _ = align_readings(clean, None, AlignConfig(), report)
    batch = F.forecast_grid(FORECASTER, grid)
    served = pd.DataFrame([{S.ASSET: f["asset_id"], "sensor": f["sensor"], "method": f["method"], **p}
                           for f in body["forecasts"] for p in f["points"]])
    assert len(served) == len(batch) == 2 * 2 * 4
    merged = batch.merge(served, on=[S.ASSET, "sensor", S.STEP, "steps_ahead", "method"], suffixes=("", "_served"))
    assert len(merged) == len(batch)
    for col in ("forecast", "lower", "upper"):
        assert (merged[col] - merged[f"{col}_served"]).abs().max() < 1e-9
    assert body["alerts"] == []  # the registered limit (1e6) is far away


def test_limits_in_the_request_raise_alerts_at_the_first_step_crossed(client) -> None:
    c, key, _ = client
    rows = jsonable(_readings())
    body = _post(c, key, {"readings": rows, "upper_limits": {"current": -1e6}, "lower_limits": {"temperature": 1e6}}).json()
    alerts = {(a["asset_id"], a["sensor"], a["limit_kind"]): a for a in body["alerts"]}
    assets = sorted({f["asset_id"] for f in body["forecasts"]})
    assert set(alerts) == {(a, s, k) for a in assets for s, k in (("current", "upper"), ("temperature", "lower"))}
    assert all(a["steps_ahead"] == 1 for a in alerts.values())  # crossed from the first step on
    first = next(f for f in body["forecasts"] if f["asset_id"] == assets[0] and f["sensor"] == "current")
    assert alerts[(assets[0], "current", "upper")]["value"] == pytest.approx(first["points"][0]["upper"])


def test_the_route_needs_the_sensor_scope(client) -> None:
    c, _, other = client
    rows = jsonable(_readings())
    assert c.post("/v1/sensor/forecast", json={"readings": rows}).status_code == 401
    assert _post(c, other, {"readings": rows}).status_code == 403


def test_a_sensor_the_request_lacks_is_a_422_naming_it(client) -> None:
    c, key, _ = client
    grid = [{"asset_id": "m1", "step": i, "temperature": 80.0 + i} for i in range(20)]
    response = _post(c, key, {"grid": grid})
    assert response.status_code == 422
    assert response.json()["detail"]["column"] == "current" and "current" in response.json()["detail"]["error"]


def test_not_served_while_no_forecaster_is_registered(tmp_path: Path) -> None:
    home = HomeLayout(tmp_path)
    with _app(home, register=False) as c:
        key, _ = key_store(home).add("forecast-test", ["sensor:predict"])
        # a key is checked before the route is looked up (no body is read before authentication)
        assert _post(c, key, {"readings": []}).status_code == 404


def test_readings_too_large_to_model_are_a_422_not_a_server_error(client) -> None:
    c, key, _ = client
    grid = [{"asset_id": "m1", "step": i, "temperature": 1.7e308 * (-1) ** i, "current": 1.0} for i in range(20)]
    response = _post(c, key, {"grid": grid})
    assert response.status_code == 422 and "not finite numbers" in response.json()["detail"]["error"]


def test_requests_batched_together_are_forecast_alone_and_a_bad_one_fails_alone() -> None:
    """The forecaster is a Predictor served by ModelRoute: a batch's requests are each forecast as the
    batch path forecasts their grid, with their own limits, and one that cannot be forecast gets its
    own error while the others are answered."""
    predictor = sensor_forecast.ForecastPredictor(MODEL, services=None)  # type: ignore[arg-type]
    readings = jsonable(_readings())
    good = sensor_forecast.SensorForecastRequest(readings=readings)
    limited = sensor_forecast.SensorForecastRequest(readings=readings, upper_limits={"current": -1e6})
    lacking = sensor_forecast.SensorForecastRequest(
        grid=[{"asset_id": "m1", "step": i, "temperature": 80.0 + i} for i in range(20)])
    out = predictor.predict(FORECASTER, [good, lacking, limited])
    assert isinstance(out[1], DataValidationError) and out[1].column == "current"
    first, third = out[0], out[2]
    assert isinstance(first, sensor_forecast.Forecasted) and isinstance(third, sensor_forecast.Forecasted)
    pd.testing.assert_frame_equal(first.table, third.table)
    assert first.alerts.empty and set(third.alerts["sensor"]) == {"current"}
    assert not predictor.rows(first).logged  # forecasts are not scores: no score-log line
