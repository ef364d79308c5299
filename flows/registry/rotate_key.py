"""``registry-rotate-key``: rewrap the data keys of an encrypted registry under a new key-encryption key."""

from __future__ import annotations

from prefect import flow

from infra.sealed import RotationReport
from tasks.registry_keys import rotate_registry_key_task


@flow(name="registry-rotate-key", log_prints=True)
def registry_rotate_key(old_key: str) -> RotationReport:
    """Rewrap every encrypted model version's data key from the old key-encryption key to the one
    INDUSFLOW_REGISTRY_KEY names now; no model file is re-encrypted or rewritten. Versions already
    under the new key are skipped (re-run after an interruption). Afterwards the old key opens nothing.

    Args:
        old_key: where the old key is: file:PATH, env:NAME or kms:module:factory (a reference, never the key).
    """
    return rotate_registry_key_task(old_key)
