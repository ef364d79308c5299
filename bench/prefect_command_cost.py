"""What Prefect costs a command-line run without ``PREFECT_API_URL``; prints one JSON line.

A command runs its flow through ``flows.cli.run_flow`` (Prefect's settings, a temporary API server,
the settle wait at the end). This bench runs a trivial flow that way in fresh ``python`` processes, for
this checkout and, with ``--baseline DIR``, another checkout of the project (e.g. ``git worktree add
/tmp/before HEAD~1``), interleaved so a busy machine slows both alike. Per process: wall seconds and
CPU seconds of the command and its children (the server included: the command waits for it). The
Prefect home is made once beforehand (its database migrated), as after a user's first command.

Usage: ``python bench/prefect_command_cost.py [--runs 7] [--baseline DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = """
import inspect
from prefect import flow
from pydantic import BaseModel
from flows.cli import run_flow

class Done(BaseModel):
    ok: bool = True

@flow
def trivial() -> Done:
    return Done()

if list(inspect.signature(run_flow).parameters)[1] == "kwargs":  # load + kwargs (the flow imported meanwhile)
    rc = run_flow(lambda: trivial, {}, as_json=False, summary=lambda r: "done")
else:  # an older checkout: one callable
    rc = run_flow(lambda: trivial(), as_json=False, summary=lambda r: "done")
raise SystemExit(rc)
"""


def one_run(checkout: Path, env: dict[str, str]) -> dict[str, float]:
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", CHILD], cwd=checkout, env={**env, "PYTHONPATH": str(checkout)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = proc.stdout.read() if proc.stdout else b""
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise RuntimeError(f"{checkout}: exit {status}: {out.decode(errors='replace')[-2000:]}")
    return {"wall_s": time.monotonic() - start, "cpu_s": usage.ru_utime + usage.ru_stime}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="processes per checkout (default 7)")
    parser.add_argument("--baseline", type=Path, help="another checkout of the project, measured side by side")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="prefect-cost-") as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "INDUSFLOW_"))}
        env.update(PREFECT_HOME=str(Path(tmp) / "prefect"), INDUSFLOW_HOME=str(Path(tmp) / "home"),
                   PREFECT_SERVER_ANALYTICS_ENABLED="false")
        checkouts = {"this": REPO, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
        one_run(REPO, env)  # the Prefect home's database, migrated once
        load_before = os.getloadavg()[0]
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in checkouts}
        for _ in range(args.runs):
            for name, path in checkouts.items():
                runs[name].append(one_run(path, env))
        figures: dict[str, object] = {"runs": args.runs, "load_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
        for name, rows in runs.items():
            for key in ("wall_s", "cpu_s"):
                figures[f"{name}_{key}_median"] = round(statistics.median(r[key] for r in rows), 2)
        if args.baseline:
            for key in ("wall_s", "cpu_s"):
                figures[f"{key}_ratio"] = round(float(figures[f"this_{key}_median"]) /  # type: ignore[arg-type]
                                                float(figures[f"baseline_{key}_median"]), 3)  # type: ignore[arg-type]
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
