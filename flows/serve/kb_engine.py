"""What the knowledge-base API does behind its routes (:mod:`flows.serve.kb`): retrieval and
answers over one collection, the documents of a collection with their ingest status, deletions,
and the dispatch of ingest jobs (uploads: :mod:`solutions.rag.upload`).

It joins the same solution and task functions as ``python -m flows.rag`` (Tika parse, redaction
and chunking rules, embeddings, Milvus dense + BM25, weighted fusion, extractive or LLM answers),
with one Milvus client and one embedder per server, loaded on first use.

Ingest jobs run outside the API process: a job is a ``rag-ingest`` flow run, started as the :data:`INGEST_DEPLOYMENT` deployment on
its work pool when the Prefect API has it, else as a child process (``python -m flows.rag.job``,
lower CPU priority, its own session); it records its progress in the job's file under the home
(:mod:`flows.rag.job`), which ``GET /v1/kb/jobs/{id}`` reads. One job at a time per collection
(one dispatch thread per collection here; the collection's lock file across replicas). A job
whose process died (a crash, ``kill -9``, the API restarted meanwhile) is started again
(ingest is incremental) up to :data:`INGEST_ATTEMPTS` times, then fails with the
reason; on start the engine recovers the jobs left queued or running by a process that is gone.
An engine built with ``ingest_in_thread=True`` runs its jobs on a thread of its own process instead, with
the Milvus client and embedder it was handed (the tests' fakes and fuzzers: a child process cannot use them).
Ingest state (the quarantine caches, the path-tag key of the redactor) lives in the configured
home (``INDUSFLOW_HOME``), as for the flows.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import fcntl
import logging
import os
import queue
import secrets
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from infra.embeddings import Embedder, embedder_from_settings, encode_queries
from infra.errors import IndusflowError
from infra.home import HomeLayout
from infra.llm import ChatClient
from infra.milvus import open_client, row_count, shared_uri
from infra.pii import redact_path, redact_text, tag_key
from infra.processes import process_alive
from infra.secrets import child_environment
from infra.settings import KbSettings, get_llm_settings, get_milvus_settings, get_tika_settings
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
    ACTIVE,
    JOB_ID,
    DocumentStatus,
    IngestJob,
    UploadRefused,
    error_text,
    flow_run_name,
    iter_folder,
    load_job,
    now,
    quarantine_reason,
    recorded_jobs,
    safe_document_name,
    save_job,
    status_of,
)
from solutions.rag.support import Support, content_query
from solutions.rag.weights import query_weights
from tasks.catalog import FOLDER, document_names, load_roots
from tasks.chunk import embedder_window
from tasks.documents import reason_text
from tasks.index import delete_sources, load_manifest
from tasks.ingest import (
    IngestResult,
    load_quarantine_cache,
    quarantine_cache_path,
    quarantine_unfinished,
    run_ingest,
    source_key,
)
from tasks.ocr import load_ocr_ledger, ocr_key, save_ocr_ledger
from tasks.retrieve import Mode, Retrieved, best_bm25, retrieve

log = logging.getLogger(__name__)

JOB_MODULE = "flows.rag.job"  # the child's command: python -m flows.rag.job JOB_ID
#: Jobs of one collection queued or running in this process; an upload beyond answers 429 (each
#: job ingests the whole folder, so one waiting job already covers every file uploaded before it).
MAX_ACTIVE_JOBS = 4
#: Times an ingest job is started when its process dies (a crash, kill -9, a server restart while it
#: ran) before it fails with the reason; ingest is incremental, so a re-run resumes.
INGEST_ATTEMPTS = 2
#: Finished ingest jobs this process remembers for GET /v1/kb/jobs/{id} (every job's file under the
#: home answers too).
JOBS_KEPT = 1000
#: The deployment (flow-name/deployment-name) that runs upload ingests on a work pool when PREFECT_API_URL is set,
#: it is registered and a worker polls its pool: prefect.yaml's kb-upload-ingest, a fixed name of the project.
INGEST_DEPLOYMENT = "rag-ingest/kb-upload-ingest"
#: Settings an ingest child never reads (the API's own, the LLM's) and the secrets it needs.
CHILD_DROPPED = ("INDUSFLOW_SERVE_", "INDUSFLOW_LLM_")
CHILD_SECRETS = ("INDUSFLOW_EMBED_API_KEY", "INDUSFLOW_MILVUS_TOKEN")
__all__ = ["DocumentStatus", "IngestJob", "KbEngine", "UploadRefused", "error_text", "safe_document_name"]


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
                 on_job: Callable[[IngestJob], None] | None = None, ingest_in_thread: bool = False) -> None:
        self.collections = collections
        self._how = "thread" if ingest_in_thread else "process"  # a job on a pool's deployment: "deployment"
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
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._last_exit: dict[str, str] = {}
        self._glossaries = GlossaryCache()
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
        """Stop the job workers and close the client it opened. A job on a thread finishes
        first; a child process or deployment run goes on (the next start adopts it), but a
        child of this process is stopped (SIGTERM) when this process is itself not being
        killed: its Milvus Lite store closes with this process."""
        self._closed = True
        for q in self._queues.values():
            q.put(None)
        for worker in self._workers.values():
            worker.join(timeout=60)
        with self._jobs_lock:
            children = list(self._children.values())
        lite = self._client is not None and shared_uri(self._client) is not None
        for proc in children:
            if proc.poll() is None and lite:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
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
        expansion = self.expansion(col, query)
        query = expansion.question
        client = self.client()
        if not client.has_collection(col.milvus):
            return []
        client.load_collection(col.milvus)
        embedder = self.embedder()
        weights = query_weights(embedder, query, HybridWeights()) if mode == "hybrid" else {}
        vectors = encode_queries(embedder, [expansion.query]) if mode != "bm25" else None
        return retrieve(client, col.milvus, [expansion.query], vectors, mode=mode, top_k=top_k, weights=weights)[0]

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

    # -- uploads and jobs
    def submit(self, col: KbCollection, names: list[str]) -> IngestJob:
        """Queue an ingest run of ``col`` for the files just written; returns its job."""
        if self._closed:
            raise IndusflowError("the server is stopping")
        job = IngestJob(job_id=secrets.token_hex(8), collection=col.name,
                        files=[{"name": n, "status": "queued"} for n in names], how=self._how,
                        owner_pid=os.getpid())
        self._record(job)
        self._enqueue(job)
        return job

    def _enqueue(self, job: IngestJob) -> None:
        with self._jobs_lock:
            self._jobs[job.job_id] = job
            while len(self._jobs) > JOBS_KEPT:
                oldest = next(iter(self._jobs.values()))
                if oldest.state in ACTIVE:
                    break
                self._jobs.popitem(last=False)
            if job.collection not in self._queues:
                self._queues[job.collection] = queue.Queue()
                # in the context of the first submit (Prefect's settings live in a context variable)
                worker = threading.Thread(target=contextvars.copy_context().run, args=(self._work, job.collection),
                                          name=f"kb-ingest-{job.collection}", daemon=True)
                self._workers[job.collection] = worker
                worker.start()
        self._queues[job.collection].put(job)

    def job(self, job_id: str) -> IngestJob | None:
        """A job as recorded under the home (by whichever process runs it, or another replica);
        a job of this process not recorded (a full disk) from memory; None if unknown."""
        if not JOB_ID.fullmatch(job_id):
            return None
        job = load_job(self.layout.kb_jobs(), job_id)
        if job is None:
            with self._jobs_lock:
                job = self._jobs.get(job_id)
        return job if job is not None and job.collection in self.collections else None

    def _record(self, job: IngestJob) -> None:
        """Write the job's state under the home (best effort: a full disk does not fail the job)."""
        try:
            save_job(self.layout.kb_jobs(), job)
        except OSError as exc:
            log.warning("cannot record kb job %s: %s", job.job_id, type(exc).__name__)

    def _work(self, name: str) -> None:
        q = self._queues[name]
        while (job := q.get()) is not None:
            if self._closed:
                continue  # left queued: the next start recovers it
            if job.how == "thread":
                self.run_job(job)
            else:
                self.run_outside(job)

    @contextmanager
    def writing(self, col: KbCollection) -> Iterator[None]:
        """Exclusive right to change ``col``'s index: one thread of this process, and one process
        among the replicas and ingest processes sharing the home (a lock file under ``<home>/rag``)."""
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
        """Run one job on this thread (an engine built with ``ingest_in_thread``): ingest, then read back
        the status of each of its files."""
        col = self.collections[job.collection]
        job.state, job.started_at, job.pid, job.attempts = "running", now(), os.getpid(), job.attempts + 1
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

    # -- jobs outside the API process
    def run_outside(self, job: IngestJob) -> None:
        """Run one job as a ``rag-ingest`` flow run outside this process and wait for its end:
        a deployment's run on its work pool, else a child process. A run that ends without
        finishing the job (its process died) is started again, up to the configured attempts."""
        while not self._closed:
            current = load_job(self.layout.kb_jobs(), job.job_id) or job
            if not current.active:
                break
            if (current.pid is not None or current.flow_run_id) and self.job_alive(current):
                # adopted after a restart: its process (or run) still works on it, within the time limit
                deadline = time.monotonic() + self._time_left(current)
                self._wait_record(current, lambda j, d=deadline: not self.job_alive(j) or time.monotonic() > d)
                if current.how == "process" and current.pid and self.job_alive(current) and time.monotonic() > deadline:
                    self._time_out(job.job_id, current.pid)
                    break
                self._last_exit.setdefault(job.job_id, "its process is gone")
                continue
            if current.attempts >= INGEST_ATTEMPTS:
                self._fail(current, f"the ingest stopped before it finished {current.attempts} time(s) "
                           f"({self._last_exit.pop(job.job_id, 'its process is gone')}); upload again or "
                           "run python -m flows.rag ingest")
                break
            current.attempts += 1
            current.state, current.error = "queued", None
            try:
                if self.deployment_ready():
                    self._start_deployment(current)
                    self._wait_record(current, self._run_finished)
                else:
                    proc = self._start_child(current)
                    deadline = time.monotonic() + self.settings.ingest_timeout_s
                    self._wait_record(current, lambda _job, p=proc, d=deadline: p.poll() is not None
                                      or time.monotonic() > d)
                    if proc.poll() is None and time.monotonic() > deadline and not self._closed:
                        self._time_out(job.job_id, proc.pid, proc)
                        break
                    if proc.poll() is not None:
                        code = proc.returncode
                        self._last_exit[job.job_id] = (f"signal {-code}" if code < 0 else f"exit code {code}")
            except Exception as exc:  # noqa: BLE001 - a job that cannot be started fails with the reason
                log.error("kb ingest job %s could not be started: %s", job.job_id, type(exc).__name__)
                self._fail(current, f"the ingest could not be started: {error_text(exc)}")
                break
        final = load_job(self.layout.kb_jobs(), job.job_id)
        if final is not None and not final.active:
            with self._jobs_lock:
                self._jobs[job.job_id] = final
            if self._on_job is not None:
                self._on_job(final)

    def _wait_record(self, job: IngestJob, ended: Callable[[IngestJob], bool], every_s: float = 0.5) -> None:
        """Wait until the job's record says it finished, its run ``ended``, or this engine closes."""
        while not self._closed:
            current = load_job(self.layout.kb_jobs(), job.job_id)
            if current is not None and not current.active:
                return
            if ended(job):
                time.sleep(every_s)  # its last record write may land just after the exit
                return
            time.sleep(every_s)

    def _time_left(self, job: IngestJob) -> float:
        """Seconds an adopted job's child has left of the time limit (from its recorded start)."""
        try:
            started = dt.datetime.fromisoformat(job.started_at or "")
        except ValueError:
            return self.settings.ingest_timeout_s
        return self.settings.ingest_timeout_s - (dt.datetime.now(dt.UTC) - started).total_seconds()

    def _time_out(self, job_id: str, pid: int, proc: subprocess.Popen[bytes] | None = None) -> None:
        """Stop a child past the time limit (its whole process group: it runs in a session of its
        own), quarantine the files it was working on until they change, and fail the job (it is not
        started again)."""
        limit = self.settings.ingest_timeout_s
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        if proc is not None:
            proc.wait(timeout=60)
        else:  # an adopted child (another process's): wait until it is gone
            ends = time.monotonic() + 60
            while process_alive(pid) and time.monotonic() < ends:
                time.sleep(0.1)
        current = load_job(self.layout.kb_jobs(), job_id)
        if current is None or not current.active:
            return  # it finished as the limit passed
        files = quarantine_unfinished(self.collections[current.collection].milvus,
                                      detail=f"the ingest ran past {limit:g} s")
        log.error("kb ingest job %s ran past %g s: stopped, %d file(s) quarantined", job_id, limit, files)
        self._fail(current, f"the ingest ran past its time limit of {limit:g} s (INDUSFLOW_KB_INGEST_TIMEOUT_S); "
                   f"{files} file(s) it was working on are quarantined until they change")

    def queue_full(self, col: KbCollection) -> bool:
        """Whether ``col`` already has :data:`MAX_ACTIVE_JOBS` jobs queued or running in this process."""
        with self._jobs_lock:
            return sum(1 for j in self._jobs.values() if j.collection == col.name and j.active) >= MAX_ACTIVE_JOBS

    def _fail(self, job: IngestJob, reason: str) -> None:
        job.state, job.error, job.finished_at = "failed", reason, now()
        for f in job.files:
            f["status"] = "failed"
        self._record(job)

    def child_env(self) -> dict[str, str]:
        """The environment of an ingest child: this process's with this engine's home, plus the
        address of this process's Milvus Lite store (one process holds the file; the child
        connects to its socket) and the model of an embedder handed to the engine. The child parses
        untrusted uploads: it gets the settings an ingest reads and the keys it needs (embeddings,
        Milvus) only, never the serving secrets (JWT, audit salt, Redis) or the LLM key
        (:func:`infra.secrets.child_environment`)."""
        env = child_environment(os.environ, dropped=CHILD_DROPPED, secrets=CHILD_SECRETS)
        env["INDUSFLOW_HOME"] = str(self.layout.root)  # this engine's home (its job records, its folders)
        uri = shared_uri(self.client()) if not get_milvus_settings().uri else None
        if uri:
            env["INDUSFLOW_MILVUS_URI"] = uri
        model = getattr(self._embedder, "model_ref", None)
        if isinstance(model, str) and model:
            env["INDUSFLOW_EMBED_MODEL"] = model
        return env

    def _start_child(self, job: IngestJob) -> subprocess.Popen[bytes]:
        """``python -m flows.rag.job JOB_ID`` in its own session (it outlives a crash of this
        process and is adopted by the next start), its output in ``<id>.log`` beside the record."""
        job.how, job.pid, job.flow_run_id, job.flow_run_name = "process", None, None, flow_run_name(job)
        self._record(job)
        log_path = self.layout.kb_jobs() / f"{job.job_id}.log"
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            proc = subprocess.Popen([sys.executable, "-m", JOB_MODULE, job.job_id], env=self.child_env(),
                                    stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, start_new_session=True,
                                    cwd=str(Path(__file__).resolve().parents[2]))
        finally:
            os.close(fd)
        with self._jobs_lock:
            self._children[job.job_id] = proc
        job.pid = proc.pid  # the child records its own pid as it starts (this process never writes after it)
        log.info("kb ingest job %s of %s: child process %d", job.job_id, job.collection, proc.pid)
        return proc

    def deployment_ready(self) -> bool:
        """Whether jobs go to the configured deployment: a Prefect API is configured
        (PREFECT_API_URL), it has the deployment and a worker polls its work pool (else a run
        sent there would wait for good: the job runs in a child process instead)."""
        from prefect.settings import PREFECT_API_URL

        if not PREFECT_API_URL.value():
            return False
        from tasks.dispatch import deployment_served

        try:
            return deployment_served(INGEST_DEPLOYMENT)
        except Exception as exc:  # noqa: BLE001 - the API is unreachable: run the job here instead
            log.warning("the Prefect API cannot say whether %s exists (%s): ingest in a child process",
                        INGEST_DEPLOYMENT, type(exc).__name__)
            return False

    def deployment_call(self, job: IngestJob) -> dict[str, Any]:
        """The ``run_deployment`` arguments of a job (the job id is its only parameter: no
        document name or personal data reaches Prefect)."""
        return {"name": INGEST_DEPLOYMENT, "parameters": {"job": job.job_id},
                "flow_run_name": flow_run_name(job), "timeout": 0, "as_subflow": False,
                "tags": ["kb-upload"]}

    def _start_deployment(self, job: IngestJob) -> None:
        from prefect.deployments import run_deployment

        job.how, job.pid, job.flow_run_name = "deployment", None, flow_run_name(job)
        self._record(job)
        run = run_deployment(**self.deployment_call(job))
        job.flow_run_id = str(run.id)
        current = load_job(self.layout.kb_jobs(), job.job_id)
        if current is not None and current.active and current.flow_run_id is None:  # else its run recorded it
            current.flow_run_id = job.flow_run_id
            self._record(current)
        log.info("kb ingest job %s of %s: flow run %s", job.job_id, job.collection, run.id)

    def _run_finished(self, job: IngestJob) -> bool:
        """Whether the job's deployment run is over (a final state, or unknown to the API)."""
        from prefect.client.orchestration import get_client

        if not job.flow_run_id:
            return True
        try:
            with get_client(sync_client=True) as client:
                state = client.read_flow_run(job.flow_run_id).state
        except Exception as exc:  # noqa: BLE001 - the API is away: wait on (the record says when it ends)
            log.debug("cannot read flow run %s: %s", job.flow_run_id, type(exc).__name__)
            return False
        return state is not None and state.is_final()

    # -- recovery after a crash
    def job_alive(self, job: IngestJob) -> bool:
        """Whether a process still works on ``job``: its child (this machine), its deployment run,
        or for a job still queued the API process that queued it."""
        if job.how == "deployment" and job.flow_run_id:
            return not self._run_finished(job)
        if job.pid is not None and process_alive(job.pid, JOB_MODULE if job.how == "process" else None):
            return True
        if job.pid is None and job.owner_pid not in (None, os.getpid()):
            return process_alive(job.owner_pid)  # queued by another replica that still runs
        return False

    def recover(self) -> list[IngestJob]:
        """Jobs left queued or running by a process that is gone (a crash, a restart): each is
        started again (ingest is incremental: a re-run resumes) or, when it was started the most
        times allowed, marked failed with the reason. A job whose child outlived its API is
        adopted (waited for, restarted if it dies). Returns the jobs taken over."""
        taken = []
        for job in recorded_jobs(self.layout.kb_jobs()):
            if not job.active or job.collection not in self.collections:
                continue
            alive = self.job_alive(job)
            if alive and (job.how == "thread" or (job.pid is None and not job.flow_run_id)):
                continue  # a job of another replica that still runs
            if alive:
                log.info("kb ingest job %s: adopting its running process", job.job_id)
            else:
                self._last_exit[job.job_id] = "the server stopped while it ran"
                job.how = self._how
                if job.how == "thread" and job.attempts >= INGEST_ATTEMPTS:
                    self._fail(job, "the server stopped while it ran; upload again")
                    continue
            job.owner_pid = os.getpid()
            self._record(job)
            log.warning("kb ingest job %s of %s: recovered after a restart (%d attempt(s) so far)", job.job_id,
                        job.collection, job.attempts)
            taken.append(job)
            self._enqueue(job)
        return taken

