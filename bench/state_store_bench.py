"""The online fraud state's writes on two embedded stores, side by side. Prints one JSON line.

Issue 47 chose the default store of the online fraud state by measurement (RocksDB; SQLite, the
store before it, was measured by this bench's first version and then deleted). This bench takes
the state's real write pattern: 256-row requests of new transactions (``bench/serve_bench.py``'s
generator, with accounts and terminals drawn at random by default) go through the real
:class:`solutions.fraud.online.OnlineFraudState` once, and each request's keys and its
:class:`infra.online_state.Journal` (new account rows, account summaries, rows cut from the history, terminal rows,
dropped rows) are kept. The same stream is then replayed on each store, one request at a time, as
the server does it: read the request's accounts and terminals (decoded to the documents the state
uses), then write its journal and a generation counter in one transaction.

Stores:

* ``rocksdb``: :class:`infra.online_state.rocks.RocksStateStore` itself (the server's store: its
  layout, one ``WriteBatch`` per request), nothing copied.
* ``lmdb`` (``lmdb``, the runner-up): the same rows as keys, ``a\\0<account>`` (summary),
  ``r\\0<account>\\0<seq>`` (one history row), ``t\\0<terminal>\\0<row id>`` (one terminal row), ``g``
  (generation), values in orjson; one write transaction per request; an account's history read by
  a prefix scan.

Durability, like with like (``--durability``):

* ``process``: a commit survives the process being killed, not a power cut (nothing fsynced per
  commit). RocksDB's WAL written without ``sync`` (what the server runs), LMDB ``sync=False`` (its
  pages written to the file, no fsync).
* ``fsync``: a commit is fsynced before it returns. RocksDB ``WriteOptions.sync=True``
  (``RocksStateStore(sync=True)``), LMDB ``sync=True`` (its default).

The crash test runs each store in a child process writing the stream and printing each request's
number once its commit returned; the parent kills it with SIGKILL mid-stream, reopens the store
and checks that the generation is the last reported commit (or the one after it, when the kill
landed after a commit but before its line) and that every key written so far reads back exactly as
an in-memory replay of that many journals says; the next child goes on from there (``--kills``
times per store, at random points).

Times are wall milliseconds and, beside them (``*_cpu_ms``), the CPU time the whole process spent
meanwhile (all its threads: RocksDB's flushes included), which a busy
machine's scheduler delays inflate far less than the wall time.

Usage: ``nice -n 10 python bench/state_store_bench.py [--requests 600] [--durability process]
[--keys random|sequential] [--stores rocksdb,lmdb]``
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from infra.online_state import ACCOUNT, TERMINAL, Journal

ROWS = 256
SEQ_LEN = 16  # serve_bench's model: sequences of 16 steps
DELAY_DAYS = 7
_OPTS = orjson.OPT_SERIALIZE_NUMPY


def canonical(value: Any) -> Any:
    """Tuples as lists, NaN as None: what every store gives back after a JSON round trip."""
    return orjson.loads(orjson.dumps(value, option=_OPTS))


# ------------------------------------------------------------------------------------------
# the stream


@dataclass
class Request:
    accounts: list[str]
    terminals: list[str]
    journal: Journal


def _random_transactions(seed: int) -> Any:
    from serve_bench import N_ACCOUNTS, N_TERMINALS, Transactions

    class RandomKeys(Transactions):
        """serve_bench's transactions (one a second, in time order) with accounts and terminals at random."""

        def __init__(self) -> None:
            super().__init__()
            self.rng = random.Random(seed)

        def one(self) -> dict[str, Any]:
            row = super().one()
            row["account_id"] = f"A{self.rng.randrange(N_ACCOUNTS)}"
            row["terminal_id"] = f"T{self.rng.randrange(N_TERMINALS)}"
            return row

    return RandomKeys()


def make_stream(n: int, keys: str, home: Path, seed: int = 0) -> list[Request]:
    """``n`` requests through the real online state (on a throwaway store): keys and journals."""
    from serve_bench import Transactions

    from infra.online_state import open_state_store
    from solutions.fraud.online import OnlineFraudState, validate_rows

    tx = _random_transactions(seed) if keys == "random" else Transactions()
    rng = random.Random(seed)
    state = OnlineFraudState.for_model(open_state_store(home), history_len=255)
    out: list[Request] = []
    try:
        for _ in range(n):
            rows = validate_rows(tx.body(ROWS)["transactions"])
            with state.update() as batch:
                batch.load(rows.accounts, [])
                batch.check(rows)
                batch.apply(rows, DELAY_DAYS, keep=SEQ_LEN)
                batch.record_scores([rng.random() for _ in range(len(rows))], 1)
                journal = batch.journal()
                out.append(Request(list(dict.fromkeys(rows.accounts)),
                                   list(dict.fromkeys(t for t in rows.terminals if t is not None)),
                                   _copy(journal)))
    finally:
        state.store.close()
    return out


def _copy(journal: Journal) -> Journal:
    return Journal(**{k: canonical(getattr(journal, k)) for k in
                      ("accounts", "account_rows", "account_cut", "terminal_rows", "labels", "dropped")})


def save_stream(stream: Sequence[Request], path: Path) -> None:
    with path.open("wb") as f:
        for r in stream:
            f.write(orjson.dumps({"a": r.accounts, "t": r.terminals, "j": r.journal.__dict__}) + b"\n")


def load_stream(path: Path) -> list[Request]:
    out = []
    for line in path.read_bytes().splitlines():
        d = orjson.loads(line)
        j = d["j"]
        out.append(Request(d["a"], d["t"], Journal(j["accounts"], [tuple(x) for x in j["account_rows"]],
                                                   j["account_cut"], [tuple(x) for x in j["terminal_rows"]],
                                                   [tuple(x) for x in j["labels"]], [tuple(x) for x in j["dropped"]])))
    return out


# ------------------------------------------------------------------------------------------
# the stores: read(kind, keys) -> documents as OnlineStateStore.read gives them; write(journal)


Clock = tuple[float, float]  #: (wall seconds, this process's CPU seconds, all its threads)


def _now() -> Clock:
    return time.perf_counter(), time.process_time()


def _since(start: Clock, end: Clock) -> Clock:
    return end[0] - start[0], end[1] - start[1]


def _terminal_doc(rows: list[tuple[Any, ...]]) -> dict[str, Any]:
    rows.sort(key=lambda r: (r[0], r[3]))
    return {"rows": rows}


class RocksBench:
    """The server's store itself."""

    name = "rocksdb"

    def __init__(self, path: Path, durability: str) -> None:
        from infra.online_state.rocks import RocksStateStore

        self.store = RocksStateStore(path / "rocks", sync=durability == "fsync")
        self.mode = (f"RocksStateStore on rocksdict {version('rocksdict')} defaults (WAL on), "
                     f"WriteOptions.sync={durability == 'fsync'}, one WriteBatch per request")

    def request(self, accounts: list[str], terminals: list[str], journal: Journal | None) -> tuple[Clock, Clock]:
        with self.store.exclusive():
            t0 = _now()
            self.store.read(ACCOUNT, accounts)
            self.store.read(TERMINAL, terminals)
            t1 = _now()
            if journal is not None:
                self.store.commit(journal)
        t2 = _now()
        return _since(t0, t1), _since(t1, t2)

    def read(self, kind: str, keys: list[str]) -> dict[str, dict[str, Any]]:
        with self.store.exclusive():
            return self.store.read(kind, keys)

    def generation(self) -> int:
        assert self.store._opened is not None
        return self.store._opened.generation

    def close(self) -> None:
        self.store.close()


def _k(prefix: bytes, key: str, n: int | None = None) -> bytes:
    out = prefix + key.encode() + b"\0"
    return out if n is None else out + n.to_bytes(8, "big")


class _KvBench:
    """The shared layout of the key-value stores; subclasses give put/delete/scan/commit."""

    def _apply(self, w: Any, journal: Journal, generation: int) -> None:
        for k, s, r in journal.account_rows:
            self._put(w, _k(b"r\0", k, s), orjson.dumps(r, option=_OPTS))
        for k, cut in journal.account_cut.items():
            self._delete_range(w, _k(b"r\0", k, 0), _k(b"r\0", k, cut))
        for k, d in journal.accounts.items():
            self._put(w, _k(b"a\0", k), orjson.dumps(d, option=_OPTS))
        for k, r in (*journal.terminal_rows, *journal.labels):  # a label row is the whole row again
            self._put(w, _k(b"t\0", k, r[3]), orjson.dumps([r[0], r[1], r[2]], option=_OPTS))
        for k, r in journal.dropped:
            self._delete(w, _k(b"t\0", k, r[3]))
        self._put(w, b"g", generation.to_bytes(8, "big"))

    def _docs(self, r: Any, kind: str, keys: list[str]) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for key in dict.fromkeys(keys):
            if kind == ACCOUNT:
                doc = self._get(r, _k(b"a\0", key))
                if doc is None:
                    continue
                d = orjson.loads(doc)
                rows = [orjson.loads(v) for v in self._scan(r, _k(b"r\0", key))]
                out[key] = {**d, "recent": [(*x[:4], tuple(x[4]), *x[5:]) for x in rows]}
            else:
                p = _k(b"t\0", key)
                rows = [(*orjson.loads(v), int.from_bytes(kk[len(p):], "big")) for kk, v in self._scan(r, p, True)]
                if rows:
                    out[key] = _terminal_doc(rows)
        return out


class LmdbBench(_KvBench):
    name = "lmdb"

    def __init__(self, path: Path, durability: str) -> None:
        import lmdb

        sync = durability == "fsync"
        self.env = lmdb.open(str(path / "lmdb"), map_size=8 << 30, sync=sync, metasync=sync, readahead=False)
        with self.env.begin() as r:
            g = r.get(b"g")
        self.gen = int.from_bytes(g, "big") if g is not None else 0
        self.mode = f"lmdb {lmdb.__version__}, sync={sync}, metasync={sync}, writemap=False, one write txn per request"

    def _put(self, w: Any, k: bytes, v: bytes) -> None:
        w.put(k, v)

    def _delete(self, w: Any, k: bytes) -> None:
        w.delete(k)

    def _delete_range(self, w: Any, lo: bytes, hi: bytes) -> None:
        cur = w.cursor()
        if cur.set_range(lo):
            while cur.key() < hi:
                if not cur.delete():  # moves to the next record
                    break

    def _get(self, r: Any, k: bytes) -> bytes | None:
        return r.get(k)

    def _scan(self, r: Any, prefix: bytes, with_keys: bool = False) -> Any:
        cur = r.cursor()
        if not cur.set_range(prefix):
            return
        for k, v in cur:
            if not k.startswith(prefix):
                break
            yield (k, v) if with_keys else v

    def request(self, accounts: list[str], terminals: list[str], journal: Journal | None) -> tuple[Clock, Clock]:
        t0 = _now()
        with self.env.begin(buffers=False) as r:
            self._docs(r, ACCOUNT, accounts)
            self._docs(r, TERMINAL, terminals)
        t1 = _now()
        if journal is not None:
            with self.env.begin(write=True) as w:
                self._apply(w, journal, self.gen + 1)
            self.gen += 1
        return _since(t0, t1), _since(t1, _now())

    def read(self, kind: str, keys: list[str]) -> dict[str, dict[str, Any]]:
        with self.env.begin() as r:
            return self._docs(r, kind, keys)

    def generation(self) -> int:
        return self.gen

    def close(self) -> None:
        self.env.close()


STORES = {"rocksdb": RocksBench, "lmdb": LmdbBench}


# ------------------------------------------------------------------------------------------
# the reference: the journals replayed in memory


@dataclass
class Reference:
    accounts: dict[str, Any] = field(default_factory=dict)
    account_rows: dict[str, dict[int, Any]] = field(default_factory=dict)
    terminal_rows: dict[str, dict[int, Any]] = field(default_factory=dict)

    def apply(self, j: Journal) -> None:
        for k, s, r in j.account_rows:
            self.account_rows.setdefault(k, {})[s] = r
        for k, cut in j.account_cut.items():
            self.account_rows[k] = {s: r for s, r in self.account_rows.get(k, {}).items() if s >= cut}
        self.accounts.update(j.accounts)
        for k, r in (*j.terminal_rows, *j.labels):
            self.terminal_rows.setdefault(k, {})[r[3]] = list(r)
        for k, r in j.dropped:
            self.terminal_rows.get(k, {}).pop(r[3], None)

    def docs(self, kind: str) -> dict[str, Any]:
        if kind == ACCOUNT:
            return canonical({k: {**d, "recent": [self.account_rows.get(k, {})[s]
                                                  for s in sorted(self.account_rows.get(k, {}))]}
                              for k, d in self.accounts.items()})
        return canonical({k: _terminal_doc([tuple(r) for r in rows.values()])
                          for k, rows in self.terminal_rows.items() if rows})


def contents_match(store: Any, stream: Sequence[Request], upto: int) -> tuple[bool, int]:
    """Whether every account and terminal of the first ``upto`` requests reads back as the replay says."""
    ref = Reference()
    for r in stream[:upto]:
        ref.apply(r.journal)
    keys = {ACCOUNT: sorted({a for r in stream[:upto] for a in r.accounts}),
            TERMINAL: sorted({t for r in stream[:upto] for t in r.terminals})}
    ok = all(canonical(store.read(kind, keys[kind])) == ref.docs(kind) for kind in (ACCOUNT, TERMINAL))
    return ok, len(keys[ACCOUNT]) + len(keys[TERMINAL])


# ------------------------------------------------------------------------------------------
# runs


def _q(values: list[float]) -> dict[str, float]:
    ms = sorted(v * 1000 for v in values)
    return {"median": round(statistics.median(ms), 3), "p99": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 3),
            "max": round(ms[-1], 3)}


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def timed(name: str, durability: str, stream: Sequence[Request], home: Path, warmup: int) -> dict[str, Any]:
    folder = home / f"{name}-{durability}"
    folder.mkdir()
    store = STORES[name](folder, durability)
    reads: list[float] = []
    commits: list[float] = []
    read_cpu: list[float] = []
    commit_cpu: list[float] = []
    try:
        for i, r in enumerate(stream):
            rd, cm = store.request(r.accounts, r.terminals, r.journal)
            if i >= warmup:
                reads.append(rd[0])
                commits.append(cm[0])
                read_cpu.append(rd[1])
                commit_cpu.append(cm[1])
        ok, n_keys = contents_match(store, stream, len(stream))
        mode = store.mode
    finally:
        store.close()
    return {"store": name, "durability": durability, "mode": mode, "commit_ms": _q(commits), "read_ms": _q(reads),
            "commit_cpu_ms": _q(commit_cpu), "read_cpu_ms": _q(read_cpu),
            "measured_requests": len(commits), "contents_match_replay": ok, "keys_checked": n_keys,
            "bytes_on_disk": _du(folder)}


def crash_child(name: str, durability: str, folder: Path, stream_file: Path) -> None:
    """Write the stream from where the store stands (its generation) on, printing each commit's count."""
    stream = load_stream(stream_file)
    store = STORES[name](folder, durability)
    for i in range(store.generation(), len(stream)):
        r = stream[i]
        store.request(r.accounts, r.terminals, r.journal)
        sys.stdout.write(f"{i + 1}\n")  # this many requests committed
        sys.stdout.flush()
    time.sleep(60)  # the parent kills it before


def _kill_once(name: str, durability: str, folder: Path, stream: Sequence[Request], stream_file: Path,
               kill_after: int) -> dict[str, Any]:
    child = subprocess.Popen([sys.executable, __file__, "--crash-child", name, durability, str(folder), str(stream_file)],
                             stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    reported = 0
    assert child.stdout is not None
    for line in child.stdout:
        reported = int(line)
        if reported >= kill_after:
            os.kill(child.pid, signal.SIGKILL)  # the child is inside its next request by now, most likely
            break
    child.wait()
    store = STORES[name](folder, durability)
    try:
        generation = store.generation()
        ok, n_keys = contents_match(store, stream, generation)
    finally:
        store.close()
    return {"reported": reported, "generation": generation, "generation_ok": generation in (reported, reported + 1),
            "contents_match_replay": ok, "keys_checked": n_keys, "child_rc": child.returncode}


def crash_test(name: str, durability: str, stream: Sequence[Request], stream_file: Path, home: Path,
               seed: int, kills: int) -> dict[str, Any]:
    """``kills`` SIGKILLs at random points of one stream; after each the store is reopened, checked,
    and the next child goes on from where the store stands."""
    folder = home / f"crash-{name}-{durability}"
    folder.mkdir()
    points = sorted(random.Random(seed).sample(range(1, len(stream) - 1), kills))
    runs = [_kill_once(name, durability, folder, stream, stream_file, p) for p in points]
    return {"signal": "SIGKILL", "kills": runs,
            "all_ok": all(r["generation_ok"] and r["contents_match_replay"] and r["child_rc"] == -signal.SIGKILL
                          for r in runs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=600, help="256-row requests in the stream")
    parser.add_argument("--warmup", type=int, default=50, help="first requests not timed")
    parser.add_argument("--durability", choices=("process", "fsync"), default="process")
    parser.add_argument("--keys", choices=("random", "sequential"), default="random",
                        help="accounts/terminals at random, or serve_bench's n mod N")
    parser.add_argument("--stores", default="rocksdb,lmdb")
    parser.add_argument("--no-crash", action="store_true")
    parser.add_argument("--kills", type=int, default=3, help="SIGKILLs per store in the crash test")
    parser.add_argument("--crash-child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.crash_child:
        name, durability, folder, stream_file = args.crash_child
        crash_child(name, durability, Path(folder), Path(stream_file))
        return
    loadavg_before = Path("/proc/loadavg").read_text().strip()
    home = Path(tempfile.mkdtemp(prefix="state-store-bench-"))
    try:
        t0 = time.perf_counter()
        stream = make_stream(args.requests, args.keys, home / "source")
        stream_s = time.perf_counter() - t0
        stream_file = home / "stream.jsonl"
        save_stream(stream, stream_file)
        results = []
        for i, name in enumerate(args.stores.split(",")):
            row = timed(name, args.durability, stream, home, args.warmup)
            if not args.no_crash:
                row["crash"] = crash_test(name, args.durability, stream, stream_file, home, seed=i, kills=args.kills)
            results.append(row)
        writes = [len(r.journal.account_rows) + len(r.journal.accounts) + len(r.journal.terminal_rows)
                  + len(r.journal.account_cut) + len(r.journal.dropped) for r in stream]
        print(json.dumps({
            "bench": "state_store", "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "cores": os.cpu_count(), "rows_per_request": ROWS, "requests": args.requests, "warmup": args.warmup,
            "keys": args.keys, "durability": args.durability,
            "stream": {"built_s": round(stream_s, 1), "writes_per_request_median": statistics.median(writes),
                       "accounts_per_request_median": statistics.median(len(r.accounts) for r in stream),
                       "terminals_per_request_median": statistics.median(len(r.terminals) for r in stream)},
            "loadavg": {"before": loadavg_before, "after": Path("/proc/loadavg").read_text().strip()},
            "stores": results,
        }))
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
