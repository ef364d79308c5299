"""The watcher of the KB API's ingest runs (:class:`RunWatcher`, a part of :class:`~flows.serve.kb_jobs.IngestJobs`).

What Prefect does not do on the temporary server, kept here as one watcher thread that reads the states of
this process's runs (no queue, no ordering):

- a run whose process was killed ends ``Crashed`` and Prefect does not run it again (flow ``retries``
  cover exceptions only: measured, bench/results/kb_uploads_prefect_probe_2026-12-06.md): its job is
  submitted once more (ingest is incremental) up to :data:`INGEST_ATTEMPTS` times, then fails with the
  reason. A Prefect automation (``prefect.flow-run.Crashed`` -> ``run-deployment``) could take this over:
  Prefect 3.9.1's temporary server does run the triggers and actions services, but that is not measured
  yet. No flow ``retries``: a bad document is quarantined, not raised, so what fails a whole run (a wrong
  key, an endpoint down) fails the next try seconds later too;
- a run past ``INDUSFLOW_KB_INGEST_TIMEOUT_S`` is cancelled through Prefect (the runner kills its process;
  a flow's own ``timeout_seconds`` cannot stop a parser stuck in native code) and the files it was on are
  quarantined;
- a server started after a crash takes over the jobs left active by a dead one (:meth:`RunWatcher.recover`):
  a run the dead server's runner left unfinished is set ``Crashed`` (a forced state: Prefect's
  ``ReleaseFlowConcurrencySlots`` frees the collection's slot, which otherwise stays held: the temporary
  server runs no ``repossessor`` service to revoke expired leases) and submitted again.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import logging
import os
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from infra.home import HomeLayout
from infra.processes import process_alive
from infra.settings import KbSettings
from solutions.rag.collections import KbCollection
from solutions.rag.library import IngestJob, load_job, recorded_jobs
from tasks.ingest import quarantine_unfinished

log = logging.getLogger(__name__)

#: The command line of a flow run's process (Prefect's runner and workers start ``python -m prefect.engine``).
RUN_MARKER = "prefect.engine"
#: Times an ingest job is started when its run's process dies (a crash, kill -9, a server restart while it
#: ran) before it fails with the reason; ingest is incremental, so a re-run resumes.
INGEST_ATTEMPTS = 2
#: How often the watcher reads the states of this process's runs (seconds).
WATCH_S = 1.0


class RunWatcher:
    """One thread that reads the states of this process's ingest runs and does what Prefect does not (the
    module's docstring). :class:`~flows.serve.kb_jobs.IngestJobs` provides what it reads and calls (below)."""

    layout: HomeLayout
    settings: KbSettings
    collections: dict[str, KbCollection]
    _jobs: OrderedDict[str, IngestJob]
    _orphans: list[IngestJob]
    _jobs_lock: threading.Lock
    _closed: threading.Event
    _watcher: threading.Thread | None
    _in_thread: bool
    _record: Callable[[IngestJob], None]
    _remember: Callable[[IngestJob], None]
    _fail: Callable[[IngestJob, str], None]
    _finished: Callable[[IngestJob], None]
    _start_run: Callable[[IngestJob], None]
    _start_thread: Callable[[IngestJob], None]
    _prefect: Callable[[], AbstractContextManager[object]]
    deployment_ready: Callable[[], bool]
    runner: Callable[[], Any]

    def _watch(self) -> None:
        with self._jobs_lock:
            if self._watcher is None and not self._closed.is_set():
                # in the caller's context (Prefect's settings live in a context variable)
                self._watcher = threading.Thread(target=contextvars.copy_context().run, args=(self._watch_runs,),
                                                 name="kb-ingest-watcher", daemon=True)
                self._watcher.start()

    def _watch_runs(self) -> None:
        while not self._closed.wait(WATCH_S):
            try:
                self.check_runs()
            except Exception as exc:  # noqa: BLE001 - the API is away for a moment: look again
                log.warning("cannot read the kb ingest runs: %s", type(exc).__name__)

    def check_runs(self) -> None:
        """One look at this process's active runs: take over the orphans, re-run a run that ended without
        finishing its job, stop one past the time limit, report the jobs that finished."""
        with self._jobs_lock:
            orphans, self._orphans = self._orphans, []
        for job in orphans:
            self._take_over(job)
        with self._jobs_lock:
            waiting = {j.job_id for j in self._orphans}
            mine = [j for j in self._jobs.values()
                    if j.active and j.how != "thread" and j.flow_run_id and j.job_id not in waiting]
        active = []
        for job in mine:
            current = load_job(self.layout.kb_jobs(), job.job_id) or job
            if current.active:
                active.append(current)
            else:
                self._finished(current)
        if not active:
            return
        runs = self._read_runs([j.flow_run_id for j in active if j.flow_run_id])
        for job in active:
            run = runs.get(job.flow_run_id or "")
            state = run.state if run is not None else None
            if state is None or state.is_final():
                time.sleep(0.5)  # its last record write may land just after its process exits
                current = load_job(self.layout.kb_jobs(), job.job_id) or job
                if current.active:
                    self._run_again(current, f"its flow run {state.name if state else 'is gone'}")
                else:
                    self._finished(current)
            elif state.is_running() and run.start_time is not None and \
                    (dt.datetime.now(dt.UTC) - run.start_time).total_seconds() > self.settings.ingest_timeout_s:
                self._cancel_run(job)
                self._time_out(job.job_id)

    def _read_runs(self, run_ids: list[str]) -> dict[str, Any]:
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

        with self._prefect(), get_client(sync_client=True) as client:
            runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=run_ids)))
        return {str(r.id): r for r in runs}

    def _run_again(self, job: IngestJob, why: str) -> None:
        """A run ended without finishing its job: run it again, or fail it after the attempts allowed."""
        if job.attempts >= INGEST_ATTEMPTS:
            self._fail(job, f"the ingest stopped before it finished {job.attempts} time(s) ({why}); upload again "
                       "or run python -m flows.rag ingest")
            return
        log.warning("kb ingest job %s of %s: %s before it finished; running it again", job.job_id, job.collection,
                    why)
        self._remember(job)
        self._start_run(job)

    def _cancel_run(self, job: IngestJob, wait_s: float = 60) -> None:
        """Cancel the job's flow run through Prefect (its runner kills the run's process) and wait for its end."""
        from prefect.client.orchestration import get_client
        from prefect.states import Cancelling

        with self._prefect(), get_client(sync_client=True) as client:
            client.set_flow_run_state(job.flow_run_id, Cancelling(message="past INDUSFLOW_KB_INGEST_TIMEOUT_S"),
                                      force=True)
        ends = time.monotonic() + wait_s
        while time.monotonic() < ends:
            run = self._read_runs([job.flow_run_id or ""]).get(job.flow_run_id or "")
            if run is None or run.state is None or run.state.is_final():
                return
            time.sleep(0.2)

    def _time_out(self, job_id: str) -> None:
        """Fail a job stopped past the time limit and quarantine the files it was working on until they change
        (it is not started again)."""
        limit = self.settings.ingest_timeout_s
        current = load_job(self.layout.kb_jobs(), job_id)
        if current is None or not current.active:
            return  # it finished as the limit passed
        files = quarantine_unfinished(self.collections[current.collection].milvus,
                                      detail=f"the ingest ran past {limit:g} s")
        log.error("kb ingest job %s ran past %g s: stopped, %d file(s) quarantined", job_id, limit, files)
        self._fail(current, f"the ingest ran past its time limit of {limit:g} s (INDUSFLOW_KB_INGEST_TIMEOUT_S); "
                   f"{files} file(s) it was working on are quarantined until they change")

    # -- after a crash
    def recover(self) -> list[IngestJob]:
        """Jobs left queued or running by a server process that is gone (a crash, a restart): each is run
        again (ingest is incremental: a re-run resumes) or, when it was started the most times allowed,
        marked failed with the reason. Returns the jobs taken over; the watcher (or a thread) runs them."""
        taken = []
        for job in recorded_jobs(self.layout.kb_jobs()):
            if not job.active or job.collection not in self.collections:
                continue
            if job.owner_pid not in (None, os.getpid()) and process_alive(job.owner_pid):
                continue  # a job of another replica that still runs (it watches its runs)
            job.owner_pid = os.getpid()
            self._record(job)
            log.warning("kb ingest job %s of %s: taken over after a restart (%d attempt(s) so far)", job.job_id,
                        job.collection, job.attempts)
            taken.append(job)
            self._remember(job)
            if self._in_thread and job.attempts >= INGEST_ATTEMPTS:
                self._fail(job, f"the ingest stopped before it finished {job.attempts} time(s) (the server stopped "
                           "while it ran); upload again")
            elif self._in_thread:
                job.how = "thread"
                self._start_thread(job)
            else:
                with self._jobs_lock:
                    self._orphans.append(job)
                self._watch()
        return taken

    def _process_alive(self, job: IngestJob) -> bool:
        """Whether the job's recorded run process still runs on this machine (it outlived its server)."""
        return job.pid is not None and job.pid != os.getpid() and process_alive(job.pid, RUN_MARKER)

    def _take_over(self, job: IngestJob) -> None:
        """An orphan (its server is gone): a run process that outlived it is waited for until the time limit
        (then killed); a run on a team server's worker is watched; a run the dead server's runner left
        unfinished is set Crashed (which frees its collection's slot) and the job runs again."""
        if self._process_alive(job):
            if self._time_left(job) > 0:
                with self._jobs_lock:
                    self._orphans.append(job)  # look again on the next round
                return
            pid = job.pid or 0  # _process_alive: a pid
            with contextlib.suppress(ProcessLookupError):  # its process group when it leads one, else itself
                os.killpg(pid, signal.SIGKILL) if os.getpgid(pid) == pid else os.kill(pid, signal.SIGKILL)
            ends = time.monotonic() + 60
            while process_alive(pid) and time.monotonic() < ends:
                time.sleep(0.1)
            self._time_out(job.job_id)
            return
        current = load_job(self.layout.kb_jobs(), job.job_id) or job
        if not current.active:
            self._finished(current)
            return
        if current.flow_run_id:
            team = self.deployment_ready()
            if not team:
                self.runner().deployment(current.collection)  # its temporary server (Prefect's database is shared)
            run = self._read_runs([current.flow_run_id]).get(current.flow_run_id)
            if run is not None and run.state is not None and not run.state.is_final():
                if team:
                    return  # a worker's run: the watcher follows it (it is among this process's jobs)
                self._crash_run(current.flow_run_id)
        self._run_again(current, "the server stopped while it ran")

    def _crash_run(self, run_id: str) -> None:
        from prefect.client.orchestration import get_client
        from prefect.states import Crashed

        with self._prefect(), get_client(sync_client=True) as client:
            client.set_flow_run_state(run_id, Crashed(message="its KB API server stopped while it ran"), force=True)

    def _time_left(self, job: IngestJob) -> float:
        """Seconds a job's run has left of the time limit (from its recorded start)."""
        try:
            started = dt.datetime.fromisoformat(job.started_at or "")
        except ValueError:
            return self.settings.ingest_timeout_s
        return self.settings.ingest_timeout_s - (dt.datetime.now(dt.UTC) - started).total_seconds()
