"""``registry-verify``: recompute the hash chain of the registry trail of every model (or one)."""

from __future__ import annotations

from prefect import flow

from tasks.champion import TrailVerification, verify_trails_task


@flow(name="registry-verify", log_prints=True)
def registry_verify(model: str | None = None) -> TrailVerification:
    """Check the registry trail (every alias move, with who, why and evidence, hash-chained) of
    every registered model, or of one: an edited, removed or appended line, or an alias moved
    outside the registry, is named with its line. Exit status 1 when any trail fails.

    Args:
        model: the model NAME to check (default: every registered model).
    """
    return verify_trails_task(model)
