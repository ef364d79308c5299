"""Configuration files and the short help of every flow command (flows/cli.py).

``--config FILE.yaml`` sets the flow's parameters nested as the flow's are, ``--set a.b=c``
one of them, ``--print-config`` prints the effective ones as such a file (and runs nothing);
the flow's defaults < the file < the flags < ``--set``. A bad file or path exits 2 with one
``error:`` line naming the file (or ``--set``) and the key. ``--help`` shows at most 15 flags,
``--help-all`` every flag. Nothing here runs a flow: ``--print-config`` stops after validation.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flows.cli import HELP_FLAGS, Command, command_flags

REPO = Path(__file__).resolve().parents[2]
MODULES = ("flows.fraud", "flows.sensor", "flows.rag", "flows.registry", "flows.compress")
FLAG_LINE = re.compile(r"^  +-")


def _call(module: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    main = importlib.import_module(f"{module}.cli").main
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's --help and its own errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def _config(module: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    code, out, err = _call(module, [*argv, "--print-config"], capsys)
    assert code == 0, err
    return yaml.safe_load(out)


def _commands() -> list[tuple[str, Command]]:
    return [(module, c) for module in MODULES for c in importlib.import_module(f"{module}.cli").COMMANDS]


def _head(command: Command) -> list[str]:
    return [command.name] if command.name else []


def test_file_then_flags_then_set_each_win_over_the_one_before(tmp_path: Path, capsys) -> None:
    file = tmp_path / "train.yaml"
    file.write_text("config:\n  model:\n    max_epochs: 3\n    lr: 0.01\n  data:\n    seed: 4\nstrict: true\n")
    defaults = _config("flows.fraud", ["train"], capsys)
    from_file = _config("flows.fraud", ["train", "--config", str(file)], capsys)
    flag = _config("flows.fraud", ["train", "--config", str(file), "--max-epochs", "5"], capsys)
    # --set wins wherever it stands on the line
    both = _config("flows.fraud", ["train", "--set", "config.model.max_epochs=7", "--config", str(file),
                                   "--max-epochs", "5", "--set", "config.candidates=[sequence, ensemble]"], capsys)
    assert defaults["config"]["model"]["max_epochs"] == 12 and defaults["strict"] is False
    assert from_file["config"]["model"] == {**defaults["config"]["model"], "max_epochs": 3, "lr": 0.01}
    assert from_file["config"]["data"]["seed"] == 4 and from_file["strict"] is True
    assert flag["config"]["model"]["max_epochs"] == 5 and flag["config"]["model"]["lr"] == 0.01
    assert both["config"]["model"]["max_epochs"] == 7 and both["config"]["candidates"] == ["sequence", "ensemble"]
    assert both["config"]["model"]["hidden"] == defaults["config"]["model"]["hidden"]  # untouched


def test_set_reaches_one_key_of_a_mapping_and_flags_not_shown_still_work(capsys) -> None:
    config = _config("flows.fraud", ["train", "--columns", "account_id=CUSTOMER_ID", "--set", "columns.amount=TX_AMOUNT",
                                     "--lr", "0.05", "--no-baseline"], capsys)
    assert config["columns"] == {"account_id": "CUSTOMER_ID", "amount": "TX_AMOUNT"}
    assert config["config"]["model"]["lr"] == 0.05 and config["config"]["baseline"]["enabled"] is False
    assert _config("flows.fraud", ["train", "--baseline"], capsys)["config"]["baseline"]["enabled"] is True


@pytest.mark.parametrize("module", MODULES)
def test_print_config_round_trips_through_config(module: str, tmp_path: Path, capsys) -> None:
    """What --print-config prints, --config reads back to the same parameters, for every command."""
    for command in importlib.import_module(f"{module}.cli").COMMANDS:
        argv = [*_head(command), *(["x"] if command.positional else [])]
        for _ in range(4):  # a required flag: give it (a value of any type a string validates as)
            code, printed, err = _call(module, [*argv, "--print-config"], capsys)
            required = re.search(r"required: (--[\w-]+)", err)
            if code == 0 or not required:
                break
            argv += [required.group(1), "x"]
        assert code == 0, (command.name, err)
        file = tmp_path / f"{command.name}.yaml"
        file.write_text(printed)
        code, again, err = _call(module, [*_head(command), *(["x"] if command.positional else []), "--config",
                                          str(file), "--print-config"], capsys)
        assert code == 0, (command.name, err)
        assert again == printed, command.name


def _bad_cases(tmp: Path) -> list[tuple[str, list[str], str]]:
    def file(name: str, text: str) -> str:
        path = tmp / name
        path.write_text(text)
        return str(path)

    missing = str(tmp / "absent.yaml")
    typo = file("typo.yaml", "config:\n  model:\n    lrr: 0.01\n")
    misplaced = file("misplaced.yaml", "lr: 0.01\n")
    wrong_type = file("type.yaml", "config:\n  model:\n    lr: fast\n")
    not_yaml = file("broken.yaml", "config:\n  model: [1\n")
    not_mapping = file("scalar.yaml", "config: 3\n")
    periods = file("periods.yaml", "config:\n  split:\n    val_days: 20\n")
    hidden = file("adapt.yaml", "config:\n  model:\n    lr: 0.01\n")  # fraud adapt does not offer the model's settings
    return [
        ("missing file", ["train", "--config", missing], f"--config: no such file: {missing}"),
        ("typo", ["train", "--config", typo], f"{typo}: unknown parameter 'config.model.lrr'; did you mean 'config.model.lr'?"),
        ("misplaced", ["train", "--config", misplaced], f"{misplaced}: unknown parameter 'lr'; did you mean 'config.model.lr'?"),
        ("wrong type", ["train", "--config", wrong_type], f"{wrong_type}: config.model.lr: Input should be a valid number"),
        ("not yaml", ["train", "--config", not_yaml], f"{not_yaml}: not a YAML file (line 3"),
        ("not a mapping", ["train", "--config", not_mapping], f"{not_mapping}: config: expected a mapping of its parameters"),
        ("across fields", ["train", "--config", periods], f"must be smaller than train_days (14.0) ({periods}: config.split.val_days)"),
        ("not this command's", ["adapt", "--config", hidden], f"{hidden}: 'config.model' is not a parameter of this command"),
        ("set typo", ["train", "--set", "config.modle.lr=1"], "--set: unknown parameter 'config.modle.lr'; did you mean 'config.model.lr'?"),
        ("set no value", ["train", "--set", "config.model.lr"], "--set config.model.lr: expected PATH=VALUE"),
        ("set wrong type", ["train", "--set", "config.model.lr=abc"], "--set config.model.lr: Input should be a valid number"),
        ("set below a leaf", ["train", "--set", "config.model.lr.x=1"], "--set: unknown parameter 'config.model.lr.x'"),
    ]


BAD = ["missing file", "typo", "misplaced", "wrong type", "not yaml", "not a mapping", "across fields",
       "not this command's", "set typo", "set no value", "set wrong type", "set below a leaf"]


@pytest.mark.parametrize("name", BAD)
def test_a_bad_file_or_set_exits_2_naming_the_file_and_the_key(name: str, tmp_path: Path, capsys) -> None:
    cases = {case: (argv, expected) for case, argv, expected in _bad_cases(tmp_path)}
    assert set(cases) == set(BAD)
    argv, expected = cases[name]
    code, out, err = _call("flows.fraud", [*argv, "--print-config"], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and lines[0].startswith("error: "), (name, err)
    assert expected in lines[0], (name, lines[0])


def test_a_required_parameter_may_come_from_the_file(tmp_path: Path, capsys) -> None:
    file = tmp_path / "score.yaml"
    file.write_text("data: /no/such/dir/input.csv\n")
    code, _, err = _call("flows.fraud", ["score"], capsys)
    assert code == 2 and "required: --data" in err
    code, _, err = _call("flows.fraud", ["score", "--config", str(file)], capsys)  # the pre-flight check runs
    assert code == 2 and err.strip() == "error: --data: no such file: /no/such/dir/input.csv"


def test_every_help_shows_at_most_15_flags_and_help_all_every_flag(monkeypatch, capsys) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    for module, command in _commands():
        label = f"{module} {command.name or ''}"
        code, short, _ = _call(module, [*_head(command), "--help"], capsys)
        assert code == 0, label
        shown = [line for line in short.splitlines() if FLAG_LINE.match(line)]
        assert len(shown) <= HELP_FLAGS, (label, len(shown))
        code, full, _ = _call(module, [*_head(command), "--help-all"], capsys)
        assert code == 0, label
        every = command_flags(command)
        listed = set(re.findall(r"(?<![\w-])--[\w-]+", "\n".join(line for line in full.splitlines()
                                                                  if FLAG_LINE.match(line))))
        assert set(every) <= listed, (label, sorted(set(every) - listed))
        assert {"--config", "--set", "--print-config", "--json"} <= set(every)
        rest = len([line for line in full.splitlines() if FLAG_LINE.match(line)]) - len(shown) - 1  # --help-all
        last = short.strip().splitlines()[-1]
        if rest:
            assert last == f"--help-all lists the other {rest} flag(s).", (label, last)
        assert "turns it off" not in full, label


def test_an_on_by_default_flag_reads_what_it_does(capsys) -> None:
    code, full, _ = _call("flows.fraud", ["train", "--help-all"], capsys)
    assert code == 0
    text = " ".join(full.split())
    assert "--baseline, --no-baseline Train the baseline beside the sequence model (default: on)" in text


def _docs_block() -> list[str]:
    from tests.docs import blocks as rb

    blocks = [b for b in rb.parse(REPO / "docs" / "configuration.md") if "Configuration files" in b.headings]
    assert blocks, "docs/configuration.md has no command block under 'Configuration files'"
    return [c.text for b in blocks for c in b.commands]


def test_the_docs_block_runs_as_written_in_fresh_processes(tmp_path: Path) -> None:
    """docs/configuration.md's example, each line through ``python -m`` as a user types it."""
    env = {**os.environ, "INDUSFLOW_HOME": str(tmp_path / "home"),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    outputs = []
    for line in _docs_block():
        command = line.replace(".venv/bin/python", sys.executable)
        proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300, check=False)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (line, proc.stderr[-2000:])
        outputs.append(proc.stdout)
    written = yaml.safe_load((tmp_path / "train.yaml").read_text())
    changed = yaml.safe_load(outputs[-1])
    assert changed["config"]["model"]["max_epochs"] == 3
    assert changed == {**written, "config": {**written["config"], "model": {**written["config"]["model"],
                                                                              "max_epochs": 3}}}
    proc = subprocess.run([sys.executable, "-m", "flows.sensor", "train", "--help"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    flags = [line for line in proc.stdout.splitlines() if FLAG_LINE.match(line)]
    assert proc.returncode == 0 and len(flags) <= HELP_FLAGS and "--help-all lists the other" in proc.stdout
