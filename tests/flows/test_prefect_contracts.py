"""What our code copies from Prefect or wraps, pinned: an upgrade that changes it fails here.

``infra/ephemeral_api.py`` starts Prefect's ephemeral server with Prefect's own command (copied: the
class that builds it is not public), and ``infra/prefect_server.py`` (worker heartbeats take SQLite's
write lock first) reaches into Prefect 3.9's internals because Prefect offers no public way (its
docstring links the upstream issue). ``pyproject.toml`` pins Prefect's minor version; these tests say
what to re-check when that pin moves.
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


def test_the_temporary_api_runs_prefects_own_ephemeral_server_command() -> None:
    """``infra.ephemeral_api.TemporaryAPI`` starts the server Prefect's client would start itself
    (``SubprocessASGIServer``): the same uvicorn arguments and the same variables on top of the
    settings. An upgrade that changes Prefect's command fails here: copy it into infra/ephemeral_api.py."""
    from prefect.server.api import server
    from prefect.settings import get_current_settings

    from infra.ephemeral_api import SERVER_ENV, uvicorn_args

    prefects = _command_of(server.SubprocessASGIServer(port=8123))
    assert prefects.args_[:3] == [sys.executable, "-m", "uvicorn"], prefects.args_
    assert prefects.args_[3:] == uvicorn_args(8123), \
        "Prefect changed the ephemeral server's uvicorn arguments: copy them into infra/ephemeral_api.py"
    settings = get_current_settings().to_environment_variables(exclude_unset=True)
    added = {k: v for k, v in prefects.env.items() if k not in settings and os.environ.get(k) != v}
    assert added == SERVER_ENV, \
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
