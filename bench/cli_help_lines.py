"""How many flags each flow command's ``--help`` shows; prints one JSON line.

For every command of the modules built by ``flows/cli.py`` (``python -m flows.fraud``,
``flows.sensor``, ``flows.rag``, ``flows.registry``, ``flows.compress``): the flag lines of
``--help`` (lines matching ``^  +-``, as ``python -m flows.X CMD --help | grep -c '^  \\+-'``
counts them) and of ``--help-all`` (every flag; null where the code has no ``--help-all``).
``--before PATH`` counts a second checkout's ``--help`` too (e.g. main before a change).
One process per module and checkout builds every command's parser in turn (the same text
``python -m`` prints; ``COLUMNS`` is fixed so that line wrapping is the same everywhere).

Usage: ``python bench/cli_help_lines.py [--before /path/to/main] [--out FILE.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODULES = ("flows.fraud", "flows.sensor", "flows.rag", "flows.registry", "flows.compress")

# run in a fresh process, with the checkout to measure first on sys.path
_COUNT = r"""
import contextlib, io, json, re, sys
from {module}.cli import COMMANDS, main

def flags(argv):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(argv)
        except SystemExit as exc:
            if exc.code != 0:
                return None
    return sum(1 for line in buf.getvalue().splitlines() if re.match(r"^  +-", line))

out = {{}}
for c in COMMANDS:
    head = [c.name] if c.name else []
    out[" ".join(["{short}", *head])] = {{"help": flags(head + ["--help"]), "help_all": flags(head + ["--help-all"])}}
print(json.dumps(out))
"""


def count(root: Path, module: str) -> dict[str, dict[str, int | None]]:
    """Command -> flag lines of ``--help`` and ``--help-all``, for the code at ``root``."""
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "100", "INDUSFLOW_HOME": os.devnull + "-not-used"}
    code = _COUNT.format(module=module, short=module.removeprefix("flows."))
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{module} at {root}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def commit(root: Path) -> str | None:
    """The checkout's HEAD commit (None outside git)."""
    proc = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False)
    return proc.stdout.strip() or None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="another checkout whose --help to count as 'before'")
    parser.add_argument("--out", type=Path, help="also write the JSON line to this file")
    args = parser.parse_args()
    commands: dict[str, dict[str, int | None]] = {}
    for module in MODULES:
        after = count(REPO, module)
        before = count(args.before, module) if args.before else {}
        for name, counts in after.items():
            commands[name] = {"help_before": before.get(name, {}).get("help"), "help_after": counts["help"],
                              "help_all": counts["help_all"]}
    shown = [c["help_after"] for c in commands.values()]
    line = json.dumps({
        "commit": commit(REPO), "before_commit": commit(args.before) if args.before else None,
        "max_help_flags": max(shown), "commands_over_15": sorted(n for n, c in commands.items() if c["help_after"] > 15),
        "commands": commands,
    })
    print(line)
    if args.out:
        args.out.write_text(line + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
