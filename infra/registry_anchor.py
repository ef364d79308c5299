"""What pins the registry trail from outside the registry folder: the hashes of each version's
stored files, and anchors that receive the trail's head on every append.

An anchor keeps (model, entry number, hash of that entry) for every line the trail gets, somewhere
the person who can rewrite the registry folder cannot rewrite:

- ``prefect``: an artifact of type ``registry-anchor`` on the Prefect server the process talks to
  (:mod:`infra.prefect_anchor`). Artifacts live in the server's database, not under the home.
- a file path: an append-only JSON-lines sink outside the home (make it append-only for the
  people it guards against: ``chattr +a``, another owner with a write-only drop, or a log shipper).

:func:`infra.settings.GovernanceSettings.trail_anchors` lists them. ``verify`` checks every anchored
entry against the trail: a truncated, re-chained or deleted trail no longer matches what the
anchors saw. Without an anchor it can only say the trail is consistent with itself ("unanchored").
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
import logging
import os
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from infra.store import sha256_file

log = logging.getLogger(__name__)

PREFECT = "prefect"


# ------------------------------------------------------------------------------------
# the files of a version, hashed as stored


def version_file_hashes(folder: Path) -> dict[str, str]:
    """File name -> SHA-256 of every file of a version folder (hidden temporary files aside)."""
    return {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.is_file() and not p.name.startswith(".")}


# ------------------------------------------------------------------------------------
# anchors


class AnchorRecord(BaseModel):
    """One trail entry as an anchor saw it."""

    model_config = ConfigDict(frozen=True)

    model: str
    seq: int
    head: str
    at: str
    edited: bool = False


class Anchor(Protocol):
    name: str

    def publish(self, record: AnchorRecord) -> None: ...

    def read(self, model: str) -> list[AnchorRecord]: ...


class FileAnchor:
    """An append-only JSON-lines file outside the home."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = f"file {path}"

    def publish(self, record: AnchorRecord) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        try:
            os.write(fd, (record.model_dump_json() + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def read(self, model: str) -> list[AnchorRecord]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            try:
                record = AnchorRecord.model_validate_json(line)
            except ValueError:
                continue
            if record.model == model:
                out.append(record)
        return out

    def models(self) -> set[str]:
        if not self.path.exists():
            return set()
        return {json.loads(line).get("model") for line in self.path.read_text().splitlines() if line.strip()}


def configured_anchors() -> list[Anchor]:
    """The anchors of the governance settings (``INDUSFLOW_GOVERNANCE_TRAIL_ANCHORS``).

    The Prefect anchor's module is imported by name, and only when it is configured: the registry
    is read by ``solutions/`` code, which must not depend on Prefect.
    """
    from infra.settings import get_governance_settings

    out: list[Anchor] = []
    for item in get_governance_settings().trail_anchors:
        if item == PREFECT:
            out.append(importlib.import_module("infra.prefect_anchor").PrefectAnchor())
        else:
            out.append(FileAnchor(Path(item)))
    return out


def publish_head(model: str, seq: int, head: str) -> None:
    """Send one trail entry's hash to every configured anchor; a failure is logged (the move has
    happened) and ``verify`` then names the entry as not anchored."""
    record = AnchorRecord(model=model, seq=seq, head=head, at=dt.datetime.now(dt.UTC).isoformat())
    for anchor in configured_anchors():
        try:
            anchor.publish(record)
        except Exception as exc:  # noqa: BLE001 - an anchor that is down must not undo a move already made
            log.error("registry trail of %s: entry %d not anchored at %s (%s: %s)", model, seq, anchor.name,
                      type(exc).__name__, exc)


def check_anchor(anchor: Anchor, model: str, heads: list[str]) -> tuple[int, list[str]]:
    """(entries this anchor pins, problems) for a trail whose lines hash to ``heads``."""
    try:
        records = anchor.read(model)
    except Exception as exc:  # noqa: BLE001 - reported: the anchor could not be read
        return 0, [f"anchor {anchor.name} could not be read ({type(exc).__name__}: {exc})"]
    problems = []
    seen: dict[int, str] = {}
    for r in records:
        if r.edited:
            problems.append(f"anchor {anchor.name}: the record of entry {r.seq} was edited after it was written")
        if seen.get(r.seq, r.head) != r.head:
            problems.append(f"anchor {anchor.name}: entry {r.seq} was anchored twice with different hashes "
                            "(the trail was rewritten and re-anchored)")
        seen[r.seq] = r.head
    for seq, head in sorted(seen.items()):
        if seq > len(heads):
            problems.append(f"anchor {anchor.name} saw entry {seq}, the trail has {len(heads)}: "
                            "entries were removed (truncated or deleted)")
            break
        if heads[seq - 1] != head:
            problems.append(f"entry {seq} is not the one anchor {anchor.name} saw: the trail was rewritten")
            break
    pinned = max(seen) if seen and not problems else 0
    if not problems and pinned < len(heads):
        problems.append(f"entries {pinned + 1}-{len(heads)} were never anchored at {anchor.name} "
                        "(appended outside the registry, or while the anchor was down)")
    return pinned, problems
