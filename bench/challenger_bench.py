"""What a challenger costs online: fraud scoring with no challenger, a shadow challenger and a
50 % split, side by side in one run. Prints one JSON line.

Two versions of serve_bench's small sequence model are registered in a throwaway home (v2
champion, v1 the ``challenger`` alias); the real server command (``python -m flows.serve``: keys,
rate limits, audit log, metrics and the score log all on) serves them three times, one after
the other, each from an empty online state and an empty score log: challenger off
(``INDUSFLOW_SERVE_FRAUD_CHALLENGER_MODE=off``), ``shadow``, ``split``. (The score log is always on: it
is the model-risk evidence; its cost was measured while it could be turned off, ``no_log`` in
bench/results up to 2026-12-06.) Closed-loop clients on 127.0.0.1
send 256-row and single-transaction requests at concurrency 16.

Figures: rows/s and p99 per mode, the ratio of each to "off" (shadow runs both models on every
row, so its ceiling is about half of off where the model call dominates), and the score log's
completeness (rows recorded per role against rows answered 200: nothing lost).

Usage: ``python bench/challenger_bench.py [--seconds 5] [--repeats 3]`` (medians over the repeats;
the modes' order alternates from round to round).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from loadgen import closed_loop, stop_server
from serve_bench import MODEL, Transactions, register_model, start_server

MODES = ("off", "shadow", "split")


def start(home: Path, mode: str) -> tuple[Any, str]:
    """serve_bench's server (batching at the defaults) with the mode's challenger."""
    from infra.settings import ServeSettings

    defaults = ServeSettings()
    return start_server(home, defaults.batch_max_size, {
        "INDUSFLOW_SERVE_FRAUD_CHALLENGER_MODE": mode,
        "INDUSFLOW_SERVE_CHALLENGER_SHARE": "0.5"})


def wait_for_challenger(url: str, mode: str) -> None:
    import httpx

    deadline = time.monotonic() + 60
    while mode in ("shadow", "split"):
        body = httpx.get(f"{url}/readyz", timeout=5).json()
        if any(v is not None for v in body.get("challengers", {}).values()):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the challenger did not load: {body}")
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per phase")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of every mode (medians are reported)")
    args = parser.parse_args()

    from infra.home import HomeLayout
    from infra.registry import ModelRegistry
    from infra.serving.auth import KeyStore
    from infra.serving.challenger import read_score_log
    from infra.serving.runtime import SCORES_DIR

    load_before = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="challenger-bench-"))
    results: dict[str, Any] = {}
    runs: dict[str, list[dict[str, Any]]] = {}
    try:
        register_model(tmp)  # v1
        register_model(tmp)  # v2, champion
        ModelRegistry(tmp / "registry").set_alias(MODEL, "challenger", 1, reason="bench")
        key, _ = KeyStore(tmp / "serving" / "keys.json").add("bench", ["admin"])
        tx = Transactions()
        for round_ in range(args.repeats):
            for mode in MODES if round_ % 2 == 0 else MODES[::-1]:  # alternate the order: no mode always first
                layout = HomeLayout(tmp)
                shutil.rmtree(layout.online_state(), ignore_errors=True)
                shutil.rmtree(layout.serving() / SCORES_DIR, ignore_errors=True)
                proc, url = start(tmp, mode)
                ok_rows = 0
                try:
                    wait_for_challenger(url, mode)
                    phases = {}
                    for rows in (256, 1):
                        phase = asyncio.run(closed_loop(
                            f"{url}/v1/fraud/score", tx.feed(rows, args.seconds + 0.5), concurrency=16,
                            seconds=args.seconds, rows_per_request=rows, headers={"X-API-Key": key}))
                        phases[f"c16_rows{rows}"] = phase
                        ok_rows += phase.get("status", {}).get("200", 0) * rows
                finally:
                    stop_server(proc)  # SIGTERM: the score log is flushed on shutdown
                logged = read_score_log(layout.serving() / SCORES_DIR, MODEL)
                by_role = {role: sum(1 for r in logged if r["role"] == role) for role in ("champion", "challenger")}
                decided = sum(1 for r in logged if r["decided"])
                runs.setdefault(mode, []).append({**phases, "rows_answered_200": ok_rows, "score_log_rows": by_role,
                                                  "score_log_decided": decided})
        for mode, mode_runs in runs.items():
            results[mode] = {
                **{phase: {"rows_per_s_median": statistics.median(r[phase]["rows_per_s"] for r in mode_runs),
                           "p99_ms_median": statistics.median(r[phase]["p99_ms"] or 0.0 for r in mode_runs),
                           "rows_per_s_runs": [r[phase]["rows_per_s"] for r in mode_runs]}
                   for phase in ("c16_rows256", "c16_rows1")},
                "score_log_complete": all(r["score_log_rows"]["champion"] >= r["rows_answered_200"]
                                          and r["score_log_decided"] >= r["rows_answered_200"] for r in mode_runs),
                "score_log_rows_last": mode_runs[-1]["score_log_rows"],
                "rows_answered_200_last": mode_runs[-1]["rows_answered_200"]}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ratios = {mode: {phase: (round(results[mode][phase]["rows_per_s_median"]
                                   / results["off"][phase]["rows_per_s_median"], 2)
                             if results["off"][phase]["rows_per_s_median"] else None)
                     for phase in ("c16_rows256", "c16_rows1")} for mode in ("shadow", "split")}
    complete = {mode: results[mode]["score_log_complete"] for mode in MODES}
    print(json.dumps({"bench": "challenger", "cores": os.cpu_count(), "seconds_per_phase": args.seconds,
                      "repeats": args.repeats,
                      "load_avg_1m": {"before": round(load_before, 1), "after": round(os.getloadavg()[0], 1)},
                      "rows_per_s_ratio_to_off": ratios, "score_log_complete": complete, **results}))


if __name__ == "__main__":
    main()
