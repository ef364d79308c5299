"""Challengers in production: a second version of the fraud (sensor) model, named by the registry's
``challenger`` alias, scored beside the champion on a real server.

* shadow: every request is answered by the champion (its batch ``score`` path's scores, 1e-5),
  and the score log holds both versions' scores of every row, the challenger's equal to ITS batch
  path's scores from the same online state;
* split: a stable share of accounts (assets), chosen by the keyed hash, is answered by the
  challenger, and each row names the version that decided it;
* a challenger that fails, or cannot use the champion's inputs, never fails a request;
* clearing the alias takes the challenger out within one reload period.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest
import torch

from flows.serve import fraud as serve_fraud
from infra.home import HomeLayout
from infra.registry import CHALLENGER, ModelRegistry
from infra.serving.challenger import ChallengerRoute, read_score_log
from infra.serving.runtime import SCORES_DIR
from solutions.fraud import schema as S
from solutions.sensor import schema as SS
from solutions.sensor.scoring import scores_table
from tasks.champion import set_challenger
from tests.serve.fraud_helpers import MODEL, FraudServer, TinyFraud, api_key, post_scores, train_tiny_kinds
from tests.serve.sensor_helpers import MODEL as SENSOR_MODEL
from tests.serve.sensor_helpers import SensorServer, TinySensor, jsonable, train_tiny_sensor

TOL = 1e-5
CHUNK = 256


@pytest.fixture(scope="module")
def kinds(tmp_path_factory: pytest.TempPathFactory) -> tuple[HomeLayout, dict[str, TinyFraud]]:
    layout = HomeLayout(tmp_path_factory.mktemp("challenger-home"))
    return layout, train_tiny_kinds(layout, kinds=("sequence", "baseline"))


def _home(src: HomeLayout, tmp_path: Path) -> HomeLayout:
    layout = HomeLayout(tmp_path / "home")
    shutil.copytree(src.registry(), layout.registry(), dirs_exist_ok=True)
    return layout


def _split(data: TinyFraud) -> tuple[list[dict], list[dict]]:
    ts = pd.to_datetime([r[S.TIMESTAMP] for r in data.records])
    history = [r for r, t in zip(data.records, ts, strict=True) if t < data.since]
    period = [r for r, t in zip(data.records, ts, strict=True) if t >= data.since]
    return history, period


def _wait(predicate, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _challenger_slot(server):
    [slot] = [s for s in server.app.state.serving.slots if s.optional]
    return slot


def _replay(server: FraudServer, key: str, data: TinyFraud) -> list[dict]:
    """The history in chunks, then the scored period one transaction per request; the period's results."""
    history, period = _split(data)
    out = []
    with httpx.Client() as client:
        for start in range(0, len(history), CHUNK):
            post_scores(client, server.url, key, history[start : start + CHUNK])
        for row in period:
            out += post_scores(client, server.url, key, [row])
    return out


def _batch(data: TinyFraud) -> dict[str, float]:
    return dict(zip(data.batch[S.TRANSACTION_ID], data.batch["score"], strict=True))


def _logged(layout: HomeLayout, model: str, role: str) -> pd.DataFrame:
    rows = [r for r in read_score_log(layout.serving() / SCORES_DIR, model) if r["role"] == role]
    return pd.DataFrame(rows).drop_duplicates("id", keep="last").set_index("id")


def test_a_shadow_challenger_is_scored_but_never_answers(kinds, tmp_path: Path) -> None:
    src, data = kinds
    seq, gbm = data["sequence"], data["baseline"]
    layout = _home(src, tmp_path)
    move = set_challenger(f"{MODEL}:{gbm.ref.version}", registry=ModelRegistry(layout.registry()),
                          reason="GBM in shadow")
    assert (move.version, move.champion_version, move.changed) == (gbm.ref.version, seq.ref.version, True)
    key = api_key(layout, serve_fraud.SCOPE, serve_fraud.LABEL_SCOPE)
    with FraudServer(layout) as server:
        _wait(lambda: _challenger_slot(server).version == gbm.ref.version, "the challenger did not load")
        ready = httpx.get(f"{server.url}/readyz").json()
        assert ready["models"] == {MODEL: seq.ref.version}
        assert ready["challengers"] == {f"{MODEL}@{CHALLENGER}": gbm.ref.version}
        results = _replay(server, key, seq)
    assert {r["model_version"] for r in results} == {seq.ref.version}
    want_seq, want_gbm = _batch(seq), _batch(gbm)
    assert max(abs(r["score"] - want_seq[r["transaction_id"]]) for r in results) <= TOL
    champion = _logged(layout, MODEL, "champion")
    shadow = _logged(layout, MODEL, "challenger")
    period = [r["transaction_id"] for r in results]
    assert set(period) <= set(champion.index) and set(period) <= set(shadow.index)
    assert (champion.loc[period, "version"] == seq.ref.version).all() and champion.loc[period, "decided"].all()
    assert (shadow.loc[period, "version"] == gbm.ref.version).all() and not shadow.loc[period, "decided"].any()
    # the challenger's scores are its own batch path's, from the one online state the champion filled
    diff = np.abs(shadow.loc[period, "score"].to_numpy() - np.array([want_gbm[t] for t in period]))
    assert diff.max() <= TOL
    assert np.abs(np.array([want_seq[t] for t in period]) - np.array([want_gbm[t] for t in period])).max() > 1e-3


def test_challenger_mode_off_loads_no_challenger(kinds, tmp_path: Path) -> None:
    src, data = kinds
    layout = _home(src, tmp_path)
    set_challenger(f"{MODEL}:{data['baseline'].ref.version}", registry=ModelRegistry(layout.registry()))
    with FraudServer(layout, fraud_challenger_mode="off") as server:
        assert MODEL not in server.app.state.serving.challengers
        assert "challengers" not in httpx.get(f"{server.url}/readyz").json()


def test_no_setting_turns_the_score_log_off(kinds, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The score log is the evidence the champion rule and validators read: an operator's environment
    cannot switch it off (INDUSFLOW_SERVE_SCORE_LOG=false did, before it was removed)."""
    src, data = kinds
    layout = _home(src, tmp_path)
    monkeypatch.setenv("INDUSFLOW_SERVE_SCORE_LOG", "false")
    key = api_key(layout, serve_fraud.SCOPE, serve_fraud.LABEL_SCOPE)
    with FraudServer(layout) as server, httpx.Client() as client:
        results = post_scores(client, server.url, key, data["sequence"].records[:CHUNK])
    logged = _logged(layout, MODEL, "champion")
    assert {r["transaction_id"] for r in results} <= set(logged.index)


def test_a_split_challenger_answers_a_stable_share_of_accounts(kinds, tmp_path: Path) -> None:
    src, data = kinds
    seq, gbm = data["sequence"], data["baseline"]
    layout = _home(src, tmp_path)
    set_challenger(f"{MODEL}:{gbm.ref.version}", registry=ModelRegistry(layout.registry()))
    key = api_key(layout, serve_fraud.SCOPE, serve_fraud.LABEL_SCOPE)
    with FraudServer(layout, fraud_challenger_mode="split", challenger_share=0.5) as server:
        route: ChallengerRoute = server.app.state.serving.challengers[MODEL]
        _wait(lambda: route.slot.version == gbm.ref.version, "the challenger did not load")
        results = _replay(server, key, seq)
    _, period = _split(seq)
    accounts = [str(r[S.ACCOUNT_ID]) for r in period]
    by_challenger = route.answers(accounts)
    assert 0 < by_challenger.sum() < len(accounts)
    by_account: dict[str, set[int]] = {}
    for account, r in zip(accounts, results, strict=True):
        by_account.setdefault(account, set()).add(r["model_version"])
    assert all(len(v) == 1 for v in by_account.values()), "an account was answered by both versions"
    want_seq, want_gbm = _batch(seq), _batch(gbm)
    for r, ch in zip(results, by_challenger, strict=True):
        want = (want_gbm if ch else want_seq)[r["transaction_id"]]
        assert r["model_version"] == (gbm.ref.version if ch else seq.ref.version)
        assert abs(r["score"] - want) <= TOL
        assert r["threshold"] == 0.4 and r["flagged"] == (r["score"] >= r["threshold"])
    champion, shadow = _logged(layout, MODEL, "champion"), _logged(layout, MODEL, "challenger")
    ids = [r["transaction_id"] for r in results]
    assert (shadow.loc[ids, "decided"].to_numpy() == by_challenger).all()
    assert (champion.loc[ids, "decided"].to_numpy() == ~by_challenger).all()


def test_a_failing_or_unfit_challenger_never_fails_a_request(kinds, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from solutions.fraud.candidates import StoredBaseline

    src, data = kinds
    seq, gbm = data["sequence"], data["baseline"]
    layout = _home(src, tmp_path)
    registry = ModelRegistry(layout.registry())
    set_challenger(f"{MODEL}:{gbm.ref.version}", registry=registry)
    key = api_key(layout, serve_fraud.SCOPE, serve_fraud.LABEL_SCOPE)
    history, period = _split(seq)

    def broken(self, frame):  # the challenger (the GBM) fails; the champion (sequence) has no GBM
        raise RuntimeError("challenger out of memory")

    with FraudServer(layout, fraud_challenger_mode="split", challenger_share=0.5) as server, httpx.Client() as client:
        route = server.app.state.serving.challengers[MODEL]
        _wait(lambda: route.slot.version == gbm.ref.version, "the challenger did not load")
        monkeypatch.setattr(StoredBaseline, "probabilities", broken)
        for start in range(0, len(history), CHUNK):
            post_scores(client, server.url, key, history[start : start + CHUNK])
        results = post_scores(client, server.url, key, period[:40])
        assert {r["model_version"] for r in results} == {seq.ref.version}
        errors = httpx.get(f"{server.url}/metrics", headers={"X-API-Key": api_key(layout, "metrics:read")}).text
        assert f'indusflow_model_errors_total{{model="{MODEL}@challenger",stage="score"}}' in errors
        # cleared: out within a reload period
        set_challenger(MODEL, clear=True, registry=registry, reason="done")
        _wait(lambda: route.slot.version is None, "the cleared challenger is still served")
        assert httpx.get(f"{server.url}/readyz").json()["challengers"] == {f"{MODEL}@{CHALLENGER}": None}
    assert registry.verify_trail(MODEL).ok


def test_a_challenger_with_another_label_delay_is_not_paired(kinds, tmp_path: Path) -> None:
    src, data = kinds
    seq, gbm = data["sequence"], data["baseline"]
    layout = _home(src, tmp_path)
    registry = ModelRegistry(layout.registry())
    folder = layout.registry() / MODEL / str(gbm.ref.version)
    params = {**gbm.ref.params, "split": {"delay_days": 14}}
    other = registry.register(MODEL, {}, params=params, metrics={"test/auprc": 0.5}, primary_metric="test/auprc",
                              kind=gbm.ref.kind, extra_files={p.name: p for p in folder.iterdir()
                                                                  if p.name not in ("meta.json", "weights.safetensors")})
    set_challenger(f"{MODEL}:{other.version}", registry=registry)
    key = api_key(layout, serve_fraud.SCOPE, serve_fraud.LABEL_SCOPE)
    with FraudServer(layout, fraud_challenger_mode="split", challenger_share=0.5) as server, httpx.Client() as client:
        route = server.app.state.serving.challengers[MODEL]
        _wait(lambda: route.slot.version == other.version, "the challenger did not load")
        results = post_scores(client, server.url, key, seq.records[:50])
    assert {r["model_version"] for r in results} == {seq.ref.version}
    logged = read_score_log(layout.serving() / SCORES_DIR, MODEL)
    assert logged and not [r for r in logged if r["role"] == "challenger"]


# ------------------------------------------------------------------------------------
# sensor


@pytest.fixture(scope="module")
def two_sensors(tmp_path_factory: pytest.TempPathFactory) -> tuple[HomeLayout, TinySensor, object, pd.DataFrame]:
    """The tiny sensor champion v1 and a v2 with other weights, with v2's batch score of the held assets."""
    home = HomeLayout(tmp_path_factory.mktemp("sensor-challenger"))
    tiny = train_tiny_sensor(home)
    registry = ModelRegistry(home.registry())
    torch.manual_seed(1)
    state = {k: v + 0.05 * torch.randn_like(v) if v.is_floating_point() else v
             for k, v in registry.load_state_dict(tiny.ref).items()}
    v2 = registry.register(SENSOR_MODEL, state, params=tiny.ref.params, metrics={"test/rmse": 1.0},
                           primary_metric="test/rmse", higher_is_better=False)
    batch2, _ = scores_table(v2, tiny.grid, 0.4, state_dict=registry.load_state_dict(v2))
    return home, tiny, v2, batch2


def _renamed(tiny: TinySensor, route: ChallengerRoute) -> dict[str, str]:
    """New names for the two held assets such that the split gives one to each side."""
    names = [f"pump-{i}" for i in range(64)]
    side = route.answers(names)
    return {tiny.held[0]: names[int(np.flatnonzero(side)[0])], tiny.held[1]: names[int(np.flatnonzero(~side)[0])]}


@pytest.mark.parametrize("mode", ["shadow", "split"])
def test_sensor_challenger(two_sensors, mode: str) -> None:
    home, tiny, v2, batch2 = two_sensors
    set_challenger(f"{SENSOR_MODEL}:{v2.version}", registry=ModelRegistry(home.registry()))
    with SensorServer(home, sensor_challenger_mode=mode, challenger_share=0.5) as server:
        route = server.app.state.serving.challengers[SENSOR_MODEL]
        _wait(lambda: route.slot.version == v2.version, "the sensor challenger did not load")
        names = _renamed(tiny, route) if mode == "split" else {a: a for a in tiny.held}
        rows = tiny.rows.assign(**{SS.ASSET: tiny.rows[SS.ASSET].map(names)})
        response = httpx.post(f"{server.url}/v1/sensor/predict", json={"readings": jsonable(rows)},
                              headers={"X-API-Key": server.key}, timeout=60)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model_version"] == tiny.ref.version
    back = {v: k for k, v in names.items()}
    for p in body["predictions"]:
        by_ch = mode == "split" and bool(route.answers([p["asset_id"]])[0])
        table = batch2 if by_ch else tiny.batch
        [want] = table.loc[table[SS.ASSET] == back[p["asset_id"]]].to_dict("records")
        assert p["model_version"] == (v2.version if by_ch else tiny.ref.version)
        assert abs(p["predicted_rul"] - want["predicted_rul"]) <= TOL
    if mode == "split":
        assert {p["model_version"] for p in body["predictions"]} == {tiny.ref.version, v2.version}
    logged = pd.DataFrame(read_score_log(home.serving() / SCORES_DIR, SENSOR_MODEL))
    last = logged.groupby(["role", "id"]).last()
    for asset in names.values():
        assert last.loc[("champion", asset), "version"] == tiny.ref.version
        assert last.loc[("challenger", asset), "version"] == v2.version
        assert last.loc[("champion", asset), "decided"] != last.loc[("challenger", asset), "decided"]
