"""The registry trail is tamper-evident: every alias move names who (the OS account, never an
environment variable), why and its evidence, and is hash-chained to the one before; verify finds
an edited, removed or appended line and an alias moved outside the registry."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from infra.registry import ALIAS_HISTORY_FILE, TRAIL_HEAD_FILE, ModelRegistry, current_actor


def _home(tmp_path: Path) -> ModelRegistry:
    registry = ModelRegistry(tmp_path)
    refs = [registry.register("m", {"w": torch.full((1,), v)}, params={}, metrics={"auc": v}, primary_metric="auc")
            for v in (0.1, 0.2, 0.3)]
    registry.write_version_file(refs[1], "card.json", '{"card": 2}')
    for ref in refs:
        registry.promote(ref)
    registry.rollback("m")  # -> v2
    registry.set_alias("m", "staging", 3)
    return registry


def _lines(tmp_path: Path) -> list[str]:
    return (tmp_path / "m" / ALIAS_HISTORY_FILE).read_text().splitlines()


def _moves(tmp_path: Path) -> list[dict]:
    """The trail's alias moves (not the registrations and documents)."""
    return [e for e in map(json.loads, _lines(tmp_path)) if "alias" in e]


def _write(tmp_path: Path, lines: list[str]) -> None:
    (tmp_path / "m" / ALIAS_HISTORY_FILE).write_text("".join(line + "\n" for line in lines))


def test_every_move_names_who_why_and_its_evidence_chained_by_hash(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INDUSFLOW_GOVERNANCE_ACTOR", "validator-anna")  # names nobody any more
    registry = _home(tmp_path)
    entries = [json.loads(line) for line in _lines(tmp_path)]
    assert [e["action"] for e in entries[:4]] == ["register", "register", "register", "document"]
    moves = _moves(tmp_path)
    assert [(e["action"], e["previous"], e["version"]) for e in moves] == [
        ("promote", None, 1), ("promote", 1, 2), ("promote", 2, 3), ("rollback", 3, 2), ("set", None, 3)]
    assert all(e["by"] == current_actor() != "validator-anna" for e in entries)
    assert [e["seq"] for e in entries] == list(range(1, 10))
    meta = hashlib.sha256((tmp_path / "m" / "2" / "meta.json").read_bytes()).hexdigest()
    assert entries[1]["files"]["meta.json"] == meta and set(entries[1]["files"]) == {"meta.json", "weights.safetensors"}
    assert entries[3]["file"] == "card.json" and entries[3]["sha256"] == hashlib.sha256(b'{"card": 2}').hexdigest()
    assert moves[1]["evidence"]["meta_sha256"] == meta
    assert moves[1]["evidence"]["card_sha256"] == hashlib.sha256(b'{"card": 2}').hexdigest()
    assert "comparison_sha256" in moves[1]["evidence"] and "card_sha256" not in moves[0]["evidence"]
    lines = _lines(tmp_path)
    assert entries[0]["prev"] is None
    assert all(entries[i]["prev"] == hashlib.sha256(lines[i - 1].encode()).hexdigest() for i in range(1, 9))
    report = registry.verify_trail("m")
    assert report.ok and report.entries == report.chained == 9 and report.unchained == 0 and not report.problems
    assert report.status == "unanchored" and report.files_checked == 7  # no anchor configured: never "ok"
    assert report.head_sha256 == registry.trail_head("m") == hashlib.sha256(lines[-1].encode()).hexdigest()


def test_the_os_account_is_named_whatever_the_environment_says(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import pwd

    monkeypatch.setenv("USER", "validator")  # getpass.getuser() would believe these
    monkeypatch.setenv("LOGNAME", "validator")
    _home(tmp_path)
    assert json.loads(_lines(tmp_path)[0])["by"] == pwd.getpwuid(os.getuid()).pw_name != "validator"


def test_an_edited_line_is_found(tmp_path: Path) -> None:
    registry = _home(tmp_path)
    lines = _lines(tmp_path)
    at = next(i for i, line in enumerate(lines) if "beats champion" in line)
    lines[at] = lines[at].replace("beats champion", "beats comfortably")  # a reworded reason
    _write(tmp_path, lines)
    report = registry.verify_trail("m")
    assert not report.ok and [p.line for p in report.problems] == [at + 2]
    assert "edited or removed" in report.problems[0].problem


def test_a_removed_line_is_found(tmp_path: Path) -> None:
    registry = _home(tmp_path)
    lines = _lines(tmp_path)
    _write(tmp_path, lines[:2] + lines[3:])
    report = registry.verify_trail("m")
    assert not report.ok and {p.line for p in report.problems} >= {3}
    assert any("sequence number" in p.problem for p in report.problems)


def test_the_last_line_removed_or_one_appended_by_hand_is_found_by_the_head(tmp_path: Path) -> None:
    registry = _home(tmp_path)
    lines = _lines(tmp_path)
    _write(tmp_path, lines[:-1])
    report = registry.verify_trail("m")
    assert not report.ok and any(TRAIL_HEAD_FILE in p.problem and p.line is None for p in report.problems)
    forged = json.dumps({**json.loads(lines[-1]), "seq": len(lines) + 1, "prev": hashlib.sha256(lines[-1].encode()).hexdigest()},
                        sort_keys=True)
    _write(tmp_path, [*lines, forged])
    assert any(TRAIL_HEAD_FILE in p.problem for p in registry.verify_trail("m").problems)


def test_an_alias_moved_outside_the_registry_is_found(tmp_path: Path) -> None:
    registry = _home(tmp_path)
    (tmp_path / "m" / "aliases.json").write_text(json.dumps({"champion": 1, "staging": 3}))
    report = registry.verify_trail("m")
    assert not report.ok and "points champion at v1, the trail's last move at v2" in report.problems[0].problem


def test_lines_written_before_the_chain_count_as_unchained(tmp_path: Path) -> None:
    registry = ModelRegistry(tmp_path)
    refs = [registry.register("m", {"w": torch.full((1,), v)}, params={}, metrics={"auc": v}, primary_metric="auc")
            for v in (0.1, 0.2)]
    old = {"alias": "champion", "version": 1, "previous": None, "action": "promote", "reason": "no champion yet",
           "at": "2026-01-01T00:00:00+00:00"}  # what an older release appended
    (tmp_path / "m" / ALIAS_HISTORY_FILE).write_text(json.dumps(old, sort_keys=True) + "\n")
    (tmp_path / "m" / "aliases.json").write_text(json.dumps({"champion": 1}))
    registry.promote(refs[1])
    report = registry.verify_trail("m")
    assert report.ok and (report.entries, report.chained, report.unchained) == (2, 1, 1)
    assert registry.rollback("m").candidate_version == 1  # the history still reads as before


def test_decide_only_moves_nothing_and_approval_events_chain_without_touching_aliases(tmp_path: Path) -> None:
    from infra.registry import Approval

    registry = _home(tmp_path)  # champion v2 (after the rollback), staging v3
    better = registry.register("m", {"w": torch.full((1,), 0.9)}, params={}, metrics={"auc": 0.9},
                               primary_metric="auc")
    pending = registry.promote(better, decide_only=True)
    assert pending.awaiting_approval and not pending.promoted and registry.get("m").version == 2
    worse = registry.register("m", {"w": torch.full((1,), 0.0)}, params={}, metrics={"auc": 0.0},
                              primary_metric="auc")
    lost = registry.promote(worse, decide_only=True)  # the rule says no: nothing to approve
    assert not lost.awaiting_approval and not lost.promoted
    for action in ("approval-requested", "approval-refused", "approved"):
        registry.record_event("m", action, candidate=better.version, champion=2, reason="r", by="bob", run_id="run-1")
    with pytest.raises(ValueError, match="unknown trail event"):
        registry.record_event("m", "deleted", candidate=better.version, champion=2, reason="r", by="bob")
    approval = Approval(run_id="run-1", requested_by="alice", decided_by="bob", approved=True, reason="reviewed",
                        requested_at="t0", decided_at="t1")
    moved = registry.promote(better, approval=approval)
    assert moved.promoted and moved.approval == approval and "approved by bob: reviewed" in moved.reason
    report = registry.verify_trail("m")
    assert report.ok and report.head_sha256 == moved.trail_sha256
    entries = [json.loads(line) for line in _lines(tmp_path)]
    assert [e["action"] for e in entries[-4:]] == ["approval-requested", "approval-refused", "approved", "promote"]
    assert entries[-1]["approval"]["decided_by"] == "bob" and entries[-2]["by"] == "bob"
    assert registry.rollback("m").candidate_version == 2  # the events are not alias moves


def test_a_waiting_request_past_its_expiry_counts_as_expired(tmp_path: Path) -> None:
    """A run killed while it waited leaves its request 'waiting': past ``expires_at`` it is listed
    as expired and cannot be approved."""
    from infra.errors import ApprovalError
    from tasks.approval import ApprovalRequest, approval_requests, decide
    from tests.approvers import enrol, statement_for

    registry = _home(tmp_path)
    people = enrol(registry, "m", tmp_path / "keys")
    folder = tmp_path / "m" / "approvals"
    folder.mkdir()
    for run_id, expires in (("1111aaaa-0000-4000-8000-000000000001", "2000-01-01T00:00:00+00:00"),
                            ("2222bbbb-0000-4000-8000-000000000002", "2999-01-01T00:00:00+00:00")):
        request = ApprovalRequest(run_id=run_id, flow_run_name="r", flow_name="fraud-train", model="m",
                                  candidate_version=3, champion_version=2, metric="auc", candidate_value=0.3,
                                  champion_value=0.2, rule="wins", requested_by="alice",
                                  requested_at="2000-01-01T00:00:00+00:00", expires_at=expires, api_url=None,
                                  files=registry.version_files("m", 3))
        (folder / f"{run_id}.json").write_text(request.model_dump_json())
    assert [r.run_id[:4] for r in approval_requests("waiting", registry)] == ["2222"]
    assert [r.run_id[:4] for r in approval_requests("expired", registry)] == ["1111"]
    def signed(who: str, run_id: str):
        return statement_for(registry, "m", 3, people[who], run_id=run_id)

    with pytest.raises(ApprovalError, match="already expired"):
        decide("1111aaaa", signed=signed("bob", "1111aaaa-0000-4000-8000-000000000001"), registry=registry)
    with pytest.raises(ApprovalError, match="four eyes: alice started this move") as refused:
        decide("2222bbbb", signed=signed("alice", "2222bbbb-0000-4000-8000-000000000002"), registry=registry)
    assert refused.value.code == "four_eyes"
    assert json.loads(_lines(tmp_path)[-1])["action"] == "approval-refused"
    with pytest.raises(ApprovalError, match="not a flow run id"):
        decide("../../etc", signed=signed("bob", "2222bbbb-0000-4000-8000-000000000002"), registry=registry)


def test_an_approved_rollback_refuses_when_the_champion_moved_meanwhile(tmp_path: Path) -> None:
    from infra.errors import RegistryError

    registry = _home(tmp_path)  # champion v2; a rollback would go to v1
    pending = registry.rollback("m", decide_only=True)
    assert (pending.champion_version, pending.candidate_version) == (2, 1) and registry.get("m").version == 2
    registry.promote(registry.get("m", 3), force=True)  # moved while the rollback waited
    with pytest.raises(RegistryError, match="moved while the rollback waited"):
        registry.rollback("m", expect=(2, 1))
    assert registry.get("m").version == 3 and registry.verify_trail("m").ok


def test_a_challenger_set_and_cleared_is_on_the_trail_and_a_hand_edit_of_it_is_found(tmp_path: Path) -> None:
    from infra.errors import RegistryError
    from tasks.champion import set_challenger

    registry = _home(tmp_path)  # champion v2
    with pytest.raises(RegistryError, match="is the champion"):
        set_challenger("m:2", registry=registry)
    move = set_challenger("m:3", registry=registry, reason="GBM in shadow for a month")
    assert (move.version, move.previous, move.changed, move.champion_version) == (3, None, True, 2)
    assert not set_challenger("m:3", registry=registry).changed
    assert registry.verify_trail("m").ok
    cleared = set_challenger("m", clear=True, registry=registry, reason="shadow period over")
    assert (cleared.version, cleared.previous, cleared.changed) == (None, 3, True)
    assert "challenger" not in registry.aliases("m") and registry.aliases("m")["champion"] == 2
    entries = [json.loads(line) for line in _lines(tmp_path)][-2:]
    assert [(e["action"], e["alias"], e["version"], e["reason"]) for e in entries] == [
        ("set", "challenger", 3, "GBM in shadow for a month"), ("clear", "challenger", None, "shadow period over")]
    assert registry.verify_trail("m").ok
    assert registry.rollback("m").candidate_version == 1  # the champion's history ignores the challenger's moves
    # put back by hand: the trail says it was cleared
    aliases = json.loads((tmp_path / "m" / "aliases.json").read_text())
    (tmp_path / "m" / "aliases.json").write_text(json.dumps({**aliases, "challenger": 3}))
    report = registry.verify_trail("m")
    assert not report.ok and "trail's last move cleared it" in report.problems[0].problem
    # removed by hand: the trail says it points somewhere
    (tmp_path / "m" / "aliases.json").write_text(json.dumps({k: v for k, v in aliases.items() if k != "staging"}))
    report = registry.verify_trail("m")
    assert not report.ok and "aliases.json has no staging" in report.problems[0].problem
    with pytest.raises(RegistryError, match="not cleared"):
        registry.clear_alias("m", "champion")
