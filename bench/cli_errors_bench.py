"""The four command-line error cases of issue 51, one checkout beside another: exit code, lines
printed (stdout + stderr), tracebacks, ``ERROR`` log lines, the ``error:`` line and seconds.

1. a CSV already in the canonical column names but without ``amount`` (``fraud train --data``);
2. the handbook file with ``--columns`` swapping timestamp and amount;
3. ``rag ask`` while another process holds the Milvus Lite file (a server, say);
4. a misspelt flag (``--max-epocs``).

Each case runs in a fresh process with its own ``INDUSFLOW_HOME`` and ``PREFECT_HOME`` and no
``PREFECT_API_URL`` (a user's first run). The load average before and after is recorded: on a
shared machine say so when quoting the seconds.

Usage: ``python bench/cli_errors_bench.py --checkout before=/tmp/base --checkout after=.
--handbook ../shared/data/fraud/handbook_2018-04-01_2018-06-24.parquet --out bench/results/cli_errors_<date>.json``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SWAPPED = ("transaction_id=TRANSACTION_ID,account_id=CUSTOMER_ID,terminal_id=TERMINAL_ID,"
           "timestamp=TX_AMOUNT,amount=TX_DATETIME,label=TX_FRAUD")
HOLDER = ("import sys, time\nfrom infra.milvus import open_client\nclient = open_client()\n"
          "print('holding', flush=True)\ntime.sleep(float(sys.argv[1]))\n")


def no_amount_csv(handbook: Path, out: Path, rows: int = 5000) -> Path:
    """The handbook's first rows under the canonical names, the amount left out."""
    import pandas as pd

    df = pd.read_parquet(handbook).head(rows).rename(columns={
        "TRANSACTION_ID": "transaction_id", "TX_DATETIME": "timestamp", "CUSTOMER_ID": "account_id",
        "TERMINAL_ID": "terminal_id", "TX_FRAUD": "label"})
    df[["transaction_id", "timestamp", "account_id", "terminal_id", "label"]].to_csv(out, index=False)
    return out


def run_case(checkout: Path, argv: list[str], env: dict[str, str]) -> dict:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", *argv], cwd=checkout, env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    seconds = time.perf_counter() - started
    lines = (proc.stdout + proc.stderr).splitlines()
    return {"exit": proc.returncode, "lines": len(lines), "seconds": round(seconds, 1),
            "tracebacks": sum(1 for line in lines if line.startswith("Traceback")),
            "error_log_lines": sum(1 for line in lines if "| ERROR" in line),
            "error_line": next((line for line in lines if line.startswith("error:")), None)}


def cases_of(checkout: Path, tmp: Path, handbook: Path, no_amount: Path) -> dict[str, dict]:
    def env(name: str) -> dict[str, str]:
        out = {**os.environ, "PYTHONPATH": str(checkout), "INDUSFLOW_HOME": str(tmp / name / "home"),
               "PREFECT_HOME": str(tmp / name / "prefect")}
        for key in ("PREFECT_API_URL", "INDUSFLOW_MILVUS_URI"):
            out.pop(key, None)
        return out

    results = {
        "missing_amount": run_case(checkout, ["flows.fraud", "train", "--data", str(no_amount)], env("amount")),
        "swapped_columns": run_case(checkout, ["flows.fraud", "train", "--data", str(handbook), "--columns", SWAPPED],
                                    env("swapped")),
        "misspelt_flag": run_case(checkout, ["flows.fraud", "train", "--max-epocs", "3"], env("flag")),
    }
    lock_env = env("lock")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, "600"], cwd=checkout, env=lock_env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        results["milvus_lock"] = run_case(checkout, ["flows.rag", "ask", "what is the policy?"], lock_env)
    finally:
        holder.kill()
        holder.wait(timeout=30)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", action="append", required=True, help="LABEL=PATH of a checkout to run")
    parser.add_argument("--handbook", type=Path, required=True, help="the Fraud Detection Handbook parquet file")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    report: dict = {"load_before": Path("/proc/loadavg").read_text().split()[:3], "cores": os.cpu_count(),
                    "commands": {"missing_amount": "python -m flows.fraud train --data no_amount.csv (5,000 handbook "
                                                   "rows, canonical names, no amount)",
                                 "swapped_columns": f"python -m flows.fraud train --data {args.handbook.name} "
                                                    f"--columns {SWAPPED}",
                                 "milvus_lock": "python -m flows.rag ask 'what is the policy?' (another process "
                                                "holds the home's Milvus Lite file)",
                                 "misspelt_flag": "python -m flows.fraud train --max-epocs 3"},
                    "checkouts": {}}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        no_amount = no_amount_csv(args.handbook, tmp / "no_amount.csv")
        for label, path in (c.split("=", 1) for c in args.checkout):
            report["checkouts"][label] = {"path": str(Path(path).resolve()),
                                          **cases_of(Path(path).resolve(), tmp / label, args.handbook.resolve(), no_amount)}
    report["load_after"] = Path("/proc/loadavg").read_text().split()[:3]
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
