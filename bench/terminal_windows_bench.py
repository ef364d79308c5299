"""The delayed terminal windows of one 256-row online request as the terminals' kept rows grow.
Prints one JSON line.

An online request's terminal windows read every kept row of its ~230 terminals inside
``[t - delay - 30 d, t - delay)``. ``bench/serve_floor.py --warm-seconds 60`` reaches about a day of
rows inside those windows; a server that has run for a month holds the whole 30 days (the bench's
stream: ~1,300 rows per terminal; a busy terminal keeps up to ``max_terminal_rows``, 20,000). This
bench times :func:`solutions.fraud.feature_defs.terminal_windows` on histories of that shape
(``--rows-per-terminal`` each, times uniform over 30 days, half the labels known, sorted by
terminal then time as :func:`solutions.fraud.online_features.kept_rows` gives them) two ways, call
by call in turn:

* ``searched``: what online scoring runs now (each window bound searched in its terminal's run);
* ``timeline``: every history row and the request's rows sorted together, as the batch path does
  (and online scoring did before).

Both give the same features (checked); medians of ``--calls`` calls, CPU time of the calling thread.

Usage: ``OMP_NUM_THREADS=1 python bench/terminal_windows_bench.py [--rows-per-terminal 40 400 1300] [--calls 30]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from solutions.fraud import feature_defs as FD

DAY = FD.NS_PER_DAY
TERMINALS, ROWS, DELAY_DAYS, WINDOWS = 230, 256, 7, (1, 7, 30)


def shapes(per_terminal: int, rng: np.random.Generator) -> tuple[FD.KeyedRows, FD.KeyedRows]:
    """A key-sorted history of ``per_terminal`` rows per terminal over 30 days, and a request of
    ``ROWS`` rows within the hour after the delay."""
    n = TERMINALS * per_terminal
    t = np.concatenate([np.sort(rng.integers(0, 30 * DAY, per_terminal)) for _ in range(TERMINALS)])
    label = np.where(rng.random(n) < 0.5, np.nan, (rng.random(n) < 0.1).astype(np.float64))
    history = FD.KeyedRows(np.repeat(np.arange(TERMINALS, dtype=np.int64), per_terminal), t, (label,))
    chunk_t = np.sort((30 + DELAY_DAYS) * DAY + rng.integers(0, 3600 * FD.NS_PER_S, ROWS))
    chunk = FD.KeyedRows(rng.integers(0, TERMINALS, ROWS).astype(np.int64), chunk_t, (np.full(ROWS, np.nan),))
    return history, chunk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows-per-terminal", type=int, nargs="+", default=[40, 400, 1300],
                        help="kept rows per terminal inside the windows (one history size each)")
    parser.add_argument("--calls", type=int, default=30, help="timed calls per way and size")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    loadavg = os.getloadavg()[0]
    out: dict[str, object] = {"bench": "terminal_windows", "terminals": TERMINALS, "request_rows": ROWS}
    for per in args.rows_per_terminal:
        history, chunk = shapes(per, rng)
        ways = {"searched": lambda h=history, c=chunk: FD.terminal_windows(WINDOWS, DELAY_DAYS, c, h),
                "timeline": lambda h=history, c=chunk: FD._windows_of_timeline(WINDOWS, DELAY_DAYS, c, h)}
        ms: dict[str, list[float]] = {name: [] for name in ways}
        got: dict[str, dict[str, np.ndarray]] = {}
        for _ in range(args.calls):
            for name, way in ways.items():
                start = time.thread_time()
                got[name] = way()
                ms[name].append((time.thread_time() - start) * 1000)
        for name, values in got["timeline"].items():
            np.testing.assert_array_equal(got["searched"][name], values, err_msg=name)
        med = {name: statistics.median(v) for name, v in ms.items()}
        out[f"rows_{per}_per_terminal"] = {
            "history_rows": len(history.t), "searched_ms": round(med["searched"], 3),
            "timeline_ms": round(med["timeline"], 3), "timeline/searched": round(med["timeline"] / med["searched"], 1)}
    out["load_1m"] = [round(loadavg, 2), round(os.getloadavg()[0], 2)]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
