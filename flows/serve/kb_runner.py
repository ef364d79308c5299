"""The KB API's Prefect runner on the embedded default: uploads become ``rag-ingest`` flow runs of a
deployment that Prefect's own :class:`~prefect.runner.Runner` serves (what ``flow.serve()`` runs),
without a Prefect server to configure.

Without ``PREFECT_API_URL`` Prefect refuses workers and task workers (they need a real API:
PrefectHQ/prefect#13942), but a Runner works against the temporary API server Prefect starts for the
API process (tethered to it: :mod:`infra.ephemeral_api`). :class:`IngestRunner` starts that server and
``python -m flows.serve.kb_runner PARENT_PID URL LIMIT``: a process of its own, with the environment of
an ingest child (:meth:`~flows.serve.kb_jobs.IngestJobs.child_env`: no serving secret, no LLM key; a Runner
hands its runs this process's whole environment) plus the server's URL as ``PREFECT_API_URL`` (else each
run's child starts a temporary server of its own: 46 s a run instead of 10 s,
bench/results/kb_uploads_prefect_probe_2026-12-06.md). It serves the flow as the deployment
:func:`served_name` (a team server's is :data:`~flows.serve.kb_jobs.INGEST_DEPLOYMENT`); its ``limit`` bounds the runs at once; each run executes
in a child process of the Runner; it exits when the API process is gone.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

log = logging.getLogger(__name__)

#: The runner process's module (``python -m flows.rag.runner PARENT_PID NAME LIMIT``).
RUNNER_MODULE = "flows.rag.runner"


def served_name(home: Path) -> str:
    """The deployment's name for the API of ``home``: ``kb-upload-ingest-<hash of the home>``. Prefect's
    temporary servers of all processes share one database (under PREFECT_HOME): under a single name, the
    runner of another API (another home) would take this API's runs."""
    import hashlib

    return f"kb-upload-ingest-{hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:12]}"


class IngestRunner:
    """The runner process serving ``rag-ingest`` as ``kb-upload-ingest`` for this API process."""

    def __init__(self, limit: int, env: dict[str, str], log_path: Path, home: Path) -> None:
        self.limit, self.env, self.log_path = limit, env, log_path
        self.deployment = f"rag-ingest/{served_name(home)}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.api_url: str | None = None

    def settings(self) -> AbstractContextManager[object]:
        """Prefect's settings for this process's calls to the runner's API (the temporary server, whatever
        PREFECT_API_URL this process was started with)."""
        from prefect.settings import PREFECT_API_URL, temporary_settings

        return temporary_settings(updates={PREFECT_API_URL: self.api_url})

    def start(self, timeout_s: float = 180) -> None:
        """Start the temporary API server (if this process has none yet) and the runner process;
        returns once the deployment is registered."""
        from prefect.server.api.server import SubprocessASGIServer

        from infra.ephemeral_api import tether_ephemeral_api
        from tasks.dispatch import deployment_exists

        tether_ephemeral_api()
        server = SubprocessASGIServer()
        server.start()
        self.api_url = server.api_url
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", RUNNER_MODULE, str(os.getpid()), self.deployment.split("/")[1], str(self.limit)],
                env={**self.env, "PREFECT_API_URL": server.api_url}, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd,
                start_new_session=True, cwd=str(Path(__file__).resolve().parents[2]))
        finally:
            os.close(fd)
        deadline = time.monotonic() + timeout_s
        while not self._registered(deployment_exists):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the KB ingest runner did not start (see {self.log_path})")
            time.sleep(0.25)
        log.info("kb ingest runner %d serving %s on %s (limit %d)", self.proc.pid, self.deployment, server.api_url,
                 self.limit)

    def _registered(self, deployment_exists: Callable[[str], bool]) -> bool:
        with self.settings():
            return deployment_exists(self.deployment)

    def stop(self) -> None:
        """Stop the runner process (SIGTERM: Prefect's Runner stops its runs)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
