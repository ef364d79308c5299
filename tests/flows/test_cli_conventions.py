"""The command-line conventions across every command: a bad invocation exits 2 with one
``error:`` line on stderr, nothing on stdout and no traceback, before a flow run starts. The
table runs in-process; one case per module also runs the way a user meets it, as
``python -m flows.<vertical>`` in a fresh process. (Each vertical's own tests go through more
cases: tests/flows/test_{fraud_cli,sensor_flows,rag_flows,compress_flow}.py.)
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MISSING = "/no/such/dir/input.csv"

BAD = [
    (["flows.fraud", "train", "--val-days", "20"], "val_days (20.0) must be smaller than train_days"),
    (["flows.fraud", "score", "--data", MISSING], "no such file"),
    (["flows.fraud", "batch", "--model", "bad name!"], "invalid model name"),
    (["flows.fraud", "tune", "--loss", "hinge"], "invalid choice: 'hinge'"),
    (["flows.sensor", "train", "--columns", "bogus=x"], "unknown canonical column(s) ['bogus']"),
    (["flows.sensor", "score", "--subset", "FD009", "--cmapss-dir", "."], "unknown C-MAPSS subset 'FD009'"),
    (["flows.sensor", "batch", "--threshold", "1.5"], "--threshold must be between 0 and 1"),
    (["flows.rag", "ingest", MISSING], "source not found"),
    (["flows.rag", "ask", "q", "--top-k", "0"], "--top-k: Input should be greater than or equal to 1"),
    (["flows.rag", "eval", "--data", MISSING], "QA file not found"),
    (["flows.compress", "--model", "no-such-model"], "no model named 'no-such-model'"),
    (["flows.compress", "--model", "m", "--tolerance", "2"], "--tolerance: Input should be less than 1"),
    (["flows.serve", "--port", "70000"], "--port 70000: not a TCP port"),
    # the embedded fraud state (RocksDB) is one process's: several workers share it only through Redis
    (["flows.serve", "--workers", "2"], "--workers 2: the fraud feature state's embedded store (RocksDB) serves one"),
    (["flows.serve", "keys", "add", "x", "--scope", "Fraud Score"], "scope 'Fraud Score' is not of the form"),
]


@pytest.mark.parametrize(("argv", "expected"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_invocation_exits_2_with_one_error_line(argv: list[str], expected: str, capsys) -> None:
    main = importlib.import_module(f"{argv[0]}.cli").main
    try:
        code = main(argv[1:])
    except SystemExit as exc:  # argparse's own checks (choices, types) exit from inside
        code = exc.code
    assert code == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert expected in lines[0]
    assert "Traceback" not in captured.out + captured.err


def test_bad_invocations_through_python_m(tmp_path: Path) -> None:
    env = {**os.environ, "INDUSFLOW_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    one_per_module = {argv[0]: (argv, expected) for argv, expected in BAD}.values()
    procs = [
        (argv, expected, subprocess.Popen([sys.executable, "-m", *argv], cwd=REPO, env=env, text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        for argv, expected in one_per_module
    ]
    failures = []
    for argv, expected, proc in procs:
        out, err = proc.communicate(timeout=300)
        lines = err.strip().splitlines()
        ok = (proc.returncode == 2 and out == "" and len(lines) == 1 and lines[0].startswith("error: ")
              and expected in lines[0] and "Traceback" not in out + err)
        if not ok:
            failures.append(f"{' '.join(argv)} -> rc {proc.returncode}\nstdout: {out[-500:]}\nstderr: {err[-1500:]}")
    assert not failures, "\n\n".join(failures)


def test_every_module_and_command_has_help() -> None:
    commands = {"flows.fraud": ["train", "adapt", "score", "batch", "tune", "promote", "rollback", "reproduce"],
                "flows.sensor": ["pretrain", "train", "score", "batch", "promote", "rollback", "reproduce"], "flows.rag": ["ingest", "ask", "eval"]}
    code = "; ".join(
        f"from {module}.cli import main as m{i}" for i, module in enumerate(commands)
    )
    # one process builds every parser (importing the modules once): each --help exits 0
    script = code + "\nimport contextlib, io\n" + "\n".join(
        f"for c in {cmds!r} + ['']:\n"
        f"    buf = io.StringIO()\n"
        f"    with contextlib.redirect_stdout(buf):\n"
        f"        try:\n            m{i}(([c] if c else []) + ['--help'])\n"
        f"        except SystemExit as e:\n            assert e.code == 0, (c, e.code)\n"
        f"    assert 'usage:' in buf.getvalue(), c\n"
        for i, cmds in enumerate(commands.values())
    )
    script += "\nfrom flows.compress.cli import main as mc\ntry:\n    mc(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
    script += "\nfrom flows.serve.cli import main as ms\nfor argv in (['--help'], ['keys', '--help'], ['keys', 'add', '--help']):\n"
    script += "    try:\n        ms(argv)\n    except SystemExit as e:\n        assert e.code == 0, argv\n"
    proc = subprocess.run([sys.executable, "-c", script], check=False, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
