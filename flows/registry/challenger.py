"""``registry-challenger``: point a model's challenger alias at a version (or clear it)."""

from __future__ import annotations

from prefect import flow

from tasks.champion import ChallengerMove, set_challenger_task


@flow(name="registry-challenger", log_prints=True)
def registry_challenger(model: str, clear: bool = False, reason: str | None = None,
                        alias: str = "challenger") -> ChallengerMove:
    """Name the version a serving process scores beside the champion (in shadow, or answering a
    stable share of accounts: INDUSFLOW_SERVE_FRAUD_CHALLENGER_MODE), or take it out with --clear.
    The champion does not move; the move is on the registry trail. Serving loads it within one
    reload period.

    Args:
        model: the version, NAME:VERSION (with --clear: the model NAME).
        clear: remove the alias instead: serving scores with the champion alone.
        reason: why (recorded in the registry trail).
        alias: the alias to move (the serving settings name which one they follow).
    """
    return set_challenger_task(model, alias=alias, clear=clear, reason=reason)
