"""Model risk end to end, on a drifting synthetic fraud feed (a new fraud pattern starts halfway)
and, shorter, on a sensor fleet whose failures come later:

champion v1 (a GBM fitted before the pattern) serves on a real server, challenger v2 (refitted
on data with the pattern) scores every request in shadow; the labels arrive through the API;
the evidence flow recommends v2 with its interval; the approval is a decision signed with an
enrolled approver's own key, given through Prefect's ``resume_flow_run`` with run input as the UI
form does, by a second person after the initiator's own signed decision is refused; serving hot-reloads v2; an emergency rollback returns v1; the trail verifies, and
verification fails after one byte of it is changed. The sensor test does the same with RULs
judged by failure events from the failures inbox (the realised RMSE per version, drawn by asset).
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest
import torch
from prefect import get_client
from prefect.flow_runs import resume_flow_run

from flows.fraud.evidence import fraud_evidence
from flows.sensor.evidence import sensor_evidence
from flows.sensor.monitor import sensor_monitor
from flows.serve import fraud as serve_fraud
from infra.errors import ApprovalError
from infra.home import HomeLayout, home_layout
from infra.registry import ALIAS_HISTORY_FILE, KIND_SKLEARN, ModelRegistry, current_actor
from infra.serving.challenger import SCORES_DIR, read_score_log
from infra.tables import assign_periods, time_split, validate_table
from solutions.fraud import candidates as CA
from solutions.fraud import pipeline as P
from solutions.fraud import schema as S
from solutions.fraud.synthetic import generate_transactions
from solutions.sensor import pipeline as SP
from solutions.sensor import schema as SS
from solutions.sensor.align import align_readings, clean_events, clean_readings
from solutions.sensor.config import AlignConfig, SyntheticFleetConfig, WindowConfig
from solutions.sensor.features import make_windows
from solutions.sensor.model import SensorRULModel
from solutions.sensor.synthetic import generate_fleet
from tasks import approval
from tasks.approval import approval_requests, decide
from tasks.champion import rollback_champion, set_challenger
from tests.approvers import Person, enrol, statement_for
from tests.serve.fraud_helpers import MODEL, FraudServer, api_key, jsonable, post_scores
from tests.serve.sensor_helpers import MODEL as SENSOR_MODEL
from tests.serve.sensor_helpers import SensorServer
from tests.serve.sensor_helpers import jsonable as sensor_jsonable

CHUNK = 256
SERVED_DAYS = 4


def _register_drift(tmp: Path) -> tuple[pd.DataFrame, pd.Timestamp]:
    """The feed, and v1 (GBM fitted on days before the new pattern, champion) and v2 (fitted on the
    days just before the served ones, challenger)."""
    raw = generate_transactions(n_accounts=400, n_terminals=120, n_days=36, fraud_rate=0.02, seed=7,
                                new_pattern=True, new_pattern_from=0.5, new_pattern_rate=0.03)
    raw[S.TIMESTAMP] = raw[S.TIMESTAMP].astype(str)
    df = validate_table(raw, P.transaction_schema(), "e2e")
    registry = ModelRegistry()
    served_from = None
    for version, delay in ((1, 16), (2, 1)):  # days between a model's training window and the served days
        split = time_split(df[S.TIMESTAMP], train_days=10, val_days=2, delay_days=delay, test_days=SERVED_DAYS)
        served_from = pd.Timestamp(split.test_start)
        feats = P.build_features(df, assign_periods(df[S.TIMESTAMP], split), 7)
        gbm = CA.fit_baseline_candidate(df, feats, seed=0, n_threads=1)
        ref = registry.register(MODEL, {}, params={**CA.baseline_params(gbm, 7), "threshold": 0.5,
                                                   "split": {"delay_days": 7}},
                                metrics={"test/auprc": 0.5}, primary_metric="test/auprc", kind=KIND_SKLEARN,
                                extra_files=CA.baseline_files(gbm, tmp / f"gbm-{version}"))
        assert ref.version == version
        if version == 1:
            registry.promote(ref)
    assert served_from is not None
    return raw.drop(columns=[S.SCENARIO]), served_from


def _paused(run_id: str) -> bool:
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(uuid.UUID(run_id)).state
    return state is not None and state.is_paused()


def _wait(predicate, what: str, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def _signed(registry: ModelRegistry, request: Any, who: Person, reason: str) -> Any:
    return statement_for(registry, request.model, request.candidate_version, who, run_id=request.run_id, reason=reason)


def _check_trail(registry: ModelRegistry, model: str, near: bytes, offset: int, byte: str) -> None:
    """The trail holds the whole path in order (after the registrations and the policy) and
    verifies; one byte changed (at ``near`` + ``offset``) and it does not."""
    path = registry.root / model / ALIAS_HISTORY_FILE
    trail = [e["action"] for e in registry.trail(model)]
    assert trail == ["register", "promote", "register", "set", "policy", "approval-requested", "approval-refused",
                     "approved", "force", "rollback"]
    approved = registry.trail(model)[-3]
    assert approved["by"] == "bob" and approved["via"] is None  # the form carries no channel name
    assert registry.trail(model)[-2]["approved_by"] == "bob" and registry.trail(model)[-1]["emergency"] is True
    assert registry.verify_trail(model).ok
    data = bytearray(path.read_bytes())
    data[data.index(near) + offset] = ord(byte)  # one byte
    path.write_bytes(bytes(data))
    assert not registry.verify_trail(model).ok


def test_shadow_evidence_approval_reload_rollback_and_trail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INDUSFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(approval, "APPROVAL_POLL_S", 1)
    layout = home_layout()
    records, served_from = _register_drift(tmp_path)
    registry = ModelRegistry()
    set_challenger(f"{MODEL}:2", registry=registry, reason="refitted on the new pattern; shadow first")
    people = enrol(registry, MODEL, tmp_path / "keys")  # alice (who starts the runs here) and bob
    ts = pd.to_datetime(records[S.TIMESTAMP])
    history = records.loc[(ts < served_from).to_numpy()].to_dict("records")
    served = records.loc[(ts >= served_from).to_numpy()]
    key = api_key(layout, serve_fraud.SCOPE, serve_fraud.LABEL_SCOPE)
    desk = api_key(layout, serve_fraud.LABEL_SCOPE)  # a second label source: the fraud desk's key

    with FraudServer(layout) as server, httpx.Client() as client:
        [champion_slot] = [s for s in server.app.state.serving.slots if not s.optional]
        route = server.app.state.serving.challengers[MODEL]
        _wait(lambda: route.slot.version == 2, "the challenger did not load")
        for a in range(0, len(history), 1024):
            post_scores(client, server.url, key, history[a : a + 1024])  # the state before the served days
        rows = served.drop(columns=[S.LABEL]).to_dict("records")
        answered = []
        for a in range(0, len(rows), CHUNK):
            answered += post_scores(client, server.url, key, rows[a : a + CHUNK])
        assert {r["model_version"] for r in answered} == {1}  # shadow: the champion answers
        # the labels arrive later, through the API, from two sources
        labels = served[[S.TRANSACTION_ID, S.ACCOUNT_ID, S.TERMINAL_ID, S.TIMESTAMP, S.LABEL]].to_dict("records")
        for n, a in enumerate(range(0, len(labels), 500)):
            response = client.post(f"{server.url}/v1/fraud/labels", json={"labels": [jsonable(r) for r in
                                                                                     labels[a : a + 500]]},
                                   headers={"X-API-Key": (key, desk)[n % 2]}, timeout=30)
            assert response.status_code == 200, response.text
        ids = set(served[S.TRANSACTION_ID].astype(str))

        def logged() -> bool:
            rows_ = read_score_log(layout.serving() / SCORES_DIR, MODEL)
            have = {(r["role"], r["id"]) for r in rows_}
            return all(("challenger", i) in have and ("label", i) in have for i in ids)

        _wait(logged, "the score log does not hold both versions' scores and the labels")

        # the evidence flow recommends v2 and asks for approval (alice started it)
        out: dict[str, Any] = {}
        # (the served days are replayed in seconds here, so the label-burst check gets a wide margin)
        thread = threading.Thread(target=lambda: out.update(result=fraud_evidence(
            model=MODEL, promote=True, max_label_rate_ratio=1000.0)), daemon=True)
        thread.start()
        _wait(lambda: (bool(w := [r for r in approval_requests("waiting") if r.model == MODEL]) and _paused(w[-1].run_id))
              or not thread.is_alive(), "the promotion did not wait for approval", timeout_s=180)
        [request] = [r for r in approval_requests("waiting") if r.model == MODEL]
        assert (request.candidate_version, request.champion_version, request.requested_by) == (2, 1, current_actor())
        with pytest.raises(ApprovalError, match="four eyes"):
            decide(request.run_id, signed=_signed(registry, request, people["alice"], "my own evidence"))
        assert registry.aliases(MODEL)["champion"] == 1
        # the UI form's path: Prefect's resume with run input, a decision signed by a second person
        signed = _signed(registry, request, people["bob"], "shadow evidence reviewed")
        resume_flow_run(uuid.UUID(request.run_id), run_input={"signed_decision": signed.model_dump_json()})
        thread.join(180)
        result = out["result"]
        assert result.recommendation == "promote", result.reason
        v1, v2 = result.versions
        assert v1.labelled == v2.labelled == len(ids) and v2.metric.value > v1.metric.value
        assert len(result.label_sources) == 2 and sum(result.label_sources.values()) == len(ids)
        assert result.paired.p_value < 0.05 and result.paired.diff_low > 0
        assert result.promotion.promoted and result.promotion.approval.decided_by == "bob"
        # serving picks v2 up within a reload period
        _wait(lambda: champion_slot.version == 2, "serving did not reload v2", timeout_s=30)
        last = pd.Timestamp(served[S.TIMESTAMP].max())
        late = {**rows[-1], S.TRANSACTION_ID: "after-promotion", S.TIMESTAMP: str(last + pd.Timedelta(seconds=1))}
        assert post_scores(client, server.url, key, [late])[0]["model_version"] == 2
        # an emergency rollback returns v1 at once (the trail says so)
        back = rollback_champion(MODEL, registry, emergency=True, reason="incident drill")
        assert back.candidate_version == 1
        _wait(lambda: champion_slot.version == 1, "serving did not reload v1", timeout_s=30)
        later = {**late, S.TRANSACTION_ID: "after-rollback", S.TIMESTAMP: str(last + pd.Timedelta(seconds=2))}
        assert post_scores(client, server.url, key, [later])[0]["model_version"] == 1

    _check_trail(registry, MODEL, b'"bob"', 1, "B")


# ------------------------------------------------------------------------------------
# sensor: the same path with failure events, shorter


def _sensor_versions(home: HomeLayout) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """A synthetic fleet; v1 (a CNN trained a few steps: champion) and v2 (the same CNN trained
    to convergence on the same assets) registered; the readings and failure events of the assets
    neither saw, which run to failure while they are served."""
    readings, events = generate_fleet(SyntheticFleetConfig(n_assets=18, min_life=40, max_life=70, fast_rate=4,
                                                           censored_fraction=0.0, bad_reading_rate=0.0, seed=11))
    readings[SS.TIMESTAMP] = readings[SS.TIMESTAMP].astype(str)
    assets = sorted(readings[SS.ASSET].unique())
    trained, served = assets[:8], assets[8:]
    cfg = AlignConfig()
    clean, report = clean_readings(readings.loc[readings[SS.ASSET].isin(trained)], cfg, "train")
    grid, _ = align_readings(clean, clean_events(events), cfg, report)
    wcfg = WindowConfig(length=12, rul_cap=80.0, horizon=10, n_regimes=1)
    norm = SP.fit_normalizer(grid, trained, wcfg, cfg.op_prefix)
    ws = make_windows(grid, norm, length=wcfg.length, stride=1, rul_cap=wcfg.rul_cap, horizon=wcfg.horizon)
    x = torch.as_tensor(ws.x, dtype=torch.float32)
    target = torch.as_tensor(np.nan_to_num(ws.rul, nan=wcfg.rul_cap) / wcfg.rul_cap, dtype=torch.float32)
    registry = ModelRegistry(home.registry())
    for version, steps in ((1, 2), (2, 300)):
        torch.manual_seed(0)
        net = SensorRULModel(n_channels=len(norm.channels_), channels=8, embedding_dim=16, rul_cap=wcfg.rul_cap)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
        net.train()
        for _ in range(steps):
            loss = torch.nn.functional.mse_loss(net(x)[0], target)
            opt.zero_grad()
            loss.backward()
            opt.step()
        net.eval()
        ref = registry.register(SENSOR_MODEL, net.state_dict(), params=SP.model_params(net, norm, wcfg, threshold=0.4),
                                metrics={"test/rmse": 1.0}, primary_metric="test/rmse", higher_is_better=False)
        assert ref.version == version
        if version == 1:
            registry.promote(ref)
    return readings.loc[readings[SS.ASSET].isin(served)], events, served


def test_sensor_shadow_failures_evidence_approval_reload_rollback_and_trail(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INDUSFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(approval, "APPROVAL_POLL_S", 1)
    home = home_layout()
    readings, events, served = _sensor_versions(home)
    registry = ModelRegistry()
    set_challenger(f"{SENSOR_MODEL}:2", registry=registry, reason="trained to convergence; shadow first")
    people = enrol(registry, SENSOR_MODEL, tmp_path / "keys")
    ts = pd.to_datetime(readings[SS.TIMESTAMP])
    with SensorServer(home) as server, httpx.Client() as client:
        [champion_slot] = [s for s in server.app.state.serving.slots if not s.optional]
        route = server.app.state.serving.challengers[SENSOR_MODEL]
        _wait(lambda: route.slot.version == 2, "the sensor challenger did not load")

        def predict(asset: str, until: pd.Timestamp) -> dict[str, Any]:
            rows = readings.loc[((readings[SS.ASSET] == asset) & (ts < until)).to_numpy()]
            response = client.post(f"{server.url}/v1/sensor/predict", json={"readings": sensor_jsonable(rows)},
                                   headers={"X-API-Key": server.key}, timeout=60)
            assert response.status_code == 200, response.text
            [prediction] = response.json()["predictions"]
            return prediction

        # each asset is asked about every 4 hours while it runs (the champion answers: shadow)
        for asset in served:
            start, end = ts[readings[SS.ASSET] == asset].min(), ts[readings[SS.ASSET] == asset].max()
            for hours in range(14, int((end - start) / pd.Timedelta(hours=1)), 4):
                assert predict(asset, start + pd.Timedelta(hours=hours))["model_version"] == 1
        # the failures arrive later, as a file in the failures inbox, and the monitor takes them in
        inbox = home.inbox("failures")
        inbox.mkdir(parents=True, exist_ok=True)
        failed = events.loc[events[SS.ASSET].isin(served)]
        failed.rename(columns={SS.FAILURE_TIME: "failed_at"})[[SS.ASSET, "failed_at"]].to_csv(
            inbox / "failures.csv", index=False)
        _wait(lambda: {r["role"] for r in read_score_log(home.serving() / SCORES_DIR, SENSOR_MODEL)}
              == {"champion", "challenger"}, "the score log does not hold both versions")
        assert sensor_monitor(settle_seconds=0, retrain=False).failures_rows == len(served)

        out: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: out.update(result=sensor_evidence(model=SENSOR_MODEL, promote=True)),
                                  daemon=True)
        thread.start()
        _wait(lambda: (bool(w := [r for r in approval_requests("waiting") if r.model == SENSOR_MODEL])
              and _paused(w[-1].run_id)) or not thread.is_alive(), "the promotion did not wait for approval",
              timeout_s=180)
        [request] = [r for r in approval_requests("waiting") if r.model == SENSOR_MODEL]
        with pytest.raises(ApprovalError, match="four eyes"):
            decide(request.run_id, signed=_signed(registry, request, people["alice"], "mine"))
        signed = _signed(registry, request, people["bob"], "realised RUL error reviewed")
        resume_flow_run(uuid.UUID(request.run_id), run_input={"signed_decision": signed.model_dump_json()})
        thread.join(180)
        result = out["result"]
        print("sensor evidence:", result.reason)
        assert result.recommendation == "promote", result.reason
        v1, v2 = result.versions
        assert v1.subjects == v2.subjects == len(served) and v2.metric.value < v1.metric.value
        assert result.paired.diff_high < 0 and result.paired.p_value < 0.05
        assert result.promotion.promoted and result.promotion.approval.decided_by == "bob"
        _wait(lambda: champion_slot.version == 2, "serving did not reload v2", timeout_s=30)
        last = ts.max()
        assert predict(served[0], last)["model_version"] == 2
        rollback_champion(SENSOR_MODEL, registry, emergency=True, reason="incident drill")
        _wait(lambda: champion_slot.version == 1, "serving did not reload v1", timeout_s=30)
        assert predict(served[0], last)["model_version"] == 1

    _check_trail(registry, SENSOR_MODEL, b"incident drill", 0, "I")
