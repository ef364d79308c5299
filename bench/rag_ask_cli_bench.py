"""Wall and CPU time of ``python -m flows.rag ask`` from the command line, one checkout beside another.

Each run is a fresh process against an ingested home (``--home``: its ``INDUSFLOW_HOME``;
``PREFECT_HOME`` beside it), after one warm-up run per checkout, so the figures are a warm
machine's second invocation. Runs are interleaved (a busy machine slows both alike). Per run:
wall seconds, CPU seconds (user + system of the process and its children), exit code and the
cited/related paths (the two checkouts should retrieve alike). The load average before and after
is recorded: on a shared machine say so when quoting the figures.

Usage: ``python bench/rag_ask_cli_bench.py --home /tmp/h/home --checkout before=/tmp/base
--checkout after=. --runs 3 --out bench/results/rag_ask_cli_<date>.json``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def ask_once(checkout: Path, home: Path, question: str) -> dict:
    """One ``rag ask --json`` in a fresh process: seconds, CPU seconds, exit code, the paths."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "INDUSFLOW_HOME": str(home),
           "PREFECT_HOME": str(home.parent / "prefect")}
    env.pop("PREFECT_API_URL", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "flows.rag", "ask", question, "--json"], cwd=checkout, env=env,
                          capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    paths = []
    if proc.returncode == 0:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        paths = [f"{h['path']}#{h['chunk_index']}" for h in result["hits"]]
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "exit": proc.returncode,
            "lines": len((proc.stdout + proc.stderr).splitlines()), "hits": paths}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, required=True, help="INDUSFLOW_HOME with an ingested default collection")
    parser.add_argument("--checkout", action="append", required=True, help="LABEL=PATH of a checkout to run")
    parser.add_argument("--question", default="what is the footnote about?")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    checkouts = {label: Path(path).resolve() for label, path in (c.split("=", 1) for c in args.checkout)}
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    for path in checkouts.values():  # warm-up: page cache, bytecode, a first Milvus Lite open
        ask_once(path, args.home, args.question)
    runs: dict[str, list[dict]] = {label: [] for label in checkouts}
    for _ in range(args.runs):
        for label, path in checkouts.items():
            runs[label].append(ask_once(path, args.home, args.question))
    report = {
        "command": f"python -m flows.rag ask {args.question!r} --json (fresh process, no PREFECT_API_URL)",
        "home": "a home with a small ingested default collection, packaged multilingual-e5-small, no LLM",
        "load_before": load_before, "load_after": Path("/proc/loadavg").read_text().split()[:3],
        "cores": os.cpu_count(),
        "checkouts": {label: {"path": str(path),
                              "median_wall_s": statistics.median(r["wall_s"] for r in runs[label]),
                              "median_cpu_s": statistics.median(r["cpu_s"] for r in runs[label]),
                              "runs": runs[label]} for label, path in checkouts.items()},
    }
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
