"""An upload's ingest job, run as a ``rag-ingest`` flow run outside the API process.

The knowledge-base API (:mod:`flows.serve.kb`) stages the uploaded files in the collection's
watched folder, records the job under ``<home>/serving/kb-jobs/<id>.json`` and creates a run of
a ``rag-ingest`` deployment with ``job=JOB_ID`` (:mod:`flows.serve.kb_jobs`: its own Prefect runner's,
:mod:`flows.rag.runner`, or a team server's on a work pool). The flow run ingests the
collection's whole watched folder (incremental: unchanged files cost a hash; files gone from it
are pruned) while holding the collection's write lock (the file ``<home>/rag/<milvus>.kb.lock``,
the lock the API's deletions take), and writes the job's progress to its record: ``running``
with its process id and flow run, then ``done`` with the counts and each uploaded file's status,
or ``failed`` with the reason. The flow run is named ``kb-<collection>-<job id>``: no document
name reaches Prefect.
"""

from __future__ import annotations

import fcntl
import logging
import os
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from flows.rag.steps import ingest_sources
from infra.embeddings import Embedder
from infra.home import HomeLayout, home_layout
from infra.pii import redact_path, tag_key
from infra.settings import get_tika_settings
from infra.store import sha256_file
from solutions.rag.collections import KbCollection, kb_collection
from solutions.rag.config import IngestParams
from solutions.rag.ingest import document_rules
from solutions.rag.library import IngestJob, error_text, load_job, now, save_job, status_of
from tasks.chunk import embedder_window
from tasks.documents import reason_text
from tasks.index import load_manifest
from tasks.ingest import IngestResult, IngestStages, load_quarantine_cache, source_key
from tasks.ocr import ocr_key

log = logging.getLogger(__name__)

#: CPU niceness an ingest child adds to its own (the API it serves keeps its priority: its requests come first).
INGEST_NICENESS = 10


class JobNotFound(LookupError):
    """No readable record for the job id."""


@contextmanager
def collection_lock(layout: HomeLayout, col: KbCollection) -> Iterator[None]:
    """The collection's write lock (shared with the API's deletions and any replica)."""
    with open(layout.rag() / f"{col.milvus}.kb.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def file_statuses(job: IngestJob, col: KbCollection, *, client: Any, embedder: Embedder,
                  params: IngestParams) -> None:
    """Set each file of the job to its status after the ingest (indexed, quarantined with the
    reason, pending, or gone when it left the folder)."""
    rules_key = document_rules(params.chunk, params.redaction, embedder.name, embedder_window(embedder)).key
    manifest = load_manifest(client, col.milvus) if client.has_collection(col.milvus) else {}
    qcache = load_quarantine_cache(col.milvus)
    key, ocr = tag_key(), ocr_key()
    folder = col.folder.resolve()
    for f in job.files:
        path = folder / f["name"]
        if path.is_symlink() or not path.is_file():
            f.update(status="gone")
            continue
        source = redact_path(str(path.resolve()), key)
        status, chunks, reason, _ = status_of(source, source_key(sha256_file(path), rules_key, ocr),
                                              manifest.get(source), qcache.get(source, {}), reason_text)
        f.update(status=status, chunks=chunks, reason=reason)


def current_flow_run() -> tuple[str | None, str | None]:
    """The id and name of the flow run this runs in (None outside one)."""
    from prefect.runtime import flow_run

    run_id = flow_run.get_id()
    return (str(run_id), str(flow_run.get_name())) if run_id else (None, None)


def run_kb_job(job_id: str, *, client: Any, embedder: Embedder, stages: IngestStages | None = None,
               layout: HomeLayout | None = None) -> IngestResult:
    """Run the recorded job ``job_id``: ingest its collection's watched folder (pruned) under the
    collection's write lock, recording its progress. Raises what failed, after recording it."""
    layout = layout or home_layout()
    folder = layout.kb_jobs()
    job = load_job(folder, job_id)
    if job is None:
        raise JobNotFound(f"no ingest job {job_id} is recorded under the home")
    col = kb_collection(job.collection, layout)
    params = IngestParams(collection=job.collection, prune=True)
    run_id, run_name = current_flow_run()
    job.pid, job.flow_run_id, job.flow_run_name = os.getpid(), run_id or job.flow_run_id, run_name or job.flow_run_name
    save_job(folder, job)  # still queued: it may wait for the lock behind another writer
    try:
        with collection_lock(layout, col):
            job.state, job.started_at, job.error = "running", now(), None
            for f in job.files:
                f["status"] = "running"
            save_job(folder, job)
            result = ingest_sources([str(col.folder)], params, client=client, embedder=embedder,
                                    tika_settings=get_tika_settings(), stages=stages)
            file_statuses(job, col, client=client, embedder=embedder, params=params)
        job.counts = {"files": result.files, "processed": result.processed, "chunks_written": result.chunks_written,
                      "quarantined": len(result.quarantined), "rows_deleted": result.rows_deleted}
        job.state = "done"
        return result
    except BaseException as exc:
        if not isinstance(exc, Exception):  # stopped (SIGTERM, Ctrl-C): left for the API to start again
            job.state, job.error = "queued", "interrupted"
            raise
        # the traceback without the message: a message may quote a document's name or text
        log.error("kb ingest job %s of %s failed: %s\n%s", job.job_id, job.collection, type(exc).__name__,
                  "".join(traceback.format_tb(exc.__traceback__)))
        job.state, job.error = "failed", error_text(exc)
        for f in job.files:
            f["status"] = "failed"
        raise
    finally:
        job.finished_at = None if job.active else now()
        save_job(folder, job)
