"""``prefect server start`` on SQLite, with the worker heartbeat writes that do not fail.

``make ui`` runs ``python -m infra.prefect_server --host 127.0.0.1 --port 4200``: Prefect's own
command (same arguments, same in-process uvicorn), after one fix to Prefect 3.9's server.

The fix. A worker's heartbeat over Prefect's worker channel is persisted in a DEFERRED SQLite
transaction that first reads the work pool, then upserts the ``worker`` row. In WAL mode, when
any other write commits between that read and that upsert (a flow run's state change, a
deployment's schedule, a second worker), SQLite cannot upgrade the read snapshot and answers
``database is locked`` at once: the busy timeout does not apply to a stale snapshot. The server
then logs ``ERROR ... Worker channel heartbeat persistence failed`` with two tracebacks (the
README test saw it in CI with one worker and ``infra.deploy serve`` running). Prefect's own
remedy for read-then-write transactions on SQLite is ``BEGIN IMMEDIATE`` (its
``with_for_update=True``): the transaction takes the write lock first, and a concurrent writer
waits its busy timeout instead of failing. :func:`immediate_worker_heartbeats` makes the heartbeat
transaction do that. On PostgreSQL nothing changes (the begin mode is read only by the SQLite
configuration).

Private Prefect names used (checked 2026-12-06 against Prefect 3.9.1, which has no setting
or ``prefect server start`` option for it): ``worker_channel._persist_worker_channel_heartbeat``
and ``configurations.SQLITE_BEGIN_MODE``. Upstream fixed the same race elsewhere the same way:
https://github.com/PrefectHQ/prefect/issues/23051 (``mark_deployments_ready``, fixed by
``with_for_update`` in https://github.com/PrefectHQ/prefect/pull/22967); the worker channel
came with https://github.com/PrefectHQ/prefect/pull/22004 and has no issue of its own yet.
``tests/unit/test_prefect_server.py`` reproduces the failure on unpatched Prefect (it says so
when a later Prefect fixes it, and this module can go); ``tests/flows/test_prefect_contracts.py``
fails when the wrapped names move; ``pyproject.toml`` pins Prefect's minor version. If a later
Prefect renames what this wraps, the server starts unpatched (with a one-line warning),
exactly as ``prefect server start`` would.
"""

from __future__ import annotations

import functools
import sys
from typing import Any


def immediate_worker_heartbeats() -> bool:
    """Run Prefect's worker-channel heartbeat persistence in a ``BEGIN IMMEDIATE`` transaction.

    Returns True when installed (or already installed), False when this Prefect has no such
    function (nothing changed then).
    """
    try:
        from prefect.server.database.configurations import SQLITE_BEGIN_MODE
        from prefect.server.utilities import worker_channel
    except ImportError:
        return False
    original = getattr(worker_channel, "_persist_worker_channel_heartbeat", None)
    if original is None:
        return False
    if getattr(original, "_indusflow_immediate", False):
        return True

    @functools.wraps(original)
    async def persist_immediately(*args: Any, **kwargs: Any) -> Any:
        # the session's transaction is begun lazily, by its first statement (inside `original`),
        # so the mode set here is the one the SQLite configuration's BEGIN reads
        token = SQLITE_BEGIN_MODE.set("IMMEDIATE")
        try:
            return await original(*args, **kwargs)
        finally:
            SQLITE_BEGIN_MODE.reset(token)

    persist_immediately._indusflow_immediate = True  # type: ignore[attr-defined]
    worker_channel._persist_worker_channel_heartbeat = persist_immediately
    return True


def main(argv: list[str]) -> int:
    """``python -m infra.prefect_server [prefect server start options]`` (``--help`` for them)."""
    if not immediate_worker_heartbeats():
        print("warning: this Prefect has no worker-channel heartbeat to fix; starting it unchanged",
              file=sys.stderr)
    from prefect.cli import app

    sys.argv = ["prefect", "server", "start", *argv]  # Prefect's entry point reads sys.argv
    try:
        app()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
