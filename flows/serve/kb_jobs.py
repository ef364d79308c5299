"""Ingest jobs of the knowledge-base API (:class:`IngestJobs`, a part of :class:`~flows.serve.kb_engine.KbEngine`).

An upload's ingest is a ``rag-ingest`` flow run of a deployment, created by ``submit`` with
``run_deployment(timeout=0)`` and executed by Prefect: the :data:`INGEST_DEPLOYMENT` on its work pool when a
Prefect server serves it (a worker polls the pool), else the collection's deployment that this API's Prefect
runner serves against Prefect's temporary server (:mod:`flows.serve.kb_runner`, started with the server).
There is no queue here: Prefect orders the runs. On the runner each collection's deployment has a
concurrency limit of 1 (a second upload's run waits in Prefect as ``AwaitingConcurrencySlot``) and the
runner's ``limit`` bounds the runs at once; on a team server the runs of one collection wait for the
collection's write lock inside the run (:func:`flows.rag.job.collection_lock`, the lock that also keeps the
API's deletions out). The run records its progress in the job's file under the home (:mod:`flows.rag.job`),
which ``GET /v1/kb/jobs/{id}`` reads (Prefect's run holds no per-file status).

What Prefect does not do on the temporary server (re-running a crashed run, stopping one past the time
limit, taking over a dead server's runs) is :class:`~flows.serve.kb_watch.RunWatcher`, the part of this
class that watches the runs.

An engine built with ``ingest_in_thread=True`` runs each job on a thread of its own process instead, with the
Milvus client and embedder it was handed: the tests' fakes and fuzzers (an in-memory Milvus client, an
embedder answering from a local HTTP stub of the test) are objects of the test process that a run's process
cannot use; one job at a time per collection there comes from :meth:`IngestJobs.writing`.
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import logging
import os
import secrets
import threading
import traceback
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from flows.serve.kb_watch import RunWatcher
from infra.errors import IndusflowError
from infra.home import HomeLayout
from infra.milvus import shared_uri
from infra.secrets import child_environment
from infra.settings import KbSettings, get_milvus_settings, get_tika_settings
from solutions.rag.collections import KbCollection
from solutions.rag.config import IngestParams
from solutions.rag.ingest import DocumentRules
from solutions.rag.library import (
    JOB_ID,
    DocumentStatus,
    IngestJob,
    error_text,
    flow_run_name,
    load_job,
    now,
    save_job,
)
from tasks.ingest import (
    IngestResult,
    run_ingest,
)

log = logging.getLogger(__name__)

#: Jobs of one collection active in this process; an upload beyond answers 429 (each job ingests the
#: whole folder, so one waiting job already covers every file uploaded before it).
MAX_ACTIVE_JOBS = 4
#: Finished ingest jobs this process remembers (every job's file under the home answers too).
JOBS_KEPT = 1000
#: The deployment (flow-name/deployment-name) that runs upload ingests on a work pool when PREFECT_API_URL is set,
#: it is registered and a worker polls its pool: prefect.yaml's kb-upload-ingest, a fixed name of the project.
INGEST_DEPLOYMENT = "rag-ingest/kb-upload-ingest"
#: Settings an ingest run never reads (the API's own, the LLM's) and the secrets it needs.
CHILD_DROPPED = ("INDUSFLOW_SERVE_", "INDUSFLOW_LLM_")
CHILD_SECRETS = ("INDUSFLOW_EMBED_API_KEY", "INDUSFLOW_MILVUS_TOKEN")


class IngestJobs(RunWatcher):
    """The engine's ingest jobs: flow runs created on upload (or threads of this process), recorded under
    the home, watched for what Prefect does not do. :class:`~flows.serve.kb_engine.KbEngine` calls
    :meth:`init_jobs` and provides what they read of it (below)."""

    layout: HomeLayout
    settings: KbSettings
    collections: dict[str, KbCollection]
    params: IngestParams
    client: Callable[[], Any]
    embedder: Callable[[], Any]
    rules: Callable[[], DocumentRules]
    writing: Callable[[KbCollection], AbstractContextManager[None]]
    documents: Callable[[KbCollection], list[DocumentStatus]]
    _embedder: Any
    _col_locks: dict[str, threading.Lock]

    def init_jobs(self, *, ingest_in_thread: bool, on_job: Callable[[IngestJob], None] | None) -> None:
        """The job state: the jobs of this process, the watcher of their runs, this API's Prefect runner."""
        self._in_thread = ingest_in_thread
        self._jobs: OrderedDict[str, IngestJob] = OrderedDict()  # this process's, for the 429 and on_job
        self._orphans: list[IngestJob] = []  # left active by a dead server: the watcher takes them over
        self._reported: set[str] = set()
        self._jobs_lock = threading.Lock()
        self._on_job = on_job
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watcher: threading.Thread | None = None
        self._runner = None  # the Prefect Runner serving rag-ingest here (the embedded default)
        self._warming = False

    # -- submitting
    def submit(self, col: KbCollection, names: list[str]) -> IngestJob:
        """Record an ingest job of ``col`` for the files just written and create its flow run (or
        start its thread); returns the job. A run that cannot be created fails the job with the reason."""
        if self._closed.is_set():
            raise IndusflowError("the server is stopping")
        job = IngestJob(job_id=secrets.token_hex(8), collection=col.name,
                        files=[{"name": n, "status": "queued"} for n in names],
                        how="thread" if self._in_thread else "deployment", owner_pid=os.getpid())
        self._record(job)
        self._remember(job)
        if self._in_thread:
            self._start_thread(job)
        else:
            self._start_run(job)
        return job

    def _remember(self, job: IngestJob) -> None:
        with self._jobs_lock:
            self._jobs[job.job_id] = job
            while len(self._jobs) > JOBS_KEPT:
                oldest = next(iter(self._jobs.values()))
                if oldest.active:
                    break
                self._jobs.popitem(last=False)

    def _start_thread(self, job: IngestJob) -> None:
        thread = threading.Thread(target=contextvars.copy_context().run, args=(self.run_job, job),
                                  name=f"kb-ingest-{job.job_id}", daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _start_run(self, job: IngestJob) -> None:
        """Create the job's flow run (attempt + 1) on its deployment; a failure fails the job."""
        from prefect.deployments import run_deployment

        job.attempts += 1
        job.state, job.error, job.how, job.pid, job.flow_run_name = "queued", None, "deployment", None, flow_run_name(job)
        job.flow_run_id = job.started_at = None
        self._record(job)
        try:
            call = self.deployment_call(job)
            with self._prefect():
                run = run_deployment(**call)
        except Exception as exc:  # noqa: BLE001 - a job that cannot be started fails with the reason
            log.error("kb ingest job %s could not be started: %s", job.job_id, type(exc).__name__)
            self._fail(job, f"the ingest could not be started: {error_text(exc)}")
            return
        job.flow_run_id = str(run.id)
        current = load_job(self.layout.kb_jobs(), job.job_id)
        if current is not None and current.active and current.flow_run_id is None:  # else its run recorded it
            current.flow_run_id = job.flow_run_id
            self._record(current)
        log.info("kb ingest job %s of %s: flow run %s", job.job_id, job.collection, run.id)
        self._watch()

    def deployment_call(self, job: IngestJob) -> dict[str, Any]:
        """The ``run_deployment`` arguments of a job (the job id is its only parameter: no document name or
        personal data reaches Prefect): the team server's deployment when it is served, else this API's
        runner's deployment of the job's collection."""
        name = INGEST_DEPLOYMENT if self.deployment_ready() else self.runner().deployment(job.collection)
        return {"name": name, "parameters": {"job": job.job_id},
                "flow_run_name": flow_run_name(job), "timeout": 0, "as_subflow": False,
                "tags": ["kb-upload"]}

    def deployment_ready(self) -> bool:
        """Whether jobs go to the configured deployment: a Prefect API is configured
        (PREFECT_API_URL), it has the deployment and a worker polls its work pool (else a run
        sent there would wait for good: this API's runner runs the job instead)."""
        from prefect.settings import PREFECT_API_URL

        if not PREFECT_API_URL.value():
            return False
        from tasks.dispatch import deployment_served

        try:
            return deployment_served(INGEST_DEPLOYMENT)
        except Exception as exc:  # noqa: BLE001 - the API is unreachable: run the job here instead
            log.warning("the Prefect API cannot say whether %s exists (%s): ingest on this server's runner",
                        INGEST_DEPLOYMENT, type(exc).__name__)
            return False

    def runner(self) -> Any:
        """This API's Prefect runner (:mod:`flows.serve.kb_runner`), started on a thread on first use."""
        from flows.serve.kb_runner import IngestRunner

        if self._runner is None:
            env = self.child_env()  # outside the lock: it may open the Milvus Lite store
            with self._jobs_lock:
                if self._runner is None:
                    self._runner = IngestRunner(MAX_ACTIVE_JOBS, env, self.layout.kb_jobs() / "runner.log",
                                                self.layout.root, sorted(self.collections))
        runner = self._runner
        runner.start_soon()
        return runner

    def start_runner(self) -> None:
        """Start this API's runner in the background (once) unless jobs run on threads: called when a key that
        may write a collection lists its documents (the page does as it opens, before a file is picked), so
        the upload that follows finds the runner ready (else the upload starts it). Not at the server's start: every server serves the KB
        (collection ``default``), and a fraud-only server would pay a temporary Prefect server, a runner
        process and the Milvus Lite store for nothing."""
        with self._jobs_lock:
            if self._in_thread or self._warming:
                return
            self._warming = True
        threading.Thread(target=contextvars.copy_context().run, args=(self._warm,), name="kb-runner-warm",
                         daemon=True).start()

    def _warm(self) -> None:
        try:
            if not self.deployment_ready():
                self.runner()
        except Exception as exc:  # noqa: BLE001 - the upload that needs it says why
            log.warning("cannot start the kb ingest runner ahead of an upload: %s", type(exc).__name__)

    def _prefect(self) -> AbstractContextManager[object]:
        """The Prefect settings of calls about this engine's runs: its runner's server when it serves them."""
        return self._runner.settings() if self._runner is not None and self._runner.api_url else \
            contextlib.nullcontext()

    # -- reading
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

    def queue_full(self, col: KbCollection) -> bool:
        """Whether ``col`` already has :data:`MAX_ACTIVE_JOBS` jobs of this process queued or running."""
        with self._jobs_lock:
            return sum(1 for j in self._jobs.values() if j.collection == col.name and j.active) >= MAX_ACTIVE_JOBS

    def _record(self, job: IngestJob) -> None:
        """Write the job's state under the home (best effort: a full disk does not fail the job)."""
        try:
            save_job(self.layout.kb_jobs(), job)
        except OSError as exc:
            log.warning("cannot record kb job %s: %s", job.job_id, type(exc).__name__)

    def _fail(self, job: IngestJob, reason: str) -> None:
        job.state, job.error, job.finished_at = "failed", reason, now()
        for f in job.files:
            f["status"] = "failed"
        self._record(job)
        self._finished(job)

    def _finished(self, job: IngestJob) -> None:
        """Keep a job's final state and report it (once)."""
        with self._jobs_lock:
            if job.job_id in self._jobs:
                self._jobs[job.job_id] = job
            first = job.job_id not in self._reported
            self._reported.add(job.job_id)
        if first and self._on_job is not None:
            self._on_job(job)

    # -- jobs on a thread of this process
    @contextmanager
    def writing(self, col: KbCollection) -> Iterator[None]:
        """Exclusive right to change ``col``'s index: one thread of this process, and one process
        among the replicas and ingest runs sharing the home (a lock file under ``<home>/rag``)."""
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
        except Exception as exc:  # noqa: BLE001 - a failed job is reported on the job
            # the traceback without the message: a message may quote a document's name or text
            log.error("kb ingest job %s of %s failed: %s\n%s", job.job_id, job.collection, type(exc).__name__,
                      "".join(traceback.format_tb(exc.__traceback__)))
            job.state, job.error = "failed", error_text(exc)
            for f in job.files:
                f["status"] = "failed"
        finally:
            job.finished_at = now()
            self._record(job)
            self._finished(job)

    # -- the run's environment, and the end
    def child_env(self) -> dict[str, str]:
        """The environment of an ingest run (the runner hands its runs its own): this process's with this
        engine's home, plus the address of this process's Milvus Lite store (one process holds the file; a
        run connects to its socket) and the model of an embedder handed to the engine. A run parses
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

    def close_jobs(self) -> None:
        """Stop watching (a team server's run goes on: the next start takes it over), let the jobs on threads
        finish, stop this process's runner (its runs end Cancelled; their jobs stay active: the next start
        runs them again)."""
        self._closed.set()
        if self._watcher is not None:
            self._watcher.join(timeout=60)
        for thread in self._threads:
            thread.join(timeout=60)
        if self._runner is not None:
            self._runner.stop()
            self._runner = None
