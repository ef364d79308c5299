"""What a 256-row fraud request's state update spends on the parts no design of issue 47's shape avoids.

In process, on a full state (``--warm`` earlier requests: past the 7-day label delay, every account
holding a full sequence), each measured request runs ``score_requests_with_inputs`` as the server
does; beside its whole time (the calling thread's CPU), the time of:

* ``definition``: the one feature definition's vectorised functions
  (:mod:`solutions.fraud.feature_defs`: row features, account and terminal windows, sequence steps);
* ``owners_read``: reading the transaction ids' owners from the store (replays and reused ids);
* ``commit_puts``: turning the update's journal into the store's keyed writes;
* ``store_write``: RocksDB writing them (one write batch), and how many keys it wrote.

These are timed by wrapping the functions in this process only (the server has no timing hooks).
``bench/serve_floor.py`` measures how much time per request the served route leaves to the state
once the app, validation, model and the rows' own writes are paid (``features_free``); this bench
says what the decided design needs at least inside that margin.

Usage: ``OMP_NUM_THREADS=1 python bench/state_parts_bench.py [--warm 2600] [--requests 300]``
"""

from __future__ import annotations

import argparse
import functools
import gc
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

DEFINITION = ("row_features", "account_windows", "terminal_windows", "step_features")


class Clock:
    """Thread CPU seconds per part, for the request being measured."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = {}

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            c0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.parts[name] = self.parts.get(name, 0.0) + time.thread_time() - c0
        return timed


class TimedDB:
    """The store's RocksDB handle with its batch write timed and its keys counted."""

    def __init__(self, db: Any, clock: Clock, counts: dict[str, int]) -> None:
        self._db, self._clock, self._counts = db, clock, counts

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    def write(self, batch: Any) -> None:
        self._counts["keys_written"] = self._counts.get("keys_written", 0) + batch.len()
        self._clock.wrap("store_write", self._db.write)(batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm", type=int, default=2600, help="256-row requests applied before measuring")
    parser.add_argument("--requests", type=int, default=300, help="256-row requests measured")
    args = parser.parse_args()

    import torch
    from model_path_bench import load_served
    from serve_bench import Transactions, register_model

    from flows.serve.app import GC_THRESHOLDS
    from infra.online_state import open_state_store, rocks
    from solutions.fraud import feature_defs as FD
    from solutions.fraud.online import OnlineFraudState, score_requests_with_inputs

    torch.set_num_threads(1)
    clock, counts = Clock(), {}
    for name in DEFINITION:
        setattr(FD, name, clock.wrap("definition", getattr(FD, name)))
    rocks.RocksStateStore.owners = clock.wrap("owners_read", rocks.RocksStateStore.owners)
    rocks.RocksStateStore.commit = clock.wrap("commit_puts", rocks.RocksStateStore.commit)
    load_before = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="state-parts-"))
    per: dict[str, list[float]] = {}
    try:
        register_model(tmp)
        model = load_served(tmp)
        gc.collect()
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        state = OnlineFraudState.for_model(open_state_store(tmp / "state"), history_len=255)
        opened = state.store._opened
        assert opened is not None
        opened.db = TimedDB(opened.db, clock, counts)
        tx = Transactions()
        for i in range(args.warm + args.requests):
            body = tx.body(256)["transactions"]
            owners = [[hashlib.sha256(r["account_id"].encode()).hexdigest()[:16] for r in body]]
            clock.parts.clear()
            counts.clear()
            c0 = time.thread_time()
            [out] = score_requests_with_inputs(model, state, [body], None, owners=owners)
            total = time.thread_time() - c0
            if isinstance(out, Exception):
                raise out
            if i >= args.warm:
                for key, seconds in {**clock.parts, "total": total}.items():
                    per.setdefault(f"{key}_ms", []).append(seconds * 1000)
                per.setdefault("keys_written", []).append(counts.get("keys_written", 0))
        state.store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"bench": "state_parts", "warm_requests": args.warm, "measured_requests": args.requests,
                      "rows_per_request": 256, "thread_cpu_medians": {k: round(statistics.median(v), 3)
                                                                      for k, v in per.items()},
                      "load_avg_1m": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)}}))


if __name__ == "__main__":
    main()
