"""What a collection holds, named as its user knows it: documents by their name inside the
folder they were ingested from, never a server path.

Sources are stored under their redacted absolute paths (:func:`infra.pii.redact_path`). Each
ingest records, per collection, the roots it was given (the files and folders named on the
command line, the watched folder of a scheduled run or an upload) in a small ledger beside the
quarantine cache (``<home>/rag/<collection>-roots.json``). A document's name is then its path
relative to the deepest root holding it (a file given by itself: its file name); two documents
that would share a name get as many of their folders in front as tell them apart. Redaction
keeps prefixes (a redacted folder is a prefix of every redacted file under it), so a name cut
from a redacted source is itself redacted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from infra.home import home_layout
from infra.pii import redact_path
from infra.store import check_name, read_json_dict, safe_join, write_json_atomic

FOLDER, FILE = "folder", "file"


def roots_path(collection: str) -> Path:
    """The roots ledger of ``collection`` (redacted root path -> ``folder`` or ``file``)."""
    return safe_join(home_layout().rag(), f"{check_name(collection, 'collection name')}-roots.json")


def load_roots(collection: str) -> dict[str, str]:
    """The roots ingested into ``collection`` (empty when none were recorded)."""
    return {str(k): str(v) for k, v in read_json_dict(roots_path(collection)).items() if v in (FOLDER, FILE)}


def record_roots(collection: str, sources: Iterable[str | Path], key: bytes | None = None) -> dict[str, str]:
    """Add the files and folders of one ingest to the ledger of ``collection`` (written only
    when it changes); returns the whole ledger."""
    roots = load_roots(collection)
    changed = False
    for src in sources:
        path = Path(src).expanduser()
        if not path.exists():
            continue
        path = path.resolve()
        name = redact_path(str(path), key)
        kind = FILE if path.is_file() else FOLDER
        if roots.get(name) != kind:
            roots[name] = kind
            changed = True
    if changed:
        write_json_atomic(roots_path(collection), roots)
    return roots


def _split(source: str, roots: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """``(folders above the name, the name's parts)``: the name relative to the deepest root
    holding ``source`` (a file root: its file name; no root: its file name too)."""
    parts = [p for p in source.split("/") if p]
    best = -1
    for root, kind in roots.items():
        root_parts = [p for p in root.split("/") if p]
        if kind == FILE and root_parts == parts:
            depth = len(parts) - 1
        elif kind == FOLDER and parts[: len(root_parts)] == root_parts and len(parts) > len(root_parts):
            depth = len(root_parts)
        else:
            continue
        best = max(best, depth)
    cut = best if best >= 0 else len(parts) - 1
    return parts[:cut], parts[cut:]


def document_names(sources: Iterable[str], roots: Mapping[str, str], taken: Iterable[str] = ()) -> dict[str, str]:
    """The name of each source in the collection, unique among them and unlike every name in
    ``taken`` (the files of the watched folder, which keep theirs)."""
    split = {s: _split(s, roots) for s in sorted(set(sources))}
    extra = dict.fromkeys(split, 0)  # folders put in front of each name
    taken = set(taken)

    def name(s: str) -> str:
        above, rel = split[s]
        return "/".join(above[len(above) - extra[s]:] + rel) if extra[s] else "/".join(rel)

    while True:
        by_name: dict[str, list[str]] = {}
        for s in split:
            by_name.setdefault(name(s), []).append(s)
        grow = [s for n, group in by_name.items() if len(group) > 1 or n in taken for s in group
                if extra[s] < len(split[s][0])]
        if not grow:
            return {s: name(s) for s in split}
        for s in grow:
            extra[s] += 1
