"""``POST /v1/sensor/predict`` in each documented request format, as README.md and
docs/sensor_api.md tell it: the README's request file (long-format readings), the OpenAPI
example, the aligned grid, C-MAPSS engines as grid rows (step = cycle - 1) — each equal to the
batch path's score of the same data (1e-5) — and every malformed request a 422 naming the field."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest
import torch

from flows.serve import sensor as serve_sensor
from infra.home import HomeLayout
from infra.registry import ModelRegistry
from solutions.sensor import data as D
from solutions.sensor import pipeline as P
from solutions.sensor import schema as S
from solutions.sensor.cmapss import COLUMNS, OP_COLUMNS, SENSOR_COLUMNS, load_cmapss
from solutions.sensor.config import AlignConfig, SensorSource, WindowConfig
from solutions.sensor.features import make_windows
from solutions.sensor.model import SensorRULModel
from solutions.sensor.scoring import scores_table, units_to_score
from tests.serve.sensor_helpers import WINDOW, SensorServer, TinySensor, jsonable, train_tiny_sensor

TOL = 1e-5
REPO = Path(__file__).resolve().parents[2]
README_REQUEST = REPO / "docs" / "examples" / "sensor-predict.json"
CMAPSS_MODEL = "cmapss-rul"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[HomeLayout, TinySensor]:
    home = HomeLayout(tmp_path_factory.mktemp("sensor-formats"))
    return home, train_tiny_sensor(home)


@pytest.fixture(scope="module")
def server(tiny: tuple[HomeLayout, TinySensor]) -> Iterator[SensorServer]:
    with SensorServer(tiny[0]) as srv:
        yield srv


def _batch_score_of_readings(home: HomeLayout, ref, readings: list[dict]) -> pd.DataFrame:
    """``sensor score --data file``'s functions on the readings written to a CSV."""
    path = home.root / "request.csv"
    pd.DataFrame(readings).to_csv(path, index=False)
    grid, _ = D.readings_plan(path, None, {}, AlignConfig()).build()
    return scores_table(ref, grid, 0.4, state_dict=ModelRegistry(home.registry()).load_state_dict(ref))[0]


def _same(prediction: dict, row: dict) -> None:
    assert prediction["asset_id"] == row[S.ASSET] and prediction["step"] == row[S.STEP]
    assert abs(prediction["predicted_rul"] - row["predicted_rul"]) <= TOL
    assert abs(prediction["failure_probability"] - row["failure_probability"]) <= TOL
    assert prediction["alert"] == bool(row["alert"])


def _post(srv: SensorServer, body: dict) -> httpx.Response:
    return httpx.post(f"{srv.url}/v1/sensor/predict", json=body, headers={"X-API-Key": srv.key}, timeout=60)


def test_the_readme_request_file_scores_as_the_batch_path(tiny, server: SensorServer) -> None:
    home, model = tiny
    body = json.loads(README_REQUEST.read_text())
    readings = body["readings"]
    sensors = {r["sensor"] for r in readings}
    assert sensors == {"op_load", "op_speed", "temperature", "pressure", "flow", "current", "vib_radial", "vib_axial"}
    hours = pd.to_datetime([r["timestamp"] for r in readings]).floor("h").nunique()
    assert 20 <= hours < 60  # more real steps than training's shortest padded windows, fewer than the default window
    response = _post(server, body)
    assert response.status_code == 200, response.text
    [prediction] = response.json()["predictions"]
    [row] = _batch_score_of_readings(home, model.ref, readings).to_dict("records")
    _same(prediction, row)
    assert prediction["asset_id"] == "pump-7" and prediction["step"] == hours - 1


def test_the_openapi_example_is_a_working_request(tiny, server: SensorServer) -> None:
    home, model = tiny
    schema = httpx.get(f"{server.url}/openapi.json").json()
    examples = schema["paths"]["/v1/sensor/predict"]["post"]["requestBody"]["content"]["application/json"]["examples"]
    example = examples["readings"]["value"]
    assert set(examples["cmapss"]["value"]["grid"][0]) == {"asset_id", "step", *OP_COLUMNS, *SENSOR_COLUMNS}
    response = _post(server, example)
    assert response.status_code == 200, response.text
    [prediction] = response.json()["predictions"]
    assert prediction["step"] == 1  # two grid steps, left-padded to the window
    [row] = _batch_score_of_readings(home, model.ref, example["readings"]).to_dict("records")
    _same(prediction, row)


def test_short_or_incomplete_requests_are_422_naming_the_field(tiny, server: SensorServer) -> None:
    _, model = tiny
    readings = jsonable(model.rows.loc[model.rows[S.ASSET] == model.held[0]])
    # the README's old one-reading body: one grid step
    one = _post(server, {"readings": [{"asset_id": "pump-7", "timestamp": "2025-03-01T10:00:00",
                                       "sensor": "temperature", "value": 71.2}]})
    assert one.status_code == 422
    detail = one.json()["detail"]
    assert detail["column"] == "timestamp" and "at least 2 steps" in detail["error"] and f"{WINDOW} steps" in detail["error"]
    # a renamed sensor: the model's feature is missing (was a 500 before)
    renamed = [{**r, "sensor": "temp"} if r["sensor"] == "temperature" else r for r in readings]
    bad = _post(server, {"readings": renamed})
    assert bad.status_code == 422, bad.text
    assert bad.json()["detail"]["column"] == "temperature" and "temperature" in bad.json()["detail"]["error"]
    # a fast sensor sent once per step is aggregated as a slow one: the answer says why
    sparse, seen = [], set()
    for r in readings:
        hour = (r["sensor"], r["timestamp"][:13])
        if r["sensor"] == "vib_radial" and hour in seen:
            continue
        seen.add(hour)
        sparse.append(r)
    slow = _post(server, {"readings": sparse})
    assert slow.status_code == 422
    assert slow.json()["detail"]["column"].startswith("vib_radial_") and "fast sensor" in slow.json()["detail"]["error"]
    # a grid without a feature, a nested value, an unmapped column
    grid = model.grid.drop(columns=[S.RUL, S.FAILED, S.FAILURE_TYPE, S.SET])
    no_flow = _post(server, {"grid": jsonable(grid.drop(columns=["flow"]))})
    assert no_flow.status_code == 422 and no_flow.json()["detail"]["column"] == "flow"
    nested = _post(server, {"readings": [{**readings[0], "asset_id": {"id": 1}}, *readings[1:]]})
    assert nested.status_code == 422 and nested.json()["detail"]["column"] == "asset_id"
    unmapped = _post(server, {"readings": readings, "columns": {"asset_id": "machine"}})
    assert unmapped.status_code == 422 and unmapped.json()["detail"]["column"] == "machine"
    # none of it counted as a model failure: a good request still answers
    assert _post(server, {"readings": readings}).status_code == 200


def test_a_bad_request_does_not_fail_the_good_one_it_shares_a_model_call_with(tiny, server: SensorServer) -> None:
    _, model = tiny
    good = jsonable(model.rows.loc[model.rows[S.ASSET] == model.held[0]])
    bad = [r for r in good if r["sensor"] != "current"]
    answers: dict[str, list[int]] = {"good": [], "bad": []}

    def send(kind: str, body: list[dict]) -> None:
        for _ in range(3):
            answers[kind].append(_post(server, {"readings": body}).status_code)

    threads = [threading.Thread(target=send, args=("good", good)), threading.Thread(target=send, args=("bad", bad))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == {"good": [200] * 3, "bad": [422] * 3}


def _write_cmapss(folder: Path, rng: np.random.Generator) -> None:
    """A small C-MAPSS-format folder: 6 run-to-failure train engines, 2 cut test engines and their RUL."""
    folder.mkdir(parents=True, exist_ok=True)

    def engine(unit: int, cycles: int, life: int) -> list[list[float]]:
        rows = []
        for c in range(1, cycles + 1):
            wear = (c / life) ** 2
            ops = [rng.normal(0, 0.002), rng.normal(0, 0.0003), 100.0]
            sensors = [518.67 + 0.0 * c, 642 + 2 * wear + rng.normal(0, 0.3), 1590 + 20 * wear + rng.normal(0, 3),
                       1400 + 30 * wear + rng.normal(0, 4)] + [10 + j + wear * (j % 3) + rng.normal(0, 0.1)
                                                               for j in range(17)]
            rows.append([unit, c, *ops, *sensors])
        return rows

    train_lives = [int(rng.integers(40, 60)) for _ in range(6)]
    train = [r for u in range(1, 7) for r in engine(u, train_lives[u - 1], train_lives[u - 1])]
    lives = [70, 65]
    cut = [25, 18]
    test = [r for u in (1, 2) for r in engine(u, cut[u - 1], lives[u - 1])]
    for name, rows in (("train", train), ("test", test)):
        (folder / f"{name}_FD001.txt").write_text("\n".join(" ".join(f"{v:.4f}" if isinstance(v, float) else str(v)
                                                                     for v in r) + " " for r in rows) + "\n")
    (folder / "RUL_FD001.txt").write_text("\n".join(str(lives[i] - cut[i]) for i in range(2)) + "\n")


def test_cmapss_cycles_as_grid_rows_score_as_the_batch_path(tmp_path: Path) -> None:
    home = HomeLayout(tmp_path / "home")
    folder = tmp_path / "cmapss"
    _write_cmapss(folder, np.random.default_rng(1))
    grid, _ = load_cmapss(folder, "FD001")
    torch.manual_seed(0)
    wcfg = WindowConfig(length=WINDOW, rul_cap=60.0, horizon=10, n_regimes=1)
    train = grid.loc[grid[S.SET] == "train"]
    norm = P.fit_normalizer(train, sorted(train[S.ASSET].unique()), wcfg, "op_")
    ws = make_windows(train, norm, length=WINDOW, stride=2, rul_cap=60.0, horizon=10)
    net = SensorRULModel(n_channels=len(norm.channels_), channels=8, embedding_dim=16, rul_cap=60.0)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    for _ in range(3):
        pred, _logit = net(torch.as_tensor(ws.x))
        loss = torch.nn.functional.mse_loss(pred, torch.as_tensor(ws.rul / 60.0, dtype=torch.float32))
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    registry = ModelRegistry(home.registry())
    ref = registry.register(CMAPSS_MODEL, net.state_dict(), params=P.model_params(net, norm, wcfg, threshold=0.4),
                            metrics={"test/rmse": 1.0}, primary_metric="test/rmse", higher_is_better=False)
    registry.set_alias(CMAPSS_MODEL, "champion", ref.version)
    # the batch path (`sensor score --cmapss-dir`): the test engines of the folder
    scored = units_to_score(grid, SensorSource(cmapss_dir=str(folder)))
    batch = scores_table(ref, scored, 0.4, state_dict=registry.load_state_dict(ref))[0]
    # online: the test file's lines as they are, one grid row per cycle (step = cycle - 1)
    lines = pd.read_csv(folder / "test_FD001.txt", sep=r"\s+", header=None, names=list(COLUMNS))
    rows = [{"asset_id": f"test-{int(r['unit'])}", "step": int(r["cycle"]) - 1,
             **{c: float(r[c]) for c in (*OP_COLUMNS, *SENSOR_COLUMNS)}} for r in lines.to_dict("records")]
    with SensorServer(home, sensor_model=CMAPSS_MODEL) as srv:
        response = _post(srv, {"grid": rows})
        documented = _post(srv, serve_sensor.OPENAPI_EXAMPLES["cmapss"]["value"])  # /docs's C-MAPSS example
    assert documented.status_code == 200, documented.text
    assert [p["asset_id"] for p in documented.json()["predictions"]] == ["engine-1"]
    assert response.status_code == 200, response.text
    predictions = response.json()["predictions"]
    assert [p["asset_id"] for p in predictions] == ["test-1", "test-2"]
    for p, row in zip(predictions, batch.sort_values(S.ASSET).to_dict("records")):
        _same(p, row)
