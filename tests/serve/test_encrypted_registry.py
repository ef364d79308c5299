"""An encrypted registry (INDUSFLOW_REGISTRY_KEY) end to end: the three fraud kinds registered sealed
(no plaintext tensor or skops bytes in the registry folder), batch-scored through the ``score``
flow's loader, served by a real ``python -m flows.serve`` process that matches the batch scores,
hot-reloads a GBM+sequence ensemble champion from its sealed files, and, started without the key,
stays unready with an error that names the model and the setting."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pandas as pd
import pytest

from flows.serve import fraud as serve_fraud
from infra.home import HomeLayout
from infra.registry import ModelRegistry
from infra.sealed import MAGIC
from solutions.fraud import schema as S
from tasks.champion import promote_by_hand
from tests.serve.fraud_helpers import MODEL, TinyFraud, api_key, free_port, post_scores, train_tiny_kinds

ROOT = Path(__file__).resolve().parents[2]
CHUNK = 256
TOL = 1e-5


@pytest.fixture(scope="module")
def sealed_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HomeLayout, str, dict[str, TinyFraud]]]:
    root = tmp_path_factory.mktemp("sealed-home")
    kek = root / "registry.kek"
    kek.write_text(os.urandom(32).hex())
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INDUSFLOW_REGISTRY_KEY", f"file:{kek}")
        layout = HomeLayout(root / "home")
        yield layout, f"file:{kek}", train_tiny_kinds(layout)  # registers sealed; batch-scores each kind


def _server(layout: HomeLayout, key_setting: str | None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "INDUSFLOW_HOME": str(layout.root), "PYTHONPATH": str(ROOT),
           "INDUSFLOW_SERVE_SENSOR_MODEL": "",
           "INDUSFLOW_SERVE_AUDIT_SALT": "test-salt"}
    env.pop("INDUSFLOW_REGISTRY_KEY", None)
    if key_setting:
        env["INDUSFLOW_REGISTRY_KEY"] = key_setting
    proc = subprocess.Popen([sys.executable, "-m", "flows.serve", "--port", str(port)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.monotonic() < deadline, "the server did not answer"
        try:
            httpx.get(f"{url}/healthz", timeout=1)
            return proc, url
        except httpx.TransportError:
            time.sleep(0.2)


def _stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


def _ready(url: str, timeout: float = 60) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(f"{url}/readyz", timeout=2)
        if r.status_code == 200 or time.monotonic() > deadline:
            return r
        time.sleep(0.2)


def test_no_plaintext_model_bytes_in_the_registry(sealed_home: tuple[HomeLayout, str, dict[str, TinyFraud]],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    layout, key, data = sealed_home
    monkeypatch.setenv("INDUSFLOW_REGISTRY_KEY", key)
    registry = ModelRegistry(layout.registry())
    state = registry.load_state_dict(data["sequence"].ref)
    needles = [t.numpy().tobytes()[:48] for t in state.values() if t.numel() >= 12]
    needles += [b"PK\x03\x04", b"schema.json"]  # a plain skops file is a zip holding schema.json
    files = [p for p in layout.registry().rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"weights.safetensors", "model.skops", "keys.json"}
    for path in files:
        blob = path.read_bytes()
        assert not any(n in blob for n in needles), f"plaintext model bytes in {path}"
        if path.suffix in (".safetensors", ".skops"):
            assert blob.startswith(MAGIC), path


def test_served_from_sealed_files_with_hot_reload(sealed_home: tuple[HomeLayout, str, dict[str, TinyFraud]]) -> None:
    layout, key_setting, data = sealed_home
    seq, ens = data["sequence"], data["ensemble"]
    ModelRegistry(layout.registry()).set_alias(MODEL, "champion", seq.ref.version)
    key = api_key(layout, serve_fraud.SCOPE, serve_fraud.LABEL_SCOPE)
    ts = pd.to_datetime([r[S.TIMESTAMP] for r in seq.records])
    history = [r for r, t in zip(seq.records, ts, strict=True) if t < seq.since]
    period = [r for r, t in zip(seq.records, ts, strict=True) if t >= seq.since]
    half = len(period) // 2
    proc, url = _server(layout, key_setting)
    try:
        assert _ready(url).status_code == 200
        with httpx.Client() as client:
            for start in range(0, len(history), CHUNK):
                post_scores(client, url, key, history[start:start + CHUNK])
            online = {r["transaction_id"]: (r["score"], r["model_version"])
                      for r in post_scores(client, url, key, period[:half])}
            # hot reload: the champion moves to the ensemble (sealed weights + sealed skops)
            promote_by_hand(f"{MODEL}:{ens.ref.version}", ModelRegistry(layout.registry()))
            deadline = time.monotonic() + 30
            while httpx.get(f"{url}/readyz", timeout=2).json()["models"].get(MODEL) != ens.ref.version:
                assert time.monotonic() < deadline, "the server did not reload the ensemble"
                time.sleep(0.1)
            online |= {r["transaction_id"]: (r["score"], r["model_version"])
                       for r in post_scores(client, url, key, period[half:])}
    finally:
        _stop(proc)
    for data_kind, rows in ((seq, period[:half]), (ens, period[half:])):
        batch = dict(zip(data_kind.batch[S.TRANSACTION_ID].astype(str), data_kind.batch["score"], strict=True))
        for row in rows:
            score, version = online[str(row[S.TRANSACTION_ID])]
            assert version == data_kind.ref.version
            assert abs(score - batch[str(row[S.TRANSACTION_ID])]) <= TOL, row[S.TRANSACTION_ID]


def test_without_the_key_the_server_names_the_model_and_the_setting(
        sealed_home: tuple[HomeLayout, str, dict[str, TinyFraud]]) -> None:
    layout, _, _ = sealed_home
    champion = ModelRegistry(layout.registry()).aliases(MODEL)["champion"]
    proc, url = _server(layout, None)
    try:
        deadline = time.monotonic() + 60
        while (r := httpx.get(f"{url}/readyz", timeout=2)).json()["waiting"].get(MODEL) == "loading":
            assert time.monotonic() < deadline, "the server never tried to load the model"
            time.sleep(0.2)
        assert r.status_code == 503 and "SealError" in r.json()["waiting"][MODEL]
    finally:
        out = _stop(proc)
    assert f"model {MODEL}:{champion} is encrypted at rest" in out
    assert "set INDUSFLOW_REGISTRY_KEY" in out
