"""A tiny trained sensor model on the synthetic fleet, the batch ``score`` output of two held-back assets,
and a real uvicorn server serving it."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Self

import httpx
import numpy as np
import pandas as pd
import torch
import uvicorn

from flows.serve import sensor as serve_sensor
from flows.serve.app import create_app
from infra.home import HomeLayout
from infra.registry import ModelRef, ModelRegistry
from infra.serving.runtime import ServeTuning, key_store
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
#: the tiny model's window (steps); the default training's is 60
WINDOW = 12


@dataclass
class TinySensor:
    """A registered tiny model and the held-back assets it is checked on."""

    rows: pd.DataFrame  # long-format readings of the held-back assets (timestamps as strings)
    grid: pd.DataFrame  # their grid, as the batch path's readings plan builds it
    batch: pd.DataFrame  # the batch path's score table of them
    held: list[str]
    ref: ModelRef


def jsonable(rows: pd.DataFrame) -> list[dict]:
    """Records as a client sends them (NaN -> null)."""
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            for r in rows.to_dict("records")]


def train_tiny_sensor(home: HomeLayout, model: str = MODEL, arch: str = "cnn") -> TinySensor:
    """Train a tiny model (a CNN, or the ``arch`` trunk) a few steps on all but two assets of a
    small fleet, register it as champion and batch-score the two held back (``sensor score
    --data file``'s functions)."""
    torch.manual_seed(0)
    readings, events = generate_fleet(SyntheticFleetConfig(n_assets=8, min_life=40, max_life=60, fast_rate=4,
                                                           bad_reading_rate=0.0, seed=3))
    readings[S.TIMESTAMP] = readings[S.TIMESTAMP].astype(str)  # as a CSV or a JSON request carries it
    held = sorted(readings[S.ASSET].unique())[-2:]
    train_rows = readings.loc[~readings[S.ASSET].isin(held)]
    cfg = AlignConfig()
    clean, report = clean_readings(train_rows, cfg, "train")
    grid, _ = align_readings(clean, clean_events(events), cfg, report)
    wcfg = WindowConfig(length=WINDOW, rul_cap=60.0, horizon=10, n_regimes=1)
    norm = P.fit_normalizer(grid, sorted(grid[S.ASSET].unique()), wcfg, cfg.op_prefix)
    ws = make_windows(grid, norm, length=wcfg.length, stride=2, rul_cap=wcfg.rul_cap, horizon=wcfg.horizon)
    net = SensorRULModel(n_channels=len(norm.channels_), channels=8, embedding_dim=16, rul_cap=wcfg.rul_cap,
                         arch=arch)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    x = torch.as_tensor(ws.x, dtype=torch.float32)
    target = torch.as_tensor(np.nan_to_num(ws.rul, nan=wcfg.rul_cap) / wcfg.rul_cap, dtype=torch.float32)
    net.train()
    for _ in range(5):
        pred, _logit = net(x)
        loss = torch.nn.functional.mse_loss(pred, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    registry = ModelRegistry(home.registry())
    ref = registry.register(model, net.state_dict(), params=P.model_params(net, norm, wcfg, threshold=0.4),
                            metrics={"test/rmse": 1.0}, primary_metric="test/rmse", higher_is_better=False)
    registry.set_alias(model, "champion", ref.version)
    # the batch `score --data file` path: the readings file's grid plan, then the score table
    path = home.root / "held.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    held_rows = readings.loc[readings[S.ASSET].isin(held)]
    held_rows.to_csv(path, index=False)
    held_grid, _ = D.readings_plan(path, None, {}, AlignConfig()).build()
    batch, _ = scores_table(ref, held_grid, 0.4, state_dict=registry.load_state_dict(ref))
    return TinySensor(rows=held_rows, grid=held_grid, batch=batch, held=list(held), ref=ref)


class SensorServer:
    """``python -m flows.serve``'s app with the sensor vertical, on a real uvicorn (127.0.0.1), and
    a ``sensor:predict`` key."""

    def __init__(self, home: HomeLayout, **settings: Any) -> None:
        values = {"reload_poll_s": 0.2, "audit_salt": "s", "fraud_model": None, "sensor_model": MODEL,
                  "max_body_bytes": 50_000_000, **settings}
        self.home = home
        tuning = ServeTuning(**{k: values.pop(k) for k in list(values) if k in ServeTuning.__dataclass_fields__})
        self.app = create_app(ServeSettings(**values), build_verticals=[serve_sensor.build], layout=home, tuning=tuning,
                              registry=ModelRegistry(home.registry()))
        self.url = f"http://127.0.0.1:{free_port()}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=int(self.url.rsplit(":", 1)[1]),
                                                    log_level="error", access_log=False))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.key = ""

    def __enter__(self) -> Self:
        self.thread.start()
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline, "the sensor server did not become ready"
            try:
                if self.server.started and httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.key, _ = key_store(self.home).add("sensor-test", [serve_sensor.SCOPE])
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
