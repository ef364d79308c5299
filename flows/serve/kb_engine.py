"""What the knowledge-base API does behind its routes (:mod:`flows.serve.kb`): retrieval and
answers over one collection, the documents of a collection with their ingest status, deletions,
and ingest jobs run in the server process (uploads: :mod:`flows.serve.kb_upload`).

It joins the same solution and task functions as ``python -m flows.rag`` (Tika parse, redaction
and chunking rules, embeddings, Milvus dense + BM25, weighted fusion, extractive or LLM answers),
with one Milvus client and one embedder per server, loaded on first use. Ingest jobs run on one
worker thread per collection, one at a time; a job ingests the whole watched folder
(incremental: unchanged files cost a hash) and prunes files gone from it. Ingest state (the
quarantine caches, the path-tag key of the redactor) lives in the configured home
(``INDUSFLOW_HOME``), as for the flows.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import logging
import queue
import re
import secrets
import threading
import traceback
import unicodedata
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from infra.embeddings import Embedder, embedder_from_settings, encode_queries
from infra.errors import IndusflowError
from infra.home import HomeLayout
from infra.llm import ChatClient
from infra.milvus import open_client, row_count
from infra.pii import redact_path, redact_text, tag_key
from infra.settings import KbSettings, get_llm_settings, get_milvus_settings, get_tika_settings
from infra.store import write_json_atomic
from solutions.rag.answer import ABSTAINED, answer_or_abstain, cited_numbers
from solutions.rag.collections import KbCollection
from solutions.rag.config import HybridWeights, IngestParams
from solutions.rag.ingest import DocumentRules, document_rules
from solutions.rag.support import Support, content_query
from solutions.rag.weights import query_weights
from tasks.catalog import FOLDER, document_names, load_roots
from tasks.chunk import embedder_window
from tasks.documents import reason_text
from tasks.index import SourceState, delete_sources, load_manifest
from tasks.ingest import IngestResult, load_quarantine_cache, quarantine_cache_path, run_ingest, source_key
from tasks.ocr import load_ocr_ledger, ocr_key, save_ocr_ledger
from tasks.retrieve import Mode, Retrieved, best_bm25, retrieve

log = logging.getLogger(__name__)

MAX_NAME_BYTES = 200
MAX_RAW_NAME_BYTES = 1024  # a longer name sent by a client is refused, not redacted
JOB_ID = re.compile(r"[0-9a-f]{16}")


class UploadRefused(IndusflowError):
    """An uploaded file cannot be stored (bad name, too large, a symlink in the way)."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


# ------------------------------------------------------------------------------------
# names and files


def safe_document_name(raw: str | None) -> str:
    """The name an uploaded file is stored under: the last path component of what the client
    sent, without control characters or leading dots, redacted (:func:`infra.pii.redact_path`: a
    phone number in a name becomes a tagged placeholder), then cut to at most 200 UTF-8 bytes
    (extension kept). Cut after redaction: a placeholder is longer than what it replaces, and a
    name cut first could grow past the file system's 255 bytes (and half a number would escape
    the redactor). ValueError (naming no part of the name) when nothing usable is left, or when
    the name is over 1,024 bytes before redaction."""
    name = unicodedata.normalize("NFC", raw or "").replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(ch for ch in name if ch.isprintable()).strip().lstrip(".").strip()
    if not name or name in {".", ".."}:
        raise ValueError("the file name has no usable characters")
    if len(name.encode()) > MAX_RAW_NAME_BYTES:
        raise ValueError(f"the file name is {len(name.encode())} bytes long; at most {MAX_RAW_NAME_BYTES} are accepted")
    name = redact_path(name).lstrip(".").strip()
    if len(name.encode()) > MAX_NAME_BYTES:
        stem, dot, ext = name.rpartition(".")
        ext = dot + ext if dot and len(ext.encode()) <= 16 else ""
        base = stem if ext else name
        while len((base + ext).encode()) > MAX_NAME_BYTES:
            base = base[:-1]
        name = base.rstrip() + ext
    if not name:
        raise ValueError("the file name has no usable characters")
    return name


def iter_folder(folder: Path) -> Iterator[Path]:
    """Regular files under ``folder`` as ingest sees them (no hidden names, no symlinks)."""
    for child in sorted(folder.rglob("*")):
        rel = child.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts) or child.is_symlink() or not child.is_file():
            continue
        yield child


# ------------------------------------------------------------------------------------
# documents and their status


@dataclass
class DocumentStatus:
    """One document of a collection as the API lists it."""

    name: str
    status: str  # indexed | quarantined | pending
    chunks: int = 0
    reason: str | None = None
    quarantined_members: int = 0
    in_folder: bool = True
    pages_ocr: int | None = None  # pages (image frames) read by OCR, None when none were
    updated_at: str | None = None
    source: str = field(default="", repr=False)  # the stored (redacted) source path
    path: Path | None = field(default=None, repr=False)  # the file, when in the folder

    def public(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "chunks": self.chunks, "reason": self.reason,
                "quarantined_members": self.quarantined_members, "in_folder": self.in_folder,
                "pages_ocr": self.pages_ocr, "updated_at": self.updated_at}


def quarantine_reason(items: list[dict[str, Any]], source: str) -> str | None:
    """Why the file was not indexed, in words (``password-protected``, ``not a document``…):
    its own record's reason, else its first member's. Never the record's detail (parser and
    exception text; it stays in the ingest's report)."""
    if not items:
        return None
    own = [q for q in items if q.get("path") == source]
    if own:
        return reason_text(str(own[0].get("reason", "")))
    return f"{len(items)} member{'s' if len(items) != 1 else ''} not indexed: {reason_text(str(items[0].get('reason', '')))}"


def status_of(source: str, file_hash: str, state: SourceState | None, cached: dict[str, Any]) -> tuple[str, int, str | None, int]:
    """``(status, chunks, reason, quarantined members)`` of one file from what ingest recorded."""
    chunks = sum(state.chunks.values()) if state else 0
    items = cached.get("items", []) if cached.get("hash") == file_hash else []
    members = sum(1 for q in items if q.get("path") != source)
    if state is not None and state.complete(file_hash):
        return "indexed", chunks, None, members
    if state is None and items:
        return "quarantined", 0, quarantine_reason(items, source), members
    return "pending", chunks, None, 0


class FileHashes:
    """SHA-256 of files, remembered by (path, size, mtime) so listing a folder re-reads only
    what changed."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[int, int, str]] = {}
        self._lock = threading.Lock()

    def sha256(self, path: Path) -> str:
        from infra.store import sha256_file

        stat = path.stat()
        key = str(path)
        with self._lock:
            known = self._known.get(key)
        if known and known[0] == stat.st_size and known[1] == stat.st_mtime_ns:
            return known[2]
        digest = sha256_file(path)
        with self._lock:
            self._known[key] = (stat.st_size, stat.st_mtime_ns, digest)
        return digest


# ------------------------------------------------------------------------------------
# jobs


@dataclass
class IngestJob:
    """One ingest run asked for by an upload."""

    job_id: str
    collection: str
    files: list[dict[str, Any]]
    state: str = "queued"  # queued | running | done | failed
    created_at: str = field(default_factory=lambda: now())
    started_at: str | None = None
    finished_at: str | None = None
    error: str | None = None
    counts: dict[str, int] = field(default_factory=dict)

    def public(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "collection": self.collection, "state": self.state,
                "files": [dict(f) for f in self.files],
                "created_at": self.created_at, "started_at": self.started_at, "finished_at": self.finished_at,
                "error": self.error, "counts": dict(self.counts)}


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def error_text(exc: BaseException) -> str:
    """What a caller may see of a failure: our own errors' messages (they name no secret and no
    personal data) or the exception type."""
    if isinstance(exc, IndusflowError | ValueError):
        return redact_text(" ".join(str(exc).split()))[:500]
    return f"internal error ({type(exc).__name__})"


# ------------------------------------------------------------------------------------
# the engine


class KbEngine:
    """Retrieval, answers, documents and ingest jobs of the served collections.

    Args:
        collections: the served collections by name.
        layout: the home.
        settings: the knowledge-base settings.
        client: a Milvus client (default: the configured server, or the home's Milvus Lite file).
        embedder: the embedder (default: the configured one), loaded on first use.
        on_job: called with each job when it finishes (metrics).
    """

    def __init__(self, collections: dict[str, KbCollection], layout: HomeLayout, settings: KbSettings, *,
                 client: Any = None, embedder: Embedder | None = None,
                 on_job: Callable[[IngestJob], None] | None = None) -> None:
        self.collections = collections
        self.layout = layout
        self.settings = settings
        self.params = IngestParams()
        self._client = client
        self._own_client = client is None
        self._embedder = embedder
        self._init_lock = threading.Lock()
        self._col_locks = {name: threading.Lock() for name in collections}
        self._queues: dict[str, queue.Queue[IngestJob | None]] = {}
        self._workers: dict[str, threading.Thread] = {}
        self._jobs: OrderedDict[str, IngestJob] = OrderedDict()
        self._jobs_lock = threading.Lock()
        self._hashes = FileHashes()
        self._names: dict[str, dict[str, str]] = {}  # per collection: source -> name, from the last listing
        self._on_job = on_job
        self._closed = False

    # -- shared resources, loaded on first use
    def client(self) -> Any:
        with self._init_lock:
            if self._client is None:
                uri = None if get_milvus_settings().uri else str(self.layout.milvus() / "rag.db")
                self._client = open_client(uri=uri)
            return self._client

    def embedder(self) -> Embedder:
        with self._init_lock:
            if self._embedder is None:
                self._embedder = embedder_from_settings()
            warm = getattr(self._embedder, "warm_up", None)
            if warm is not None:
                warm()
            return self._embedder

    def rules(self) -> DocumentRules:
        embedder = self.embedder()
        return document_rules(self.params.chunk, self.params.redaction, embedder.name, embedder_window(embedder))

    def close(self) -> None:
        """Stop the job workers (a running job finishes first) and close the client it opened."""
        self._closed = True
        for q in self._queues.values():
            q.put(None)
        for worker in self._workers.values():
            worker.join(timeout=60)
        if self._own_client and self._client is not None:
            self._client.close()
            self._client = None

    # -- retrieval and answers
    def search(self, col: KbCollection, query: str, *, top_k: int, mode: Mode) -> list[Retrieved]:
        """The ``top_k`` chunks of ``col`` for ``query`` (redacted first, as the stored chunks are)."""
        query = redact_text(query)
        client = self.client()
        if not client.has_collection(col.milvus):
            return []
        client.load_collection(col.milvus)
        embedder = self.embedder()
        hybrid = HybridWeights()
        weights = query_weights(embedder, query, hybrid) if mode == "hybrid" else {}
        vectors = encode_queries(embedder, [query]) if mode != "bm25" else None
        return retrieve(client, col.milvus, [query], vectors, mode=mode, top_k=top_k, weights=weights,
                        fusion=hybrid.fusion, rrf_k=hybrid.rrf_k)[0]

    def chat(self) -> ChatClient | None:
        """The configured chat endpoint, or None (extractive answers)."""
        settings = get_llm_settings()
        return ChatClient(settings) if settings.configured() else None

    def answer(self, col: KbCollection, question: str, *, top_k: int, mode: Mode,
               stream_to: TextIO | None = None, on_extractive: Callable[[str], None] | None = None,
               ) -> tuple[str, str, list[Retrieved], list[int], Support]:
        """``(answer, mode, hits, cited numbers, support)`` for ``question`` over ``col``: an
        answer only when the passages support one (else the abstention sentence, mode ``none``).

        With ``stream_to`` an LLM answer is written there piece by piece (redacted on the fly) as
        it comes; an extractive one (or the abstention) is handed whole to ``on_extractive``.
        """
        question = redact_text(question)
        hits = self.search(col, question, top_k=top_k, mode=mode)
        chat = self.chat()
        client = self.client()
        lexical = bool(hits) and mode != "dense"  # the support check's BM25 probe (solutions.rag.support)
        text, kind, support = answer_or_abstain(
            question, hits, chat, collection=col.name, embedder=self.embedder().name if mode != "bm25" else None,
            n_chunks=row_count(client, col.milvus) if hits else None, mode=mode,
            content_bm25=best_bm25(client, col.milvus, content_query(question)) if lexical else None,
            stream_to=stream_to if chat else None)
        if kind != "llm" and on_extractive is not None:
            on_extractive(text)
        return text, kind, hits, cited_numbers(text, len(hits)) if kind != ABSTAINED else [], support

    # -- documents
    def documents(self, col: KbCollection) -> list[DocumentStatus]:
        """Every document of the collection: the files of its folder with their status, then what
        the store holds from elsewhere (``python -m flows.rag ingest DIR``: indexed, or
        quarantined with its reason), each named inside the collection (:mod:`tasks.catalog`)."""
        client = self.client()
        manifest = load_manifest(client, col.milvus) if client.has_collection(col.milvus) else {}
        qcache = load_quarantine_cache(col.milvus)
        ocr = {source: sum(int(d.get("pages_ocr", 0)) for d in entry.get("documents", [])) or None
               for source, entry in load_ocr_ledger(col.milvus).items()}
        key = tag_key()
        rules_key = self.rules().key
        ocr_setup = ocr_key()
        folder = col.folder.resolve()
        out: list[DocumentStatus] = []
        seen: set[str] = set()
        for path in iter_folder(folder):
            source = redact_path(str(path.resolve()), key)
            file_hash = source_key(self._hashes.sha256(path), rules_key, ocr_setup)
            status, chunks, reason, members = status_of(source, file_hash, manifest.get(source), qcache.get(source, {}))
            mtime = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC).isoformat(timespec="seconds")
            out.append(DocumentStatus(name=redact_path(path.relative_to(folder).as_posix(), key), status=status,
                                      chunks=chunks, reason=reason, quarantined_members=members, updated_at=mtime,
                                      pages_ocr=ocr.get(source), source=source, path=path))
            seen.add(source)
        others = sorted((set(manifest) | set(qcache)) - seen)
        names = document_names(others, self.roots(col, key), taken={d.name for d in out})
        for source in others:
            state, cached = manifest.get(source), qcache.get(source, {})
            items = list(cached.get("items", []))
            if state is not None:
                current = cached.get("hash") in state.hashes
                members = sum(1 for q in items if q.get("path") != source) if current else 0
                out.append(DocumentStatus(name=names[source], status="indexed", chunks=sum(state.chunks.values()),
                                          quarantined_members=members, in_folder=False, pages_ocr=ocr.get(source),
                                          source=source))
            elif items:
                out.append(DocumentStatus(name=names[source], status="quarantined",
                                          reason=quarantine_reason(items, source),
                                          quarantined_members=sum(1 for q in items if q.get("path") != source),
                                          in_folder=False, source=source))
        with self._init_lock:
            self._names[col.name] = {d.source: d.name for d in out}
        return out

    def roots(self, col: KbCollection, key: bytes | None = None) -> dict[str, str]:
        """The roots ingested into ``col``, its watched folder among them."""
        return load_roots(col.milvus) | {redact_path(str(col.folder.resolve()), key): FOLDER}

    def document_name(self, col: KbCollection, source: str, path: str = "") -> str:
        """A stored chunk's document as the documents list names it (an archive member:
        ``archive!/member``): the name of the last listing, else its path relative to its root."""
        with self._init_lock:
            base = self._names.get(col.name, {}).get(source)
        if base is None:
            base = document_names([source], self.roots(col))[source] if source else ""
        return base + path[len(source):] if source and path.startswith(source) else base or path

    def delete(self, col: KbCollection, name: str) -> tuple[DocumentStatus, int] | None:
        """Remove a document's chunks (dense and BM25 live in the same rows), its quarantine
        record and, when it is in the folder, the file. None when there is no such document."""
        with self.writing(col):  # never while an ingest of the collection writes
            doc = next((d for d in self.documents(col) if d.name == name), None)
            if doc is None:
                return None
            client = self.client()
            removed = delete_sources(client, col.milvus, [doc.source]) if client.has_collection(col.milvus) else 0
            qcache = load_quarantine_cache(col.milvus)
            if qcache.pop(doc.source, None) is not None:
                write_json_atomic(quarantine_cache_path(col.milvus), qcache)
            ledger = load_ocr_ledger(col.milvus)
            if ledger.pop(doc.source, None) is not None:
                save_ocr_ledger(col.milvus, ledger)
            if doc.path is not None and not doc.path.is_symlink():
                doc.path.unlink(missing_ok=True)
            return doc, removed

    # -- uploads and jobs
    def submit(self, col: KbCollection, names: list[str]) -> IngestJob:
        """Queue an ingest run of ``col`` for the files just written; returns its job."""
        if self._closed:
            raise IndusflowError("the server is stopping")
        job = IngestJob(job_id=secrets.token_hex(8), collection=col.name,
                        files=[{"name": n, "status": "queued"} for n in names])
        with self._jobs_lock:
            self._jobs[job.job_id] = job
            while len(self._jobs) > self.settings.jobs_kept:
                oldest = next(iter(self._jobs.values()))
                if oldest.state in ("queued", "running"):
                    break
                self._jobs.popitem(last=False)
            if col.name not in self._queues:
                self._queues[col.name] = queue.Queue()
                worker = threading.Thread(target=self._work, args=(col.name,), name=f"kb-ingest-{col.name}",
                                          daemon=True)
                self._workers[col.name] = worker
                worker.start()
        self._record(job)
        self._queues[col.name].put(job)
        return job

    def job(self, job_id: str) -> IngestJob | None:
        """A job of this process, else one another replica sharing the home recorded; None if unknown."""
        with self._jobs_lock:
            job = self._jobs.get(job_id)
        if job is not None or not JOB_ID.fullmatch(job_id):
            return job
        try:
            data = json.loads((self.layout.kb_jobs() / f"{job_id}.json").read_text())
        except (OSError, ValueError):
            return None
        fields = {k: data.get(k) for k in IngestJob.__dataclass_fields__ if k in data}
        return IngestJob(**fields) if fields.get("collection") in self.collections else None

    def _record(self, job: IngestJob) -> None:
        """Write the job's state under the home (best effort: a full disk does not fail the job)."""
        try:
            write_json_atomic(self.layout.kb_jobs() / f"{job.job_id}.json", job.public())
        except OSError as exc:
            log.warning("cannot record kb job %s: %s", job.job_id, type(exc).__name__)

    def _work(self, name: str) -> None:
        q = self._queues[name]
        while (job := q.get()) is not None:
            self.run_job(job)

    @contextmanager
    def writing(self, col: KbCollection) -> Iterator[None]:
        """Exclusive right to change ``col``'s index: one thread of this process, and one process
        among the replicas sharing the home (a lock file under ``<home>/rag``)."""
        with self._col_locks[col.name], open(self.layout.rag() / f"{col.milvus}.kb.lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def ingest(self, col: KbCollection) -> IngestResult:
        """Ingest the collection's folder now (incremental; files gone from it are pruned)."""
        with self.writing(col):
            return run_ingest([str(col.folder)], self.rules(), collection=col.milvus, client=self.client(),
                              embedder=self.embedder(), batch_docs=self.params.batch_docs,
                              max_archive_members=self.params.max_archive_members, prune=True,
                              tika_settings=get_tika_settings())

    def run_job(self, job: IngestJob) -> None:
        """Run one job: ingest, then read back the status of each of its files."""
        col = self.collections[job.collection]
        job.state, job.started_at = "running", now()
        for f in job.files:
            f["status"] = "running"
        self._record(job)
        try:
            result = self.ingest(col)
            by_name = {d.name: d for d in self.documents(col)}
            for f in job.files:
                doc = by_name.get(f["name"])
                if doc is None:
                    f.update(status="gone")
                else:
                    f.update(status=doc.status, chunks=doc.chunks, reason=doc.reason)
            job.counts = {"files": result.files, "processed": result.processed, "chunks_written": result.chunks_written,
                          "quarantined": len(result.quarantined), "rows_deleted": result.rows_deleted}
            job.state = "done"
        except Exception as exc:  # noqa: BLE001 - a failed job is reported on the job, the worker goes on
            # the traceback without the message: a message may quote a document's name or text
            log.error("kb ingest job %s of %s failed: %s\n%s", job.job_id, job.collection, type(exc).__name__,
                      "".join(traceback.format_tb(exc.__traceback__)))
            job.state, job.error = "failed", error_text(exc)
            for f in job.files:
                f["status"] = "failed"
        finally:
            job.finished_at = now()
            self._record(job)
            if self._on_job is not None:
                self._on_job(job)
