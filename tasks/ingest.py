"""Incremental, idempotent ingestion of documents into a vector store: the generic engine.

Files are discovered, compared with what the store already holds (content hash + the
caller's rules key), parsed in batches (``parse_ahead`` batches ahead on the flow's task
runner while the current one is embedded and written), redacted and chunked by the caller's
:class:`DocumentRules`, embedded and written per source; sources gone from the given folders
are pruned on request. With ``IngestStages.overlap`` (the default) a bounded pipeline runs the
stages side by side: the caller's thread parses and chunks batch k+1 while one thread embeds
batch k and another writes batch k-1 to the store (writes keep their order). Documents that cannot be parsed are quarantined with a reason and
remembered per collection, so an unchanged broken file is not parsed again.

Nothing here knows a domain: what is redacted and where chunks are cut come from the
``rules`` argument (the RAG vertical passes ``solutions.rag.ingest.DocumentRules``).
"""

from __future__ import annotations

import contextvars
import itertools
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, Self

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from infra.embeddings import EMBED_BATCH_SIZE, CoverageReport, Embedder, coverage_report
from infra.home import home_layout
from infra.milvus import ensure_collection
from infra.pii import redact_path, tag_key
from infra.settings import TikaSettings
from infra.store import check_name, read_json_dict, safe_join, stable_hash, write_json_atomic
from tasks.catalog import record_roots
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
    parse_sources_task,
    render_quarantine,
)
from tasks.embed import embed_texts, embed_texts_task
from tasks.index import (
    IndexRow,
    WriteCounts,
    delete_sources,
    load_manifest,
    row_id,
    write_source,
    write_source_task,
)
from tasks.ocr import OcrItem, load_ocr_ledger, ocr_key, ocr_summary, record_ocr, render_ocr, save_ocr_ledger
from tasks.progress import track
from tasks.retrieve import to_timestamp

log = logging.getLogger(__name__)

COVERAGE_SAMPLE = 2000  # chunk texts kept to measure the embedder's coverage of the corpus


class DocumentRules(Protocol):
    """What the caller does to each parsed document before it is embedded."""

    @property
    def key(self) -> str:
        """Changes whenever the rules would store different rows for the same file."""

    @property
    def chunk_tokens(self) -> int: ...

    @property
    def chunk_overlap(self) -> int: ...

    def redact(self, text: str) -> tuple[str, Mapping[str, int]]:
        """The text to store, and how many values of each kind were replaced."""

    def sentences(self, text: str) -> list[tuple[int, int]]:
        """Character spans of the sentences (chunks are cut between them)."""


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
    #: Batches embedded and written on background threads while the next is parsed and chunked
    #: (at most this many in flight); 0 embeds and writes each batch in line.
    overlap: int = 2


def task_stages() -> IngestStages:
    """The stages as Prefect tasks (inside a flow: parse batches run ahead on its task runner)."""
    return IngestStages(parse=parse_sources_task, embed=embed_texts_task, write=write_source_task,
                        submit_parse=parse_sources_task.submit)


class QuarantineItem(BaseModel):
    """A document that was not ingested."""

    model_config = ConfigDict(frozen=True)

    path: str
    reason: str
    detail: str = ""
    file_indexed: bool = Field(default=False, description="The file it comes from holds indexed chunks (an archive's "
                               "other members): the documents list shows that file as indexed, not quarantined.")


class IngestResult(BaseModel):
    """What an ingestion did."""

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
    pages_ocr: int = Field(default=0, description="Pages (image frames) read by OCR in this run.")
    ocr: list[OcrItem] = Field(default_factory=list, description="The documents with pages read by OCR in this run.")


# ------------------------------------------------------------------------------------
# parse batches


def parsed_batches(todo: Sequence[SourceFile], batch_docs: int, stages: IngestStages,
                   starting: Callable[[list[SourceFile]], None] = lambda batch: None,
                   **parse_kwargs: Any) -> Iterator[tuple[list[SourceFile], Any]]:
    """``(batch, parse result)`` in order; with ``stages.submit_parse`` the next batches are
    parsed on the task runner while the current one is embedded and written. ``starting`` is
    called with each batch before its parse begins."""
    batches = [list(todo[i : i + batch_docs]) for i in range(0, len(todo), batch_docs)]
    submit_parse = stages.submit_parse
    if submit_parse is None:
        for batch in batches:
            starting(batch)
            yield batch, stages.parse(batch, **parse_kwargs)
        return

    def submit(batch: list[SourceFile]) -> tuple[list[SourceFile], Any]:
        starting(batch)
        return batch, submit_parse(batch, **parse_kwargs)

    waiting = iter(batches)
    in_flight: deque[tuple[list[SourceFile], Any]] = deque(map(submit, itertools.islice(waiting,
                                                                                         max(1, stages.parse_ahead))))
    while in_flight:
        batch, future = in_flight.popleft()
        following = next(waiting, None)
        if following is not None:
            in_flight.append(submit(following))
        yield batch, future.result()


# ------------------------------------------------------------------------------------
# quarantine cache: broken files are remembered per collection


def quarantine_cache_path(collection: str) -> Path:
    """The quarantine cache of ``collection`` (source path -> file hash and quarantined items)."""
    return safe_join(home_layout().rag(), f"{check_name(collection, 'collection name')}-quarantine.json")


def load_quarantine_cache(collection: str) -> dict[str, dict]:
    """The quarantine cache of ``collection`` (empty when missing or unreadable)."""
    return read_json_dict(quarantine_cache_path(collection))


#: Runs that may stop (killed, crashed) while a file is being ingested before it is quarantined
#: as ``unfinished``: one stop is forgiven (a restart, a killed child started again).
UNFINISHED_RUNS = 2


class QuarantineCache:
    """The quarantine cache of one ingest run, shared by its parse and write threads.

    Besides the quarantined items of each source it marks the files being ingested
    (``unfinished``: how many runs started them): a mark still there when a run begins means
    a run stopped (was killed, crashed, ran out of time) while working on that file. A file
    marked by :data:`UNFINISHED_RUNS` runs, or by a run that ran out of time
    (:func:`quarantine_unfinished`), is quarantined until it changes: later runs never parse a
    file that stops them again and again.
    """

    def __init__(self, collection: str, entries: dict[str, dict]) -> None:
        self.path = quarantine_cache_path(collection)
        self.entries = entries
        self._lock = threading.Lock()

    def save(self) -> None:
        with self._lock:
            write_json_atomic(self.path, self.entries)

    def stopped(self, source: str, source_hash: str) -> Quarantined | None:
        """The quarantine of a file that stopped :data:`UNFINISHED_RUNS` runs (now recorded as such)."""
        entry = self.entries.get(source, {})
        runs = entry.get("unfinished", 0) if entry.get("hash") == source_hash else 0
        if runs < UNFINISHED_RUNS:
            return None
        item = Quarantined(source, "unfinished", f"{runs} ingest runs stopped before this file was written")
        self.entries[source] = {"hash": source_hash, "items": [item.__dict__]}
        return item

    def starting(self, sources: dict[str, str]) -> None:
        """Mark ``sources`` (source -> hash) as being ingested, on disk before their parse begins."""
        with self._lock:
            for source, source_hash in sources.items():
                entry = self.entries.get(source, {})
                same = entry.get("hash") == source_hash
                self.entries[source] = {"hash": source_hash, "items": entry.get("items", []) if same else [],
                                        "unfinished": (entry.get("unfinished", 0) if same else 0) + 1}
        self.save()

    def parsed(self, source: str, source_hash: str, items: list[dict]) -> None:
        """Record a source's quarantined items (its mark stays until it is written)."""
        with self._lock:
            marked = self.entries.get(source, {}).get("unfinished")
            entry = {"hash": source_hash, "items": items} | ({"unfinished": marked} if marked else {})
            if items or marked:
                self.entries[source] = entry
            else:
                self.entries.pop(source, None)

    @contextmanager
    def run(self) -> Iterator[None]:
        """The run's parse, embed and write stages: a run that fails with an error (an endpoint
        down, not a file that stops the process) removes its marks: it did not stop on them."""
        try:
            yield
        except Exception:
            with self._lock:
                for entry in self.entries.values():
                    entry.pop("unfinished", None)
                self.entries = {s: e for s, e in self.entries.items() if e.get("items")}
            self.save()
            raise

    def written(self, source: str) -> None:
        """The source is written: its mark goes (on disk with the next save)."""
        with self._lock:
            entry = self.entries.get(source)
            if entry is not None:
                entry.pop("unfinished", None)
                if not entry.get("items"):
                    self.entries.pop(source)


def quarantine_unfinished(collection: str, reason: str = "timed_out", detail: str = "") -> int:
    """Quarantine every file of ``collection`` a stopped run was working on (its ingest ran out of
    time: what it was parsing or embedding is what took the time); how many."""
    entries = load_quarantine_cache(collection)
    marked = [s for s, e in entries.items() if e.get("unfinished")]
    for source in marked:
        entries[source] = {"hash": entries[source].get("hash"),
                           "items": [Quarantined(source, reason, detail).__dict__]}
    if marked:
        write_json_atomic(quarantine_cache_path(collection), entries)
    return len(marked)


# ------------------------------------------------------------------------------------
# documents -> rows


def redact_document(doc: ParsedDocument, rules: DocumentRules, counts: Counter) -> ParsedDocument:
    """``doc`` with its text, title and author passed through the rules' redaction."""
    text, n = rules.redact(doc.text)
    title, n2 = rules.redact(doc.meta.title)
    author, n3 = rules.redact(doc.meta.author)
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


def _timestamp_or_zero(value: str) -> int:
    try:
        return (to_timestamp(value) or 0) if value else 0
    except ValueError:
        return 0


def document_rows(doc: ParsedDocument, chunks: list[Chunk], source_hash: str, n_docs: int) -> list[IndexRow]:
    """The stored rows of one document's chunks (metadata clipped to the store's field sizes)."""
    m = doc.meta
    created, modified = _timestamp_or_zero(m.created), _timestamp_or_zero(m.modified)
    return [
        IndexRow(
            id=row_id(doc.doc_id, doc.content_hash, c.index), doc_id=doc.doc_id, content_hash=doc.content_hash,
            source=doc.source, source_hash=source_hash, path=doc.path, title=_clip(m.title, 500),
            author=_clip(m.author, 500), content_type=_clip(m.content_type, 120), language=_clip(m.language, 16),
            created=_clip(m.created, 32), modified=_clip(m.modified, 32), chunk_index=c.index,
            n_chunks=len(chunks), n_docs=n_docs, created_ts=created, modified_ts=modified,
            page=c.page or 0, start_char=c.start_char, end_char=c.end_char, tokens=c.tokens, text=c.text,
        )
        for c in chunks
    ]


@dataclass
class IngestProgress:
    """What the writes of one ingestion have done so far."""

    written: WriteCounts = field(default_factory=WriteCounts)
    redactions: Counter = field(default_factory=Counter)
    chunk_texts: list[str] = field(default_factory=list)  # a sample for the coverage report
    chunked_docs: int = 0
    indexed: set[str] = field(default_factory=set)  # sources holding rows after this run


@dataclass
class PreparedBatch:
    """One batch of sources redacted and chunked: their rows and the texts to embed, in order."""

    groups: list[tuple[str, str, list[IndexRow]]]
    texts: list[str]


def prepare_documents(
    embedder: Embedder,
    groups: Sequence[tuple[str, str, list[ParsedDocument]]],
    rules: DocumentRules,
    progress: IngestProgress,
) -> PreparedBatch:
    """Redact and chunk each ``(source, source_hash, documents)`` group into stored rows."""
    prepared: list[tuple[str, str, list[IndexRow]]] = []
    texts: list[str] = []
    for source, source_hash, docs in groups:
        chunked: list[tuple[ParsedDocument, list[Chunk]]] = []
        for doc in docs:
            doc = redact_document(doc, rules, progress.redactions)
            chunks = chunk_document(doc.doc_id, doc.text, embedder.tokenizer, rules.sentences,
                                    size=rules.chunk_tokens, overlap=rules.chunk_overlap, page_at=doc.page_at,
                                    page_starts=doc.page_starts)
            if chunks:
                chunked.append((doc, chunks))
        rows = [r for doc, chunks in chunked for r in document_rows(doc, chunks, source_hash, len(chunked))]
        progress.chunked_docs += len(chunked)
        prepared.append((source, source_hash, rows))
        texts.extend(r.text for r in rows)
    progress.chunk_texts.extend(texts[: max(0, COVERAGE_SAMPLE - len(progress.chunk_texts))])
    return PreparedBatch(prepared, texts)


def embed_batch(embedder: Embedder, batch: PreparedBatch, stages: IngestStages, *,
                show_progress: bool = False) -> np.ndarray | None:
    """The vectors of a prepared batch's texts (None when it has none)."""
    if not batch.texts:
        return None
    return stages.embed(embedder, batch.texts, batch_size=EMBED_BATCH_SIZE,
                        progress=show_progress)


def write_batch(
    client: Any, collection: str, batch: PreparedBatch, vectors: np.ndarray | None, stages: IngestStages,
    progress: IngestProgress, on_source_written: Callable[[str], None] | None = None,
) -> None:
    """Write each source's rows with their vectors (a source left without rows loses its old ones)."""
    offset = 0
    for source, source_hash, rows in batch.groups:
        if rows:
            vecs = vectors[offset : offset + len(rows)]
            offset += len(rows)
            progress.written.add(stages.write(client, collection, source, source_hash, rows, vecs))
            progress.indexed.add(source)
        else:
            progress.written.deleted += delete_sources(client, collection, [source])
        if on_source_written:
            on_source_written(source)


def write_documents(
    client: Any,
    collection: str,
    embedder: Embedder,
    groups: Sequence[tuple[str, str, list[ParsedDocument]]],
    rules: DocumentRules,
    stages: IngestStages,
    progress: IngestProgress,
    *,
    show_progress: bool = False,
    on_source_written: Callable[[str], None] | None = None,
) -> None:
    """Redact, chunk, embed and write each ``(source, source_hash, documents)`` group (in line)."""
    batch = prepare_documents(embedder, groups, rules, progress)
    vectors = embed_batch(embedder, batch, stages, show_progress=show_progress)
    write_batch(client, collection, batch, vectors, stages, progress, on_source_written)


class EmbedWritePipeline:
    """Embeds prepared batches on one thread and writes them on another, in submission order,
    while the caller parses and chunks the next batch; at most ``depth`` batches in flight.

    Use as a context manager: leaving it waits for every submitted write (also when the caller
    fails, as in-line writing would have done them); the first embedding or write error is
    raised in the caller's thread and cancels the batches not started. Each job runs in a copy of the caller's context (a Prefect task then stays a task
    of the caller's flow run). ``depth`` 0 runs each batch in line.
    """

    def __init__(self, client: Any, collection: str, embedder: Embedder, stages: IngestStages,
                 progress: IngestProgress, *, show_progress: bool = False,
                 on_source_written: Callable[[str], None] | None = None) -> None:
        self.client, self.collection, self.embedder = client, collection, embedder
        self.stages, self.progress = stages, progress
        self.show_progress, self.on_source_written = show_progress, on_source_written
        self.depth = max(0, stages.overlap)
        self._pending: deque[Future] = deque()
        self._embed_pool: ThreadPoolExecutor | None = None
        self._write_pool: ThreadPoolExecutor | None = None

    def __enter__(self) -> Self:
        if self.depth:
            self._embed_pool = ThreadPoolExecutor(1, thread_name_prefix="ingest-embed")
            self._write_pool = ThreadPoolExecutor(1, thread_name_prefix="ingest-write")
        return self

    def _write_when_embedded(self, batch: PreparedBatch, embedded: Future) -> None:
        write_batch(self.client, self.collection, batch, embedded.result(), self.stages, self.progress,
                    self.on_source_written)

    def submit(self, batch: PreparedBatch) -> None:
        """Embed and write ``batch`` (in line with depth 0); waits while ``depth`` batches are in flight."""
        if self._embed_pool is None or self._write_pool is None:
            vectors = embed_batch(self.embedder, batch, self.stages, show_progress=self.show_progress)
            write_batch(self.client, self.collection, batch, vectors, self.stages, self.progress,
                        self.on_source_written)
            return
        embedded = self._embed_pool.submit(contextvars.copy_context().run, embed_batch, self.embedder, batch,
                                           self.stages, show_progress=self.show_progress)
        self._pending.append(self._write_pool.submit(contextvars.copy_context().run, self._write_when_embedded,
                                                     batch, embedded))
        while len(self._pending) > self.depth:
            self._pending.popleft().result()

    def drain(self) -> None:
        """Wait for every submitted batch to be written (raises the first error)."""
        while self._pending:
            self._pending.popleft().result()

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        try:
            if exc_type is None:
                self.drain()
            else:  # the caller failed: still finish what it submitted, as the in-line order would have
                try:
                    self.drain()
                except Exception:  # the caller's error is the one to raise
                    log.exception("embedding/writing a submitted batch failed while the ingest was failing")
        finally:
            for pool in (self._embed_pool, self._write_pool):
                if pool is not None:
                    pool.shutdown(wait=True, cancel_futures=True)
            self._pending.clear()


# ------------------------------------------------------------------------------------
# ingest files / in-memory texts


def _under(source: str, roots: Sequence[Path]) -> bool:
    for root in roots:
        r = str(root)
        if source == r or source.startswith(r.rstrip("/") + "/"):
            return True
    return False


def total_chunks(client: Any, collection: str) -> int:
    """Rows in ``collection``."""
    res = client.query(collection, filter="", output_fields=["count(*)"])
    return int(res[0]["count(*)"]) if res else 0


def _coverage(embedder: Embedder, texts: list[str]) -> CoverageReport | None:
    if not texts or not getattr(embedder, "exact_tokenizer", True):  # a stand-in tokenizer says nothing
        return None
    return coverage_report(embedder.tokenizer, texts, embedder.max_tokens, embedder.name)


def source_key(file_sha256: str, rules_key: str, ocr: dict[str, object] | None) -> str:
    """The key a source file is stored under: its bytes, the document rules and, when OCR is on,
    the OCR set-up (it changes what a scanned page stores). A file whose key changed is ingested again."""
    return stable_hash({"file": file_sha256, "pipeline": rules_key, **({"ocr": ocr} if ocr else {})})


def run_ingest(
    sources: Sequence[str],
    rules: DocumentRules,
    *,
    collection: str,
    client: Any,
    embedder: Embedder,
    batch_docs: int = 16,
    max_archive_members: int = 1000,
    prune: bool = False,
    tika_settings: TikaSettings | None = None,
    stages: IngestStages = IngestStages(),
    show_progress: bool = False,
    on_source_written: Callable[[str], None] | None = None,
) -> IngestResult:
    """Ingest files/folders incrementally: unchanged sources are skipped, changed ones replaced,
    and (with ``prune``) sources gone from the given folders removed.

    Sources are stored, cached and reported under their redacted paths
    (:func:`infra.pii.redact_path`); rows a former version stored under a path that still holds
    personal data are deleted (their file is then ingested again under its redacted name).
    """
    started = time.perf_counter()
    collection = check_name(collection, "collection name")
    files = discover(sources)
    key = tag_key()
    record_roots(collection, sources, key)  # documents are named relative to these (tasks.catalog)
    name = {f.path: redact_path(f.path, key) for f in files}
    exists = client.has_collection(collection)
    manifest = load_manifest(client, collection) if exists else {}
    entries = load_quarantine_cache(collection)
    progress = IngestProgress()
    legacy = [s for s in manifest if redact_path(s, key) != s]
    if legacy:
        progress.written.deleted += delete_sources(client, collection, legacy)
        manifest = {s: st for s, st in manifest.items() if s not in legacy}
        log.info("removed the rows of %d sources stored under unredacted paths", len(legacy))
    qcache = QuarantineCache(collection, {s: v for s, v in entries.items() if redact_path(s, key) == s})
    todo: list[SourceFile] = []
    quarantined: list[Quarantined] = []
    unchanged = 0
    ocr = ocr_key()
    hashes = {name[f.path]: source_key(f.sha256, rules.key, ocr) for f in files}
    ocr_ledger = load_ocr_ledger(collection)
    ocr_items: list[OcrItem] = []
    for f in files:
        h = hashes[name[f.path]]
        state = manifest.get(name[f.path])
        cached = qcache.entries.get(name[f.path], {})
        if state is not None and state.complete(h):
            unchanged += 1  # an archive may hold documents and quarantined members side by side
            progress.indexed.add(name[f.path])
            qcache.written(name[f.path])  # a mark left by a run that stopped just after writing it
            if cached.get("hash") == h:
                quarantined.extend(Quarantined(**q) for q in cached["items"])
        elif (stopped := qcache.stopped(name[f.path], h)) is not None:
            unchanged += 1
            quarantined.append(stopped)
        elif state is None and cached.get("hash") == h and not cached.get("unfinished"):
            unchanged += 1
            quarantined.extend(Quarantined(**q) for q in cached["items"])
        else:
            todo.append(f)
    if todo or not exists:
        ensure_collection(client, collection, embedder.dim)
    parsed = 0
    meter = track(len(todo), f"ingest {collection}", "files",
                  description=f"Ingest into {collection}: % of the {len(todo)} new or changed files written")

    def written(source: str) -> None:
        qcache.written(source)
        meter.advance()
        if on_source_written:
            on_source_written(source)

    pipeline = EmbedWritePipeline(client, collection, embedder, stages, progress, show_progress=show_progress,
                                  on_source_written=written)
    with qcache.run(), meter, pipeline:
        for batch, result in parsed_batches(todo, batch_docs, stages,
                                            lambda b: qcache.starting({name[f.path]: hashes[name[f.path]] for f in b}),
                                            settings=tika_settings, max_archive_members=max_archive_members):
            parsed += len(result.documents)
            quarantined.extend(result.quarantined)
            by_source: dict[str, list[ParsedDocument]] = {name[f.path]: [] for f in batch}
            for doc in result.documents:
                by_source[doc.source].append(doc)
            for f in batch:
                src = name[f.path]
                qcache.parsed(src, hashes[src], [q.__dict__ for q in result.quarantined
                                                 if q.path == src or q.path.startswith(src + "!/")])
            qcache.save()
            ocr_items.extend(record_ocr(ocr_ledger, collection, batch, name, hashes, result.documents))
            groups = [(name[f.path], hashes[name[f.path]], by_source[name[f.path]]) for f in batch]
            pipeline.submit(prepare_documents(embedder, groups, rules, progress))
    pruned = 0
    if prune:
        roots = [Path(redact_path(str(Path(s).expanduser().resolve()), key)) for s in sources]
        gone = [s for s in manifest if _under(s, roots) and s not in hashes]
        if gone:
            progress.written.deleted += delete_sources(client, collection, gone)
            pruned = len(gone)
        for s in [s for s in qcache.entries if _under(s, roots) and s not in hashes]:
            qcache.entries.pop(s)
        for s in [s for s in ocr_ledger if _under(s, roots) and s not in hashes]:
            ocr_ledger.pop(s)
        save_ocr_ledger(collection, ocr_ledger)
    qcache.save()
    reasons = Counter(q.reason for q in quarantined)
    return IngestResult(
        collection=collection, files=len(files), unchanged=unchanged, processed=len(todo), parsed=parsed,
        chunked_documents=progress.chunked_docs,
        quarantined=[QuarantineItem(path=q.path, reason=q.reason, detail=q.detail,
                                    file_indexed=q.path.split("!/", 1)[0] in progress.indexed) for q in quarantined],
        quarantine_counts=dict(sorted(reasons.items())), chunks_written=progress.written.upserted,
        rows_deleted=progress.written.deleted, writes=progress.written.writes, pruned_sources=pruned,
        redactions={k: int(v) for k, v in sorted(progress.redactions.items())},
        total_chunks=total_chunks(client, collection) if client.has_collection(collection) else 0,
        coverage=_coverage(embedder, progress.chunk_texts), seconds=round(time.perf_counter() - started, 3),
        pages_ocr=sum(i.pages_ocr for i in ocr_items), ocr=ocr_items,
    )


def text_documents(items: Sequence[tuple[str, str, str]], namespace: str) -> list[ParsedDocument]:
    """In-memory ``(id, title, text)`` passages (e.g. a QA set's contexts) as documents."""
    docs = []
    for pid, title, text in items:
        path = redact_path(f"{namespace}/{pid}")
        docs.append(ParsedDocument(
            doc_id=doc_id_for(path), source=path, path=path, content_hash=stable_hash(text), text=text,
            meta=DocMeta(content_type="text/plain", title=title, language=guess_language(text)),
        ))
    return docs


def ingest_texts(
    docs: Sequence[ParsedDocument], rules: DocumentRules, *, collection: str, client: Any, embedder: Embedder,
    stages: IngestStages = IngestStages(), show_progress: bool = False,
) -> tuple[int, int]:
    """Write in-memory documents incrementally; returns ``(documents written, rows written)``."""
    collection = check_name(collection, "collection name")
    ensure_collection(client, collection, embedder.dim)
    manifest = load_manifest(client, collection)
    todo = []
    for doc in docs:
        h = stable_hash({"text": doc.content_hash, "pipeline": rules.key})
        state = manifest.get(doc.source)
        if state is None or not state.complete(h):
            todo.append((doc.source, h, [doc]))
    progress = IngestProgress()
    with EmbedWritePipeline(client, collection, embedder, stages, progress, show_progress=show_progress) as pipe:
        for start in range(0, len(todo), 64):
            pipe.submit(prepare_documents(embedder, todo[start : start + 64], rules, progress))
    return len(todo), progress.written.upserted


# ------------------------------------------------------------------------------------
# report


def render_ingest(r: IngestResult, flow: str = "ingest") -> str:
    """Markdown report of one ingestion (titled ``{flow}: {collection}``)."""
    lines = [
        f"# {flow}: {r.collection}", "",
        f"- files: {r.files} ({r.unchanged} unchanged, {r.processed} processed)",
        (f"- documents parsed: {r.parsed}; chunked: {r.chunked_documents}; quarantined: {len(r.quarantined)} "
         f"{r.quarantine_counts}"),
        f"- chunks written: {r.chunks_written}; rows deleted: {r.rows_deleted}; pruned sources: {r.pruned_sources}",
        f"- chunks in the collection: {r.total_chunks}",
        f"- redactions: {r.redactions or 'none'}",
        f"- pages read by OCR: {ocr_summary(r.ocr)}",
        f"- seconds: {r.seconds}",
    ]
    if r.coverage:
        c = r.coverage
        lines.append(f"- embedder {c.model}: unknown pieces {c.unk_share:.1%}, chunks over its {c.window}-token "
                     f"window {c.truncated_share:.1%}" + (f" — {c.advice}" if c.poor else ""))
    items = [Quarantined(q.path, q.reason, q.detail) for q in r.quarantined]
    lines += ["", "## Quarantine", "", render_quarantine(items)]
    if r.ocr:
        lines += ["", "## OCR", "", render_ocr(r.ocr)]
    return "\n".join(lines)
