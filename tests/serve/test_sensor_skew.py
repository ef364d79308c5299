"""No training/serving skew for the sensor vertical: a held-back asset's readings sent to
``POST /v1/sensor/predict`` (long format, or as the aligned grid) give the batch ``score``
path's RUL and failure probability for that asset (1e-5)."""

from __future__ import annotations

import math
import threading
import time

import httpx
import numpy as np
import pandas as pd
import pytest
import torch
import uvicorn

from flows.serve import sensor as serve_sensor
from flows.serve.app import create_app
from infra.home import HomeLayout
from infra.registry import ModelRegistry
from infra.serving.runtime import key_store
from infra.settings import ServeSettings
from solutions.sensor import data as D
from solutions.sensor import pipeline as P
from solutions.sensor import schema as S
from solutions.sensor.align import align_readings, clean_events, clean_readings
from solutions.sensor.config import AlignConfig, SyntheticFleetConfig, WindowConfig
from solutions.sensor.features import make_windows
from solutions.sensor.model import SensorRULModel
from solutions.sensor.scoring import scores_table
from solutions.sensor.synthetic import generate_fleet
from tests.serve.fraud_helpers import free_port

MODEL = "sensor-rul"
TOL = 1e-5


def _jsonable(rows: pd.DataFrame) -> list[dict]:
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            for r in rows.to_dict("records")]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A tiny fleet, a model trained a few steps on all but two assets, and the batch scores of those two."""
    torch.manual_seed(0)
    home = HomeLayout(tmp_path_factory.mktemp("sensor-home"))
    readings, events = generate_fleet(SyntheticFleetConfig(n_assets=8, min_life=40, max_life=60, fast_rate=4,
                                                           bad_reading_rate=0.0, seed=3))
    readings[S.TIMESTAMP] = readings[S.TIMESTAMP].astype(str)  # as a CSV or a JSON request carries it
    held = sorted(readings[S.ASSET].unique())[-2:]
    train_rows = readings.loc[~readings[S.ASSET].isin(held)]
    cfg = AlignConfig()
    clean, report = clean_readings(train_rows, cfg, "train")
    grid, _ = align_readings(clean, clean_events(events), cfg, report)
    wcfg = WindowConfig(length=12, rul_cap=60.0, horizon=10, n_regimes=1)
    norm = P.fit_normalizer(grid, sorted(grid[S.ASSET].unique()), wcfg, cfg.op_prefix)
    ws = make_windows(grid, norm, length=wcfg.length, stride=2, rul_cap=wcfg.rul_cap, horizon=wcfg.horizon)
    model = SensorRULModel(n_channels=len(norm.channels_), channels=8, embedding_dim=16, rul_cap=wcfg.rul_cap)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x = torch.as_tensor(ws.x, dtype=torch.float32)
    target = torch.as_tensor(np.nan_to_num(ws.rul, nan=wcfg.rul_cap) / wcfg.rul_cap, dtype=torch.float32)
    model.train()
    for _ in range(5):
        pred, _logit = model(x)
        loss = torch.nn.functional.mse_loss(pred, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    registry = ModelRegistry(home.registry())
    ref = registry.register(MODEL, model.state_dict(), params=P.model_params(model, norm, wcfg, threshold=0.4),
                            metrics={"test/rmse": 1.0}, primary_metric="test/rmse", higher_is_better=False)
    registry.set_alias(MODEL, "champion", ref.version)
    # the batch `score --data file` path: the readings file's grid plan, then the score table
    path = home.root / "held.csv"
    held_rows = readings.loc[readings[S.ASSET].isin(held)]
    held_rows.to_csv(path, index=False)
    held_grid, _ = D.readings_plan(path, None, {}, AlignConfig()).build()
    batch, _ = scores_table(ref, held_grid, 0.4, state_dict=registry.load_state_dict(ref))
    return {"home": home, "rows": held_rows, "grid": held_grid, "batch": batch, "held": held, "ref": ref}


@pytest.fixture
def server(fleet: dict):
    home: HomeLayout = fleet["home"]
    settings = ServeSettings(reload_poll_s=0.2, audit_salt="s", fraud_model=None, sensor_model=MODEL,
                             max_readings=len(fleet["rows"]), max_body_bytes=50_000_000)
    app = create_app(settings, build_verticals=[serve_sensor.build], layout=home,
                     registry=ModelRegistry(home.registry()))
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", access_log=False))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        assert time.monotonic() < deadline, "the sensor server did not become ready"
        try:
            if srv.started and httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    key, _ = key_store(home).add("sensor-test", [serve_sensor.SCOPE])
    try:
        yield url, key
    finally:
        srv.should_exit = True
        thread.join(timeout=15)


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
