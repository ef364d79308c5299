"""The online state's storage: one protocol (:class:`OnlineStateStore`), two stores.

* :class:`~infra.online_state.rocks.RocksStateStore`: embedded, the default (RocksDB through
  ``rocksdict``; one process, a restart continues where it stopped);
* :class:`~infra.online_state.redis_store.RedisStateStore`: shared by several server processes
  or replicas.

The domain code (``solutions.fraud.online``) computes the state; this package only keeps it,
and imports no domain code.
"""

from __future__ import annotations

from pathlib import Path

from infra.online_state.protocol import (
    ACCOUNT,
    TERMINAL,
    AccountRow,
    Journal,
    OnlineStateStore,
    StateConflict,
    TerminalRow,
)

__all__ = [
    "ACCOUNT",
    "TERMINAL",
    "AccountRow",
    "Journal",
    "OnlineStateStore",
    "StateConflict",
    "TerminalRow",
    "open_state_store",
]


def open_state_store(folder: Path, redis_url: str | None = None) -> OnlineStateStore:
    """Redis when a URL is given, else the embedded RocksDB store in ``<folder>/rocksdb``."""
    if redis_url:
        from infra.online_state.redis_store import RedisStateStore

        return RedisStateStore(redis_url)
    from infra.online_state.rocks import RocksStateStore

    return RocksStateStore(folder / "rocksdb")
