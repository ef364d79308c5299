"""A TCN or patch-transformer sensor model serves like the CNN: trained a few steps, registered
as champion, its held-back assets' readings sent to ``POST /v1/sensor/predict`` give the batch
``score`` path's RUL and failure probability (1e-5)."""

from __future__ import annotations

import httpx
import pytest

from infra.home import HomeLayout
from solutions.sensor import schema as S
from tests.serve.sensor_helpers import SensorServer, train_tiny_sensor
from tests.serve.sensor_helpers import jsonable as _jsonable


@pytest.mark.parametrize("arch", ["tcn", "transformer"])
def test_a_tcn_or_transformer_serves_its_batch_scores(arch: str, tmp_path) -> None:
    home = HomeLayout(tmp_path / "home")
    tiny = train_tiny_sensor(home, arch=arch)
    assert tiny.ref.params["hparams"]["arch"] == arch
    with SensorServer(home, max_readings=len(tiny.rows)) as srv, httpx.Client(timeout=60) as client:
        response = client.post(f"{srv.url}/v1/sensor/predict", json={"readings": _jsonable(tiny.rows)},
                               headers={"X-API-Key": srv.key})
    assert response.status_code == 200, response.text
    online = {p["asset_id"]: p for p in response.json()["predictions"]}
    assert set(online) == set(tiny.batch[S.ASSET])
    for row in tiny.batch.to_dict("records"):
        p = online[row[S.ASSET]]
        assert abs(p["predicted_rul"] - row["predicted_rul"]) <= 1e-5
        assert abs(p["failure_probability"] - row["failure_probability"]) <= 1e-5
        assert p["model_version"] == tiny.ref.version
