"""Approval before promotion (four eyes): a run whose candidate wins pauses in Prefect with the
approval form; a decision counts only when an enrolled approver who did not start the run signed
it. The three self-approval routes of the review are refused: a run input naming someone else
(the UI form), ``INDUSFLOW_GOVERNANCE_ACTOR`` on the ``approve`` command, and an API key minted by
anyone who can write the home. A second person's signed decision approves through Prefect's
resume API as the UI does; a rejection and a timeout leave the champion; every step is in the
registry trail, which verifies until one byte changes."""

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
from infra.registry import ALIAS_HISTORY_FILE, ModelRegistry, current_actor
from tasks import approval
from tasks.approval import approval_gate_task, approval_requests, decide, find_request
from tasks.register import RegistrationResult, register_model_task
from tests.approvers import Person, enrol, person, statement_for

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
    """The trail's moves and approval events (not the registrations, documents and policies)."""
    return [e["action"] for e in ModelRegistry().alias_history(name, None)]


def _signed(name: str, run_id: str, who: Person, decision: str = "approve", reason: str = "card reviewed") -> Any:
    request = find_request(run_id)
    return statement_for(ModelRegistry(), name, request.candidate_version, who, alias=request.alias, run_id=run_id,
                         decision=decision, reason=reason)


def _form(signed: Any) -> dict[str, Any]:
    """What the Prefect UI's approval form sends: the signed decision, pasted."""
    return {"signed_decision": signed.model_dump_json()}


@pytest.fixture
def approval_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Callable[[str], dict[str, Person]]]:
    """Enrols alice (this process's OS account: she starts the runs) and bob as the approvers of a model."""
    monkeypatch.setattr(approval, "APPROVAL_POLL_S", 1)

    def require(name: str) -> dict[str, Person]:
        return enrol(ModelRegistry(), name, tmp_path / "keys")
    yield require


def test_four_eyes_then_approved_through_prefects_resume(approval_env: Callable[[str], dict[str, Person]],
                                                         tmp_path: Path) -> None:
    name = "appr-fraud"
    registry = ModelRegistry()
    first = gated_train(name, 0.30)  # no policy yet: the first champion
    assert first.decision.promoted and first.decision.approval is None
    people = approval_env(name)

    run = Background(lambda: gated_train(name, 0.40))
    run_id = _wait_paused(name)
    assert registry.get(name).version == 1  # nothing moved while it waits
    request = find_request(run_id[:8])
    assert (request.requested_by, request.candidate_version, request.champion_version) == (current_actor(), 2, 1)
    assert request.api_url and "/api" in request.api_url and request.files == registry.version_files(name, 2)

    # (a) the UI form filled in with a name: no signed decision, Prefect does not even resume the run
    with pytest.raises(RuntimeError, match="Validation failed"):
        resume_flow_run(uuid.UUID(run_id), run_input={"decision": "approve", "reason": "fine", "approver": "bob"})
    # the form carrying the initiator's own signed decision: the run refuses it and pauses again
    resume_flow_run(uuid.UUID(run_id), run_input=_form(_signed(name, run_id, people["alice"])))
    _wait_paused(name, refusals=1)
    # the CLI/API path refuses the initiator before resuming (and records it)
    with pytest.raises(ApprovalError, match="four eyes: .* started this move, so alice may not decide") as refused:
        decide(run_id, signed=_signed(name, run_id, people["alice"]))
    assert refused.value.code == "four_eyes"
    # a key nobody enrolled (anyone who can write the home could make one)
    mallory = person(tmp_path / "keys", "mallory")
    resume_flow_run(uuid.UUID(run_id), run_input=_form(_signed(name, run_id, mallory)))
    _wait_paused(name, refusals=2)

    decided = decide(run_id, signed=_signed(name, run_id, people["bob"], reason="card and comparison reviewed"))
    assert (decided.status, decided.decided_by) == ("approved", "bob")
    result = run.join()
    decision = result.decision
    assert decision.promoted and not decision.awaiting_approval
    assert decision.approval.decided_by == "bob" and decision.approval.requested_by == current_actor()
    assert "approved by bob: card and comparison reviewed" in decision.reason
    assert registry.get(name).version == 2
    assert _actions(name) == ["promote", "approval-requested", "approval-refused", "approval-refused",
                              "approval-refused", "approved", "promote"]
    move = registry.trail(name)[-1]
    assert move["approval"]["decided_by"] == "bob" and move["previous"] == 1
    assert move["approved_by"] == "bob" and move["approver_key"] == people["bob"].public_key
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
        decide(run_id, signed=_signed(name, run_id, people["bob"]))


def test_rejection_and_timeout_keep_the_champion(approval_env: Callable[[str], dict[str, Person]],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    name = "appr-reject"
    registry = ModelRegistry()
    gated_train(name, 0.30)
    people = approval_env(name)

    run = Background(lambda: gated_train(name, 0.50))
    run_id = _wait_paused(name)
    decided = decide(run_id, signed=_signed(name, run_id, people["bob"], "reject", "drift in the validation period"))
    assert decided.status == "rejected"
    decision = run.join().decision
    assert not decision.promoted and decision.approval.decided_by == "bob"
    assert "rejected by bob: drift in the validation period" in decision.reason
    assert registry.get(name).version == 1

    monkeypatch.setenv("INDUSFLOW_GOVERNANCE_APPROVAL_TIMEOUT_S", "3")
    # a gate that ignored the 3 s (the default is a day) fails the join's 120 s, and hangs nobody
    result = Background(lambda: gated_train(name, 0.60)).join()
    assert not result.decision.promoted and result.decision.approval.decided_by is None
    assert "no decision within 3 s" in result.decision.reason
    assert registry.get(name).version == 1
    expired = [r for r in approval_requests("expired") if r.model == name]
    assert expired and expired[-1].candidate_version == 3
    with get_client(sync_client=True) as client:  # a rejection is not a failed run
        assert client.read_flow_run(uuid.UUID(expired[-1].run_id)).state.is_completed()
    assert _actions(name)[-4:] == ["approval-requested", "rejected", "approval-requested", "approval-expired"]
    assert registry.verify_trail(name).ok


def test_the_approve_command_signs_with_the_approvers_key_in_another_process(
        approval_env: Callable[[str], dict[str, Person]]) -> None:
    """``python -m flows.fraud approve RUN --key PATH --reason ...`` in its own process: it finds the
    run's Prefect API from the request and resumes it. (b): ``INDUSFLOW_GOVERNANCE_ACTOR`` names
    nobody: the initiator's key is refused whatever the variable says."""
    name = "appr-cli"
    gated_train(name, 0.30)
    people = approval_env(name)
    run = Background(lambda: gated_train(name, 0.45))
    run_id = _wait_paused(name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}

    def approve(who: Person, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "flows.fraud", "approve", run_id, "--key", str(who.key_path),
                               *extra, "--json"], cwd=ROOT, env={**env, "INDUSFLOW_GOVERNANCE_ACTOR": "validator"},
                              capture_output=True, text=True, timeout=240, check=False)

    same = approve(people["alice"], "--reason", "self-approval")
    assert same.returncode == 2 and "four eyes" in same.stderr and "alice may not decide" in same.stderr
    listed = subprocess.run([sys.executable, "-m", "flows.fraud", "approvals", "--json"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=240, check=False)
    assert listed.returncode == 0, listed.stderr
    assert any(r["run_id"] == run_id for r in json.loads(listed.stdout.strip().splitlines()[-1])["requests"])
    done = approve(people["bob"], "--reason", "validated against the monitoring period")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert (out["status"], out["decided_by"]) == ("approved", "bob")
    assert f"{name} v2 (run {run_id}): approved by bob" in done.stdout
    assert run.join().decision.promoted
    assert ModelRegistry().get(name).version == 2


def test_the_serving_api_carries_only_signed_decisions(approval_env: Callable[[str], dict[str, Person]],
                                                      tmp_path: Path) -> None:
    """``POST /v1/registry/approvals/RUN``: (c) a ``registry:approve`` key alone approves nothing;
    the decision must be signed by an enrolled approver other than the initiator; a key bound to
    a person carries only that person's decisions; a key for another model is refused; of two
    racing decisions the second gets 409."""
    from fastapi.testclient import TestClient

    from flows.serve import registry as registry_routes
    from flows.serve.app import create_app
    from infra.home import home_layout
    from infra.serving.runtime import key_store
    from infra.settings import ServeSettings

    name = "appr-api"
    gated_train(name, 0.30)
    people = approval_env(name)
    layout = home_layout()
    keys = key_store(layout)
    minted_key, _ = keys.add("minted", ("registry:approve",))  # what anyone who can write the home can do
    bobs_key, bobs = keys.add("bob", ("registry:approve:appr-api",), person="bob")
    carols_key, _ = keys.add("carol", ("registry:approve",), person="carol")
    other_key, _ = keys.add("other", ("registry:approve:sensor-rul",))
    scorer_key, _ = keys.add("scorer", ("fraud:score",))
    run = Background(lambda: gated_train(name, 0.55))
    run_id = _wait_paused(name)
    app = create_app(ServeSettings(audit_salt="test-salt"), build_verticals=[registry_routes.build],
                     layout=layout, registry=ModelRegistry())
    url = f"/v1/registry/approvals/{run_id}"
    mallory = person(tmp_path / "keys", "mallory")

    def body(who: Person) -> dict[str, Any]:
        return {"signed_decision": json.loads(_signed(name, run_id, who, reason="validation report").model_dump_json())}

    with TestClient(app) as client:
        assert client.post(url, json=body(people["bob"])).status_code == 401
        assert client.post(url, json=body(people["bob"]), headers={"X-API-Key": scorer_key}).status_code == 403
        listed = client.get("/v1/registry/approvals", headers={"X-API-Key": bobs_key})
        assert listed.status_code == 200 and [a["run_id"] for a in listed.json()["approvals"]] == [run_id]
        assert "api_url" not in listed.json()["approvals"][0]
        assert client.get("/v1/registry/approvals", headers={"X-API-Key": other_key}).json()["approvals"] == []
        unsigned = client.post(url, json={"decision": "approve", "reason": "looks fine"},
                               headers={"X-API-Key": minted_key})
        assert unsigned.status_code == 422  # a key alone is no decision
        forged = client.post(url, json=body(mallory), headers={"X-API-Key": minted_key})
        assert forged.status_code == 403 and "no approver" in forged.json()["detail"]["error"]
        own = client.post(url, json=body(people["alice"]), headers={"X-API-Key": minted_key})
        assert own.status_code == 403 and "four eyes" in own.json()["detail"]["error"]
        carried = client.post(url, json=body(people["bob"]), headers={"X-API-Key": carols_key})
        assert carried.status_code == 403 and "bound to carol" in carried.json()["detail"]["error"]
        elsewhere = client.post(url, json=body(people["bob"]), headers={"X-API-Key": other_key})
        assert elsewhere.status_code == 403
        unknown = client.post("/v1/registry/approvals/0123456789abcdef", json=body(people["bob"]),
                              headers={"X-API-Key": bobs_key})
        assert unknown.status_code == 404
        done = client.post(url, json=body(people["bob"]), headers={"X-API-Key": bobs_key})
        assert done.status_code == 200, done.text
        assert (done.json()["status"], done.json()["decided_by"]) == ("approved", "bob")
        again = client.post(url, json=body(people["bob"]), headers={"X-API-Key": bobs_key})
        assert again.status_code == 409
    assert run.join().decision.promoted
    registry = ModelRegistry()
    assert registry.get(name).version == 2
    approved = [e for e in registry.trail(name) if e["action"] == "approved"][-1]
    assert approved["by"] == "bob" and approved["via"] == f"api-key:{bobs.key_id} (bob; made by {current_actor()})"


def test_racing_decisions_one_wins_the_other_is_refused(approval_env: Callable[[str], dict[str, Person]]) -> None:
    """Two decisions sent at once for one waiting run: compare-and-set, the second is 'decided'."""
    name = "appr-race"
    gated_train(name, 0.30)
    people = approval_env(name)
    run = Background(lambda: gated_train(name, 0.45))
    run_id = _wait_paused(name)
    outcomes: list[str] = []

    def send() -> None:
        try:
            outcomes.append(decide(run_id, signed=_signed(name, run_id, people["bob"]), wait_s=30).status)
        except ApprovalError as exc:
            outcomes.append(exc.code)

    threads = [threading.Thread(target=send) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(outcomes) == ["approved", "decided"], outcomes
    assert run.join().decision.promoted
    # the trail says what happened: one decision approved and moved it, the other was refused as late
    registry = ModelRegistry()
    events = [e for e in registry.alias_history(name, None) if e.get("run") == run_id or e.get("alias")]
    assert [e["action"] for e in events][-3:] in (["approval-refused", "approved", "promote"],
                                                   ["approved", "approval-refused", "promote"],
                                                   ["approved", "promote", "approval-refused"])
    [late] = [e for e in events if e["action"] == "approval-refused"]
    assert late["refused_code"] == "decided" and late["decision_sha256"]
    assert registry.verify_trail(name).status != "failed"


def test_a_sensor_promotion_by_hand_waits_too(approval_env: Callable[[str], dict[str, Person]]) -> None:
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
    people = approval_env(name)
    run = Background(lambda: sensor_promote(f"{name}:2"))
    run_id = _wait_paused(name)
    assert find_request(run_id).flow_name == "sensor-promote"
    decide(run_id, signed=_signed(name, run_id, people["bob"], reason="rollback drill: v2 on purpose"))
    decision = run.join()
    assert decision.promoted and decision.approval.decided_by == "bob"
    assert "promoted by hand" in decision.reason and registry.get(name).version == 2
    assert registry.alias_history(name)[-1]["action"] == "force"


def test_a_rollback_waits_for_approval_unless_it_is_an_emergency(
        approval_env: Callable[[str], dict[str, Person]]) -> None:
    from flows.fraud.promote import fraud_rollback

    name = "appr-rollback"
    registry = ModelRegistry()
    for value in (0.3, 0.4, 0.5):
        gated_train(name, value)  # v3 champion, v2 before it, then v1
    people = approval_env(name)
    run = Background(lambda: fraud_rollback(name, reason="v3 flags too many card-present payments"))
    run_id = _wait_paused(name)
    assert find_request(run_id).candidate_version == 2 and registry.get(name).version == 3
    decide(run_id, signed=_signed(name, run_id, people["bob"], reason="incident 4711 confirmed"))
    decision = run.join()
    assert decision.promoted and registry.get(name).version == 2
    assert "v3 flags too many card-present payments; approved by bob: incident 4711 confirmed" in decision.reason
    emergency = fraud_rollback(name, emergency=True, reason="outage")
    assert emergency.promoted and registry.get(name).version == 1
    assert "emergency (no approval asked); outage" in emergency.reason
    moves = registry.alias_history(name, None)
    assert [m["action"] for m in moves[-4:]] == ["approval-requested", "approved", "rollback", "rollback"]
    assert moves[-2]["approval"]["decided_by"] == "bob" and moves[-1]["emergency"] is True
    assert registry.verify_trail(name).ok


def test_naming_a_challenger_of_a_gated_model_waits_for_approval(
        approval_env: Callable[[str], dict[str, Person]]) -> None:
    """A split challenger answers live traffic: ``registry challenger`` waits for a signed approval
    too, and outside a flow run it is refused rather than moved."""
    from flows.registry.challenger import registry_challenger
    from tasks.champion import set_challenger

    name = "appr-challenger"
    registry = ModelRegistry()
    for value in (0.3, 0.2):
        gated_train(name, value)  # v1 champion, v2 lost
    people = approval_env(name)
    with pytest.raises(ApprovalError, match="run it as a flow"):
        set_challenger(f"{name}:2", registry=registry)
    run = Background(lambda: registry_challenger(f"{name}:2", reason="shadow the refit"))
    run_id = _wait_paused(name)
    assert find_request(run_id).alias == "challenger"
    decide(run_id, signed=_signed(name, run_id, people["bob"], reason="shadow only"))
    move = run.join()
    assert move.changed and registry.aliases(name)["challenger"] == 2
    assert registry.alias_history(name, "challenger")[-1]["approved_by"] == "bob"
