"""Write chunks to Milvus idempotently and incrementally.

Rows are keyed by ``{doc_id}-{content hash}-{chunk index}`` and carry the hash of the source
file plus pipeline settings (``source_hash``), the number of chunks of their document and the
number of documents of their source. A source is complete when every one of its documents has
all its chunks under the current ``source_hash``: a re-run skips it (0 writes). Writing a source
upserts its new rows first and only then deletes its rows of any other ``source_hash``, so a
run killed at any point leaves a state the next run repairs: no duplicates, none missing.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from prefect import task
from prefect.cache_policies import NONE

from infra.milvus import MANIFEST_FIELDS, TEXT_MAX_CHARS, query_all, quote

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IndexRow:
    """One chunk as stored (``vector`` added at write time)."""

    id: str
    doc_id: str
    content_hash: str
    source: str
    source_hash: str
    path: str
    title: str
    author: str
    content_type: str
    language: str
    created: str
    modified: str
    chunk_index: int
    n_chunks: int
    n_docs: int
    created_ts: int
    modified_ts: int
    page: int
    start_char: int
    end_char: int
    tokens: int
    text: str


def row_id(doc_id: str, content_hash: str, index: int) -> str:
    return f"{doc_id}-{content_hash[:16]}-{index:05d}"


@dataclass
class SourceState:
    """What the store holds of one source."""

    hashes: set[str] = field(default_factory=set)
    n_docs: set[int] = field(default_factory=set)
    chunks: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    expected: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))

    def complete(self, source_hash: str) -> bool:
        """All rows under ``source_hash`` and every document has all its chunks."""
        if self.hashes != {source_hash} or len(self.n_docs) != 1:
            return False
        if len(self.chunks) != next(iter(self.n_docs)):
            return False
        return all(self.expected[d] == {n} for d, n in self.chunks.items())


def load_manifest(client: Any, collection: str) -> dict[str, SourceState]:
    """Per source: hashes, document count and chunk counts held by the store."""
    states: dict[str, SourceState] = defaultdict(SourceState)
    for row in query_all(client, collection, MANIFEST_FIELDS):
        st = states[row["source"]]
        st.hashes.add(row["source_hash"])
        st.n_docs.add(int(row["n_docs"]))
        st.chunks[row["doc_id"]] += 1
        st.expected[row["doc_id"]].add(int(row["n_chunks"]))
    return dict(states)


@dataclass
class WriteCounts:
    """Rows written and deleted."""

    upserted: int = 0
    deleted: int = 0

    def add(self, other: WriteCounts) -> None:
        self.upserted += other.upserted
        self.deleted += other.deleted

    @property
    def writes(self) -> int:
        return self.upserted + self.deleted


def _ids(client: Any, collection: str, expr: str) -> list[str]:
    return [r["id"] for r in query_all(client, collection, ("id",), expr)]


def delete_where(client: Any, collection: str, expr: str) -> int:
    """Delete the rows matching ``expr``; return how many there were."""
    ids = _ids(client, collection, expr)
    for start in range(0, len(ids), 1000):
        batch = ids[start : start + 1000]
        client.delete(collection, filter="id in [" + ",".join(quote(i) for i in batch) + "]")
    return len(ids)


def write_source(
    client: Any, collection: str, source: str, source_hash: str, rows: Sequence[IndexRow], vectors: np.ndarray,
    batch: int = 256,
) -> WriteCounts:
    """Replace the rows of ``source`` by ``rows`` (upsert first, then delete stale ones)."""
    if len(rows) != len(vectors):
        raise ValueError(f"{len(rows)} rows but {len(vectors)} vectors")
    counts = WriteCounts()
    for start in range(0, len(rows), batch):
        data = []
        for row, vec in zip(rows[start : start + batch], vectors[start : start + batch], strict=True):
            item = asdict(row)
            item["text"] = item["text"][:TEXT_MAX_CHARS]
            item["vector"] = vec.astype(np.float32).tolist()
            data.append(item)
        client.upsert(collection, data)
        counts.upserted += len(data)
    counts.deleted = delete_where(
        client, collection, f"source == {quote(source)} and source_hash != {quote(source_hash)}"
    )
    return counts


def delete_sources(client: Any, collection: str, sources: Iterable[str]) -> int:
    """Remove every row of the given sources."""
    deleted = 0
    for source in sources:
        deleted += delete_where(client, collection, f"source == {quote(source)}")
    return deleted


write_source_task = task(name="index-chunks", cache_policy=NONE, retries=2, retry_delay_seconds=[2, 5])(write_source)
