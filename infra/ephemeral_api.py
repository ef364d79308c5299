"""Prefect's ephemeral API server, tied to the process it serves.

A command-line flow run without ``PREFECT_API_URL`` gets a temporary API server from Prefect
(``SubprocessASGIServer``: ``python -m uvicorn ... prefect.server.api.server:create_app`` in a
child process). Prefect stops it from an ``atexit`` handler, which never runs when the command is
killed with SIGKILL (an OOM kill, ``kill -9``, a CI job timeout): the server then ran on as an
orphan, ~220 MB and a port, until someone found it.

:func:`tether_ephemeral_api` makes Prefect start that same server through this module instead
(``python -m infra.ephemeral_api PARENT_PID <uvicorn arguments>``), which runs uvicorn exactly as
Prefect does plus a watchdog thread: when its parent is gone (the parent pid changed) it stops
the server with SIGTERM (uvicorn's normal shutdown) and exits. The watchdog is portable (Linux
and macOS); ``PR_SET_PDEATHSIG`` is not used because Linux ties it to the thread that forked,
and Prefect may start the server from a thread that ends before the run does.

Private Prefect names used, and why they stay (checked 2026-12-06 against Prefect 3.9.1):
``SubprocessASGIServer._instances`` (where the client finds its one server per process) and
``SubprocessASGIServer._run_uvicorn_command`` (the only place the child's command is built).
Prefect offers no public way: its ephemeral settings (``PREFECT_SERVER_EPHEMERAL_ENABLED``,
``..._STARTUP_TIMEOUT_SECONDS``) say nothing of the server's lifetime, and its stop is the
``atexit`` handler alone. No upstream issue names this case (the nearest is
https://github.com/PrefectHQ/prefect/issues/20292, a test fixture's uvicorn surviving its
parent on Windows). Measured: without this, the server of a ``kill -9``'d run lived on
(``tests/unit/test_ephemeral_api.py``). ``pyproject.toml`` pins Prefect's minor version, and
``tests/flows/test_prefect_contracts.py`` fails when the wrapped names or Prefect's own command
change, so an upgrade re-checks this module instead of silently dropping the watchdog.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from infra.processes import exit_with_parent

#: After SIGTERM, the longest the server gets to shut down before it exits regardless (seconds).
SHUTDOWN_GRACE_S = 5.0


def tether_ephemeral_api() -> bool:
    """Have Prefect's ephemeral API server (when this process starts one) exit with this process.

    Installs, before Prefect creates it, the ephemeral server instance Prefect's client asks
    for (``SubprocessASGIServer()``, one per process), as a subclass that starts the server
    through this module. Returns False (and changes nothing) when the server already exists.
    """
    from prefect.server.api import server as prefect_server

    base = prefect_server.SubprocessASGIServer
    if None in base._instances:
        return isinstance(base._instances[None], _tethered_class(base))
    _tethered_class(base)()  # registered under port None: what the client's SubprocessASGIServer() returns
    return True


_TETHERED: dict[type, type] = {}


def _tethered_class(base: type) -> type:
    if base in _TETHERED:
        return _TETHERED[base]

    import subprocess

    from prefect.settings import get_current_settings

    class TetheredASGIServer(base):  # type: ignore[misc, valid-type]
        """Prefect's ephemeral server, started through :mod:`infra.ephemeral_api`."""

        def _run_uvicorn_command(self) -> subprocess.Popen[Any]:
            import prefect

            # the command and environment of Prefect 3's SubprocessASGIServer, behind the watchdog
            return subprocess.Popen(
                args=[sys.executable, "-m", "infra.ephemeral_api", str(os.getpid()),
                      "--app-dir", str(prefect.__module_path__.parent),
                      "--factory", "prefect.server.api.server:create_app",
                      "--host", "127.0.0.1", "--port", str(self.port),
                      "--log-level", "error", "--lifespan", "on"],
                env={**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
                     "PREFECT__SERVER_FINAL": "1",
                     **get_current_settings().to_environment_variables(exclude_unset=True)},
            )

    _TETHERED[base] = TetheredASGIServer
    return TetheredASGIServer


def main(argv: list[str]) -> None:
    """``python -m infra.ephemeral_api PARENT_PID <uvicorn arguments>``."""
    exit_with_parent(int(argv[0]), grace_s=SHUTDOWN_GRACE_S)
    import uvicorn.main

    uvicorn.main.main(args=argv[1:], prog_name="uvicorn")


if __name__ == "__main__":
    main(sys.argv[1:])
