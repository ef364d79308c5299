"""The ``prefect`` trail anchor: one artifact per registry trail entry on the Prefect server
(:mod:`infra.registry_anchor` imports it by name when ``INDUSFLOW_GOVERNANCE_TRAIL_ANCHORS`` names it)."""

from __future__ import annotations

import hashlib
import re

from infra.registry_anchor import PREFECT, AnchorRecord

#: Artifacts of this type are anchors; one edited after it was written (``updated`` later than
#: ``created``) is reported by ``verify``. Prefect also emits its ``prefect.artifact.created`` event.
ARTIFACT_TYPE = "registry-anchor"
_PAGE = 200


def artifact_key(model: str) -> str:
    """The Prefect artifact key of ``model``'s anchors (lower-case letters, digits, dashes)."""
    slug = re.sub(r"[^a-z0-9-]+", "-", model.lower()).strip("-")[:40]
    return f"registry-trail-{slug}-{hashlib.sha256(model.encode()).hexdigest()[:8]}"


class PrefectAnchor:
    """Artifacts on the Prefect server (one per trail entry)."""

    name = PREFECT

    def publish(self, record: AnchorRecord) -> None:
        from prefect import get_client
        from prefect.client.schemas.actions import ArtifactCreate

        with get_client(sync_client=True) as client:
            client.create_artifact(ArtifactCreate(
                key=artifact_key(record.model), type=ARTIFACT_TYPE, data=record.model_dump(mode="json"),
                description=f"registry trail of {record.model}: entry {record.seq} hashes to {record.head}"))

    def read(self, model: str) -> list[AnchorRecord]:
        from prefect import get_client
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

        flt = ArtifactFilter(key=ArtifactFilterKey(any_=[artifact_key(model)]))
        out: list[AnchorRecord] = []
        with get_client(sync_client=True) as client:
            while True:
                page = client.read_artifacts(artifact_filter=flt, limit=_PAGE, offset=len(out))
                for art in page:
                    if art.type != ARTIFACT_TYPE or not isinstance(art.data, dict):
                        continue
                    edited = art.updated is not None and art.created is not None and art.updated > art.created
                    out.append(AnchorRecord.model_validate({**art.data, "edited": edited}))
                if len(page) < _PAGE:
                    return out
