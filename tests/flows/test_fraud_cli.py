"""Bad invocations of the fraud commands: exit 2, one ``error:`` line, no traceback, no flow run."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.fraud.cli import main

MISSING = "/no/such/dir/transactions.csv"


def _invocations(existing: Path) -> list[tuple[list[str], str]]:
    file = str(existing)
    return [
        (["train", "--val-days", "20"], "val_days (20.0) must be smaller than train_days"),
        (["train", "--data", MISSING], "--data: no such file"),
        (["train", "--columns", "customer=CUSTOMER_ID"], "unknown canonical column(s) ['customer']"),
        (["train", "--columns", "account_id"], "is not of the form name=VALUE"),
        (["train", "--max-epochs", "0"], "--max-epochs: Input should be greater than or equal to 1"),
        (["adapt", "--fraction", "2", "--model", "fraud-none"], "--fraction: 2.0 is not in (0, 1]"),
        (["adapt", "--model", "fraud-none"], "no model named 'fraud-none'"),
        (["score"], "the following arguments are required: --data"),
        (["score", "--data", MISSING], "--data: no such file"),
        (["score", "--data", file, "--since", "yesterday-ish"], "--since: 'yesterday-ish' is not a timestamp"),
        (["score", "--data", file, "--model", "fraud-none"], "no model named 'fraud-none'"),
        (["batch", "--model", "bad name!"], "--model: invalid model name"),
        (["batch", "--accounts", MISSING], "--accounts: no such file"),
        (["tune", "--trials", "0"], "--trials: Input should be greater than or equal to 1"),
        (["tune", "--loss", "hinge"], "invalid choice: 'hinge'"),
    ]


@pytest.mark.parametrize("index", range(15))
def test_bad_invocation_exits_2_with_one_error_line(index: int, tmp_path: Path, capsys) -> None:
    existing = tmp_path / "tx.csv"
    existing.write_text("transaction_id,account_id,timestamp,amount\n1,a,2025-01-01,1.0\n")
    argv, expected = _invocations(existing)[index]
    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(main(argv))
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert expected in lines[0]
    assert "Traceback" not in captured.out + captured.err
    assert captured.out == ""


@pytest.mark.parametrize("command", ["train", "adapt", "score", "batch", "tune"])
def test_every_command_has_help(command: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--json" in out and ("--model" in out)
