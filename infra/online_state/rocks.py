"""The embedded online state store: RocksDB through ``rocksdict`` (one folder under the home).

Chosen by ``bench/state_store_bench.py`` (issue 47): on the state's real write pattern (256-row
requests, random accounts and terminals) a request's commit took 3.1-3.6 ms of CPU against
SQLite's 10.6-10.8 ms and LMDB's 4.5-4.9 ms, on half SQLite's disk; a SIGKILL at random points
never lost or tore a committed request. RocksDB is a log-structured store made for write-heavy
random keys: we write no journal, compactor or checkpoint thread of our own.

Layout (raw bytes keys, values in orjson; ``K`` is a key's UTF-8 bytes after their length in two
bytes, so no key's range holds another key's rows):

* ``a K``: an account's summary ``{"n", "sum", "terms", "seq"}``;
* ``r K seq``: one account row under its sequence number (8 bytes, big-endian);
* ``t K time rid``: one terminal row ``[label, id]`` under its time (ns + 2**63, 8 bytes) and row id
  (8 bytes): a prefix scan gives a terminal's rows in time order, equal times in arrival order,
  and a scan backwards its newest rows;
* ``o K``: a transaction id's owner ``[owner, time]``; ``e time commit``: the claims of one commit
  ``[[time, id], ...]`` (oldest first) under their oldest time (ns + 2**63, 8 bytes) and the
  commit's id (its generation, 8 bytes, and its place in its write batch, 4): the order in which owners are forgotten, one key per commit (a key
  per claim was a fifth of a 256-row request's writes);
* ``g``: the generation, which every commit increments in the same write batch.

One update is one ``WriteBatch``: atomic, and written to RocksDB's write-ahead log before it returns,
so a killed process loses nothing it committed (``sync=True``: nor does a power cut, for one fsync
per commit). RocksDB lets one process open a database; several store objects of one process on
one folder share the opened database and its lock (what several workers of one process do).
Several server processes or replicas share a state through Redis (:mod:`.redis_store`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from infra.online_state.protocol import (
    ACCOUNT,
    AccountRow,
    Journal,
    TerminalRow,
    account_doc,
    account_row,
    owners_horizon,
)

__all__ = ["RocksStateStore"]

_TIME_OFFSET = 2**63  # signed ns since the epoch -> an unsigned, order-preserving 8-byte key
_GENERATION = b"g"
_EXPIRY = b"e"
#: At most this many owners forgotten per commit (the rest at the next ones): a commit's cost stays bounded.
_EXPIRE_PER_COMMIT = 4096


def _prefix(tag: bytes, key: str) -> bytes:
    raw = key.encode("utf-8")
    return tag + len(raw).to_bytes(2, "big") + raw


def _summary_key(key: str) -> bytes:
    return _prefix(b"a", key)


def _account_row_key(key: str, seq: int) -> bytes:
    return _prefix(b"r", key) + seq.to_bytes(8, "big")


def _terminal_row_key(key: str, t_ns: int, rid: int) -> bytes:
    return _prefix(b"t", key) + (t_ns + _TIME_OFFSET).to_bytes(8, "big") + rid.to_bytes(8, "big")


def _owner_key(tx: str) -> bytes:
    return _prefix(b"o", tx)


def _expiry_key(t_ns: int, commit_id: bytes) -> bytes:
    return _EXPIRY + (t_ns + _TIME_OFFSET).to_bytes(8, "big") + commit_id


@dataclass
class _Opened:
    """One database opened by this process: its lock (the exclusive section of every store object on
    it), the generation last committed, and how many store objects use it."""

    db: Any
    lock: threading.Lock
    generation: int
    users: int = 0


_OPENED: dict[Path, _Opened] = {}
_OPENED_LOCK = threading.Lock()


def _open(path: Path, sync: bool) -> _Opened:
    import rocksdict

    path.mkdir(parents=True, exist_ok=True)
    # owner-only: the state holds account and terminal ids and their recent transactions (RocksDB
    # creates its files with the process's umask; nobody else can reach them through this folder)
    os.chmod(path, 0o700)
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_keep_log_file_num(5)  # RocksDB's info LOG, one more per open: keep a few
    try:
        db = rocksdict.Rdict(str(path), options=options)
    except Exception as exc:  # rocksdict raises a plain Exception with RocksDB's status text
        if "lock" in str(exc).lower():
            raise RuntimeError(
                f"the online state {path} is open in another process: an embedded store serves one process "
                "(run the server with one worker, or share the state between processes and replicas through "
                "Redis: INDUSFLOW_SERVE_REDIS_URL)") from None
        raise
    write = rocksdict.WriteOptions()
    write.sync = sync
    db.set_write_options(write)
    stored = db.get(_GENERATION)
    return _Opened(db=db, lock=threading.Lock(), generation=int.from_bytes(stored, "big") if stored else 0)


class RocksStateStore:
    """The online state in one RocksDB folder (see the module's docstring for the layout).

    Args:
        path: the database folder (created owner-only).
        sync: fsync the write-ahead log at each commit (survives a power cut; one fsync per
            request). Default: written, not synced (survives a killed process, as SQLite's
            ``synchronous=NORMAL`` did).
    """

    def __init__(self, path: Path, sync: bool = False) -> None:
        self.path = path.resolve()
        with _OPENED_LOCK:
            opened = _OPENED.get(self.path)
            if opened is None:
                opened = _OPENED[self.path] = _open(self.path, sync)
            opened.users += 1
        self._opened: _Opened | None = opened
        self._generation: int | None = None
        self._batch: Any = None
        self._own = False  # the section's writes include an update's commit (not only a reset)

    @property
    def _db(self) -> Any:
        if self._opened is None:
            raise RuntimeError(f"the online state store {self.path} is closed")
        return self._opened.db

    @contextmanager
    def exclusive(self) -> Iterator[bool]:
        import rocksdict

        opened = self._opened
        if opened is None:
            raise RuntimeError(f"the online state store {self.path} is closed")
        with opened.lock:
            generation: int | None = opened.generation
            self._batch = rocksdict.WriteBatch(raw_mode=True)
            self._own = False
            try:
                yield generation == self._generation
                if not self._batch.is_empty():
                    self._batch.put(_GENERATION, (opened.generation + 1).to_bytes(8, "big"))
                    opened.db.write(self._batch)
                    opened.generation += 1
                    # after a reset alone, what this store kept in memory is not the stored state either
                    generation = opened.generation if self._own else None
            except BaseException:
                self._generation = None  # what the caller kept in memory may be ahead of the store
                raise
            finally:
                self._batch = None
            self._generation = generation

    def read(self, kind: str, keys: Sequence[str], limit: int | None = None) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        db = self._db
        for key in dict.fromkeys(keys):
            if kind == ACCOUNT:
                summary = db.get(_summary_key(key))
                if summary is not None:
                    rows: list[AccountRow] = [account_row(orjson.loads(v))
                                              for _, v in self._scan(_prefix(b"r", key), 8)]
                    out[key] = account_doc(orjson.loads(summary), rows)
            else:
                trows = self._terminal_rows(key, limit)
                if trows:
                    out[key] = {"rows": trows}
        return out

    def _scan(self, prefix: bytes, tail: int, newest: int | None = None) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) of the keys ``prefix`` + ``tail`` bytes, in key order; with ``newest``, at most
        that many of the last."""
        it = self._db.iter()
        if newest is None:
            it.seek(prefix)
            while it.valid() and (k := it.key()).startswith(prefix):
                yield k, it.value()
                it.next()
            return
        found: list[tuple[bytes, bytes]] = []
        it.seek_for_prev(prefix + b"\xff" * tail)
        while len(found) < newest and it.valid() and (k := it.key()).startswith(prefix):
            found.append((k, it.value()))
            it.prev()
        yield from reversed(found)

    def _terminal_rows(self, key: str, limit: int | None) -> list[TerminalRow]:
        rows: list[TerminalRow] = []
        for k, v in self._scan(_prefix(b"t", key), 16, limit):
            label, tx = orjson.loads(v)
            rows.append((int.from_bytes(k[-16:-8], "big") - _TIME_OFFSET, label, tx, int.from_bytes(k[-8:], "big")))
        return rows

    def commit(self, journal: Journal) -> None:
        if not journal:
            return
        batch = self._batch
        for k, seq, row in journal.account_rows:
            batch.put(_account_row_key(k, seq), orjson.dumps(row))
        for k, cut in journal.account_cut.items():
            batch.delete_range(_account_row_key(k, 0), _account_row_key(k, cut))
        for k, summary in journal.accounts.items():
            batch.put(_summary_key(k), orjson.dumps(summary))
        for k, row in (*journal.terminal_rows, *journal.labels):  # a label: the whole row again
            batch.put(_terminal_row_key(k, row[0], row[3]), orjson.dumps([row[1], row[2]]))
        for k, row in journal.dropped:
            batch.delete(_terminal_row_key(k, row[0], row[3]))
        horizon = owners_horizon(journal)
        if horizon is not None:  # first the owners forgotten, then the claims (a claim older than that stays
            self._forget_owners(batch, horizon)  # until the next commit forgets it with its expiry key)
        if journal.owners:
            for tx, owner, t in journal.owners:
                batch.put(_owner_key(tx), orjson.dumps([owner, t]))
            claims = sorted((t, tx) for tx, _, t in journal.owners)
            assert self._opened is not None
            # unique: the generation this commit writes, and the writes before it in its batch
            commit_id = (self._opened.generation + 1).to_bytes(8, "big") + batch.len().to_bytes(4, "big")
            batch.put(_expiry_key(claims[0][0], commit_id), orjson.dumps(claims))
        self._own = True

    def _forget_owners(self, batch: Any, horizon: int) -> None:
        """Delete the owners of transactions dated before ``horizon`` (ns), oldest commits first, at most
        about :data:`_EXPIRE_PER_COMMIT` (whole commits' claims); a commit's claims from ``horizon`` on
        stay, under their oldest time."""
        end = _EXPIRY + (max(horizon, -_TIME_OFFSET) + _TIME_OFFSET).to_bytes(8, "big")
        it = self._db.iter()
        it.seek(_EXPIRY)
        forgotten = 0
        while forgotten < _EXPIRE_PER_COMMIT and it.valid() and (k := it.key()).startswith(_EXPIRY) and k < end:
            claims = orjson.loads(it.value())
            batch.delete(k)
            kept = [claim for claim in claims if claim[0] >= horizon]
            for _, tx in claims[: len(claims) - len(kept)]:  # oldest first: the forgotten ones lead
                batch.delete(_owner_key(tx))
            forgotten += len(claims) - len(kept)
            if kept:
                batch.put(_expiry_key(kept[0][0], k[9:]), orjson.dumps(kept))
            it.next()

    def owners(self, ids: Sequence[str]) -> dict[str, str]:
        db = self._db
        unique = list(dict.fromkeys(ids))
        found = db.get([_owner_key(tx) for tx in unique]) if unique else []
        return {tx: orjson.loads(v)[0] for tx, v in zip(unique, found, strict=True) if v is not None}

    def reset(self, kind: str, key: str) -> bool:
        prefix = _prefix(b"r" if kind == ACCOUNT else b"t", key)
        with self.exclusive():
            found = next(self._scan(prefix, 8 if kind == ACCOUNT else 16), None) is not None
            if kind == ACCOUNT and self._db.get(_summary_key(key)) is not None:
                found = True
                self._batch.delete(_summary_key(key))
            if found:  # the generation moves: every writer reads again
                self._batch.delete_range(prefix, prefix + b"\xff" * 17)
        return found

    def close(self) -> None:
        with _OPENED_LOCK:
            opened, self._opened = self._opened, None
            if opened is None:
                return
            opened.users -= 1
            if opened.users == 0:
                del _OPENED[self.path]
                opened.db.close()
