"""Moving a model's ``champion`` alias by hand: promote a named version, roll back to the one
before; and verifying the registry trail those moves leave.

Both go through the registry's lock (:meth:`infra.registry.ModelRegistry.promote` with
``force``: the champion it replaces is read inside the lock, compare-and-swap; and
:meth:`~infra.registry.ModelRegistry.rollback`, which reads the alias history). A serving
process follows the alias, so the next requests are answered by the version moved to.
"""

from __future__ import annotations

import logging

from prefect import task
from prefect.cache_policies import NONE
from pydantic import BaseModel, ConfigDict

from infra.errors import RegistryError
from infra.registry import CHAMPION, Approval, ModelRegistry, PromotionDecision, TrailReport, parse_model_spec

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
    decision = registry.promote(ref, force=True, decide_only=approval_required(name))
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
    gated = approval_required(name)
    note = "; ".join(part for part in (
        "emergency (no approval asked)" if emergency and gated else "emergency" if emergency else None,
        reason.strip() if reason and reason.strip() else None) if part) or None
    if not gated or emergency:
        return registry.rollback(name, note=note)
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
    """Verify the registry trail of ``model`` (default: every registered model)."""
    registry = registry or ModelRegistry()
    reports = [registry.verify_trail(name) for name in ([model] if model else registry.models())]
    for report in reports:
        if not report.ok:
            log.warning("registry trail of %s: %d problem(s), first: %s", report.name, len(report.problems),
                        report.problems[0].problem)
    return TrailVerification(ok=all(r.ok for r in reports), reports=reports)


promote_by_hand_task = task(promote_by_hand, name="promote-by-hand", cache_policy=NONE)
rollback_champion_task = task(rollback_champion, name="rollback-champion", cache_policy=NONE)
verify_trails_task = task(verify_trails, name="verify-registry-trail", cache_policy=NONE)


def champion_move_summary(decision: PromotionDecision) -> str:
    """One line for people: which version is champion now, and which was before."""
    before = f"v{decision.champion_version}" if decision.champion_version is not None else "none"
    return f"{decision.name}: champion {before} -> v{decision.candidate_version}: {decision.reason}"
