"""Command-line start-up benchmark; prints one JSON line.

For each command: the wall time of ``--help``, of a missing input file and of a bad column
mapping (a source column the file does not have), each the median of ``--runs`` fresh
``python -m`` processes, beside a bare ``python -c "import prefect"`` measured in the same
run (runs interleaved, so a busy machine slows all of them alike), and the ratio to it. The
error cases also record the exit code and the number of lines printed (one ``error:`` line
is the convention). The load average before and after is part of the line: on a shared
machine say so when quoting the figures.

Usage: ``python bench/cli_bench.py [--runs 5] [--all]`` (``--all``: every sub-command; the
default is one command per module). ``PYTHONPATH=/other/checkout python bench/cli_bench.py``
measures another checkout's code (e.g. before a change).
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
MISSING = "/no/such/dir/input.csv"

FRAUD_CSV = "TRANSACTION_ID,CUSTOMER_ID,TX_DATETIME,TX_AMOUNT,TX_FRAUD\n1,7,2025-01-01 10:00:00,12.5,0\n"
SENSOR_CSV = "machine,ts,sensor,value\nm1,2025-01-01 10:00:00,temp,21.5\n"


def cases(tmp: Path, every: bool) -> dict[str, list[str]]:
    """Label -> argv (after ``python``) of every case."""
    fraud = tmp / "tx.csv"
    fraud.write_text(FRAUD_CSV)
    sensor = tmp / "readings.csv"
    sensor.write_text(SENSOR_CSV)
    fraud_cols = ["--data", str(fraud), "--columns", "account_id=NO_SUCH_COLUMN"]
    sensor_cols = ["--data", str(sensor), "--columns", "asset_id=NO_SUCH_COLUMN"]
    out: dict[str, list[str]] = {}

    def add(module: str, command: str | None, missing: list[str] | None, columns: list[str] | None) -> None:
        head = ["-m", module] + ([command] if command else [])
        name = " ".join(head[1:])
        out[f"{name} --help"] = head + ["--help"]
        if missing is not None:
            out[f"{name} (missing file)"] = head + missing
        if columns is not None:
            out[f"{name} (bad --columns)"] = head + columns

    add("flows.fraud", "train", ["--data", MISSING], fraud_cols)
    add("flows.sensor", "train", ["--data", MISSING], sensor_cols)
    add("flows.rag", "ingest", [MISSING], None)
    add("flows.compress", None, None, None)
    add("flows.serve", None, None, None)
    if every:
        for command in ("adapt", "score", "tune"):
            add("flows.fraud", command, ["--data", MISSING], fraud_cols)
        add("flows.fraud", "batch", ["--accounts", MISSING], None)
        add("flows.fraud", "monitor", ["--accounts", MISSING], None)
        add("flows.fraud", "reproduce", None, None)
        for command in ("pretrain", "score"):
            add("flows.sensor", command, ["--data", MISSING], sensor_cols)
        add("flows.sensor", "batch", None, None)
        add("flows.sensor", "monitor", None, None)
        add("flows.rag", "ask", None, None)
        add("flows.rag", "eval", ["--data", MISSING], None)
    return out


def code_root() -> Path:
    """The checkout measured: the first ``PYTHONPATH`` entry when set, else this one (``python -m``
    puts its working directory first on ``sys.path``, so the processes start there)."""
    first = os.environ.get("PYTHONPATH", "").split(os.pathsep)[0]
    return Path(first) if first else REPO


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, int, int]:
    """(seconds, exit code, lines printed) of one fresh process."""
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], cwd=code_root(), env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    seconds = time.perf_counter() - started
    return seconds, proc.returncode, len((proc.stdout + proc.stderr).strip().splitlines())


def loadavg() -> list[float]:
    """The 1-, 5- and 15-minute load averages (empty where /proc is absent)."""
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per case (default: 5)")
    parser.add_argument("--all", action="store_true", help="every sub-command (default: one per module)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        env = {**os.environ, "INDUSFLOW_HOME": str(tmp / "home"), "PREFECT_HOME": str(tmp / "prefect"),
               "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        table = {"bare: python -c 'import prefect'": ["-c", "import prefect"], **cases(tmp, args.all)}
        times: dict[str, list[float]] = {label: [] for label in table}
        last: dict[str, tuple[int, int]] = {}
        load_before = loadavg()
        for _ in range(args.runs):  # interleaved: machine noise falls on every case alike
            for label, case in table.items():
                seconds, code, lines = run_once(case, env)
                times[label].append(seconds)
                last[label] = (code, lines)
                print(f"{seconds:6.2f} s  rc {code}  {lines:3d} lines  {label}", file=sys.stderr)
        load_after = loadavg()
    bare_label = next(iter(table))
    bare = statistics.median(times[bare_label])
    rows = {
        label: {"median_s": round(statistics.median(values), 3), "ratio_to_bare": round(statistics.median(values) / bare, 2),
                "exit_code": last[label][0], "lines": last[label][1]}
        for label, values in times.items() if label != bare_label
    }
    print(json.dumps({"bench": "cli", "code": str(code_root()), "runs": args.runs, "python": sys.version.split()[0],
                      "bare_import_prefect_s": round(bare, 3), "loadavg_before": load_before,
                      "loadavg_after": load_after, "cpus": os.cpu_count(), "cases": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
