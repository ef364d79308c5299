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
from infra.registry import (
    CHALLENGER,
    CHAMPION,
    Approval,
    ModelRegistry,
    PromotionDecision,
    TrailReport,
    parse_model_spec,
)

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

    A serving process configured with that alias (``INDUSFLOW_SERVE_FRAUD_CHALLENGER`` /
    ``..._SENSOR_CHALLENGER``) loads it within one reload period; it never moves the champion.

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
    changed = registry.set_alias(name, alias, ref.version, reason=why)
    return ChallengerMove(name=name, alias=alias, version=ref.version, previous=aliases.get(alias), changed=changed,
                          champion_version=aliases.get(CHAMPION))


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
