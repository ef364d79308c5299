"""Ingest jobs of the knowledge-base API (:class:`IngestJobs`, a part of :class:`~flows.serve.kb_engine.KbEngine`).

An upload's ingest is a ``rag-ingest`` flow run of a deployment, submitted with ``run_deployment(timeout=0)``
and executed by Prefect: the :data:`INGEST_DEPLOYMENT` on its work pool when a Prefect server serves it (a
worker polls the pool), else the deployment that this API's Prefect runner serves against Prefect's
temporary server (:mod:`flows.serve.kb_runner`; the runner's ``limit`` bounds the runs at once). The run
records its progress in the job's file under the home (:mod:`flows.rag.job`), which ``GET /v1/kb/jobs/{id}``
reads (Prefect's run holds no per-file status). A dispatch thread per collection still submits its jobs one
at a time and waits for each run (not yet replaced by Prefect's own concurrency: issue 48). What Prefect does
not do, kept here: a run that Prefect marks Crashed (a killed run process: flow retries cover exceptions
only) or that a dead API left Running (no automations on the temporary server) is submitted again (ingest
is incremental) up to :data:`INGEST_ATTEMPTS` times, then fails with the reason; a run past
``INDUSFLOW_KB_INGEST_TIMEOUT_S`` is cancelled through Prefect and its unfinished files quarantined.
An engine built with ``ingest_in_thread=True`` runs its jobs on a thread of its own process instead, with
the Milvus client and embedder it was handed (the tests' fakes and fuzzers: a run's process cannot use them).
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
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from infra.errors import IndusflowError
from infra.home import HomeLayout
from infra.milvus import shared_uri
from infra.processes import process_alive
from infra.secrets import child_environment
from infra.settings import KbSettings, get_milvus_settings, get_tika_settings
from solutions.rag.collections import KbCollection
from solutions.rag.config import IngestParams
from solutions.rag.ingest import DocumentRules
from solutions.rag.library import (
    ACTIVE,
    JOB_ID,
    DocumentStatus,
    IngestJob,
    error_text,
    flow_run_name,
    load_job,
    now,
    recorded_jobs,
    save_job,
)
from tasks.ingest import (
    IngestResult,
    quarantine_unfinished,
    run_ingest,
)

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


class IngestJobs:
    """The engine's ingest jobs: queued per collection, run on a thread, a child process or a
    deployment, recorded under the home, recovered after a crash. :class:`~flows.serve.kb_engine.KbEngine`
    calls :meth:`init_jobs` and provides what they read of it (below)."""

    layout: HomeLayout
    settings: KbSettings
    collections: dict[str, KbCollection]
    params: IngestParams
    client: Callable[[], Any]
    embedder: Callable[[], Any]
    rules: Callable[[], DocumentRules]
    writing: Callable[[KbCollection], AbstractContextManager[None]]
    documents: Callable[[KbCollection], list[DocumentStatus]]

    def init_jobs(self, *, ingest_in_thread: bool, on_job: Callable[[IngestJob], None] | None) -> None:
        """The job state: per collection a queue and its worker thread, the jobs of this process, their children."""
        self._how = "thread" if ingest_in_thread else "process"  # a job on a pool's deployment: "deployment"
        self._queues: dict[str, queue.Queue[IngestJob | None]] = {}
        self._workers: dict[str, threading.Thread] = {}
        self._jobs: OrderedDict[str, IngestJob] = OrderedDict()
        self._jobs_lock = threading.Lock()
        self._on_job = on_job
        self._closed = False
        self._last_exit: dict[str, str] = {}
        self._runner = None  # the Prefect Runner serving rag-ingest here (the embedded default), started on first use
        self._runner_lock = threading.Lock()

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
                    self.served_here()
                    self._start_deployment(current)
                    deadline = time.monotonic() + self.settings.ingest_timeout_s
                    self._wait_record(current, lambda j, d=deadline: self._run_finished(j) or time.monotonic() > d)
                    if time.monotonic() > deadline and not self._run_finished(current) and not self._closed:
                        self._cancel_run(current)
                        self._time_out(job.job_id, None)
                        break
                    self._last_exit[job.job_id] = self._run_end(current)
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

    def _cancel_run(self, job: IngestJob, wait_s: float = 60) -> None:
        """Cancel the job's flow run through Prefect (its runner kills the run's process) and wait for its end."""
        from prefect.client.orchestration import get_client
        from prefect.states import Cancelling

        with self._prefect(), get_client(sync_client=True) as client:
            client.set_flow_run_state(job.flow_run_id, Cancelling(message="past INDUSFLOW_KB_INGEST_TIMEOUT_S"),
                                      force=True)
        ends = time.monotonic() + wait_s
        while not self._run_finished(job) and time.monotonic() < ends:
            time.sleep(0.2)

    def _time_out(self, job_id: str, pid: int | None, proc: subprocess.Popen[bytes] | None = None) -> None:
        """Stop a child past the time limit (its whole process group: it runs in a session of its
        own), quarantine the files it was working on until they change, and fail the job (it is not
        started again)."""
        limit = self.settings.ingest_timeout_s
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        if pid is None:
            pass  # a flow run: cancelled through Prefect
        elif proc is not None:
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

    def served_here(self) -> None:
        """Start the Prefect runner serving the ingest deployment for this process (once), against
        Prefect's temporary server (:mod:`flows.serve.kb_runner`)."""
        from flows.serve.kb_runner import IngestRunner

        with self._runner_lock:
            if self._runner is None:
                runner = IngestRunner(MAX_ACTIVE_JOBS, self.child_env(), self.layout.kb_jobs() / "runner.log",
                                      self.layout.root)
                runner.start()
                self._runner = runner

    def _run_end(self, job: IngestJob) -> str:
        """How the job's flow run ended, in words (its state's name)."""
        from prefect.client.orchestration import get_client

        current = load_job(self.layout.kb_jobs(), job.job_id) or job
        if not current.flow_run_id:
            return "its flow run is gone"
        try:
            with self._prefect(), get_client(sync_client=True) as client:
                state = client.read_flow_run(current.flow_run_id).state
        except Exception as exc:  # noqa: BLE001
            return f"its flow run cannot be read ({type(exc).__name__})"
        return f"its flow run {state.name if state else 'has no state'}"

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
        name = self._runner.deployment if self._runner is not None else INGEST_DEPLOYMENT
        return {"name": name, "parameters": {"job": job.job_id},
                "flow_run_name": flow_run_name(job), "timeout": 0, "as_subflow": False,
                "tags": ["kb-upload"]}

    def _start_deployment(self, job: IngestJob) -> None:
        from prefect.deployments import run_deployment

        job.how, job.pid, job.flow_run_name = "deployment", None, flow_run_name(job)
        self._record(job)
        with self._prefect():
            run = run_deployment(**self.deployment_call(job))
        job.flow_run_id = str(run.id)
        current = load_job(self.layout.kb_jobs(), job.job_id)
        if current is not None and current.active and current.flow_run_id is None:  # else its run recorded it
            current.flow_run_id = job.flow_run_id
            self._record(current)
        log.info("kb ingest job %s of %s: flow run %s", job.job_id, job.collection, run.id)

    def _prefect(self) -> AbstractContextManager[object]:
        """The Prefect settings of calls about this engine's runs: its runner's server when it serves them."""
        return self._runner.settings() if self._runner is not None else contextlib.nullcontext()

    def _run_finished(self, job: IngestJob) -> bool:
        """Whether the job's deployment run is over (a final state, or unknown to the API)."""
        from prefect.client.orchestration import get_client

        if not job.flow_run_id:
            return True
        try:
            with self._prefect(), get_client(sync_client=True) as client:
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

