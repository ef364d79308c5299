"""CPU time of the online state's ``apply`` per 256-row fraud request. Prints one JSON line.

The request stream is ``bench/serve_bench.py``'s (new transactions in time order over 20,000 accounts
and 2,000 terminals), applied as the server applies it (load, order check, :meth:`apply`, the scores
recorded, the update committed to RocksDB), with the server's GC thresholds; only ``apply`` is timed
(``time.process_time``: CPU, not wall, so other processes on the cores count less). With
``--before FILE`` (an older ``solutions/fraud/online.py``, e.g. ``git show REV:solutions/fraud/online.py
> /tmp/online_before.py``) the same stream also goes through that version's state, request by request
in turn, so both are measured side by side under the same load. ``--profile`` prints the top of a
cProfile of the current version's ``apply`` after the JSON line.

Usage: ``OMP_NUM_THREADS=1 python bench/online_apply_bench.py [--requests 250] [--before FILE] [--profile]``
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import importlib.util
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

ROWS = 256
WARMUP = 50


def _module_from(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("online_before", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules["online_before"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=250, help=f"requests measured (after {WARMUP} warm-up)")
    parser.add_argument("--before", type=Path, help="an older solutions/fraud/online.py to measure beside")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the current apply")
    args = parser.parse_args()

    from serve_bench import Transactions

    from flows.serve.app import GC_THRESHOLDS
    from infra.online_state import open_state_store
    from solutions.fraud import online

    gc.set_threshold(*GC_THRESHOLDS)
    versions = {"current": online, **({"before": _module_from(args.before)} if args.before else {})}
    load_before = os.getloadavg()
    profile = cProfile.Profile() if args.profile else None
    cpu: dict[str, list[float]] = {name: [] for name in versions}
    with tempfile.TemporaryDirectory() as tmp:
        states = {name: m.OnlineFraudState.for_model(open_state_store(Path(tmp) / name), history_len=255)
                  for name, m in versions.items()}
        streams = {name: Transactions() for name in versions}
        try:
            for i in range(WARMUP + args.requests):
                for name, m in versions.items():
                    rows = m.validate_rows(streams[name].body(ROWS)["transactions"])
                    measured = i >= WARMUP
                    with states[name].update() as batch:
                        batch.load(rows.accounts, [])
                        batch.check(rows)
                        on = profile is not None and measured and name == "current"
                        t0 = time.process_time()
                        if on:
                            profile.enable()
                        inputs = batch.apply(rows, 7, keep=16)
                        if on:
                            profile.disable()
                        t1 = time.process_time()
                        batch.record_scores([0.5] * len(inputs), 1)
                    if measured:
                        cpu[name].append((t1 - t0) * 1000)
        finally:
            for state in states.values():
                state.store.close()
    print(json.dumps({
        "bench": "online_apply", "rows_per_request": ROWS, "requests": args.requests, "cores": os.cpu_count(),
        "load_avg_1m": {"before": round(load_before[0], 1), "after": round(os.getloadavg()[0], 1)},
        "apply_cpu_ms": {name: {"median": round(statistics.median(v), 3),
                                "p90": round(sorted(v)[int(0.9 * len(v))], 3)} for name, v in cpu.items()},
    }))
    if profile is not None:
        pstats.Stats(profile).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
