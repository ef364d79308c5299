"""Retrieve chunks from Milvus: dense (cosine), BM25 full text, or hybrid, with metadata filters.

Hybrid fuses the two lists client-side by weighted standardised scores (:func:`fuse`), each
retriever weighted so that a weak one can be given little say. ``bench/rag_fusion_bench.py``
compared it on CMRC 2018 with four other client-side fusions (max-normalised scores, weighted
RRF, min-max, per-query confidence) and with Milvus's own ``hybrid_search`` (``RRFRanker``,
``WeightedRanker``); none did better, and the server-side rankers did worse
(``bench/results/rag_fusion.md``): RRF takes no weights in pymilvus 2.5, so MiniLM's poor
Chinese dense list drags BM25 down, and milvus-lite 2.5.1's ``WeightedRanker`` scores BM25 as a
distance (the best BM25 hit counts least). ``hybrid_search`` also returns only the fused score,
while the answer step's support check reads each retriever's own rank and score.
Earlier figures: with the packaged multilingual-e5-small, CMRC recall@5 / MRR@10 0.995 / 0.986
vs BM25 0.986 / 0.972 and dense 0.980 / 0.958; with MiniLM on Chinese the coverage-aware dense
weight (0.1) keeps it at BM25's level (0.986 / 0.970) where equal-weight fusions fell (RRF 0.64
recall@5).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from infra.milvus import quote, row_count

log = logging.getLogger(__name__)

Mode = Literal["dense", "bm25", "hybrid"]
#: What Milvus says when a BM25 search meets a collection without rows (its mean length is 0/0).
EMPTY_BM25 = "NaN or Inf"
OUTPUT_FIELDS = ["id", "doc_id", "source", "path", "title", "author", "content_type", "language", "created",
                 "chunk_index", "n_chunks", "page", "start_char", "end_char", "text"]


@dataclass(frozen=True)
class Retrieved:
    """One retrieved chunk with its fused score and per-retriever ranks and raw scores (dense:
    cosine similarity; bm25: Milvus's BM25 score), which the answer step's support check reads."""

    id: str
    score: float
    fields: dict[str, Any]
    ranks: dict[str, int] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)


def to_timestamp(value: str | None, end_of_day: bool = False) -> int | None:
    """Epoch seconds of an ISO date/time (``None`` stays ``None``)."""
    if not value:
        return None
    text = value.strip().replace("Z", "+00:00")
    parsed = dt.datetime.fromisoformat(text)
    if len(text) == 10 and end_of_day:
        parsed = parsed + dt.timedelta(days=1) - dt.timedelta(seconds=1)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return int(parsed.timestamp())


def build_filter(
    *,
    content_type: str | None = None,
    path_prefix: str | None = None,
    language: str | None = None,
    created_from: str | None = None,
    created_to: str | None = None,
) -> str:
    """A Milvus boolean expression from metadata filters (values are quoted, never spliced)."""
    parts = []
    if content_type:
        parts.append(f"content_type like {quote(content_type.replace('%', '') + '%')}")
    if path_prefix:
        parts.append(f"path like {quote(path_prefix.replace('%', '') + '%')}")
    if language:
        parts.append(f"language == {quote(language)}")
    lo, hi = to_timestamp(created_from), to_timestamp(created_to, end_of_day=True)
    if lo is not None:
        parts.append(f"created_ts >= {lo}")
    if hi is not None:
        parts.append(f"created_ts > 0 and created_ts <= {hi}")
    return " and ".join(parts)


def _hits(result: Any) -> list[list[dict]]:
    """Search results as plain dicts (pymilvus versions differ in their hit classes)."""
    out = []
    for hits in result:
        row = []
        for h in hits:
            try:
                hid, dist, entity = h["id"], h["distance"], h["entity"]
            except (KeyError, TypeError):
                hid, dist, entity = h.id, h.distance, h.entity
            row.append({"id": hid, "distance": float(dist), "entity": dict(entity)})
        out.append(row)
    return out


def dense_search(
    client: Any, collection: str, vectors: np.ndarray, top_k: int, expr: str = ""
) -> list[list[Retrieved]]:
    """Nearest chunks by cosine similarity, one list per query vector."""
    res = client.search(collection, data=[v.astype(np.float32).tolist() for v in vectors], anns_field="vector",
                        limit=top_k, filter=expr, output_fields=OUTPUT_FIELDS,
                        search_params={"metric_type": "COSINE"})
    return [[Retrieved(h["id"], h["distance"], h["entity"], {"dense": r}, {"dense": h["distance"]})
             for r, h in enumerate(hits, 1)]
            for hits in _hits(res)]


def bm25_search(client: Any, collection: str, queries: Sequence[str], top_k: int, expr: str = "") -> list[list[Retrieved]]:
    """Best chunks by BM25 over the analysed text, one list per query (empty lists when the
    collection holds no rows yet: Milvus then fails the search, its mean document length being
    0/0 — as happens while a first ingest has created the collection and not yet written)."""
    try:
        res = client.search(collection, data=list(queries), anns_field="sparse", limit=top_k, filter=expr,
                            output_fields=OUTPUT_FIELDS, search_params={"metric_type": "BM25"})
    except Exception as exc:
        if EMPTY_BM25 in str(exc) and row_count(client, collection) == 0:
            return [[] for _ in queries]
        raise
    return [[Retrieved(h["id"], h["distance"], h["entity"], {"bm25": r}, {"bm25": h["distance"]})
             for r, h in enumerate(hits, 1)]
            for hits in _hits(res)]


def best_bm25(client: Any, collection: str, query: str, expr: str = "") -> float:
    """The best BM25 score of ``query`` in the collection (0.0: no chunk matches a term of it)."""
    if not query.strip():
        return 0.0
    hits = bm25_search(client, collection, [query], 1, expr)[0]
    return hits[0].score if hits else 0.0


def _standardised(hits: list[Retrieved]) -> np.ndarray:
    arr = np.asarray([h.score for h in hits], dtype=np.float64)
    return (arr - arr.mean()) / (float(arr.std()) or 1.0)


def fuse(lists: dict[str, list[Retrieved]], weights: dict[str, float], top_k: int) -> list[Retrieved]:
    """One hybrid list: each chunk scores the weighted sum over retrievers of its standardised
    score ``(s - mean) / std`` in that retriever's list (a hit that stands out from the rest of
    its list counts for more than one in a flat list, whatever the retriever's score scale; a
    chunk a retriever did not return gets that list's lowest); ties go to the better best rank."""
    ranks: dict[str, dict[str, int]] = {}
    raw: dict[str, dict[str, float]] = {}
    fields: dict[str, dict] = {}
    per: list[tuple[dict[str, float], float]] = []  # per retriever: weighted score by id, score if absent
    for name, hits in lists.items():
        if not hits:
            continue
        w, z = weights.get(name, 1.0), _standardised(hits)
        per.append((dict(zip((h.id for h in hits), (w * z).tolist(), strict=True)), w * float(z.min())))
        for rank, hit in enumerate(hits, 1):
            ranks.setdefault(hit.id, {})[name] = rank
            raw.setdefault(hit.id, {})[name] = hit.score
            fields.setdefault(hit.id, hit.fields)
    scores = {hid: sum(got.get(hid, missing) for got, missing in per) for hid in fields}
    order = sorted(scores, key=lambda i: (-scores[i], min(ranks[i].values())))
    return [Retrieved(i, scores[i], fields[i], ranks[i], raw[i]) for i in order[:top_k]]


def retrieve(
    client: Any,
    collection: str,
    queries: Sequence[str],
    vectors: np.ndarray | None,
    *,
    mode: Mode = "hybrid",
    top_k: int = 5,
    expr: str = "",
    weights: dict[str, float] | None = None,
    depth: int | None = None,
) -> list[list[Retrieved]]:
    """Top-``top_k`` chunks per query with the chosen retriever."""
    if mode in ("dense", "hybrid") and vectors is None:
        raise ValueError("dense and hybrid retrieval need query vectors")
    if mode == "dense":
        return dense_search(client, collection, vectors, top_k, expr)
    if mode == "bm25":
        return bm25_search(client, collection, queries, top_k, expr)
    weights = weights or {"dense": 1.0, "bm25": 1.0}
    depth = depth or max(4 * top_k, 20)
    dense = dense_search(client, collection, vectors, depth, expr) if weights.get("dense", 1.0) > 0 else [[] for _ in queries]
    sparse = bm25_search(client, collection, queries, depth, expr) if weights.get("bm25", 1.0) > 0 else [[] for _ in queries]
    return [fuse({"dense": d, "bm25": s}, weights, top_k) for d, s in zip(dense, sparse, strict=True)]


def retrieve_batched(client: Any, collection: str, queries: Sequence[str], vectors: np.ndarray | None, *,
                     batch: int = 64, **options: Any) -> list[list[Retrieved]]:
    """:func:`retrieve` over many queries, ``batch`` queries per call (same options)."""
    out: list[list[Retrieved]] = []
    for start in range(0, len(queries), batch):
        part = None if vectors is None else vectors[start : start + batch]
        out += retrieve(client, collection, queries[start : start + batch], part, **options)
    return out
