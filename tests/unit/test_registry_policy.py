"""The registry enforces each model's policy on every alias move, whatever process asks: no
champion or challenger move of a gated model without a decision signed by an enrolled approver
who did not start it; the policy itself is signed and on the trail; a policy file changed outside
the registry stops every move."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from infra.errors import ApprovalError, RegistryError
from infra.registry import Approval, ModelRegistry
from infra.registry_policy import Approver, ModelPolicy, sha256_of, sign_policy
from tests.approvers import Person, enrol, person, statement_for


def _gated(tmp_path: Path) -> tuple[ModelRegistry, dict[str, Person]]:
    """v1 champion, v2 (better) and v3 registered, then a policy enrolling alice (this process's
    account: she starts every move here) and bob."""
    registry = ModelRegistry(tmp_path / "home")
    for value in (0.1, 0.2, 0.3):
        ref = registry.register("m", {"w": torch.full((2,), value)}, params={}, metrics={"auc": value},
                                primary_metric="auc")
        if value == 0.1:
            registry.promote(ref)
    return registry, enrol(registry, "m", tmp_path / "keys")


def _approval(registry: ModelRegistry, who: Person, version: int = 2, alias: str = "champion",
              **kw: str) -> Approval:
    signed = statement_for(registry, "m", version, who, alias=alias, **kw)
    return Approval(run_id=None, requested_by="alice", decided_by=who.name, approved=True, reason="r",
                    requested_at="t0", decided_at="t1", signed=signed)


def test_set_alias_and_promote_cannot_move_a_gated_champion_or_challenger(tmp_path: Path) -> None:
    registry, _ = _gated(tmp_path)
    with pytest.raises(ApprovalError, match="needs a decision signed by an approver"):
        registry.set_alias("m", "champion", 2)
    with pytest.raises(ApprovalError, match="needs a decision signed"):
        registry.promote(registry.get("m", 2))  # the setting is unset: the registry's policy still holds
    with pytest.raises(ApprovalError, match="needs a decision signed"):
        registry.promote(registry.get("m", 2), force=True)
    with pytest.raises(ApprovalError, match="needs a decision signed"):
        registry.set_alias("m", "challenger", 3)
    assert registry.aliases("m") == {"champion": 1}
    pending = registry.promote(registry.get("m", 2), decide_only=True)
    assert pending.awaiting_approval and not pending.promoted


def test_a_decision_signed_by_a_second_enrolled_person_moves_it_once(tmp_path: Path) -> None:
    registry, people = _gated(tmp_path)
    approval = _approval(registry, people["bob"])
    moved = registry.promote(registry.get("m", 2), approval=approval)
    assert moved.promoted and registry.aliases("m")["champion"] == 2
    last = registry.trail("m")[-1]
    assert last["approved_by"] == "bob" and last["approver_key"] == people["bob"].public_key
    assert last["decision_sha256"] == approval.signed.sha256 and last["by"]
    registry.rollback("m", emergency=True)  # back to v1 at once: the policy allows emergency rollbacks
    assert registry.trail("m")[-1]["emergency"] is True
    with pytest.raises(ApprovalError, match="already used") as replayed:
        registry.promote(registry.get("m", 2), approval=approval)
    assert replayed.value.code == "replayed"
    challenger = _approval(registry, people["bob"], version=3, alias="challenger")
    assert registry.set_alias("m", "challenger", 3, approval=challenger)
    assert registry.verify_trail("m").ok


@pytest.mark.parametrize("case", ["initiator", "stranger", "other_version", "other_alias", "edited", "reject"])
def test_decisions_that_do_not_hold_are_refused(tmp_path: Path, case: str) -> None:
    registry, people = _gated(tmp_path)
    if case == "initiator":  # alice signs her own move: four eyes
        approval, code = _approval(registry, people["alice"]), "four_eyes"
    elif case == "stranger":  # a key that anyone who can write the home could make
        approval, code = _approval(registry, person(tmp_path / "keys", "mallory")), "not_approver"
    elif case == "other_version":
        approval, code = _approval(registry, people["bob"], version=3), "stale"
    elif case == "other_alias":
        approval, code = _approval(registry, people["bob"], alias="challenger"), "stale"
    elif case == "edited":  # the statement changed after bob signed it
        good = _approval(registry, people["bob"])
        forged = good.signed.model_copy(update={"statement": good.signed.statement.model_copy(
            update={"reason": "approved by the board"})})
        approval, code = good.model_copy(update={"signed": forged}), "signature"
    else:
        approval, code = _approval(registry, people["bob"], decision="reject"), "unapproved"
    with pytest.raises(ApprovalError) as refused:
        registry.promote(registry.get("m", 2), approval=approval)
    assert refused.value.code == code, str(refused.value)
    assert registry.aliases("m") == {"champion": 1}


def test_a_card_edited_after_the_decision_voids_it(tmp_path: Path) -> None:
    registry, people = _gated(tmp_path)
    approval = _approval(registry, people["bob"])
    registry.write_version_file(registry.get("m", 2), "card.json", '{"auprc": 0.99}')
    with pytest.raises(ApprovalError, match="differs in: files"):
        registry.promote(registry.get("m", 2), approval=approval)


def test_the_policy_is_signed_chained_and_on_the_trail(tmp_path: Path) -> None:
    registry, people = _gated(tmp_path)
    current = registry.policy("m")
    assert current is not None and [a.person for a in current.approvers] == ["alice", "bob"]
    mallory = person(tmp_path / "keys", "mallory")
    grab = ModelPolicy(model="m", seq=2, previous_sha256=sha256_of(current), approval_required=False,
                       approvers=[Approver(person="mallory", public_key=mallory.public_key)])
    with pytest.raises(ApprovalError, match="no approver of the current policy"):
        registry.set_policy("m", sign_policy(mallory.key(), grab))
    change = grab.model_copy(update={"approvers": [*current.approvers,
                                                   Approver(person="carol", public_key=mallory.public_key)],
                                     "approval_required": True})
    registry.set_policy("m", sign_policy(people["bob"].key(), change))  # one of two signatures: a proposal
    registry.set_policy("m", sign_policy(people["alice"].key(), change))
    entry = registry.trail("m")[-1]
    assert (entry["action"], entry["signers"], entry["policy_seq"]) == ("policy", ["alice", "bob"], 2)
    with pytest.raises(ApprovalError, match="does not follow"):  # a replay of an older change
        registry.set_policy("m", sign_policy(people["bob"].key(), change))


def test_one_approver_alone_cannot_widen_their_own_rights(tmp_path: Path) -> None:
    """The insider: alice, enrolled, signs a policy that drops the account that makes her the
    initiator of her own runs and enrols a second key she holds. Alone it stays a proposal (on the
    trail), her own decision is still refused; bob's signature over the same policy puts it in force."""
    registry, people = _gated(tmp_path)
    alice, bob = people["alice"], people["bob"]
    current = registry.policy("m")
    spare = person(tmp_path / "keys", "carol")  # a key alice holds, under another name
    widened = ModelPolicy(model="m", seq=2, previous_sha256=sha256_of(current),
                          approvers=[Approver(person="alice", public_key=alice.public_key),
                                     Approver(person="bob", public_key=bob.public_key),
                                     Approver(person="carol", public_key=spare.public_key)])
    registry.set_policy("m", sign_policy(alice.key(), widened))
    registry.set_policy("m", sign_policy(alice.key(), widened))  # twice by one person is still one
    with pytest.raises(ApprovalError, match="no approver of the current policy"):
        registry.set_policy("m", sign_policy(spare.key(), widened))  # her spare key is not enrolled yet
    assert registry.policy("m") == current
    proposed = [e for e in registry.trail("m") if e["action"] == "policy-proposed"]
    assert len(proposed) == 2 and "one of bob must sign the same policy too" in proposed[-1]["reason"]
    with pytest.raises(ApprovalError, match="four eyes: alice started this move"):
        registry.promote(registry.get("m", 2), approval=_approval(registry, alice))
    assert registry.aliases("m") == {"champion": 1}
    assert registry.verify_trail("m").problems == []
    registry.set_policy("m", sign_policy(bob.key(), widened))
    entry = registry.trail("m")[-1]
    assert (entry["action"], entry["signers"]) == ("policy", ["bob", "alice"])
    assert registry.policy("m") == widened and registry.verify_trail("m").ok


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_policy_file_changed_outside_the_registry_stops_every_move(tmp_path: Path, how: str) -> None:
    registry, _ = _gated(tmp_path)
    path = registry.root / "m" / "policy.json"
    if how == "deleted":
        path.unlink()
    else:  # a self-signed policy that lets everything through
        mallory = person(tmp_path / "keys", "mallory")
        open_policy = ModelPolicy(model="m", seq=1, previous_sha256=None, approval_required=False,
                                  approvers=[Approver(person="mallory", public_key=mallory.public_key)])
        path.write_text(json.dumps(sign_policy(mallory.key(), open_policy).model_dump(mode="json")))
    with pytest.raises(RegistryError, match="policy.json does not match"):
        registry.set_alias("m", "champion", 2)
    report = registry.verify_trail("m")
    assert not report.ok and any("policy.json does not match" in p.problem for p in report.problems)


def _rechain(registry: ModelRegistry, edit) -> None:
    """Edit the trail's entries with ``edit`` and re-chain every line and the head, as someone who can
    write the registry folder would (no anchor is configured: only the signatures can tell)."""
    import hashlib

    path = registry.root / "m" / "alias_history.jsonl"
    entries = [edit(json.loads(line)) for line in path.read_text().splitlines()]
    lines: list[str] = []
    for e in entries:
        e["prev"] = hashlib.sha256(lines[-1].encode()).hexdigest() if lines else None
        lines.append(json.dumps(e, sort_keys=True))
    path.write_text("".join(line + "\n" for line in lines))
    (registry.root / "m" / "alias_history.head.json").write_text(json.dumps(
        {"entries": len(lines), "last_sha256": hashlib.sha256(lines[-1].encode()).hexdigest()}))


@pytest.mark.parametrize("how", ["edited", "forged", "stripped", "policy"])
def test_verify_checks_every_signature_on_the_trail_even_re_chained(tmp_path: Path, how: str) -> None:
    """Each signed entry keeps its signature (a move: the decision; a policy change: the signed
    policy) and verify checks it against the policy then in force: an edited reason, a decision
    re-signed by a key nobody enrolled, a gated move stripped of its decision, or a policy entry
    naming another approver is found although the trail was re-chained."""
    registry, people = _gated(tmp_path)
    registry.promote(registry.get("m", 2), approval=_approval(registry, people["bob"]))
    assert registry.verify_trail("m").status == "unanchored"  # consistent; nothing outside pins it
    mallory = person(tmp_path / "keys", "mallory")
    forged = statement_for(registry, "m", 2, mallory)

    def edit(e: dict) -> dict:
        if e.get("action") == "promote" and e.get("approval"):
            if how == "edited":
                e["approval"]["signed"]["statement"]["reason"] = "approved by the model-risk committee"
            elif how == "forged":
                e["approval"]["signed"] = json.loads(forged.model_dump_json())
                e["approver_key"], e["decision_sha256"] = mallory.public_key, forged.sha256
            elif how == "stripped":
                del e["approval"], e["approved_by"], e["approver_key"], e["decision_sha256"]
        if how == "policy" and e.get("action") == "policy":
            e["signed"]["policy"]["approvers"][1]["public_key"] = mallory.public_key
        return e

    _rechain(registry, edit)
    report = registry.verify_trail("m")
    assert report.status == "failed", report
    expected = {"edited": "signature does not verify", "forged": "no approver of its policy",
                "stripped": "without a signed decision", "policy": "policy change:"}[how]
    assert any(expected in p.problem for p in report.problems), report.problems


def test_the_policy_command_keeps_one_signature_as_a_proposal_until_a_second_person_signs(tmp_path: Path) -> None:
    """``flows.registry policy`` run by alice, then by bob with the same arguments: the first is a
    proposal (not in force, saying who else must sign), the second puts it in force."""
    from tasks.champion import set_policy

    registry, people = _gated(tmp_path)
    carol = person(tmp_path / "keys", "carol")
    approvers = [f"alice:{people['alice'].public_key}", f"bob:{people['bob'].public_key}",
                 f"carol:{carol.public_key}"]
    first = set_policy("m", approvers, people["alice"].key_path, registry=registry)
    assert (first.in_force, first.signed_by, first.seq) == (False, "alice", 2)
    assert "one of bob must sign" in (first.waiting_for or "") and registry.policy("m").seq == 1
    second = set_policy("m", approvers, people["bob"].key_path, registry=registry)
    assert (second.in_force, second.signed_by, second.approvers) == (True, "bob, alice", ["alice", "bob", "carol"])
    assert registry.policy("m").seq == 2 and not (registry.root / "m" / "policy.proposed.json").exists()
