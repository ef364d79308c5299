"""The shared online state store: Redis, for several server processes or replicas.

Per account a summary string (``<prefix>:a:<id>``) and a list of its recent rows
(``<prefix>:ar:<id>``); per terminal a hash of its rows by row id (``<prefix>:t:<id>``); per
transaction id its owner (``<prefix>:o:<id>``), with the ids in a sorted set by their transaction's
time (``<prefix>:owner-times``, the order they are forgotten in); a generation counter
(``<prefix>:generation``). Updates are serialised by one Redis lock that its
holder renews; an update's writes go in one MULTI/EXEC transaction that watches the generation.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import orjson

from infra.online_state.protocol import (
    ACCOUNT,
    TERMINAL,
    Journal,
    StateConflict,
    account_doc,
    account_row,
    owners_horizon,
    terminal_doc,
)

__all__ = ["RedisStateStore"]

log = logging.getLogger(__name__)


class RedisStateStore:
    """The shared store (several replicas): per account a summary string (``<prefix>:a:<id>``) and a
    list of its recent rows (``<prefix>:ar:<id>``); per terminal a hash of its rows by row id
    (``<prefix>:t:<id>``); a generation counter (``<prefix>:generation``).

    Updates from several replicas are serialised by one Redis lock (``<prefix>:lock``); an update's
    writes go in one MULTI/EXEC transaction after the whole batch was computed. The lock expires
    ``lock_ttl_s`` after it was taken or last renewed, and a thread of the holder renews it while
    the update runs (for at most ``lock_timeout_s``): a replica killed inside an update holds the
    others up for ``lock_ttl_s`` at most, not ``lock_timeout_s``. The transaction watches the
    generation counter, so an update whose lock expired meanwhile (its process paused past the
    TTL) and that another writer overtook writes nothing (:class:`StateConflict`) instead of
    applying its rows on a state it did not read.

    Args:
        url: ``redis://host:port/db``.
        prefix: key prefix.
        lock_timeout_s: longest wait for the lock, and longest an update keeps renewing it (a hung
            replica cannot block the others longer).
        lock_ttl_s: the lock's expiry without renewal (how long a replica that died holding it
            blocks the others).
        lock_poll_s: how often a writer waiting for the lock tries again. redis-py's default,
            0.1 s, made each wait for the other replica's update (a few ms) cost 100 ms: two
            replicas at 100 single-transaction requests/s had a p99 of 387-514 ms (3 runs),
            12-47 ms with 2 ms (one replica alone: 8-38 ms; bench/replica_kill_bench.py).
    """

    def __init__(self, url: str, prefix: str = "indusflow:fraud", lock_timeout_s: float = 30.0,
                 lock_ttl_s: float = 2.0, lock_poll_s: float = 0.002) -> None:
        import redis

        self._redis = redis.Redis.from_url(url)
        self._errors = redis.exceptions
        self.prefix = prefix
        self.lock_key = f"{prefix}:lock"  #: held by the replica whose update runs
        self.generation_key = f"{prefix}:generation"  #: incremented by every commit
        self.owner_times_key = f"{prefix}:owner-times"  #: transaction ids by their time (ns)
        self._lock_timeout_s = lock_timeout_s
        self._lock_ttl_s = min(lock_ttl_s, lock_timeout_s)
        self._lock_poll_s = lock_poll_s
        self._thread_lock = threading.Lock()
        self._generation: int | None = None
        self._committed = False
        self._pipe: Any = None
        self._held: tuple[Any, float] | None = None  # the running update's lock and when it was taken
        self._keeper: threading.Thread | None = None
        self._closed = threading.Event()

    def _key(self, kind: str, key: str) -> str:
        return f"{self.prefix}:{kind}:{key}"

    def _keep_lock(self) -> None:
        """Renew the running update's lock every third of its TTL (for ``lock_timeout_s`` at most)."""
        while not self._closed.wait(self._lock_ttl_s / 3):
            held = self._held
            if held is None or time.monotonic() - held[1] > self._lock_timeout_s:
                continue
            try:
                held[0].reacquire()
            except self._errors.LockError:
                pass  # released meanwhile; or expired and maybe taken: the commit's WATCH refuses it then
            except self._errors.RedisError as exc:
                log.warning("online-state lock not renewed: %s", type(exc).__name__)

    @contextmanager
    def exclusive(self) -> Iterator[bool]:
        with self._thread_lock:
            # thread_local=False: the keeper thread renews the token this thread took
            lock = self._redis.lock(self.lock_key, timeout=self._lock_ttl_s, sleep=self._lock_poll_s,
                                    blocking_timeout=self._lock_timeout_s, thread_local=False)
            if not lock.acquire():
                raise TimeoutError("could not take the online-state lock in Redis")
            self._held = (lock, time.monotonic())
            if self._keeper is None:
                self._keeper = threading.Thread(target=self._keep_lock, name="online-state-lock", daemon=True)
                self._keeper.start()
            pipe = self._redis.pipeline(transaction=True)
            self._committed = False
            try:
                pipe.watch(self.generation_key)  # EXEC writes nothing if another writer commits before it
                generation: Any = pipe.get(self.generation_key)  # immediate: the pipeline is watching
                pipe.multi()  # from here on the pipeline queues the update's writes
                self._pipe = pipe
                yield (int(generation) if generation is not None else 0) == self._generation
                pipe.incr(self.generation_key)
                try:
                    executed: list[Any] = pipe.execute()
                    written = int(executed[-1])
                except self._errors.WatchError:
                    raise StateConflict("another writer committed while this update ran (its lock had "
                                        "expired): nothing of the update was written") from None
                # only an update that committed knows the stored state as it is now (a reset does not)
                self._generation = written if self._committed else None
            except BaseException:
                self._generation = None
                raise
            finally:
                self._held = None
                self._pipe = None
                pipe.reset()
                try:
                    lock.release()
                except self._errors.LockError:
                    pass  # it expired (and another writer may hold it now): theirs to release

    def read(self, kind: str, keys: Sequence[str], limit: int | None = None) -> dict[str, dict[str, Any]]:
        unique = list(dict.fromkeys(keys))
        if not unique:
            return {}
        if kind == TERMINAL and limit is not None:  # every row is fetched (a hash); the newest kept
            return {k: {"rows": doc["rows"][-limit:]} for k, doc in self.read(kind, unique).items()}
        pipe = self._redis.pipeline(transaction=False)
        for k in unique:
            if kind == ACCOUNT:
                pipe.get(self._key("a", k))
                pipe.lrange(self._key("ar", k), 0, -1)
            else:
                pipe.hvals(self._key("t", k))
        values = pipe.execute()
        out: dict[str, dict[str, Any]] = {}
        for i, k in enumerate(unique):
            if kind == ACCOUNT:
                doc, rows = values[2 * i], values[2 * i + 1]
                if doc is not None:
                    out[k] = account_doc(orjson.loads(doc), [account_row(orjson.loads(r)) for r in rows])
            elif values[i]:
                out[k] = terminal_doc([tuple(orjson.loads(r)) for r in values[i]])
        return out

    def commit(self, journal: Journal) -> None:
        self._committed = True
        pipe = self._pipe
        for k, doc in journal.accounts.items():
            pipe.set(self._key("a", k), orjson.dumps(doc))
        appended: dict[str, list[bytes]] = {}
        for k, _, row in journal.account_rows:
            appended.setdefault(k, []).append(orjson.dumps(row))
        for k, rows in appended.items():
            pipe.rpush(self._key("ar", k), *rows)
        for k, doc in journal.accounts.items():  # the list keeps the rows from the cut on
            cut = journal.account_cut.get(k)
            if cut is not None:
                pipe.ltrim(self._key("ar", k), -(doc["seq"] - cut), -1) if doc["seq"] > cut else \
                    pipe.delete(self._key("ar", k))
        by_terminal: dict[str, dict[str, bytes]] = {}
        for k, row in [*journal.terminal_rows, *journal.labels]:
            by_terminal.setdefault(k, {})[str(row[3])] = orjson.dumps(row)
        for k, fields in by_terminal.items():
            pipe.hset(self._key("t", k), mapping=fields)
        dropped: dict[str, list[str]] = {}
        for k, row in journal.dropped:
            dropped.setdefault(k, []).append(str(row[3]))
        for k, rids in dropped.items():
            pipe.hdel(self._key("t", k), *rids)
        horizon = owners_horizon(journal)
        if horizon is not None:  # read under the lock: no other writer changes them meanwhile
            expired: list[Any] = list(self._redis.zrangebyscore(  # type: ignore[arg-type]
                self.owner_times_key, "-inf", f"({horizon}", start=0, num=4096))
            if expired:
                pipe.delete(*[self._key("o", tx.decode()) for tx in expired])
                pipe.zrem(self.owner_times_key, *expired)
        if journal.owners:
            pipe.mset({self._key("o", tx): owner for tx, owner, _ in journal.owners})
            pipe.zadd(self.owner_times_key, {tx: t for tx, _, t in journal.owners})

    def owners(self, ids: Sequence[str]) -> dict[str, str]:
        unique = list(dict.fromkeys(ids))
        held: list[Any] = list(self._redis.mget([self._key("o", tx) for tx in unique])) if unique else []  # type: ignore[arg-type]
        return {tx: got.decode() for tx, got in zip(unique, held, strict=True) if got is not None}

    def reset(self, kind: str, key: str) -> bool:
        with self.exclusive():
            names = ([self._key("a", key), self._key("ar", key)] if kind == ACCOUNT else [self._key("t", key)])
            found = self._redis.delete(*names)
        return bool(found)

    def close(self) -> None:
        self._closed.set()
        if self._keeper is not None:
            self._keeper.join(timeout=5)
        self._redis.close()
