"""The RAG pipeline as plain functions: the flows in ``flows/rag.py`` run them with Prefect
tasks as stages; tests and benchmarks run them with the plain functions.

It joins the domain (``solutions.rag``: redaction, sentence rules, answers, metrics) and the
generic tasks (parse, chunk, embed, index, retrieve).
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from infra.embeddings import Embedder
from infra.home import home_layout
from infra.milvus import ensure_collection
from infra.settings import TikaSettings
from infra.store import check_name, safe_join, stable_hash, write_json_atomic
from solutions.rag.config import ChunkParams, HybridWeights, IngestParams, RedactionParams
from solutions.rag.redact import RedactionConfig, redact, redaction_fingerprint
from solutions.rag.text import sentence_spans
from tasks.chunk import Chunk, chunk_document
from tasks.documents import (
    DocMeta,
    ParsedDocument,
    Quarantined,
    SourceFile,
    discover,
    doc_id_for,
    guess_language,
    parse_sources,
)
from tasks.embed import CoverageReport, coverage_report, embed_texts
from tasks.index import IndexRow, WriteCounts, delete_sources, load_manifest, row_id, write_source
from tasks.retrieve import dense_weight_for, to_timestamp

log = logging.getLogger(__name__)
PIPELINE_VERSION = "1"


@dataclass(frozen=True)
class IngestStages:
    """The callables of each stage (plain functions, or their Prefect task wrappers)."""

    parse: Callable[..., Any] = parse_sources
    embed: Callable[..., np.ndarray] = embed_texts
    write: Callable[..., WriteCounts] = write_source
    #: Submits a parse batch to the flow's task runner (threads or Dask) and returns a future;
    #: None parses in line. Batches are parsed ``parse_ahead`` ahead of embedding and writing.
    submit_parse: Callable[..., Any] | None = None
    parse_ahead: int = 2


def parsed_batches(todo: Sequence[SourceFile], batch_docs: int, stages: IngestStages,
                   **parse_kwargs: Any) -> Iterator[tuple[list[SourceFile], Any]]:
    """``(batch, parse result)`` in order; with ``stages.submit_parse`` the next batches are
    parsed on the task runner while the current one is embedded and written."""
    batches = [list(todo[i : i + batch_docs]) for i in range(0, len(todo), batch_docs)]
    if stages.submit_parse is None:
        for batch in batches:
            yield batch, stages.parse(batch, **parse_kwargs)
        return
    waiting = iter(batches)
    in_flight: deque[tuple[list[SourceFile], Any]] = deque()
    for batch in itertools.islice(waiting, max(1, stages.parse_ahead)):
        in_flight.append((batch, stages.submit_parse(batch, **parse_kwargs)))
    while in_flight:
        batch, future = in_flight.popleft()
        following = next(waiting, None)
        if following is not None:
            in_flight.append((following, stages.submit_parse(following, **parse_kwargs)))
        yield batch, future.result()


class QuarantineItem(BaseModel):
    """A document that was not ingested."""

    model_config = ConfigDict(frozen=True)

    path: str
    reason: str
    detail: str = ""


class IngestResult(BaseModel):
    """What ``rag-ingest`` did."""

    model_config = ConfigDict(frozen=True)

    collection: str
    files: int = Field(description="Source files found.")
    unchanged: int = Field(description="Source files skipped because the store already holds them.")
    processed: int = Field(description="Source files parsed in this run.")
    parsed: int = Field(description="Documents parsed (archive members count one each).")
    chunked_documents: int
    quarantined: list[QuarantineItem]
    quarantine_counts: dict[str, int]
    chunks_written: int
    rows_deleted: int
    writes: int = Field(description="Rows upserted plus rows deleted: 0 for an unchanged re-run.")
    pruned_sources: int
    redactions: dict[str, int]
    total_chunks: int
    coverage: CoverageReport | None
    seconds: float


def pipeline_key(chunk: ChunkParams, redaction: RedactionParams, embedder_name: str) -> str:
    """Hash of everything that changes the stored rows of an unchanged file: chunking, the
    redaction kinds switched on and their rules (:func:`redaction_fingerprint`), the embedder."""
    rules = redaction_fingerprint(RedactionConfig(**redaction.model_dump()))
    return stable_hash({"chunk": chunk.model_dump(), "redaction": redaction.model_dump(), "redaction_rules": rules,
                        "embedder": embedder_name, "v": PIPELINE_VERSION})


def _quarantine_cache_path(collection: str) -> Path:
    return safe_join(home_layout().rag(), f"{check_name(collection, 'collection name')}-quarantine.json")


def _load_quarantine_cache(collection: str) -> dict[str, dict]:
    import json

    path = _quarantine_cache_path(collection)
    if not path.exists():
        return {}
    try:
        return dict(json.loads(path.read_text()))
    except (ValueError, OSError):
        return {}


def _redacted(doc: ParsedDocument, cfg: RedactionConfig, counts: Counter) -> ParsedDocument:
    text, n = redact(doc.text, cfg)
    title, n2 = redact(doc.meta.title, cfg)
    author, n3 = redact(doc.meta.author, cfg)
    counts.update(n)
    counts.update(n2)
    counts.update(n3)
    if not (n or n2 or n3):
        return doc
    # page offsets stay valid to within the placeholder length differences
    return replace(doc, text=text, meta=replace(doc.meta, title=title, author=author))


def _clip(text: str, max_bytes: int) -> str:
    """Cut ``text`` to at most ``max_bytes`` UTF-8 bytes (Milvus VARCHAR limits count bytes)."""
    data = text.encode("utf-8")
    return text if len(data) <= max_bytes else data[:max_bytes].decode("utf-8", "ignore")


def _rows(doc: ParsedDocument, chunks: list[Chunk], source_hash: str, n_docs: int) -> list[IndexRow]:
    created = to_timestamp(doc.meta.created) if _iso_ok(doc.meta.created) else None
    modified = to_timestamp(doc.meta.modified) if _iso_ok(doc.meta.modified) else None
    m = doc.meta
    return [
        IndexRow(
            id=row_id(doc.doc_id, doc.content_hash, c.index), doc_id=doc.doc_id, content_hash=doc.content_hash,
            source=doc.source, source_hash=source_hash, path=doc.path, title=_clip(m.title, 500),
            author=_clip(m.author, 500), content_type=_clip(m.content_type, 120), language=_clip(m.language, 16),
            created=_clip(m.created, 32), modified=_clip(m.modified, 32), chunk_index=c.index,
            n_chunks=len(chunks), n_docs=n_docs, created_ts=created or 0, modified_ts=modified or 0,
            page=c.page or 0, start_char=c.start_char, end_char=c.end_char, tokens=c.tokens, text=c.text,
        )
        for c in chunks
    ]


def _iso_ok(value: str) -> bool:
    try:
        return bool(value) and to_timestamp(value) is not None
    except ValueError:
        return False


@dataclass
class _Progress:
    written: WriteCounts
    redactions: Counter
    chunk_texts: list[str]
    chunked_docs: int = 0


def write_documents(
    client: Any,
    collection: str,
    embedder: Embedder,
    groups: Sequence[tuple[str, str, list[ParsedDocument]]],
    params: IngestParams,
    stages: IngestStages,
    progress: _Progress,
    *,
    show_progress: bool = False,
    on_source_written: Callable[[str], None] | None = None,
) -> None:
    """Redact, chunk, embed and write each ``(source, source_hash, documents)`` group."""
    cfg = RedactionConfig(**params.redaction.model_dump())
    tokenizer = embedder.tokenizer
    prepared: list[tuple[str, str, list[IndexRow]]] = []
    texts: list[str] = []
    for source, source_hash, docs in groups:
        chunked: list[tuple[ParsedDocument, list[Chunk]]] = []
        for doc in docs:
            doc = _redacted(doc, cfg, progress.redactions)
            chunks = chunk_document(doc.doc_id, doc.text, tokenizer, sentence_spans, size=params.chunk.tokens,
                                    overlap=params.chunk.overlap, page_at=doc.page_at)
            if chunks:
                chunked.append((doc, chunks))
        rows = [r for doc, chunks in chunked for r in _rows(doc, chunks, source_hash, len(chunked))]
        progress.chunked_docs += len(chunked)
        prepared.append((source, source_hash, rows))
        texts.extend(r.text for r in rows)
    vectors = stages.embed(embedder, texts, batch_size=_batch_size(), progress=show_progress) if texts else None
    progress.chunk_texts.extend(texts[:2000 - len(progress.chunk_texts)] if len(progress.chunk_texts) < 2000 else [])
    offset = 0
    for source, source_hash, rows in prepared:
        if rows:
            vecs = vectors[offset : offset + len(rows)]
            offset += len(rows)
            progress.written.add(stages.write(client, collection, source, source_hash, rows, vecs))
        else:
            progress.written.deleted += delete_sources(client, collection, [source])
        if on_source_written:
            on_source_written(source)


def _batch_size() -> int:
    from infra.settings import get_embedding_settings

    return get_embedding_settings().batch_size


def _under(source: str, roots: Sequence[Path]) -> bool:
    for root in roots:
        r = str(root)
        if source == r or source.startswith(r.rstrip("/") + "/"):
            return True
    return False


def total_chunks(client: Any, collection: str) -> int:
    res = client.query(collection, filter="", output_fields=["count(*)"])
    return int(res[0]["count(*)"]) if res else 0


def run_ingest(
    sources: Sequence[str],
    params: IngestParams,
    *,
    client: Any,
    embedder: Embedder,
    tika_settings: TikaSettings | None = None,
    stages: IngestStages = IngestStages(),
    show_progress: bool = False,
    on_source_written: Callable[[str], None] | None = None,
) -> IngestResult:
    """Ingest files/folders incrementally: unchanged sources are skipped, changed ones replaced,
    and (with ``params.prune``) sources gone from the given folders removed."""
    started = time.perf_counter()
    collection = check_name(params.collection, "collection name")
    files = discover(sources)
    key = pipeline_key(params.chunk, params.redaction, embedder.name)
    exists = client.has_collection(collection)
    manifest = load_manifest(client, collection) if exists else {}
    qcache = _load_quarantine_cache(collection)
    todo: list[SourceFile] = []
    quarantined: list[Quarantined] = []
    unchanged = 0
    hashes = {f.path: stable_hash({"file": f.sha256, "pipeline": key}) for f in files}
    for f in files:
        h = hashes[f.path]
        state = manifest.get(f.path)
        cached = qcache.get(f.path, {})
        if state is not None and state.complete(h):
            unchanged += 1  # an archive may hold documents and quarantined members side by side
            if cached.get("hash") == h:
                quarantined.extend(Quarantined(**q) for q in cached["items"])
        elif state is None and cached.get("hash") == h:
            unchanged += 1
            quarantined.extend(Quarantined(**q) for q in cached["items"])
        else:
            todo.append(f)
    if todo or not exists:
        ensure_collection(client, collection, embedder.dim)
    progress = _Progress(written=WriteCounts(), redactions=Counter(), chunk_texts=[])
    parsed = 0
    for batch, result in parsed_batches(todo, params.batch_docs, stages, settings=tika_settings,
                                        max_archive_members=params.max_archive_members):
        parsed += len(result.documents)
        quarantined.extend(result.quarantined)
        by_source: dict[str, list[ParsedDocument]] = {f.path: [] for f in batch}
        for doc in result.documents:
            by_source[doc.source].append(doc)
        for f in batch:
            items = [q.__dict__ for q in result.quarantined if q.path == f.path or q.path.startswith(f.path + "!/")]
            if items:
                qcache[f.path] = {"hash": hashes[f.path], "items": items}
            else:
                qcache.pop(f.path, None)
        write_json_atomic(_quarantine_cache_path(collection), qcache)
        groups = [(f.path, hashes[f.path], by_source[f.path]) for f in batch]
        write_documents(client, collection, embedder, groups, params, stages, progress,
                        show_progress=show_progress, on_source_written=on_source_written)
    pruned = 0
    if params.prune:
        roots = [Path(s).expanduser().resolve() for s in sources]
        gone = [s for s in manifest if _under(s, roots) and s not in hashes]
        if gone:
            progress.written.deleted += delete_sources(client, collection, gone)
            pruned = len(gone)
        for s in [s for s in qcache if _under(s, roots) and s not in hashes]:
            qcache.pop(s)
        write_json_atomic(_quarantine_cache_path(collection), qcache)
    coverage = None
    if progress.chunk_texts and getattr(embedder, "exact_tokenizer", True):
        coverage = coverage_report(embedder.tokenizer, progress.chunk_texts, embedder.max_tokens, embedder.name)
    reasons = Counter(q.reason for q in quarantined)
    return IngestResult(
        collection=collection, files=len(files), unchanged=unchanged, processed=len(todo), parsed=parsed,
        chunked_documents=progress.chunked_docs,
        quarantined=[QuarantineItem(path=q.path, reason=q.reason, detail=q.detail) for q in quarantined],
        quarantine_counts=dict(sorted(reasons.items())), chunks_written=progress.written.upserted,
        rows_deleted=progress.written.deleted, writes=progress.written.writes, pruned_sources=pruned,
        redactions={k: int(v) for k, v in sorted(progress.redactions.items())},
        total_chunks=total_chunks(client, collection) if client.has_collection(collection) else 0,
        coverage=coverage, seconds=round(time.perf_counter() - started, 3),
    )


def text_documents(items: Sequence[tuple[str, str, str]], namespace: str) -> list[ParsedDocument]:
    """In-memory ``(id, title, text)`` passages (e.g. a QA set's contexts) as documents."""
    docs = []
    for pid, title, text in items:
        path = f"{namespace}/{pid}"
        docs.append(ParsedDocument(
            doc_id=doc_id_for(path), source=path, path=path, content_hash=stable_hash(text), text=text,
            meta=DocMeta(content_type="text/plain", title=title, language=guess_language(text)),
        ))
    return docs


def ingest_texts(
    docs: Sequence[ParsedDocument], params: IngestParams, *, client: Any, embedder: Embedder,
    stages: IngestStages = IngestStages(), show_progress: bool = False,
) -> tuple[int, int]:
    """Write in-memory documents incrementally; returns ``(documents written, rows written)``."""
    collection = check_name(params.collection, "collection name")
    key = pipeline_key(params.chunk, params.redaction, embedder.name)
    ensure_collection(client, collection, embedder.dim)
    manifest = load_manifest(client, collection)
    todo = []
    for doc in docs:
        h = stable_hash({"text": doc.content_hash, "pipeline": key})
        state = manifest.get(doc.source)
        if state is None or not state.complete(h):
            todo.append((doc.source, h, [doc]))
    progress = _Progress(written=WriteCounts(), redactions=Counter(), chunk_texts=[])
    for start in range(0, len(todo), 64):
        write_documents(client, collection, embedder, todo[start : start + 64], params, stages, progress,
                        show_progress=show_progress)
    return len(todo), progress.written.upserted


def query_weights(embedder: Embedder, question: str, weights: HybridWeights) -> dict[str, float]:
    """Fusion weights for one query (``auto`` dense weight from the embedder's coverage of it)."""
    if weights.dense != "auto":
        return {"dense": float(weights.dense), "bm25": weights.bm25}
    if not getattr(embedder, "exact_tokenizer", True):  # no evidence about a remote model's vocabulary
        return {"dense": 1.0, "bm25": weights.bm25}
    tok = embedder.tokenizer
    ids = tok(question, add_special_tokens=False, verbose=False)["input_ids"]
    unk = getattr(tok, "unk_token_id", None)
    share = (sum(1 for i in ids if i == unk) / len(ids)) if ids and unk is not None else 0.0
    return {"dense": dense_weight_for(share), "bm25": weights.bm25}


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
