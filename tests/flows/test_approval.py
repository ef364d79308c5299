"""Approval before promotion (four eyes): a run whose candidate wins pauses in Prefect with the
approval form; the person who started it is refused (from the CLI path and from the UI's form);
a second person approves through Prefect's resume API as the UI does; a rejection and a timeout
leave the champion; every step is in the registry trail, which verifies until one byte changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from prefect import flow, get_client
from prefect.flow_runs import resume_flow_run

from infra.errors import ApprovalError
from infra.registry import ALIAS_HISTORY_FILE, ModelRegistry
from tasks.approval import approval_gate_task, approval_requests, decide, find_request
from tasks.register import RegistrationResult, register_model_task

ROOT = Path(__file__).resolve().parents[2]


@flow(name="gated-train")
def gated_train(name: str, value: float) -> RegistrationResult:
    """A training run's last two steps: register through the champion rule, then the approval gate."""
    registration = register_model_task(name, torch.nn.Linear(2, 1), params={}, metrics={"test/auprc": value},
                                       primary_metric="test/auprc")
    return approval_gate_task(registration)


class Background:
    """A flow run in a thread (the training process), and its result."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as exc:  # noqa: BLE001 - reported by join()
            self.error = exc

    def join(self, timeout: float = 120) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the run did not finish"
        if self.error is not None:
            raise self.error
        return self.result


def _wait_paused(model: str, refusals: int = 0, timeout: float = 60) -> str:
    """The run id once its approval request exists and Prefect shows the run Paused."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        waiting = [r for r in approval_requests("waiting") if r.model == model and len(r.refused) >= refusals]
        if waiting:
            with get_client(sync_client=True) as client:
                state = client.read_flow_run(uuid.UUID(waiting[-1].run_id)).state
            if state is not None and state.is_paused():
                return waiting[-1].run_id
        time.sleep(0.3)
    raise AssertionError(f"no paused run of {model} waits for approval")


def _actions(name: str) -> list[str]:
    return [json.loads(line)["action"] for line in
            (ModelRegistry().root / name / ALIAS_HISTORY_FILE).read_text().splitlines()]


@pytest.fixture
def approval_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    monkeypatch.setenv("INDUSFLOW_GOVERNANCE_ACTOR", "alice")
    monkeypatch.setenv("INDUSFLOW_GOVERNANCE_APPROVAL_POLL_S", "1")

    def require(name: str) -> None:
        monkeypatch.setenv("INDUSFLOW_GOVERNANCE_APPROVAL_REQUIRED", json.dumps([name]))
    yield require


def test_four_eyes_then_approved_through_prefects_resume(approval_env: Callable[[str], None]) -> None:
    name = "appr-fraud"
    registry = ModelRegistry()
    first = gated_train(name, 0.30)  # no approval asked yet: the first champion
    assert first.decision.promoted and first.decision.approval is None
    approval_env(name)

    run = Background(lambda: gated_train(name, 0.40))
    run_id = _wait_paused(name)
    assert registry.get(name).version == 1  # nothing moved while it waits
    request = find_request(run_id[:8])
    assert (request.requested_by, request.candidate_version, request.champion_version) == ("alice", 2, 1)
    assert request.api_url and "/api" in request.api_url

    # the CLI/API path refuses the initiator before resuming (and records it)
    with pytest.raises(ApprovalError, match="four eyes: alice started this run"):
        decide(run_id, approve=True, reason="looks fine", approver="Alice")
    # the UI's form, filled in by the initiator: the run refuses it and pauses again
    resume_flow_run(uuid.UUID(run_id), run_input={"decision": "approve", "reason": "my own model", "approver": " alice "})
    _wait_paused(name, refusals=1)
    # Prefect validates the form: a reason of two letters does not resume the run
    with pytest.raises(RuntimeError, match="reason"):
        resume_flow_run(uuid.UUID(run_id), run_input={"decision": "approve", "reason": "ok", "approver": "bob"})

    decided = decide(run_id, approve=True, reason="card and comparison reviewed", approver="bob")
    assert (decided.status, decided.decided_by) == ("approved", "bob")
    result = run.join()
    decision = result.decision
    assert decision.promoted and not decision.awaiting_approval
    assert decision.approval.decided_by == "bob" and decision.approval.requested_by == "alice"
    assert "approved by bob: card and comparison reviewed" in decision.reason
    assert registry.get(name).version == 2
    assert _actions(name) == ["promote", "approval-requested", "approval-refused", "approval-refused",
                              "approved", "promote"]
    move = json.loads((registry.root / name / ALIAS_HISTORY_FILE).read_text().splitlines()[-1])
    assert move["approval"]["decided_by"] == "bob" and move["previous"] == 1
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(uuid.UUID(run_id)).state.is_completed()

    report = registry.verify_trail(name)
    assert report.ok and report.head_sha256 == decision.trail_sha256
    path = registry.root / name / ALIAS_HISTORY_FILE
    original = path.read_bytes()
    data = bytearray(original)
    at = data.index(b'"bob"') + 1
    data[at] = ord("B")  # one byte: the approver's name
    path.write_bytes(bytes(data))
    assert not registry.verify_trail(name).ok
    path.write_bytes(original)  # the session's other tests verify every model of this home
    assert registry.verify_trail(name).ok

    with pytest.raises(ApprovalError, match="already approved by bob"):
        decide(run_id, approve=True, reason="again", approver="carol")


def test_rejection_and_timeout_keep_the_champion(approval_env: Callable[[str], None],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    name = "appr-reject"
    registry = ModelRegistry()
    gated_train(name, 0.30)
    approval_env(name)

    run = Background(lambda: gated_train(name, 0.50))
    run_id = _wait_paused(name)
    decided = decide(run_id, approve=False, reason="drift in the validation period", approver="bob")
    assert decided.status == "rejected"
    decision = run.join().decision
    assert not decision.promoted and decision.approval.decided_by == "bob"
    assert "rejected by bob: drift in the validation period" in decision.reason
    assert registry.get(name).version == 1

    monkeypatch.setenv("INDUSFLOW_GOVERNANCE_APPROVAL_TIMEOUT_S", "3")
    started = time.monotonic()
    result = gated_train(name, 0.60)
    assert time.monotonic() - started < 30
    assert not result.decision.promoted and result.decision.approval.decided_by is None
    assert "no decision within 3 s" in result.decision.reason
    assert registry.get(name).version == 1
    expired = [r for r in approval_requests("expired") if r.model == name]
    assert expired and expired[-1].candidate_version == 3
    with get_client(sync_client=True) as client:  # a rejection is not a failed run
        assert client.read_flow_run(uuid.UUID(expired[-1].run_id)).state.is_completed()
    assert _actions(name)[-4:] == ["approval-requested", "rejected", "approval-requested", "approval-expired"]
    assert registry.verify_trail(name).ok


def test_the_approve_command_resumes_the_run_from_another_process(approval_env: Callable[[str], None]) -> None:
    """``python -m flows.fraud approve RUN --reason ...`` as a second user, in its own process:
    it finds the run's Prefect API from the request and resumes it."""
    name = "appr-cli"
    gated_train(name, 0.30)
    approval_env(name)
    run = Background(lambda: gated_train(name, 0.45))
    run_id = _wait_paused(name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}

    def approve(actor: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "flows.fraud", "approve", run_id, *extra, "--json"],
                              cwd=ROOT, env={**env, "INDUSFLOW_GOVERNANCE_ACTOR": actor}, capture_output=True,
                              text=True, timeout=240, check=False)

    same = approve("alice", "--reason", "self-approval")
    assert same.returncode == 2 and "four eyes: alice started this run" in same.stderr
    listed = subprocess.run([sys.executable, "-m", "flows.fraud", "approvals", "--json"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=240, check=False)
    assert listed.returncode == 0, listed.stderr
    assert any(r["run_id"] == run_id for r in json.loads(listed.stdout.strip().splitlines()[-1])["requests"])
    done = approve("bob", "--reason", "validated against the monitoring period")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert (out["status"], out["decided_by"]) == ("approved", "bob")
    assert f"{name} v2 (run {run_id}): approved by bob" in done.stdout
    assert run.join().decision.promoted
    assert ModelRegistry().get(name).version == 2


def test_the_serving_api_decides_as_the_callers_key(approval_env: Callable[[str], None],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``POST /v1/registry/approvals/RUN`` (scope registry:approve): the approver is the key, not a
    name in the body; the initiator's own key is refused (403); a second key approves."""
    from fastapi.testclient import TestClient

    from flows.serve import registry as registry_routes
    from flows.serve.app import create_app
    from infra.home import home_layout
    from infra.serving.runtime import key_store
    from infra.settings import ServeSettings

    name = "appr-api"
    gated_train(name, 0.30)
    approval_env(name)
    layout = home_layout()
    keys = key_store(layout)
    starter_key, starter = keys.add("starter", ("registry:approve",))
    checker_key, checker = keys.add("checker", ("registry:approve",))
    scorer_key, _ = keys.add("scorer", ("fraud:score",))
    monkeypatch.setenv("INDUSFLOW_GOVERNANCE_ACTOR", f"api-key:{starter.key_id}")  # the run is started as that key
    run = Background(lambda: gated_train(name, 0.55))
    run_id = _wait_paused(name)
    app = create_app(ServeSettings(audit_salt="test-salt"), build_verticals=[registry_routes.build],
                     layout=layout, registry=ModelRegistry())
    url = f"/v1/registry/approvals/{run_id}"
    body = {"decision": "approve", "reason": "validation report signed"}
    with TestClient(app) as client:
        assert client.post(url, json=body).status_code == 401
        assert client.post(url, json=body, headers={"X-API-Key": scorer_key}).status_code == 403
        listed = client.get("/v1/registry/approvals", headers={"X-API-Key": checker_key})
        assert listed.status_code == 200 and [a["run_id"] for a in listed.json()["approvals"]] == [run_id]
        assert "api_url" not in listed.json()["approvals"][0]
        own = client.post(url, json=body, headers={"X-API-Key": starter_key})
        assert own.status_code == 403 and "four eyes" in own.json()["detail"]["error"]
        short = client.post(url, json={"decision": "approve", "reason": "ok"}, headers={"X-API-Key": checker_key})
        assert short.status_code == 422
        unknown = client.post("/v1/registry/approvals/0123456789abcdef", json=body, headers={"X-API-Key": checker_key})
        assert unknown.status_code == 404
        done = client.post(url, json=body, headers={"X-API-Key": checker_key})
        assert done.status_code == 200, done.text
        assert (done.json()["status"], done.json()["decided_by"]) == ("approved", f"api-key:{checker.key_id}")
        again = client.post(url, json=body, headers={"X-API-Key": checker_key})
        assert again.status_code == 409
    assert run.join().decision.promoted
    assert ModelRegistry().get(name).version == 2


def test_a_sensor_promotion_by_hand_waits_too(approval_env: Callable[[str], None]) -> None:
    """``sensor promote`` (a move whatever the metrics say) needs the approval as well; approved,
    the forced move happens and names the approver."""
    from flows.sensor.promote import sensor_promote

    name = "appr-sensor"
    registry = ModelRegistry()
    for rmse in (12.0, 14.0):  # v2 is worse: only a promotion by hand makes it champion
        ref = registry.register(name, {"w": torch.full((2,), rmse)}, params={}, metrics={"test/rmse": rmse},
                                primary_metric="test/rmse", higher_is_better=False)
        registry.promote(ref)
    assert registry.get(name).version == 1
    approval_env(name)
    run = Background(lambda: sensor_promote(f"{name}:2"))
    run_id = _wait_paused(name)
    assert find_request(run_id).flow_name == "sensor-promote"
    decide(run_id, approve=True, reason="rollback drill: v2 on purpose", approver="bob")
    decision = run.join()
    assert decision.promoted and decision.approval.decided_by == "bob"
    assert "promoted by hand" in decision.reason and registry.get(name).version == 2
    assert json.loads((registry.root / name / ALIAS_HISTORY_FILE).read_text().splitlines()[-1])["action"] == "force"


def test_a_rollback_waits_for_approval_unless_it_is_an_emergency(approval_env: Callable[[str], None]) -> None:
    from flows.fraud.promote import fraud_rollback

    name = "appr-rollback"
    registry = ModelRegistry()
    for value in (0.3, 0.4, 0.5):
        gated_train(name, value)  # v3 champion, v2 before it, then v1
    approval_env(name)
    run = Background(lambda: fraud_rollback(name, reason="v3 flags too many card-present payments"))
    run_id = _wait_paused(name)
    assert find_request(run_id).candidate_version == 2 and registry.get(name).version == 3
    decide(run_id, approve=True, reason="incident 4711 confirmed", approver="bob")
    decision = run.join()
    assert decision.promoted and registry.get(name).version == 2
    assert "v3 flags too many card-present payments; approved by bob: incident 4711 confirmed" in decision.reason
    emergency = fraud_rollback(name, emergency=True, reason="outage")
    assert emergency.promoted and registry.get(name).version == 1
    assert "emergency (no approval asked); outage" in emergency.reason
    moves = [json.loads(line) for line in (registry.root / name / ALIAS_HISTORY_FILE).read_text().splitlines()]
    assert [m["action"] for m in moves[-4:]] == ["approval-requested", "approved", "rollback", "rollback"]
    assert moves[-2]["approval"]["decided_by"] == "bob" and registry.verify_trail(name).ok
