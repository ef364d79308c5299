"""No training/serving skew: the API scores a replayed period exactly like the batch ``score``
path (1e-5), with the embedded state across a server restart and with Redis shared by two
replicas; bad input gets a 422 naming the column and row."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest

from flows.serve import fraud as serve_fraud
from infra.home import HomeLayout
from solutions.fraud import schema as S
from tests.serve.fraud_helpers import (
    FraudServer,
    TinyFraud,
    api_key,
    free_port,
    post_scores,
    train_tiny_fraud,
)

TOL = 1e-5
ROOT = Path(__file__).resolve().parents[2]
CHUNK = 256  # history is loaded through the same endpoint, several rows per request


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[HomeLayout, TinyFraud]:
    layout = HomeLayout(tmp_path_factory.mktemp("fraud-home"))
    return layout, train_tiny_fraud(layout)


def _split(data: TinyFraud) -> tuple[list[dict], list[dict]]:
    ts = pd.to_datetime([r[S.TIMESTAMP] for r in data.records])
    history = [r for r, t in zip(data.records, ts, strict=True) if t < data.since]
    period = [r for r, t in zip(data.records, ts, strict=True) if t >= data.since]
    assert len(period) == len(data.batch) > 30
    return history, period


def _compare(data: TinyFraud, online: dict[str, float]) -> float:
    batch = dict(zip(data.batch[S.TRANSACTION_ID], data.batch["score"], strict=True))
    assert set(online) == set(batch)
    diff = max(abs(online[k] - batch[k]) for k in batch)
    assert diff <= TOL, f"online and batch scores differ by up to {diff}"
    return diff


def test_replay_matches_batch_scores_across_a_server_process_restart(tiny: tuple[HomeLayout, TinyFraud], tmp_path: Path) -> None:
    src, data = tiny
    layout = HomeLayout(tmp_path / "home")
    shutil.copytree(src.registry(), layout.registry(), dirs_exist_ok=True)
    key = api_key(layout, serve_fraud.SCOPE, serve_fraud.LABEL_SCOPE)  # the history carries labels
    history, period = _split(data)
    half = len(period) // 2
    online: dict[str, float] = {}
    with FraudServer(layout) as server, httpx.Client() as client:
        for start in range(0, len(history), CHUNK):
            post_scores(client, server.url, key, history[start : start + CHUNK])
        for row in period[:half]:  # one transaction per request, as a payment switch sends them
            [result] = post_scores(client, server.url, key, [row])
            assert result["model"] == "fraud-seq" and result["model_version"] == data.ref.version
            assert result["flagged"] == (result["score"] >= result["threshold"])
            online[result["transaction_id"]] = result["score"]
    assert (layout.online_state() / "rocksdb").exists()
    # a new server process (python -m flows.serve) on the same home continues from the persisted state
    port = free_port()
    env = {**os.environ, "INDUSFLOW_HOME": str(layout.root), "INDUSFLOW_SERVE_SENSOR_MODEL": "",
           "INDUSFLOW_SERVE_AUDIT_SALT": "test-salt", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    log = (tmp_path / "server.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "flows.serve", "--port", str(port)], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            assert time.monotonic() < deadline, "the server process did not become ready"
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        with httpx.Client() as client:
            for row in period[half:]:
                [result] = post_scores(client, url, key, [row])
                online[result["transaction_id"]] = result["score"]
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()
    _compare(data, online)


def test_replay_with_redis_shared_by_two_replicas(tiny: tuple[HomeLayout, TinyFraud], tmp_path: Path,
                                                  redis_url: str) -> None:
    """Two replicas share the state in Redis; labels arrive after scoring through /v1/fraud/labels
    (the rows are sent without them), as chargebacks do, and feed the delayed terminal risk."""
    src, data = tiny
    layouts = [HomeLayout(tmp_path / f"home{i}") for i in range(2)]  # nothing shared but the registry and Redis
    keys = []
    for layout in layouts:
        shutil.copytree(src.registry(), layout.registry(), dirs_exist_ok=True)
        keys.append(api_key(layout, "fraud:score", "fraud:label"))
    history, period = _split(data)
    assert data.risky_rows > 0  # the labels change scores: without them the comparison would fail
    unlabelled = [{k: v for k, v in r.items() if k != S.LABEL} for r in history]
    labels = [{k: r[k] for k in (S.TRANSACTION_ID, S.ACCOUNT_ID, S.TERMINAL_ID, S.TIMESTAMP, S.LABEL)} for r in history]
    online: dict[str, float] = {}
    with FraudServer(layouts[0], redis_url=redis_url) as a, FraudServer(layouts[1], redis_url=redis_url) as b, \
            httpx.Client() as client:
        servers = [(a, keys[0]), (b, keys[1])]
        for i, start in enumerate(range(0, len(history), CHUNK)):
            server, key = servers[i % 2]
            post_scores(client, server.url, key, unlabelled[start : start + CHUNK])
        for i, start in enumerate(range(0, len(labels), CHUNK)):
            server, key = servers[i % 2]
            response = client.post(f"{server.url}/v1/fraud/labels", json={"labels": labels[start : start + CHUNK]},
                                   headers={"X-API-Key": key}, timeout=30)
            assert response.status_code == 200, response.text
            assert response.json()["unknown"] == []
        for i, row in enumerate(period):
            server, key = servers[i % 2]
            [result] = post_scores(client, server.url, key, [{k: v for k, v in row.items() if k != S.LABEL}])
            online[result["transaction_id"]] = result["score"]
        unknown = client.post(f"{a.url}/v1/fraud/labels", headers={"X-API-Key": keys[0]},
                              json={"labels": [{**labels[0], S.TRANSACTION_ID: "never-seen"}]})
        assert unknown.json() == {"recorded": 0, "unknown": ["never-seen"]}
        denied = client.post(f"{a.url}/v1/fraud/labels", headers={"X-API-Key": api_key(layouts[0])},
                             json={"labels": labels[:1]})
        assert denied.status_code == 403
    assert not (layouts[0].online_state() / "rocksdb").exists()
    _compare(data, online)


def test_one_accounts_rows_in_one_batch_are_scored_in_arrival_order(tiny: tuple[HomeLayout, TinyFraud],
                                                                    tmp_path: Path) -> None:
    """Concurrent single-transaction submissions coalesced by the dynamic batcher (several rows of one
    account in one model call) give the batch path's scores: the state applies a batch in arrival order.

    In-process, so that the arrival order is exact (HTTP connections may reorder concurrent requests)."""
    _replay_in_arrival_order(*tiny, tmp_path)


def test_a_window_added_to_the_one_list_scores_online_as_in_batch(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The example feature of issue 47: a 14-day window added to ``feature_defs.WINDOWS_DAYS`` (the one
    place; opt-in, the default list stays 1/7/30) is trained on, computed online and replayed as the
    batch path scores it, by the check above, with no parity code of its own."""
    from solutions.fraud import feature_defs as FD

    monkeypatch.setattr(FD, "WINDOWS_DAYS", (1, 7, 14, 30))
    layout = HomeLayout(tmp_path / "src")
    model = _replay_in_arrival_order(layout, train_tiny_fraud(layout), tmp_path)
    assert model.preprocessor is not None
    assert {"cust_nb_tx_14d", "cust_mean_amount_14d", "term_nb_tx_14d", "term_risk_14d"} <= set(
        model.preprocessor.window_feature_names)


def test_a_model_is_scored_with_the_windows_it_was_trained_with(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A model trained while ``WINDOWS_DAYS`` was (2, 14) keeps its windows once the default is 1/7/30
    again: batch and online scoring read them from the features it records, so both score as at
    training time (a state built with the default windows alone would compute other features)."""
    from flows.fraud.steps import load_scoring_model
    from infra.registry import ModelRegistry
    from infra.tables import validate_table
    from solutions.fraud import feature_defs as FD
    from solutions.fraud import pipeline as P
    from solutions.fraud import scoring as SC

    monkeypatch.setattr(FD, "WINDOWS_DAYS", (2, 14))
    layout = HomeLayout(tmp_path / "src")
    data = train_tiny_fraud(layout)  # trained and batch-scored with 2- and 14-day windows
    monkeypatch.undo()
    assert FD.WINDOWS_DAYS == (1, 7, 30)
    scorer = load_scoring_model(data.ref, ModelRegistry(layout.registry()))
    frame = validate_table(pd.DataFrame.from_records(data.records), P.transaction_schema(for_scoring=True), "tiny")
    again = SC.score_transactions(scorer.net, scorer.preprocessor, scorer.config, data.ref, frame, source="tiny",
                                  since=str(data.since), baseline=scorer.baseline).table
    _compare(data, dict(zip(again[S.TRANSACTION_ID].astype(str), again["score"], strict=True)))
    model = _replay_in_arrival_order(layout, data, tmp_path)
    assert model.windows_days == (2, 14)


def _replay_in_arrival_order(src: HomeLayout, data: TinyFraud, tmp_path: Path) -> Any:
    """Replay ``data``'s history then its period, one row per request through the dynamic batcher, and
    compare with the batch path's scores; the model that scored."""
    from infra.online_state.rocks import RocksStateStore
    from infra.registry import ModelRegistry
    from infra.serving.batching import DynamicBatcher
    from solutions.fraud.online import OnlineFraudState, score_requests

    layout = HomeLayout(tmp_path / "home")
    shutil.copytree(src.registry(), layout.registry(), dirs_exist_ok=True)

    class _Services:
        registry = ModelRegistry(layout.registry())

    model = serve_fraud.load_online_model(data.ref, _Services())  # type: ignore[arg-type]
    state = OnlineFraudState.for_model(RocksStateStore(layout.online_state() / "rocksdb"), history_len=63)
    history, period = _split(data)
    batches: list[list[str]] = []

    def fn(items: list[list[dict]]) -> list:
        batches.append([rows[0][S.ACCOUNT_ID] for rows in items])
        return score_requests(model, state, items)

    batcher = DynamicBatcher(fn, max_batch_size=32, max_wait_ms=20)

    async def replay() -> list:
        await batcher.submit([history])
        return await asyncio.gather(*(batcher.submit([[row]]) for row in period))

    try:
        results = asyncio.run(replay())
    finally:
        batcher.close()
        state.store.close()
    online = {str(row[S.TRANSACTION_ID]): float(r[0][0]) for row, r in zip(period, results, strict=True)}
    _compare(data, online)
    assert len(batches) - 1 < len(period)  # coalesced
    assert any(pd.Series(b).duplicated().any() for b in batches[1:])  # one account twice in one call
    return model


def _model_calls(server: FraudServer) -> int:
    text = server.app.state.serving.metrics.render().decode()
    match = re.search(r'^indusflow_batch_size_count\{model="fraud-seq"\} ([0-9.e+]+)$', text, re.MULTILINE)
    return int(float(match.group(1))) if match else 0


def test_bad_rows_get_a_422_naming_column_and_row(tiny: tuple[HomeLayout, TinyFraud], tmp_path: Path) -> None:
    src, _ = tiny
    layout = HomeLayout(tmp_path / "home")
    shutil.copytree(src.registry(), layout.registry(), dirs_exist_ok=True)
    key = api_key(layout)
    good = {"transaction_id": "t1", "account_id": "A", "timestamp": "2025-01-01T10:00:00", "amount": 5.0,
            "terminal_id": "T1"}
    with FraudServer(layout) as server, httpx.Client() as client:
        def post(rows: list[dict], **extra: object) -> httpx.Response:
            return client.post(f"{server.url}/v1/fraud/score", json={"transactions": rows, **extra},
                               headers={"X-API-Key": key}, timeout=30)

        missing = post([good, {k: v for k, v in good.items() if k != "amount"}])
        assert missing.status_code == 422
        assert "amount" in missing.text
        bad_time = post([good, {**good, "transaction_id": "t2", "timestamp": "not a time"}])
        assert bad_time.status_code == 422
        detail = bad_time.json()["detail"]
        assert detail["column"] == "timestamp" and detail["rows"] == [1]
        mapped = post([{"TX": "t3", "CUST": "B", "WHEN": "2025-01-01T10:00:00", "AMT": 2.0, "terminal_id": "T1"}],
                      columns={"transaction_id": "TX", "account_id": "CUST", "timestamp": "WHEN", "amount": "AMT"})
        assert mapped.status_code == 200, mapped.text
        assert mapped.json()["results"][0]["transaction_id"] == "t3"
        serve_fraud.FraudScoreResponse.model_validate_json(mapped.content)  # the documented answer
        # the route reads its body itself: the same 422s as a FastAPI body parameter, and the same docs
        empty = post([])
        assert empty.status_code == 422 and empty.json()["detail"][0]["loc"] == ["body", "transactions"]
        broken = client.post(f"{server.url}/v1/fraud/score", content=b'{"transactions": [', timeout=30,
                             headers={"X-API-Key": key, "content-type": "application/json"})
        assert broken.status_code == 422 and broken.json()["detail"][0]["type"] == "json_invalid"
        spec = client.get(f"{server.url}/openapi.json").json()["paths"]["/v1/fraud/score"]["post"]
        assert "transactions" in spec["requestBody"]["content"]["application/json"]["schema"]["properties"]
        first = post([good])
        assert first.status_code == 200 and "replayed" not in first.json()
        retry = post([good])  # sent again (its answer lost): answered as the first time, applied once
        assert retry.status_code == 200 and retry.json() == {**first.json(), "replayed": True}
        for changed in ([{**good, "amount": 6.0}], [good, {**good, "transaction_id": "t1b"}]):
            reused = post(changed)  # the id again with another amount; or beside a new transaction
            assert reused.status_code == 409 and "already scored" in reused.text
        older = post([{**good, "transaction_id": "t0", "timestamp": "2025-01-01T09:00:00"}])
        assert older.status_code == 409 and "older" in older.text
        twice = post([{**good, "transaction_id": "t9", "timestamp": "2025-01-01T11:00:00"},
                      {**good, "transaction_id": "t9", "timestamp": "2025-01-01T12:00:00"}])
        assert twice.status_code == 409 and "appears twice" in twice.text
        assert post([{**good, "transaction_id": "t9", "timestamp": "2025-01-01T11:00:00"}]).status_code == 200
        assert client.post(f"{server.url}/v1/fraud/score", json={"transactions": [good]}).status_code == 401
