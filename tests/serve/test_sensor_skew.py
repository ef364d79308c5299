"""No training/serving skew for the sensor vertical: a held-back asset's readings sent to
``POST /v1/sensor/predict`` (long format, or as the aligned grid) give the batch ``score``
path's RUL and failure probability for that asset (1e-5)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pandas as pd
import pytest

from infra.home import HomeLayout
from infra.serving.runtime import key_store
from solutions.sensor import schema as S
from tests.serve.sensor_helpers import SensorServer, TinySensor, train_tiny_sensor
from tests.serve.sensor_helpers import jsonable as _jsonable

TOL = 1e-5


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A tiny fleet, a model trained a few steps on all but two assets, and the batch scores of those two."""
    home = HomeLayout(tmp_path_factory.mktemp("sensor-home"))
    tiny: TinySensor = train_tiny_sensor(home)
    return {"home": home, "rows": tiny.rows, "grid": tiny.grid, "batch": tiny.batch, "held": tiny.held,
            "ref": tiny.ref}


@pytest.fixture
def server(fleet: dict) -> Iterator[tuple[str, str]]:
    with SensorServer(fleet["home"], max_readings=len(fleet["rows"])) as srv:
        yield srv.url, srv.key


def _check(predictions: list[dict], batch: pd.DataFrame, version: int, same_steps: bool = True) -> None:
    online = {p["asset_id"]: p for p in predictions}
    assert set(online) == set(batch[S.ASSET])
    for row in batch.to_dict("records"):
        p = online[row[S.ASSET]]
        assert abs(p["predicted_rul"] - row["predicted_rul"]) <= TOL
        assert abs(p["failure_probability"] - row["failure_probability"]) <= TOL
        assert p["alert"] == bool(row["alert"]) and p["model_version"] == version
        assert p["step"] == row[S.STEP] or not same_steps


def test_held_back_assets_match_batch_scores(fleet: dict, server: tuple[str, str]) -> None:
    url, key = server
    headers = {"X-API-Key": key}
    with httpx.Client(timeout=60) as client:
        # one asset per request, long format
        for asset in fleet["held"]:
            rows = fleet["rows"].loc[fleet["rows"][S.ASSET] == asset]
            response = client.post(f"{url}/v1/sensor/predict", json={"readings": _jsonable(rows)}, headers=headers)
            assert response.status_code == 200, response.text
            _check(response.json()["predictions"], fleet["batch"].loc[fleet["batch"][S.ASSET] == asset],
                   fleet["ref"].version)
        # only the recent readings (window + forward-fill limit + 1 steps): the same window, the same answer
        for asset in fleet["held"]:
            rows = fleet["rows"].loc[fleet["rows"][S.ASSET] == asset]
            ts = pd.to_datetime(rows[S.TIMESTAMP])
            recent = rows.loc[(ts >= ts.max() - pd.Timedelta(hours=12 + 3 + 1)).to_numpy()]
            response = client.post(f"{url}/v1/sensor/predict", json={"readings": _jsonable(recent)}, headers=headers)
            assert response.status_code == 200, response.text
            _check(response.json()["predictions"], fleet["batch"].loc[fleet["batch"][S.ASSET] == asset],
                   fleet["ref"].version, same_steps=False)
        # both assets in one request, with source column names
        renamed = fleet["rows"].rename(columns={S.ASSET: "machine", S.SENSOR: "probe"})
        response = client.post(f"{url}/v1/sensor/predict", headers=headers,
                               json={"readings": _jsonable(renamed), "columns": {"asset_id": "machine", "sensor": "probe"}})
        assert response.status_code == 200, response.text
        _check(response.json()["predictions"], fleet["batch"], fleet["ref"].version)
        # the aligned grid format
        grid = fleet["grid"].drop(columns=[S.RUL, S.FAILED, S.FAILURE_TYPE, S.SET])
        response = client.post(f"{url}/v1/sensor/predict", json={"grid": _jsonable(grid)}, headers=headers)
        assert response.status_code == 200, response.text
        _check(response.json()["predictions"], fleet["batch"], fleet["ref"].version)
        too_many = client.post(f"{url}/v1/sensor/predict", headers=headers,
                               json={"readings": _jsonable(pd.concat([fleet["rows"], fleet["rows"].head(1)]))})
        assert too_many.status_code == 413 and "readings" in too_many.text
        # bad input: 422 naming the column
        bad = client.post(f"{url}/v1/sensor/predict", headers=headers,
                          json={"readings": _jsonable(fleet["rows"].drop(columns=[S.SENSOR]).head(5))})
        assert bad.status_code == 422 and "sensor" in bad.text
        both = client.post(f"{url}/v1/sensor/predict", headers=headers, json={"readings": [], "grid": []})
        assert both.status_code == 422
        denied = client.post(f"{url}/v1/sensor/predict", json={"grid": _jsonable(grid.head(2))},
                             headers={"X-API-Key": key_store(fleet["home"]).add("no-scope", ["fraud:score"])[0]})
        assert denied.status_code == 403
