"""``fraud-promote`` and ``fraud-rollback``: move the fraud champion by hand."""

from __future__ import annotations

from prefect import flow

from infra.registry import PromotionDecision
from tasks.champion import promote_by_hand_task, rollback_champion_task


@flow(name="fraud-promote", log_prints=True)
def fraud_promote(model: str) -> PromotionDecision:
    """Make a registered fraud version the champion, whatever the champion rule would say (a
    sequence model, a GBM or an ensemble). The serving API follows the alias: its next requests
    are answered by this version. The move is recorded in the registry's alias history.

    Args:
        model: the version to promote, NAME:VERSION (or NAME@alias).
    """
    return promote_by_hand_task(model)


@flow(name="fraud-rollback", log_prints=True)
def fraud_rollback(model: str = "fraud-seq", emergency: bool = False, reason: str | None = None) -> PromotionDecision:
    """Return the fraud champion to the version that was champion before the current one (from
    the registry's alias history; repeated rollbacks go further back). A model that needs approval
    waits for a second person's, as a promotion does, unless --emergency.

    Args:
        model: the model NAME whose champion moves back.
        emergency: roll back at once even when the model needs approval (recorded as an
            emergency in the trail); otherwise such a rollback waits for a second person.
        reason: why, recorded in the trail.
    """
    return rollback_champion_task(model, emergency=emergency, reason=reason)
