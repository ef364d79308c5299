"""Every fraud champion kind is served: a sequence-model, a GBM and an ensemble champion score a
replayed period exactly like the batch ``score`` path (1e-5) from the same online state, the
dynamic batcher coalesces requests for each kind, and moving the champion alias from one kind to
another while serving swaps the version that answers (the response names it)."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest

from flows.serve import fraud as serve_fraud
from infra.home import HomeLayout
from infra.registry import ModelRegistry
from solutions.fraud import schema as S
from tasks.champion import promote_by_hand, rollback_champion
from tests.serve.fraud_helpers import MODEL, FraudServer, TinyFraud, api_key, post_scores, train_tiny_kinds

TOL = 1e-5
CHUNK = 256
KINDS = ("sequence", "baseline", "ensemble")


@pytest.fixture(scope="module")
def kinds(tmp_path_factory: pytest.TempPathFactory) -> tuple[HomeLayout, dict[str, TinyFraud]]:
    layout = HomeLayout(tmp_path_factory.mktemp("fraud-kinds-home"))
    return layout, train_tiny_kinds(layout)


def _home(src: HomeLayout, tmp_path: Path, champion: int) -> HomeLayout:
    layout = HomeLayout(tmp_path / "home")
    shutil.copytree(src.registry(), layout.registry(), dirs_exist_ok=True)
    ModelRegistry(layout.registry()).set_alias(MODEL, "champion", champion)
    return layout


def _split(data: TinyFraud) -> tuple[list[dict], list[dict]]:
    ts = pd.to_datetime([r[S.TIMESTAMP] for r in data.records])
    history = [r for r, t in zip(data.records, ts, strict=True) if t < data.since]
    period = [r for r, t in zip(data.records, ts, strict=True) if t >= data.since]
    assert len(period) == len(data.batch) > 30
    return history, period


def _compare(data: TinyFraud, online: dict[str, float]) -> None:
    batch = dict(zip(data.batch[S.TRANSACTION_ID], data.batch["score"], strict=True))
    assert online and set(online) <= set(batch)
    diff = max(abs(online[k] - batch[k]) for k in online)
    assert diff <= TOL, f"{data.ref.spec} ({data.ref.kind}): online and batch scores differ by up to {diff}"


def test_the_kinds_score_differently(kinds: tuple[HomeLayout, dict[str, TinyFraud]]) -> None:
    """The comparisons below tell the kinds apart: each kind's batch scores are its own."""
    _, data = kinds
    assert [data[k].ref.kind for k in KINDS] == ["torch", "sklearn-skops", "torch+sklearn-skops"]
    scores = {k: data[k].batch["score"].to_numpy() for k in KINDS}
    assert all(np.unique(s).size > 5 for s in scores.values())
    assert np.abs(scores["sequence"] - scores["baseline"]).max() > 1e-3
    np.testing.assert_allclose(scores["ensemble"], (scores["sequence"] + scores["baseline"]) / 2, atol=1e-9)


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_of_champion_matches_batch_scores(kinds: tuple[HomeLayout, dict[str, TinyFraud]], kind: str,
                                                    tmp_path: Path) -> None:
    src, all_data = kinds
    data = all_data[kind]
    layout = _home(src, tmp_path, data.ref.version)
    key = api_key(layout, serve_fraud.SCOPE, serve_fraud.LABEL_SCOPE)  # the history carries labels
    history, period = _split(data)
    online: dict[str, float] = {}
    with FraudServer(layout) as server, httpx.Client() as client:
        for start in range(0, len(history), CHUNK):
            post_scores(client, server.url, key, history[start : start + CHUNK])
        for row in period:
            [result] = post_scores(client, server.url, key, [row])
            assert result["model"] == MODEL and result["model_version"] == data.ref.version
            assert result["flagged"] == (result["score"] >= result["threshold"])
            online[result["transaction_id"]] = result["score"]
    assert len(online) == len(period)
    _compare(data, online)


def test_champion_moving_between_kinds_while_serving(kinds: tuple[HomeLayout, dict[str, TinyFraud]],
                                                     tmp_path: Path) -> None:
    """sequence -> GBM -> ensemble: after each move the next requests are answered by the new
    version, from the one online state the earlier kinds filled."""
    src, data = kinds
    layout = _home(src, tmp_path, data["sequence"].ref.version)
    registry = ModelRegistry(layout.registry())
    key = api_key(layout, serve_fraud.SCOPE, serve_fraud.LABEL_SCOPE)
    history, period = _split(data["sequence"])
    thirds = np.array_split(np.arange(len(period)), 3)
    with FraudServer(layout) as server, httpx.Client() as client:
        [slot] = [s for s in server.app.state.serving.slots if s.name == MODEL and not s.optional]
        for start in range(0, len(history), CHUNK):
            post_scores(client, server.url, key, history[start : start + CHUNK])
        for kind, rows in zip(KINDS, thirds, strict=True):
            version = data[kind].ref.version
            if slot.version != version:  # what `python -m flows.fraud promote --model NAME:VERSION` does
                promote_by_hand(f"{MODEL}:{version}", registry)
            _wait_for(slot, version)
            online: dict[str, float] = {}
            for i in rows:
                [result] = post_scores(client, server.url, key, [period[i]])
                assert result["model_version"] == version
                online[result["transaction_id"]] = result["score"]
            _compare(data[kind], online)
        # `python -m flows.fraud rollback`: back to the GBM, which answers the next request
        assert rollback_champion(MODEL, registry).candidate_version == data["baseline"].ref.version
        _wait_for(slot, data["baseline"].ref.version)
        late = {**period[-1], S.TRANSACTION_ID: "after-rollback",
                S.TIMESTAMP: str(pd.Timestamp(period[-1][S.TIMESTAMP]) + pd.Timedelta(seconds=1))}
        [result] = post_scores(client, server.url, key, [late])
        assert result["model_version"] == data["baseline"].ref.version


def _wait_for(slot: object, version: int) -> None:
    deadline = time.monotonic() + 20
    while slot.version != version:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, f"the server did not reload {MODEL}:{version}"
        time.sleep(0.05)


@pytest.mark.parametrize("kind", ["baseline", "ensemble"])
def test_the_batcher_coalesces_requests_for_gbm_kinds(kinds: tuple[HomeLayout, dict[str, TinyFraud]], kind: str,
                                                      tmp_path: Path) -> None:
    """Concurrent single-row submissions, coalesced by the dynamic batcher into one model call (one
    account twice in a call), give the batch path's scores for a GBM and an ensemble champion."""
    from infra.online_state.rocks import RocksStateStore
    from infra.serving.batching import DynamicBatcher
    from solutions.fraud.online import OnlineFraudState, score_requests

    src, all_data = kinds
    data = all_data[kind]
    layout = _home(src, tmp_path, data.ref.version)

    class _Services:
        registry = ModelRegistry(layout.registry())

    model = serve_fraud.load_online_model(data.ref, _Services())  # type: ignore[arg-type]
    assert model.kind == kind
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
    assert len(online) == len(period) and len(batches) - 1 < len(period)
    assert any(pd.Series(b).duplicated().any() for b in batches[1:])


def test_a_gbm_champion_needs_the_terminal_column(kinds: tuple[HomeLayout, dict[str, TinyFraud]],
                                                  tmp_path: Path) -> None:
    """Rows without terminal_id cannot give the GBM's terminal-risk features: a 422 that says so."""
    src, data = kinds
    layout = _home(src, tmp_path, data["baseline"].ref.version)
    key = api_key(layout)
    row = {"transaction_id": "n1", "account_id": "A", "timestamp": "2025-01-01T10:00:00", "amount": 5.0}
    with FraudServer(layout) as server, httpx.Client() as client:
        response = client.post(f"{server.url}/v1/fraud/score", json={"transactions": [row]},
                               headers={"X-API-Key": key}, timeout=30)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail["column"] == "terminal_id" and "term_risk" in detail["error"]
