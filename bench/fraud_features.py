"""Batch feature time on the handbook file: the window features and the sequence steps of every row,
as training computes them (``WindowFeatures.fit_transform`` on the whole file; ``step_features`` on
the file sorted by account and time). Prints one JSON line.

With ``--tree A --tree B`` each tree's code (a checkout of the repository: e.g. ``git archive`` of
the commit before a change) is timed in its own subprocess, interleaved over ``--repeats`` rounds,
so two versions are compared in the same run on the same machine; the medians and their ratio.

With ``--online`` each run also times the online state's ``apply`` on 256-row requests of the file
(:func:`time_apply`).

Usage: ``OMP_NUM_THREADS=1 python bench/fraud_features.py --data FILE [--tree DIR ...] [--repeats 3] [--online]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HANDBOOK_COLUMNS = ("transaction_id=TRANSACTION_ID,account_id=CUSTOMER_ID,timestamp=TX_DATETIME,"
                    "terminal_id=TERMINAL_ID,amount=TX_AMOUNT,label=TX_FRAUD")


def time_once(data: Path) -> dict[str, float]:
    """Seconds of each part, in this process (the code on ``sys.path``)."""
    import pandas as pd

    from solutions.fraud import pipeline as P
    from solutions.fraud import schema as S
    from solutions.fraud.sequences import FraudPreprocessor, step_features

    frame = S.ColumnMapping.parse(HANDBOOK_COLUMNS).apply(pd.read_parquet(data))
    t0 = time.perf_counter()
    P.window_transformer(7).fit(frame).transform(frame)
    t1 = time.perf_counter()
    step_features(FraudPreprocessor._sorted(frame)[0])
    t2 = time.perf_counter()
    return {"window_s": t1 - t0, "steps_s": t2 - t1, "rows": len(frame)}


def time_apply(data: Path, requests: int = 250, warmup: int = 150) -> dict[str, float]:
    """Thread CPU milliseconds of the online state's ``apply`` per 256-row request (median, p90): the
    file's rows in time order from day 30 (so accounts and terminals have history), ``warmup``
    requests first. CPU time, not wall: on the shared cores wall time varied 30% between runs."""
    import statistics
    import tempfile

    import pandas as pd

    from infra.online_state.rocks import RocksStateStore
    from solutions.fraud import schema as S
    from solutions.fraud.online import OnlineFraudState, validate_rows

    frame = S.ColumnMapping.parse(HANDBOOK_COLUMNS).apply(pd.read_parquet(data))
    frame = frame.sort_values(S.TIMESTAMP, kind="stable")
    frame = frame[frame[S.TIMESTAMP] >= frame[S.TIMESTAMP].min() + pd.Timedelta(days=30)]
    frame = frame.head(256 * (warmup + requests)).astype({S.TIMESTAMP: str, S.ACCOUNT_ID: str, S.TERMINAL_ID: str,
                                                          S.TRANSACTION_ID: str})
    records = frame.to_dict("records")
    with tempfile.TemporaryDirectory() as tmp:
        state = OnlineFraudState.for_model(RocksStateStore(Path(tmp) / "s"), history_len=255)
        spent = []
        for i in range(warmup + requests):
            rows = validate_rows(records[i * 256 : (i + 1) * 256])
            with state.update() as batch:
                batch.load(rows.accounts, [])
                t0 = time.thread_time()
                batch.apply(rows, 7, keep=50)
                spent.append((time.thread_time() - t0) * 1000)
                batch.record_scores([0.0] * len(rows), 1)
        state.store.close()
    kept = sorted(spent[warmup:])
    return {"apply_cpu_ms": statistics.median(kept), "apply_cpu_ms_p90": kept[int(0.9 * len(kept))]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--tree", action="append", type=Path, help="a checkout to time (default: this one)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--online", action="store_true", help="also time the online state's apply (CPU ms)")
    parser.add_argument("--once", action="store_true", help=argparse.SUPPRESS)  # a subprocess's single run
    args = parser.parse_args()
    if args.once:
        print(json.dumps({**time_once(args.data), **(time_apply(args.data) if args.online else {})}))
        return
    trees = args.tree or [ROOT]
    runs: dict[str, list[dict[str, float]]] = {str(t): [] for t in trees}
    for _ in range(args.repeats):
        for tree in trees:
            env = {**os.environ, "PYTHONPATH": str(tree)}
            out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--data", str(args.data), "--once",
                                  *(["--online"] if args.online else [])],
                                 env=env, cwd=tree, check=True, capture_output=True, text=True).stdout
            runs[str(tree)].append(json.loads(out.strip().splitlines()[-1]))
    result: dict[str, object] = {"bench": "fraud_features", "repeats": args.repeats,
                                 "load": Path("/proc/loadavg").read_text().split()[:3]}
    for tree, rs in runs.items():
        result[tree] = {k: round(statistics.median(r[k] for r in rs), 3) for k in rs[0] if k != "rows"}
        result[tree]["rows"] = rs[0]["rows"]
        result[tree]["total_s"] = round(result[tree]["window_s"] + result[tree]["steps_s"], 3)
    if len(trees) == 2:
        a, b = (result[str(t)]["total_s"] for t in trees)
        result["ratio_first_over_second"] = round(a / b, 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
