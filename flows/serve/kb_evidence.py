"""Evidence behind a citation, read from the store: the stored (redacted) text around a chunk,
and the original file a chunk came from (when it is in the collection's watched folder).

A chunk is named by its id (``chunk_id`` of a passage), never by a document name, so the
request line names no document.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows.serve.kb_engine import DocumentStatus, KbEngine
from infra.milvus import query_all, quote
from solutions.rag.collections import KbCollection
from solutions.rag.evidence import SourceText, StoredChunk, surrounding_text

CHUNK_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_FIELDS = ("id", "doc_id", "source", "path", "title", "chunk_index", "n_chunks", "page", "start_char", "end_char",
           "text")


def source_scope(col: KbCollection) -> str:
    """The scope that lets a key download the original files of ``col``."""
    return f"kb:{col.name}:source"


def chunk_row(engine: KbEngine, col: KbCollection, chunk_id: str) -> dict[str, Any] | None:
    """The stored row of ``chunk_id`` in ``col`` (None: no such chunk, or a malformed id)."""
    if not CHUNK_ID.match(chunk_id):
        return None
    client = engine.client()
    if not client.has_collection(col.milvus):
        return None
    client.load_collection(col.milvus)
    rows = client.query(col.milvus, filter=f"id == {quote(chunk_id)}", output_fields=list(_FIELDS), limit=1)
    return dict(rows[0]) if rows else None


def _stored(row: dict[str, Any]) -> StoredChunk:
    return StoredChunk(index=int(row.get("chunk_index", 0)), page=int(row.get("page") or 0) or None,
                       start_char=int(row.get("start_char", 0)), end_char=int(row.get("end_char", 0)),
                       text=str(row.get("text", "")))


@dataclass(frozen=True)
class ChunkSource:
    """A chunk's row and the stored text around it."""

    row: dict[str, Any]
    text: SourceText
    pages: tuple[int, ...]


def chunk_source(engine: KbEngine, col: KbCollection, chunk_id: str, around: int = 1) -> ChunkSource | None:
    """The stored text of ``chunk_id`` and of its ``around`` neighbours on each side (chunks of
    the same document, same ingest), stitched without their overlaps."""
    row = chunk_row(engine, col, chunk_id)
    if row is None:
        return None
    index = int(row.get("chunk_index", 0))
    expr = (f"doc_id == {quote(str(row['doc_id']))} and source == {quote(str(row['source']))} "
            f"and chunk_index >= {index - around} and chunk_index <= {index + around} "
            f"and id != {quote(chunk_id)}")
    rows = [r for r in query_all(engine.client(), col.milvus, _FIELDS, expr)
            if r["id"].rsplit("-", 1)[0] == chunk_id.rsplit("-", 1)[0]]  # the same content hash
    neighbours = [_stored(r) for r in rows]
    pages = sorted({c.page for c in [_stored(row), *neighbours] if c.page})
    return ChunkSource(row=row, text=surrounding_text(_stored(row), neighbours), pages=tuple(pages))


def original_file(engine: KbEngine, col: KbCollection, row: dict[str, Any]) -> tuple[DocumentStatus, Path] | None:
    """The document of a stored chunk and its file in ``col``'s folder, when the file is a regular
    file inside that folder (no symlink on the way); None otherwise (ingested from elsewhere,
    deleted since, or an archive member's archive that is gone)."""
    source = str(row.get("source", ""))
    doc = next((d for d in engine.documents(col) if d.source == source and d.path is not None), None)
    if doc is None or doc.path is None:
        return None
    folder = col.folder.resolve()
    path = doc.path
    try:
        rel = path.relative_to(folder)
    except ValueError:
        return None
    here = folder
    for part in rel.parts:  # no link anywhere between the folder and the file
        here = here / part
        if here.is_symlink():
            return None
    real = Path(os.path.realpath(path))
    if not real.is_relative_to(folder) or not real.is_file():
        return None
    return doc, real
