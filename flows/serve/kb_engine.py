"""What the knowledge-base API does behind its routes (:mod:`flows.serve.kb`): retrieval and
answers over one collection, the documents of a collection with their ingest status, deletions,
and the dispatch of ingest jobs (uploads: :mod:`solutions.rag.upload`).

It joins the same solution and task functions as ``python -m flows.rag`` (Tika parse, redaction
and chunking rules, embeddings, Milvus dense + BM25, weighted fusion, extractive or LLM answers),
with one Milvus client and one embedder per server, loaded on first use.

Ingest jobs (:mod:`flows.serve.kb_jobs`: a deployment's flow run, or a thread with the tests' fakes) are the
engine's :class:`~flows.serve.kb_jobs.IngestJobs` part.
Ingest state (the quarantine caches, the path-tag key of the redactor) lives in the configured
home (``INDUSFLOW_HOME``), as for the flows.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from flows.serve.kb_jobs import MAX_ACTIVE_JOBS, IngestJobs
from infra.embeddings import Embedder, embedder_from_settings, encode_queries
from infra.home import HomeLayout
from infra.llm import ChatClient
from infra.milvus import open_client, row_count
from infra.pii import redact_path, redact_text, tag_key
from infra.settings import KbSettings, get_llm_settings, get_milvus_settings
from infra.store import write_json_atomic
from solutions.rag.answer import ABSTAINED, answer_or_abstain, cited_numbers
from solutions.rag.collections import KbCollection
from solutions.rag.config import HybridWeights, IngestParams
from solutions.rag.glossary import (
    Expansion,
    Glossary,
    GlossaryCache,
    GlossaryError,
    expand,
    glossary_path,
    in_passage_words,
)
from solutions.rag.ingest import DocumentRules, document_rules
from solutions.rag.library import (
    DocumentStatus,
    IngestJob,
    UploadRefused,
    error_text,
    iter_folder,
    quarantine_reason,
    safe_document_name,
    status_of,
)
from solutions.rag.support import Support, content_query
from solutions.rag.weights import query_weights
from tasks.catalog import FOLDER, document_names, load_roots
from tasks.chunk import embedder_window
from tasks.documents import reason_text
from tasks.index import delete_sources, load_manifest
from tasks.ingest import (
    load_quarantine_cache,
    quarantine_cache_path,
    source_key,
)
from tasks.ocr import load_ocr_ledger, ocr_key, save_ocr_ledger
from tasks.retrieve import Mode, Retrieved, best_bm25, retrieve

log = logging.getLogger(__name__)

__all__ = ["MAX_ACTIVE_JOBS", "DocumentStatus", "IngestJob", "KbEngine", "UploadRefused", "error_text", "safe_document_name"]


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


@dataclass(frozen=True)
class Search:
    """One search of :meth:`KbEngine.search_many`: a query (not yet redacted) over a collection."""

    col: KbCollection
    query: str
    top_k: int
    mode: Mode


# ------------------------------------------------------------------------------------
# the engine


class KbEngine(IngestJobs):
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
                 on_job: Callable[[IngestJob], None] | None = None, ingest_in_thread: bool = False) -> None:
        self.collections = collections
        self.layout = layout
        self.settings = settings
        self.params = IngestParams()
        self._client = client
        self._own_client = client is None
        self._embedder = embedder
        self._init_lock = threading.Lock()
        self._col_locks = {name: threading.Lock() for name in collections}
        self._hashes = FileHashes()
        self._names: dict[str, dict[str, str]] = {}  # per collection: source -> name, from the last listing
        self._glossaries = GlossaryCache()
        self.init_jobs(ingest_in_thread=ingest_in_thread, on_job=on_job)
        self._glossary_lock = threading.Lock()  # not the init lock: the first read loads jieba's dictionary

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
        """Stop the ingest jobs (:meth:`~flows.serve.kb_jobs.IngestJobs.close_jobs`) and close the client it opened."""
        self.close_jobs()
        if self._own_client and self._client is not None:
            self._client.close()
            self._client = None

    # -- retrieval and answers
    def glossary(self, col: KbCollection) -> Glossary | None:
        """The collection's glossary (:mod:`solutions.rag.glossary`), re-read when its file
        changes; None when it has none. Raises GlossaryError when its file is bad."""
        with self._glossary_lock:
            return self._glossaries.get(glossary_path(col.name, self.layout))

    def expansion(self, col: KbCollection, query: str) -> Expansion:
        """``query`` (redacted) and the query retrieval uses: with the other forms of each
        glossary term it names. A bad glossary file is logged and left out (its upload route
        refuses bad files; ``GET .../glossary`` names the bad lines of one edited by hand)."""
        try:
            glossary = self.glossary(col)
        except GlossaryError as exc:
            log.error("the glossary of collection %s is not used: %s", col.name, exc)
            glossary = None
        return expand(glossary, redact_text(query))

    def search(self, col: KbCollection, query: str, *, top_k: int, mode: Mode) -> list[Retrieved]:
        """The ``top_k`` chunks of ``col`` for ``query`` (redacted first, as the stored chunks are;
        expanded with the collection's glossary)."""
        return self.search_many([Search(col, query, top_k, mode)])[0][0]

    def search_many(self, searches: Sequence[Search]) -> list[tuple[list[Retrieved], Expansion]]:
        """The hits of each search (as :meth:`search`) and its glossary expansion: every query that
        needs a vector embedded in one embedder call, the searches of one collection, retriever,
        depth and fusion weights in one Milvus call."""
        expansions = [self.expansion(s.col, s.query) for s in searches]
        out: list[tuple[list[Retrieved], Expansion]] = [([], e) for e in expansions]
        client = self.client()
        live = [k for k, s in enumerate(searches) if client.has_collection(s.col.milvus)]
        dense = [k for k in live if searches[k].mode != "bm25"]
        embedder = self.embedder() if dense else None
        vectors = dict(zip(dense, encode_queries(embedder, [expansions[k].query for k in dense]), strict=True)) \
            if embedder is not None else {}
        groups: dict[tuple[str, Mode, int, tuple[tuple[str, float], ...]], list[int]] = {}
        for k in live:
            s = searches[k]
            weights = query_weights(embedder, expansions[k].question, HybridWeights()) \
                if embedder is not None and s.mode == "hybrid" else {}
            groups.setdefault((s.col.milvus, s.mode, s.top_k, tuple(sorted(weights.items()))), []).append(k)
        for (milvus, mode, top_k, weights), ks in groups.items():
            client.load_collection(milvus)
            found = retrieve(client, milvus, [expansions[k].query for k in ks],
                             np.stack([vectors[k] for k in ks]) if mode != "bm25" else None,
                             mode=mode, top_k=top_k, weights=dict(weights))
            for k, hits in zip(ks, found, strict=True):
                out[k] = (hits, expansions[k])
        return out

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
        # a glossary term asked by another name: the answer step reads the passages' name for it
        question = in_passage_words(self.expansion(col, question), [str(h.fields.get("text", "")) for h in hits])
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
            status, chunks, reason, members = status_of(source, file_hash, manifest.get(source), qcache.get(source, {}),
                                                         reason_text)
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
                                          reason=quarantine_reason(items, source, reason_text),
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
