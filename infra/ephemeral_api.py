"""A temporary Prefect API server for one process's runs, started early and tied to that process.

A command-line flow run without ``PREFECT_API_URL`` needs an API to report to. Prefect's own answer
(its client starts ``SubprocessASGIServer`` on first use) costs every command twice over: the client
imports ``prefect.server.api.server`` (FastAPI, the routes, the ORM: ~2.7 s, only to reach that
class), and the command then waits for the server (~3.5 s on 2 cores) before its flow can start.
Measured on a trivial flow: 7.5 s wall and 2.7 CPU-s in the command, against 2.0 s and 1.05 CPU-s
with an API already running (bench/results/test_durations_2026-12-07.md, session 9). And Prefect
stops that server from an ``atexit`` handler, which never runs when the command is killed with
SIGKILL (an OOM kill, ``kill -9``, a CI job timeout): the server ran on as an orphan, ~220 MB and a
port, until someone found it.

:class:`TemporaryAPI` starts the same server, Prefect's ephemeral app with Prefect's own command and
environment (``tests/flows/test_prefect_contracts.py`` fails when Prefect changes them), as soon as
the command knows it will run a flow, so it starts while the command imports its flow (torch,
Lightning, pandas); the run is pointed at it with the public ``PREFECT_API_URL`` setting. It runs
through this module (``python -m infra.ephemeral_api PARENT_PID <uvicorn arguments>``): uvicorn
exactly as Prefect runs it, plus a watchdog thread that stops the server (SIGTERM, uvicorn's normal
shutdown) once its parent is gone. The watchdog is portable (Linux and macOS); ``PR_SET_PDEATHSIG``
is not used because Linux ties it to the thread that forked (tests/unit/test_ephemeral_api.py kills a
run with SIGKILL). No private Prefect name is imported or patched; the server's two internal variables
(``PREFECT__SERVER_EPHEMERAL``, ``PREFECT__SERVER_FINAL``) are copied from Prefect's own class, pinned by
the contract test.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from infra.processes import exit_with_parent, free_port

log = logging.getLogger(__name__)

#: After SIGTERM, the longest the server gets to shut down before it exits regardless (seconds).
SHUTDOWN_GRACE_S = 5.0
#: uvicorn's exit status when its port was taken between our choice and its bind: start again elsewhere.
PORT_IN_USE_STATUS = 3
#: Pause between two health checks while the server starts (seconds).
POLL_S = 0.1
#: The application factory and the variables Prefect's ``SubprocessASGIServer`` starts its server with
#: (the UI off, the ephemeral set of services, the final app): pinned by tests/flows/test_prefect_contracts.py.
APP_FACTORY = "prefect.server.api.server:create_app"
SERVER_ENV = {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}


def _prefect_parent_dir() -> str:
    """The folder that holds the ``prefect`` package (uvicorn's ``--app-dir``), found without importing it."""
    spec = importlib.util.find_spec("prefect")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("Prefect is not installed")
    return str(Path(next(iter(spec.submodule_search_locations))).parent)


def uvicorn_args(port: int) -> list[str]:
    """Prefect's own uvicorn arguments for an ephemeral server on ``port`` (after ``-m uvicorn``)."""
    return ["--app-dir", _prefect_parent_dir(), "--factory", APP_FACTORY, "--host", "127.0.0.1",
            "--port", str(port), "--log-level", "error", "--lifespan", "on"]


class TemporaryAPI:
    """Prefect's ephemeral API server in a child process that exits with this one.

    :meth:`start` returns at once; :meth:`wait_ready` waits until ``/api/health`` answers;
    :meth:`stop` ends it (also at interpreter exit, and by its watchdog if this process is killed).
    ``env`` is the server's environment: Prefect's settings as variables (the caller's temporary
    settings included), on top of this process's environment.
    """

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.env = {**os.environ, **(env or {}), **SERVER_ENV}
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The API's URL, what ``PREFECT_API_URL`` names (``http://127.0.0.1:PORT/api``)."""
        return f"http://127.0.0.1:{self.port}/api"

    @property
    def running(self) -> bool:
        """Its process was started and has not exited."""
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> TemporaryAPI:
        """Start the server (returns at once: :meth:`wait_ready` waits for it)."""
        self._spawn()
        atexit.register(self.stop)
        log.info("Starting temporary server on http://127.0.0.1:%d (Prefect's API for this process's runs; "
                 "PREFECT_API_URL names a server to keep them)", self.port)
        return self

    def _spawn(self) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "infra.ephemeral_api", str(os.getpid()), *uvicorn_args(self.port)],
            env=self.env, stdin=subprocess.DEVNULL)

    def wait_ready(self, timeout_s: float) -> str:
        """Wait until the server answers (at most ``timeout_s``); returns :attr:`url`."""
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.proc is not None, "start() first"
            status = self.proc.poll()
            if status == PORT_IN_USE_STATUS:  # the port was taken since free_port() chose it
                self._spawn()
            elif status is not None:
                raise RuntimeError(f"Prefect's temporary API server exited with status {status} while starting")
            elif self._healthy():
                return self.url
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"Prefect's temporary API server did not answer within {timeout_s:g} s "
                                   "(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS sets the wait)")
            time.sleep(POLL_S)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        """SIGTERM (uvicorn's shutdown), then SIGKILL after :data:`SHUTDOWN_GRACE_S`."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        atexit.unregister(self.stop)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(SHUTDOWN_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def main(argv: list[str]) -> None:
    """``python -m infra.ephemeral_api PARENT_PID <uvicorn arguments>``."""
    exit_with_parent(int(argv[0]), grace_s=SHUTDOWN_GRACE_S)
    import uvicorn.main

    uvicorn.main.main(args=argv[1:], prog_name="uvicorn")


if __name__ == "__main__":
    main(sys.argv[1:])
