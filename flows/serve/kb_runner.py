"""The KB API's Prefect runner on the embedded default: uploads become ``rag-ingest`` flow runs of a
deployment that Prefect's own :class:`~prefect.runner.Runner` serves (what ``flow.serve()`` runs),
without a Prefect server to configure.

Without ``PREFECT_API_URL`` Prefect refuses workers and task workers (they need a real API:
PrefectHQ/prefect#13942), but a Runner works against the temporary API server Prefect starts for the
API process (a :class:`~infra.ephemeral_api.TemporaryAPI`, tied to it). :class:`IngestRunner` starts that server and
``python -m flows.rag.runner PARENT_PID LIMIT NAME...``: a process of its own, with the environment of
an ingest child (:meth:`~flows.serve.kb_jobs.IngestJobs.child_env`: no serving secret, no LLM key; a Runner
hands its runs this process's whole environment) plus the server's URL as ``PREFECT_API_URL`` (else each
run's child starts a temporary server of its own: 46 s a run instead of 10 s,
bench/results/kb_uploads_prefect_probe_2026-12-06.md). It serves the flow as the deployment
:func:`served_name` (a team server's is :data:`~flows.serve.kb_jobs.INGEST_DEPLOYMENT`); its ``limit`` bounds the runs at once; each run executes
in a child process of the Runner; it exits when the API process is gone.
"""

from __future__ import annotations

import contextvars
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infra.ephemeral_api import TemporaryAPI

log = logging.getLogger(__name__)

#: The runner process's module (``python -m flows.rag.runner PARENT_PID LIMIT NAME...``).
RUNNER_MODULE = "flows.rag.runner"
#: The longest the temporary server and the runner take to start (2 busy cores, a fresh Prefect home: ~40 s).
START_TIMEOUT_S = 180.0
#: Seconds a collection's queued run waits before it asks Prefect again for the collection's slot.
SLOT_WAIT_S = 2.0


def served_name(home: Path) -> str:
    """The deployment's name for the API of ``home``: ``kb-upload-ingest-<hash of the home>``. Prefect's
    temporary servers of all processes share one database (under PREFECT_HOME): under a single name, the
    runner of another API (another home) would take this API's runs."""
    import hashlib

    return f"kb-upload-ingest-{hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:12]}"


def deployment_name(name: str, collection: str) -> str:
    """The deployment (without the flow's name) of one collection's uploads: ``<served name>-<collection>``."""
    return f"{name}-{collection}"


class IngestRunner:
    """The runner process serving ``rag-ingest`` for this API process, one deployment per collection.

    :meth:`start_soon` starts it on a thread when the server starts (the temporary server and the runner
    take 10-40 s on 2 busy cores: paid then, not by the first upload); :meth:`deployment` waits for it."""

    def __init__(self, limit: int, env: dict[str, str], log_path: Path, home: Path, collections: list[str]) -> None:
        self.limit, self.env, self.log_path, self.collections = limit, env, log_path, collections
        self.name = served_name(home)
        self.proc: subprocess.Popen[bytes] | None = None
        self.server: TemporaryAPI | None = None  #: the temporary API server the runner serves against
        self.api_url: str | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.timings: dict[str, float] = {}  # seconds of the start: the temporary server, then the runner

    def deployment(self, collection: str, timeout_s: float = START_TIMEOUT_S) -> str:
        """The deployment of ``collection``'s uploads (``flow/deployment``), once the runner serves it. A start
        that failed is tried again by the next call."""
        self.start_soon()
        if not self._started.wait(timeout_s):
            raise RuntimeError(f"the KB ingest runner did not start in {timeout_s:g} s (see {self.log_path})")
        error = self._error
        if error is not None:
            with self._lock:
                if self._error is error:  # the next call starts it again
                    self._thread, self._error = None, None
                    self._started.clear()
            raise RuntimeError(f"the KB ingest runner did not start: {error} (see {self.log_path})") from error
        return f"rag-ingest/{deployment_name(self.name, collection)}"

    def settings(self) -> AbstractContextManager[object]:
        """Prefect's settings for this process's calls to the runner's API (the temporary server, whatever
        PREFECT_API_URL this process was started with)."""
        from prefect.settings import PREFECT_API_URL, temporary_settings

        return temporary_settings(updates={PREFECT_API_URL: self.api_url})

    def start_soon(self) -> None:
        """Start the runner on a thread of its own (once; the context is the caller's: Prefect's settings)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=contextvars.copy_context().run, args=(self._start,),
                                                name="kb-ingest-runner", daemon=True)
                self._thread.start()

    def _start(self) -> None:
        try:
            self.start()
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for the deployment
            log.error("the KB ingest runner did not start: %s", type(exc).__name__)
            self._error = exc
        finally:
            self._started.set()

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the temporary API server (if this process has none yet) and the runner process;
        returns once every collection's deployment is registered."""
        from prefect.settings import get_current_settings, temporary_settings

        from infra.ephemeral_api import TemporaryAPI
        from infra.prefect_env import server_defaults
        from tasks.dispatch import deployment_exists

        t0 = time.monotonic()
        # a queued run asks again for its collection's slot after this wait (Prefect's default, 30 s, would
        # be most of a second upload's wait)
        if self.server is None or not self.server.running:  # a runner started again keeps a running server
            with temporary_settings(updates=server_defaults(),
                                    set_defaults={"server.deployments.concurrency_slot_wait_seconds": SLOT_WAIT_S}):
                self.server = TemporaryAPI(get_current_settings().to_environment_variables(exclude_unset=True)).start()
        server = self.server
        # Prefect's own wait (PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, 20 s of sleeps) ran out at a
        # load of 12 on 2 cores while the API loaded its embedder (measured: RuntimeError, no upload ran)
        self.api_url = server.wait_ready(timeout_s)
        self.timings["server_s"] = time.monotonic() - t0
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", RUNNER_MODULE, str(os.getpid()), str(self.limit),
                 *(deployment_name(self.name, c) for c in self.collections)],
                env={**self.env, "PREFECT_API_URL": server.url}, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd,
                start_new_session=True, cwd=str(Path(__file__).resolve().parents[2]))
        finally:
            os.close(fd)
        deadline = time.monotonic() + timeout_s
        names = [f"rag-ingest/{deployment_name(self.name, c)}" for c in self.collections]
        while not self._registered(deployment_exists, names):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()  # the next try starts another
                raise RuntimeError(f"the KB ingest runner did not start (see {self.log_path})")
            time.sleep(0.25)
        self.timings["runner_s"] = time.monotonic() - t0 - self.timings["server_s"]
        log.info("kb ingest runner %d serving %d collection(s) as %s-* on %s (limit %d): temporary server %.1f s, "
                 "runner and deployments %.1f s", self.proc.pid, len(self.collections), self.name, server.url,
                 self.limit, self.timings["server_s"], self.timings["runner_s"])

    def _registered(self, deployment_exists: Callable[[str], bool], names: list[str]) -> bool:
        with self.settings():
            return all(deployment_exists(n) for n in names)

    def stop(self) -> None:
        """Stop the runner process (SIGTERM: Prefect's Runner stops its runs)."""
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=START_TIMEOUT_S)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
