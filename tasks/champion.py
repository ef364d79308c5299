"""Moving a model's ``champion`` alias by hand: promote a named version, roll back to the one
before; and verifying the registry trail those moves leave.

Both go through the registry's lock (:meth:`infra.registry.ModelRegistry.promote` with
``force``: the champion it replaces is read inside the lock, compare-and-swap; and
:meth:`~infra.registry.ModelRegistry.rollback`, which reads the alias history). A serving
process follows the alias, so the next requests are answered by the version moved to.
"""

from __future__ import annotations

import logging
from pathlib import Path

from prefect import task
from prefect.cache_policies import NONE
from pydantic import BaseModel, ConfigDict, Field

from infra.errors import RegistryError
from infra.registry import (
    CHALLENGER,
    CHAMPION,
    Approval,
    ModelRef,
    ModelRegistry,
    PromotionDecision,
    TrailReport,
    parse_model_spec,
)
from infra.registry_policy import Approver

log = logging.getLogger(__name__)


def version_spec(spec: str) -> tuple[str, str]:
    """(name, version or alias) of a spec that names a version: ``NAME:VERSION`` or ``NAME@alias``.

    Raises:
        RegistryError: a bare ``NAME`` (it would name the champion itself).
    """
    name, version = parse_model_spec(spec)
    if version == CHAMPION and not spec.endswith((f":{CHAMPION}", f"@{CHAMPION}")):
        raise RegistryError(f"{spec!r} names no version: promote NAME:VERSION (e.g. {name}:3) or NAME@alias")
    return name, version


def bare_name(spec: str) -> str:
    """The model name of ``NAME`` (a rollback moves that model's champion).

    Raises:
        RegistryError: the spec names a version or an alias.
    """
    name, _ = parse_model_spec(spec)
    if spec != name:
        raise RegistryError(f"{spec!r}: rollback takes a model NAME (it returns its champion to the one before)")
    return name


def promote_by_hand(spec: str, registry: ModelRegistry | None = None) -> PromotionDecision:
    """Make the version ``spec`` names the champion, whatever the champion rule would say; a model
    that needs approval waits for it first (inside a flow run: :func:`tasks.approval.approval_gate`)."""
    from tasks.approval import approval_gate, approval_required
    from tasks.register import RegistrationResult

    registry = registry or ModelRegistry()
    name, version = version_spec(spec)
    ref = registry.get(name, version)
    decision = registry.promote(ref, force=True, decide_only=approval_required(name, registry))
    if decision.awaiting_approval:
        return approval_gate(RegistrationResult(model=ref, decision=decision), force=True).decision
    return decision


def rollback_champion(spec: str, registry: ModelRegistry | None = None, *, emergency: bool = False,
                      reason: str | None = None) -> PromotionDecision:
    """Return ``spec``'s champion to the version that was champion before the current one.

    A model that needs approval (:func:`tasks.approval.approval_required`) waits for it first,
    inside a flow run, unless ``emergency``: then it moves at once and the trail says so.
    """
    from tasks.approval import approval_gate, approval_required
    from tasks.register import RegistrationResult

    registry = registry or ModelRegistry()
    name = bare_name(spec)
    gated = approval_required(name, registry)
    note = "; ".join(part for part in (
        "emergency (no approval asked)" if emergency and gated else "emergency" if emergency else None,
        reason.strip() if reason and reason.strip() else None) if part) or None
    if not gated or emergency:
        return registry.rollback(name, note=note, emergency=emergency)
    pending = registry.rollback(name, note=note, decide_only=True)

    def move(approval: Approval) -> PromotionDecision:
        assert pending.champion_version is not None  # a rollback always has a champion to leave
        return registry.rollback(name, note=note, approval=approval,
                                 expect=(pending.champion_version, pending.candidate_version))

    registration = RegistrationResult(model=registry.get(name, pending.candidate_version), decision=pending)
    return approval_gate(registration, move=move).decision


class TrailVerification(BaseModel):
    """``registry-verify``: the trail report of each model checked."""

    model_config = ConfigDict(frozen=True)

    ok: bool
    reports: list[TrailReport]


def verify_trails(model: str | None = None, registry: ModelRegistry | None = None) -> TrailVerification:
    """Verify the registry trail of ``model`` (default: every registered model, and every model an
    anchor file knows: one deleted from the registry as a whole is named)."""
    from infra.registry_anchor import FileAnchor, configured_anchors

    registry = registry or ModelRegistry()
    known = set(registry.models())
    for anchor in configured_anchors():
        if isinstance(anchor, FileAnchor):
            known |= anchor.models()
    reports = [registry.verify_trail(name) for name in ([model] if model else sorted(known))]
    for report in reports:
        if not report.ok:
            log.warning("registry trail of %s: %d problem(s), first: %s", report.name, len(report.problems),
                        report.problems[0].problem)
    return TrailVerification(ok=all(r.ok for r in reports), reports=reports)


class ChallengerMove(BaseModel):
    """``registry-challenger``: where a model's challenger alias points now."""

    model_config = ConfigDict(frozen=True)

    name: str
    alias: str
    version: int | None  # None: cleared
    previous: int | None
    changed: bool
    champion_version: int | None


def set_challenger(spec: str, *, alias: str = CHALLENGER, clear: bool = False, reason: str | None = None,
                   registry: ModelRegistry | None = None) -> ChallengerMove:
    """Point ``alias`` (``challenger``) of ``spec``'s model at the version it names, or remove it
    (``clear``, with a bare ``NAME``); the move goes on the registry trail with ``reason``.

    A serving process whose challenger mode is not ``off`` (``INDUSFLOW_SERVE_FRAUD_CHALLENGER_MODE`` /
    ``..._SENSOR_CHALLENGER_MODE``) loads the ``challenger`` alias within one reload period; it never moves the champion. A
    model whose registry policy requires approval waits for a signed approval first (a split
    challenger answers live traffic), inside a flow run; clearing needs none.

    Raises:
        RegistryError: the spec names no version (or, with ``clear``, names one), the alias is
            ``champion``, or the version is the champion itself.
    """
    registry = registry or ModelRegistry()
    if alias == CHAMPION:
        raise RegistryError("the champion moves with promote or rollback, not as a challenger")
    why = reason.strip() if reason and reason.strip() else f"{alias} set by hand"
    if clear:
        name = bare_name(spec)
        registry.get(name, "latest")  # the model exists
        previous = registry.clear_alias(name, alias, reason=why)
        return ChallengerMove(name=name, alias=alias, version=None, previous=previous, changed=previous is not None,
                              champion_version=registry.aliases(name).get(CHAMPION))
    name, version = version_spec(spec)
    ref = registry.get(name, version)
    aliases = registry.aliases(name)
    if aliases.get(CHAMPION) == ref.version:
        raise RegistryError(f"{ref.spec} is the champion; a challenger is another version")
    from tasks.approval import approval_required

    if aliases.get(alias) != ref.version and approval_required(name, registry):
        changed = _challenger_after_approval(registry, ref, alias, why)
    else:
        changed = registry.set_alias(name, alias, ref.version, reason=why)
    return ChallengerMove(name=name, alias=alias, version=ref.version, previous=aliases.get(alias), changed=changed,
                          champion_version=aliases.get(CHAMPION))


def _challenger_after_approval(registry: ModelRegistry, ref: ModelRef, alias: str, why: str) -> bool:
    """Point ``alias`` at ``ref`` once an approver signs it (inside a flow run: the run pauses)."""
    from tasks.approval import approval_gate
    from tasks.register import RegistrationResult

    champion = registry.champion(ref.name)
    pending = PromotionDecision(
        name=ref.name, metric=ref.primary_metric, candidate_version=ref.version, candidate_value=ref.primary_value(),
        champion_version=champion.version if champion else None,
        champion_value=champion.primary_value() if champion else None, promoted=False,
        reason=f"{alias} -> v{ref.version}: {why}", awaiting_approval=True, trail_sha256=registry.trail_head(ref.name))
    moved: list[bool] = []

    def move(approval: Approval) -> PromotionDecision:
        moved.append(registry.set_alias(ref.name, alias, ref.version, reason=why, approval=approval))
        return pending.model_copy(update={"promoted": True, "awaiting_approval": False, "approval": approval,
                                          "reason": f"{pending.reason}; approved by {approval.decided_by}"})

    approval_gate(RegistrationResult(model=ref, decision=pending), move=move, alias=alias)
    return bool(moved and moved[0])


def challenger_summary(move: ChallengerMove) -> str:
    """One line for people."""
    what = (f"{move.alias} -> v{move.version}" if move.version is not None else
            f"{move.alias} cleared" if move.changed else f"no {move.alias} was set")
    was = f" (was v{move.previous})" if move.previous is not None and move.changed else \
        " (unchanged)" if not move.changed and move.version is not None else ""
    champ = f"; champion v{move.champion_version}" if move.champion_version is not None else ""
    return f"{move.name}: {what}{was}{champ}"


promote_by_hand_task = task(promote_by_hand, name="promote-by-hand", cache_policy=NONE)
rollback_champion_task = task(rollback_champion, name="rollback-champion", cache_policy=NONE)
verify_trails_task = task(verify_trails, name="verify-registry-trail", cache_policy=NONE)
set_challenger_task = task(set_challenger, name="set-challenger", cache_policy=NONE)


def champion_move_summary(decision: PromotionDecision) -> str:
    """One line for people: which version is champion now, and which was before."""
    before = f"v{decision.champion_version}" if decision.champion_version is not None else "none"
    return f"{decision.name}: champion {before} -> v{decision.candidate_version}: {decision.reason}"


class PolicyChange(BaseModel):
    """``registry-policy``: the policy now in force and the trail head after the change."""

    model_config = ConfigDict(frozen=True)

    model: str
    seq: int
    approval_required: bool
    approvers: list[str]
    signed_by: str
    trail_sha256: str
    in_force: bool = Field(default=True, description="False: the change waits for a second approver's signature "
                           "(a policy enrolling two people or more changes only with two).")
    waiting_for: str | None = Field(default=None, description="Why it is not in force yet (who else must sign).")


def parse_approver(text: str) -> Approver:
    """``PERSON:PUBLIC_KEY[:ACCOUNT,ACCOUNT]`` as an :class:`~infra.registry_policy.Approver`."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0].strip() or not parts[1].strip():
        raise ValueError(f"approver {text!r}: write PERSON:PUBLIC_KEY[:ACCOUNT,ACCOUNT] (the public key that "
                         "python -m flows.registry keygen printed)")
    accounts = [a.strip() for a in parts[2].split(",") if a.strip()] if len(parts) == 3 else []
    return Approver(person=parts[0].strip(), public_key=parts[1].strip(), accounts=accounts)


def set_policy(model: str, approvers: list[str], key_path: Path, *, approval_required: bool = True,
               emergency_rollback: bool = True, registry: ModelRegistry | None = None) -> PolicyChange:
    """Sign a new policy for ``model`` with the key in ``key_path`` and hand it to the registry."""
    from infra.registry import POLICY
    from infra.registry_policy import ModelPolicy, load_signing_key, public_key_of, sha256_of, sign_policy

    registry = registry or ModelRegistry()
    registry.get(model, "latest")  # the model exists
    current = registry.policy(model)
    policy = ModelPolicy(model=model, seq=current.seq + 1 if current else 1,
                         previous_sha256=sha256_of(current) if current else None,
                         approval_required=approval_required, approvers=[parse_approver(a) for a in approvers],
                         emergency_rollback=emergency_rollback)
    head = registry.set_policy(model, sign_policy(load_signing_key(key_path), policy))
    entry = registry.trail(model)[-1]
    if entry["action"] == POLICY:
        return PolicyChange(model=model, seq=policy.seq, approval_required=approval_required,
                            approvers=[a.person for a in policy.approvers], signed_by=", ".join(entry["signers"]),
                            trail_sha256=head)
    signer = (current or policy).approver(public_key_of(load_signing_key(key_path)))
    return PolicyChange(model=model, seq=policy.seq, approval_required=approval_required,
                        approvers=[a.person for a in policy.approvers], signed_by=signer.person if signer else "?",
                        trail_sha256=head, in_force=False, waiting_for=entry["reason"])


set_policy_task = task(set_policy, name="set-registry-policy", cache_policy=NONE)
