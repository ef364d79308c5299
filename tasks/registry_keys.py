"""Rotating the key-encryption key of a registry encrypted at rest (infra.sealed): the data key of
every sealed version is unwrapped with the old KEK and wrapped with the one ``INDUSFLOW_REGISTRY_KEY``
names now; no model file is re-encrypted or rewritten."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NONE

from infra.registry import ModelRegistry
from infra.sealed import RotationReport, rotation_keys


def rotate_registry_key(old_key: str, registry: ModelRegistry | None = None) -> RotationReport:
    """Rewrap every sealed version's data key from ``old_key`` (a key reference: ``file:PATH``,
    ``env:NAME`` or ``kms:module:factory``) to the key ``INDUSFLOW_REGISTRY_KEY`` names.

    Raises:
        SealError: no new key is configured, the two name the same key, or a version is sealed under
            neither (its error names it).
    """
    old, new = rotation_keys(old_key)
    return (registry or ModelRegistry()).rotate_key(old, new)


rotate_registry_key_task = task(name="rotate-registry-key", cache_policy=NONE)(rotate_registry_key)
