"""Which account each transaction id of a model was scored under: the evidence's key.

The score log and the evidence flows name transactions by id alone (never by account), so an id
must name one transaction per model: a transaction id first scored under one account cannot be
scored again under another (it would add a second score of "the same" transaction to the
evidence) and a label counts only when it names the account the id was scored under. This index
keeps, per model and transaction id, a keyed hash of the account (the audit log's
:meth:`~infra.serving.audit.AuditLog.hash_id`: no account id is stored). A claim is atomic, on
every replica: an SQLite file beside the score log (one machine) or the Redis of
``INDUSFLOW_SERVE_REDIS_URL`` (replicas), ``SET NX`` per id. Replicas must hash with one salt (a
shared home, or one ``INDUSFLOW_SERVE_AUDIT_SALT``), as the challenger split already needs.

Ids claimed by a request the model then refused are released, so a corrected request can claim
them again. Ids scored before this index existed are unknown to it: their labels are refused.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

#: The SQLite file of the index, beside a model's score log.
OWNERS_FILE = "transaction-owners.sqlite"


class TransactionOwners(Protocol):
    def claim(self, ids: Sequence[str], owners: Sequence[str]) -> tuple[list[int], list[str]]:
        """Claim each id for its owner (a hashed account): (positions whose id another owner holds,
        ids newly claimed). Where one id is another's, nothing is claimed."""
        ...

    def release(self, ids: Sequence[str]) -> None:
        """Forget ids a refused request claimed."""
        ...

    def owned(self, ids: Sequence[str], owners: Sequence[str]) -> list[bool]:
        """Per position, whether the id was claimed for that owner."""
        ...

    def close(self) -> None: ...


class SqliteOwners:
    """The index in one SQLite file (WAL; several processes of one machine)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(path, timeout=30, check_same_thread=False, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at each checkpoint, no fsync per claim
        self._conn.execute("CREATE TABLE IF NOT EXISTS owner (tx TEXT PRIMARY KEY, owner TEXT NOT NULL) WITHOUT ROWID")
        self._lock = threading.Lock()

    def _read(self, ids: Sequence[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        unique = list(dict.fromkeys(ids))
        for start in range(0, len(unique), 500):
            chunk = unique[start : start + 500]
            marks = ",".join("?" * len(chunk))
            out.update(self._conn.execute(f"SELECT tx, owner FROM owner WHERE tx IN ({marks})", chunk).fetchall())
        return out

    def claim(self, ids: Sequence[str], owners: Sequence[str]) -> tuple[list[int], list[str]]:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                known = self._read(ids)
                held = dict(known)  # with this request's own claims, first row first
                taken = [i for i, (tx, who) in enumerate(zip(ids, owners, strict=True))
                         if held.setdefault(tx, who) != who]
                new = [] if taken else [tx for tx in held if tx not in known]
                self._conn.executemany("INSERT INTO owner (tx, owner) VALUES (?, ?)", [(tx, held[tx]) for tx in new])
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        return taken, new

    def release(self, ids: Sequence[str]) -> None:
        with self._lock:
            self._conn.executemany("DELETE FROM owner WHERE tx = ?", [(tx,) for tx in ids])

    def owned(self, ids: Sequence[str], owners: Sequence[str]) -> list[bool]:
        with self._lock:
            known = self._read(ids)
        return [known.get(tx) == who for tx, who in zip(ids, owners, strict=True)]

    def close(self) -> None:
        self._conn.close()


class RedisOwners:
    """The index in Redis, one key per id (``<prefix>:<model>:<id>``), claimed with ``SET NX``."""

    def __init__(self, url: str, model: str, prefix: str = "indusflow:txowner") -> None:
        import redis

        self._redis = redis.Redis.from_url(url)
        self._prefix = f"{prefix}:{model}:"

    def claim(self, ids: Sequence[str], owners: Sequence[str]) -> tuple[list[int], list[str]]:
        pipe = self._redis.pipeline(transaction=False)
        for tx, who in zip(ids, owners, strict=True):
            pipe.set(self._prefix + tx, who, nx=True)
        made = pipe.execute()
        new = [tx for tx, ok in zip(ids, made, strict=True) if ok]
        held: list[Any] = list(self._redis.mget([self._prefix + tx for tx in ids]))  # type: ignore[arg-type]
        taken = [i for i, (who, got) in enumerate(zip(owners, held, strict=True))
                 if got is None or got.decode() != who]
        if taken and new:
            self.release(new)
            new = []
        return taken, new

    def release(self, ids: Sequence[str]) -> None:
        if ids:
            self._redis.delete(*[self._prefix + tx for tx in ids])

    def owned(self, ids: Sequence[str], owners: Sequence[str]) -> list[bool]:
        held: list[Any] = list(self._redis.mget([self._prefix + tx for tx in ids])) if ids else []  # type: ignore[arg-type]
        return [got is not None and got.decode() == who for who, got in zip(owners, held, strict=True)]

    def close(self) -> None:
        self._redis.close()


def open_owners(folder: Path, model: str, redis_url: str | None = None) -> TransactionOwners:
    """The index of ``model``: in Redis when a URL is given, else in ``folder/<model>/`` (the score log's)."""
    if redis_url:
        return RedisOwners(redis_url, model)
    return SqliteOwners(folder / model / OWNERS_FILE)
