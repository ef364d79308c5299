"""The private Prefect names our two patches wrap, pinned: an upgrade that moves them fails here.

``infra/ephemeral_api.py`` (the ephemeral API exits with its run) and ``infra/prefect_server.py``
(worker heartbeats take SQLite's write lock first) reach into Prefect 3.9's internals because
Prefect offers no public way (each module's docstring links the upstream issue). ``pyproject.toml``
pins Prefect's minor version; these tests say what to re-check when that pin moves.
"""

from __future__ import annotations

import contextvars
import inspect
import os
import subprocess
import sys
from typing import Any

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


class _Captured(Exception):
    """Raised by the fake Popen: the command was built, nothing was started."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        super().__init__("captured")
        self.args_, self.env = args, env


def _command_of(server: Any) -> _Captured:
    """The command and environment ``server._run_uvicorn_command()`` would start (nothing starts)."""

    def fake_popen(args: list[str], env: dict[str, str], **_: Any) -> None:
        raise _Captured(list(args), dict(env))

    server.port = 8123
    with pytest.MonkeyPatch.context() as mp, pytest.raises(_Captured) as caught:
        mp.setattr(subprocess, "Popen", fake_popen)
        server._run_uvicorn_command()
    return caught.value


def test_prefect_keeps_one_ephemeral_server_per_process_in_instances(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.server.api import server

    from infra.ephemeral_api import tether_ephemeral_api

    base = server.SubprocessASGIServer
    assert isinstance(base.__dict__.get("_instances"), dict), \
        "SubprocessASGIServer._instances is gone: re-check infra/ephemeral_api.py against this Prefect"
    monkeypatch.setattr(base, "_instances", {})  # this test's registry, restored after it
    assert tether_ephemeral_api()
    client_side = base()  # what Prefect's client asks for when no PREFECT_API_URL is set
    assert type(client_side).__name__ == "TetheredASGIServer", \
        "Prefect's SubprocessASGIServer() no longer returns the instance registered under port None"
    assert not client_side.running  # built, never started
    assert tether_ephemeral_api() and base() is client_side  # already installed: nothing changes
    monkeypatch.setattr(base, "_instances", {None: object.__new__(base)})  # Prefect's own came first
    assert not tether_ephemeral_api()


def test_the_tethered_server_runs_prefects_own_uvicorn_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """Our override copies Prefect's command: it must stay Prefect's, behind the watchdog."""
    from prefect.server.api import server

    from infra.ephemeral_api import tether_ephemeral_api

    base = server.SubprocessASGIServer
    assert callable(base.__dict__.get("_run_uvicorn_command")), \
        "SubprocessASGIServer._run_uvicorn_command is gone: re-check infra/ephemeral_api.py"
    monkeypatch.setattr(base, "_instances", {})
    prefects = _command_of(base(port=8123))
    monkeypatch.setattr(base, "_instances", {})
    assert tether_ephemeral_api()
    ours = _command_of(base())  # the tethered server Prefect's client will start

    assert prefects.args_[:3] == [sys.executable, "-m", "uvicorn"], prefects.args_
    assert ours.args_[:4] == [sys.executable, "-m", "infra.ephemeral_api", str(os.getpid())], ours.args_
    assert ours.args_[4:] == prefects.args_[3:], \
        "Prefect changed the ephemeral server's uvicorn arguments: copy them into infra/ephemeral_api.py"
    assert ours.env == prefects.env, \
        "Prefect changed the ephemeral server's environment: copy it into infra/ephemeral_api.py"


def test_the_worker_channel_heartbeat_is_where_prefect_server_wraps_it() -> None:
    from prefect.server.database import configurations
    from prefect.server.utilities import worker_channel

    persist = getattr(worker_channel, "_persist_worker_channel_heartbeat", None)
    assert persist is not None and inspect.iscoroutinefunction(inspect.unwrap(persist)), \
        "worker_channel._persist_worker_channel_heartbeat is gone: re-check infra/prefect_server.py " \
        "(does Prefect take the write lock itself now? tests/unit/test_prefect_server.py says)"
    assert list(inspect.signature(persist).parameters)[:3] == ["session", "work_pool_name", "frame"]
    assert isinstance(configurations.SQLITE_BEGIN_MODE, contextvars.ContextVar)
    # the SQLite configuration's BEGIN reads the context variable the wrapper sets
    assert "SQLITE_BEGIN_MODE" in inspect.getsource(configurations.AioSqliteConfiguration)
