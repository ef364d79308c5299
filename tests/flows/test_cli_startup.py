"""The command line answers without the heavy imports: ``--help``, a bad flag and every
pre-flight error (missing file, bad or unknown ``--columns`` mapping, bad values) of every
``python -m`` module import neither torch, Lightning nor Prefect's engine (the flows are
named by entrypoint and imported only when a command runs: flows/cli.py). A bad column
mapping is caught from the file's header alone: exit 2, one ``error:`` line naming the
column and the file, nothing else printed.

Each error case runs in a fresh process through a small wrapper that runs the module as
``python -m`` would and then reports which of the heavy modules ``sys.modules`` holds. The cases
that answer (``--help``, ``--print-config``) of one module run one after the other in one such
process, each with its own stdout: a heavy module imported by any of them is still in
``sys.modules`` at the end (33 answers in 6 processes instead of 33).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from flows.cli import check_commands, flow_doc, signature_from_source

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "lightning", "pytorch_lightning", "prefect.engine", "prefect.flow_engine", "sklearn")
MISSING = "/no/such/dir/input.csv"

WRAPPER = """
import json, runpy, sys
module, report, *argv = sys.argv[1:]
sys.argv = [module, *argv]
code = 0
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
heavy = HEAVY_NAMES
with open(report, "w") as fh:
    json.dump({"code": code, "heavy": sorted(m for m in heavy if m in sys.modules)}, fh)
sys.exit(code)
""".replace("HEAVY_NAMES", repr(HEAVY))

# the answering cases of one module in one process: per case its exit code and stdout
ANSWERS_WRAPPER = """
import contextlib, io, json, runpy, sys
module, report, cases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
results = []
for argv in cases:
    sys.argv = [module, *argv]
    out, code = io.StringIO(), 0
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    results.append({"code": code, "out": out.getvalue()})
heavy = HEAVY_NAMES
with open(report, "w") as fh:
    json.dump({"results": results, "heavy": sorted(m for m in heavy if m in sys.modules)}, fh)
""".replace("HEAVY_NAMES", repr(HEAVY))


def _cases(tmp: Path) -> list[tuple[list[str], int, str]]:
    tx = tmp / "tx.csv"
    tx.write_text("TRANSACTION_ID,CUSTOMER_ID,TX_DATETIME,TX_AMOUNT,TX_FRAUD\n1,7,2025-01-01 10:00:00,12.5,0\n")
    readings = tmp / "readings.csv"
    readings.write_text("machine,ts,sensor,value\nm1,2025-01-01 10:00:00,temp,21.5\n")
    fraud_cols = ["--data", str(tx), "--columns", "account_id=NO_SUCH_COLUMN"]
    # the Fraud Detection Handbook's format (../shared/data/fraud), a few rows of it
    handbook = tmp / "handbook.csv"
    handbook.write_text("TRANSACTION_ID,TX_DATETIME,CUSTOMER_ID,TERMINAL_ID,TX_AMOUNT,TX_FRAUD\n"
                        "0,2018-04-01 00:00:31,596,3156,57.16,0\n200,2018-04-01 02:09:22,819,1591,75.38,1\n")
    swapped = ("transaction_id=TRANSACTION_ID,account_id=CUSTOMER_ID,terminal_id=TERMINAL_ID,"
               "timestamp=TX_AMOUNT,amount=TX_DATETIME,label=TX_FRAUD")
    no_amount = tmp / "no_amount.csv"  # canonical names already, no amount
    no_amount.write_text("transaction_id,timestamp,account_id,terminal_id,label\n"
                         "0,2018-04-01 00:00:31,596,3156,0\n200,2018-04-01 02:09:22,819,1591,1\n")
    dated_amount = tmp / "dated_amount.parquet"  # amounts that are timestamps (a typed file)
    pd.DataFrame({"transaction_id": ["0", "1"], "account_id": ["596", "819"], "label": [0, 1],
                  "timestamp": pd.to_datetime(["2018-04-01 00:00:31", "2018-04-01 02:09:22"]),
                  "amount": pd.to_datetime(["2018-04-01 00:00:31", "2018-04-01 02:09:22"])}).to_parquet(dated_amount)
    return [
        (["flows.fraud", "--help"], 0, "usage:"),
        *[(["flows.fraud", c, "--help"], 0, "usage:")
          for c in ("train", "adapt", "score", "batch", "monitor", "tune", "federate", "promote", "rollback",
                    "reproduce")],
        (["flows.fraud", "train", "--data", MISSING], 2, "--data: no such file"),
        (["flows.fraud", "train", *fraud_cols], 2, "'NO_SUCH_COLUMN'"),
        (["flows.fraud", "score", *fraud_cols], 2, "'NO_SUCH_COLUMN'"),
        (["flows.fraud", "tune", *fraud_cols], 2, "'NO_SUCH_COLUMN'"),
        (["flows.fraud", "train", "--columns", "bogus=x"], 2, "unknown canonical column(s) ['bogus']"),
        (["flows.fraud", "train", "--val-days", "20"], 2, "must be smaller than train_days"),
        (["flows.fraud", "tune", "--loss", "hinge"], 2, "invalid choice"),
        (["flows.fraud", "train", "--no-such-flag"], 2, "unrecognized arguments"),
        (["flows.fraud", "train", "--max-epocs", "3"], 2, "--max-epocs 3; did you mean --max-epochs?"),
        (["flows.fraud", "train", "--data", str(no_amount)], 2,
         f"{no_amount}, column 'amount': missing required column(s) ['amount']"),
        (["flows.fraud", "score", "--data", str(no_amount)], 2, "column 'amount': missing required"),
        (["flows.fraud", "train", "--data", str(handbook), "--columns", swapped], 2,
         ("column 'timestamp': 2 number(s) where timestamps are expected (first offending rows: [0, 1]); "
          "in the first 2 rows read before the run, row 0 of 'TX_AMOUNT' holds '57.16'")),
        (["flows.fraud", "train", "--data", str(dated_amount)], 2,
         ("column 'amount': 2 timestamp(s) where numbers are expected (first offending rows: [0, 1]); "
          "in the first 2 rows read before the run, row 0 of 'amount' holds '2018-04-01 00:00:31'")),
        # configuration files: printed, checked and the full help, all without a heavy import
        (["flows.fraud", "train", "--print-config"], 0, "model_name: fraud-seq"),
        (["flows.fraud", "train", "--set", "config.modle.lr=1"], 2, "did you mean 'config.model.lr'?"),
        (["flows.sensor", "train", "--help-all"], 0, "--no-cross-fit"),
        (["flows.sensor", "forecast", "--print-config"], 0, "horizon:"),
        (["flows.sensor", "--help"], 0, "usage:"),
        *[(["flows.sensor", c, "--help"], 0, "usage:")
          for c in ("pretrain", "train", "score", "batch", "monitor", "promote", "rollback", "reproduce",
                    "forecast-train", "forecast")],
        (["flows.sensor", "train", "--data", MISSING], 2, "file not found"),
        (["flows.sensor", "train", "--data", str(readings), "--columns", "asset_id=NO_SUCH_COLUMN"], 2,
         "NO_SUCH_COLUMN"),
        (["flows.sensor", "batch", "--threshold", "1.5"], 2, "--threshold must be between 0 and 1"),
        (["flows.sensor", "forecast", "--upper-limits", "temp=10", "--lower-limits", "temp=20"], 2,
         "limits of temp: the lower one (20.0) is not below the upper one (10.0)"),
        (["flows.sensor", "forecast-train", "--candidates", "prophet"], 2, "--candidates: Input should be 'naive'"),
        (["flows.rag", "--help"], 0, "usage:"),
        *[(["flows.rag", c, "--help"], 0, "usage:") for c in ("ingest", "ask", "eval")],
        (["flows.rag", "ingest", MISSING], 2, "source not found"),
        (["flows.rag", "eval", "--data", MISSING], 2, "QA file not found"),
        (["flows.compress", "--help"], 0, "usage:"),
        (["flows.compress", "--model", "no-such-model"], 2, "no model named 'no-such-model'"),
        (["flows.serve", "--help"], 0, "usage:"),
        (["flows.serve", "keys", "add", "--help"], 0, "usage:"),
        (["flows.serve", "--port", "70000"], 2, "not a TCP port"),
        (["flows.serve", "keys", "add", "x", "--scope", "fraud:scor"], 2, "fraud:score"),
        (["flows.registry", "rotate-key", "--help"], 0, "usage:"),
        (["flows.registry", "rotate-key", "--old-key", "file:/no/such/kek"], 2, "set INDUSFLOW_REGISTRY_KEY to the NEW"),
    ]


def _answers_of_each_module(cases: list[tuple[list[str], int, str]], env: dict[str, str], tmp: Path) -> list[str]:
    """Run each module's answering cases in one process; the failures, one line each."""
    by_module: dict[str, list[tuple[list[str], str]]] = {}
    for argv, _, expected in cases:
        by_module.setdefault(argv[0], []).append((argv[1:], expected))
    procs = []
    for module, answers in by_module.items():
        report = tmp / f"answers-{module}.json"
        procs.append((module, answers, report, subprocess.Popen(
            [sys.executable, "-c", ANSWERS_WRAPPER, module, str(report), json.dumps([a for a, _ in answers])],
            cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)))
    failures = []
    for module, answers, report, proc in procs:
        _, err = proc.communicate(timeout=300)
        if proc.returncode != 0 or not report.exists():
            failures.append(f"{module}: the answers' process failed (exit {proc.returncode}): {err[-800:]}")
            continue
        seen = json.loads(report.read_text())
        if seen["heavy"]:
            failures.append(f"{module} {[' '.join(a) for a, _ in answers]}: imported {seen['heavy']}")
        for (argv, expected), got in zip(answers, seen["results"], strict=True):
            if got["code"] != 0 or expected not in got["out"]:
                failures.append(f"{module} {' '.join(argv)}: exit {got['code']}, wanted 0 and {expected!r} on stdout"
                                f"\n  stdout: {got['out'][-300:]}")
    return failures


def test_help_and_preflight_errors_import_no_heavy_module(tmp_path: Path) -> None:
    env = {**os.environ, "INDUSFLOW_HOME": str(tmp_path / "home"), "PREFECT_HOME": str(tmp_path / "prefect"),
           "PYTHONPATH": str(REPO)}
    all_cases = _cases(tmp_path)
    failures = _answers_of_each_module([c for c in all_cases if c[1] == 0], env, tmp_path)
    cases = [c for c in all_cases if c[1] != 0]
    assert {code for _, code, _ in cases} == {2}
    for start in range(0, len(cases), 4):  # 4 at a time: the machine may have 2 cores
        batch = []
        for i, (argv, code, expected) in enumerate(cases[start:start + 4], start):
            report = tmp_path / f"report-{i}.json"
            proc = subprocess.Popen([sys.executable, "-c", WRAPPER, argv[0], str(report), *argv[1:]], cwd=REPO,
                                    env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            batch.append((argv, code, expected, report, proc))
        for argv, code, expected, report, proc in batch:
            out, err = proc.communicate(timeout=120)
            seen = json.loads(report.read_text()) if report.exists() else {"heavy": ["(no report)"]}
            problems = []
            if proc.returncode != code:
                problems.append(f"exit {proc.returncode}, wanted {code}")
            if seen["heavy"]:
                problems.append(f"imported {seen['heavy']}")
            lines = err.strip().splitlines()  # every case here is a user error (exit 2)
            if out or len(lines) != 1 or not lines[0].startswith("error: ") or expected not in lines[0]:
                problems.append(f"wanted one error line with {expected!r}")
            if problems:
                failures.append(f"{' '.join(argv)}: {'; '.join(problems)}\n  stdout: {out[-300:]}\n  stderr: {err[-800:]}")
    assert not failures, "\n".join(failures)


def test_unknown_column_error_names_the_column_and_the_file(tmp_path: Path, capsys) -> None:
    from flows.fraud.cli import main

    tx = tmp_path / "tx.csv"
    tx.write_text("TRANSACTION_ID,CUSTOMER_ID,TX_DATETIME,TX_AMOUNT,TX_FRAUD\n1,7,2025-01-01 10:00:00,12.5,0\n")
    code = main(["train", "--data", str(tx), "--columns", "account_id=CUSTOMER,timestamp=TX_DATETIME"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("error: ") and str(tx) in lines[0] and "'CUSTOMER'" in lines[0]
    assert "CUSTOMER_ID" in lines[0]  # the columns the file has


ENTRYPOINT_MODULES = ("flows.fraud.cli", "flows.sensor.cli", "flows.rag.cli", "flows.compress.cli", "flows.registry.cli")


@pytest.mark.parametrize("module", ENTRYPOINT_MODULES)
def test_signatures_read_from_source_match_the_flows(module: str) -> None:
    """What the parser reads from a flow's source is what the imported flow has: parameter
    names, kinds, defaults, annotations (with extras) and the docstring."""
    import importlib
    import inspect
    import typing

    from flows.cli import load_flow

    commands = importlib.import_module(module).COMMANDS
    check_commands(commands)  # every command's flags build (no clash, no stray name)
    for command in commands:
        assert isinstance(command.flow, str), f"{module} {command.name}: name the flow by entrypoint"
        stand_in = signature_from_source(command.flow)
        real = load_flow(command.flow).fn
        ours, theirs = inspect.signature(stand_in).parameters, inspect.signature(real).parameters
        assert list(ours) == list(theirs), command.flow
        for name in ours:
            assert ours[name].kind == theirs[name].kind, (command.flow, name)
            assert ours[name].default == theirs[name].default, (command.flow, name)
        # compared by repr: pydantic's FieldInfo (in Annotated extras) compares by identity
        assert {k: repr(v) for k, v in typing.get_type_hints(stand_in, include_extras=True).items()} == {
            k: repr(v) for k, v in typing.get_type_hints(real, include_extras=True).items() if k != "return"
        }, command.flow
        assert flow_doc(command.flow) == inspect.getdoc(real), command.flow
        if command.local is not None:  # called with every parameter of the flow instead of it
            assert set(ours) <= set(inspect.signature(load_flow(command.local)).parameters), command.local


EMPTY_KB = """
from infra.milvus import default_collection, ensure_collection, open_client
from solutions.rag.collections import milvus_collection
ensure_collection(open_client(), default_collection(milvus_collection(None)), 384)
"""


def test_ask_without_a_prefect_api_runs_no_flow_and_starts_no_prefect_server(tmp_path: Path) -> None:
    """``rag ask`` only reads: with no PREFECT_API_URL it answers without a flow run, so it
    starts no temporary Prefect server (Prefect is not even imported) and no torch (the packaged
    E5 encodes the question on its C engine); ``--json`` prints the same typed result."""
    from solutions.rag.results import AskResult

    env = {**os.environ, "INDUSFLOW_HOME": str(tmp_path / "home"), "PREFECT_HOME": str(tmp_path / "prefect"),
           "PYTHONPATH": str(REPO)}
    for name in ("INDUSFLOW_MILVUS_URI", "PREFECT_API_URL", "INDUSFLOW_EMBED_URL", "INDUSFLOW_LLM_URL"):
        env.pop(name, None)
    subprocess.run([sys.executable, "-c", EMPTY_KB], cwd=REPO, env=env, check=True, timeout=120)
    report = tmp_path / "report.json"
    wrapper = WRAPPER.replace(repr(HEAVY), repr((*HEAVY, "prefect")))
    proc = subprocess.run([sys.executable, "-c", wrapper, "flows.rag", str(report), "ask", "what is the policy?",
                           "--json"], cwd=REPO, env=env, text=True, capture_output=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = AskResult.model_validate_json(proc.stdout.strip().splitlines()[-1])
    assert result.answered is False and result.hits == []  # an empty collection: nothing to cite
    assert json.loads(report.read_text())["heavy"] == []
    assert not (tmp_path / "prefect").exists() or not any((tmp_path / "prefect").rglob("*.db"))


@pytest.mark.parametrize("argv", [["flows.registry", "verify", "--json"], ["flows.fraud", "approvals", "--json"],
                                  ["flows.registry", "approvals", "--status", "all", "--json"]])
def test_registry_reads_without_a_prefect_api_start_no_prefect_server(tmp_path: Path, argv: list[str]) -> None:
    """``verify`` and ``approvals`` only read the registry's files: with no PREFECT_API_URL they answer
    without a flow run, so no temporary Prefect server starts (it left its database in PREFECT_HOME);
    ``--json`` prints the flow's typed result."""
    env = {**os.environ, "INDUSFLOW_HOME": str(tmp_path / "home"), "PREFECT_HOME": str(tmp_path / "prefect"),
           "PYTHONPATH": str(REPO)}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.run([sys.executable, "-m", *argv], cwd=REPO, env=env, text=True, capture_output=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result in ({"ok": True, "reports": []}, {"requests": []})
    assert "temporary server" not in proc.stderr + proc.stdout
    assert not (tmp_path / "prefect").exists() or not any((tmp_path / "prefect").rglob("*.db"))


def test_keygen_and_sign_without_a_prefect_api_start_no_prefect_server(tmp_path: Path) -> None:
    """``keygen`` writes only the key file it is given and ``sign`` only reads the registry: with no
    PREFECT_API_URL neither starts a temporary Prefect server; a sign for a run nobody asked about
    says so (exit 2)."""
    env = {**os.environ, "INDUSFLOW_HOME": str(tmp_path / "home"), "PREFECT_HOME": str(tmp_path / "prefect"),
           "PYTHONPATH": str(REPO)}
    env.pop("PREFECT_API_URL", None)
    key = tmp_path / "keys" / "alice.pem"

    def registry(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "flows.registry", *argv], cwd=REPO, env=env, text=True,
                              capture_output=True, timeout=120, check=False)

    made = registry("keygen", "alice", "--out", str(key), "--json")
    assert made.returncode == 0, made.stdout + made.stderr
    result = json.loads(made.stdout.strip().splitlines()[-1])
    assert result["person"] == "alice" and result["path"] == str(key) and result["public_key"]
    assert key.stat().st_mode & 0o777 == 0o600
    signed = registry("sign", "0123456789abcdef", "--key", str(key), "--reason", "reviewed")
    assert signed.returncode == 2 and "0123456789abcdef" in signed.stderr, signed.stdout + signed.stderr
    assert not (tmp_path / "prefect").exists() or not any((tmp_path / "prefect").rglob("*.db"))


HOLDER = """
import sys, time
from infra.milvus import open_client
client = open_client()
print("holding", flush=True)
time.sleep(float(sys.argv[1]))
"""


def test_ask_names_the_process_that_holds_the_milvus_lite_file(tmp_path: Path) -> None:
    """While another process (a running server, say) holds the Milvus Lite file, ``rag ask``
    says which process holds it and what to do, before any flow run: exit 2, one line."""
    env = {**os.environ, "INDUSFLOW_HOME": str(tmp_path / "home"), "PREFECT_HOME": str(tmp_path / "prefect"),
           "PYTHONPATH": str(REPO)}
    env.pop("INDUSFLOW_MILVUS_URI", None)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, "120"], cwd=REPO, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        report = tmp_path / "report.json"
        proc = subprocess.run([sys.executable, "-c", WRAPPER, "flows.rag", str(report), "ask", "what is the policy?"],
                              cwd=REPO, env=env, text=True, capture_output=True, timeout=120, check=False)
    finally:
        holder.kill()
        holder.wait(timeout=30)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and proc.stdout == "" and len(lines) == 1, proc.stdout + proc.stderr
    db = tmp_path / "home" / "milvus" / "rag.db"
    assert lines[0].startswith(f"error: the Milvus Lite file {db} is held by process {holder.pid} (python -c"), lines[0]
    assert f"kill {holder.pid}" in lines[0] and "Ask that server instead" in lines[0]
    assert json.loads(report.read_text())["heavy"] == []


@pytest.mark.parametrize("for_scoring", [False, True])
def test_the_preflight_schema_is_the_required_part_of_the_validation_schema(for_scoring: bool) -> None:
    """The CLI checks a file's first rows by the kinds the flow validates the whole file with."""
    from solutions.fraud.pipeline import transaction_schema
    from solutions.fraud.schema import preflight_schema

    full = {c.name: c.kind for c in transaction_schema(for_scoring).columns if c.required}
    assert {c.name: c.kind for c in preflight_schema(for_scoring).columns} == full
