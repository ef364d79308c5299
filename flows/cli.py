"""One command-line generator for every flow: flags, defaults and help come from the flow.

A vertical's ``__main__`` lists its :class:`Command` s; :func:`make_main` turns them into a
``main(argv) -> int``. For each parameter of a flow, a pydantic model contributes one flag
per field (recursively; help = the field's description, default = the flow's default
value), and a plain typed argument one flag (help = the ``Args:`` entry of the flow's
docstring). The conventions every command shares:

- ``--data`` names the input file, ``--model NAME[:VERSION|@alias]`` a registered model;
- ``--json`` prints the flow's typed result as one JSON object on the last line of stdout;
- a user error (bad value, unknown name, bad mapping) exits 2 with one ``error: ...`` line
  on stderr and no traceback, and is caught before a flow run starts wherever the
  parameters alone can tell (pydantic validation, then the command's ``check``);
- ``--config FILE.yaml`` reads the parameters from a file nested as the flow's parameters are
  (as the Prefect form shows them), ``--set a.b=c`` sets one (the value read as YAML), and
  ``--print-config`` prints the effective parameters as such a file without running; flow
  defaults < the file < the flags < ``--set``, validated together by pydantic;
- ``--help`` shows at most :data:`HELP_FLAGS` flags (:attr:`Command.common`), ``--help-all``
  every flag; every flag works whether shown or not.

A command names its flow by entrypoint (``"flows.fraud.train:fraud_train"``, as the
deployments do). Building the parser reads the flow's signature and docstring from its
source (:func:`~flows.cli_source.signature_from_source`: the module is parsed, not imported;
only the names its parameters' annotations and defaults use are imported, from light modules
such as ``solutions/<vertical>/config.py``), and the flow module is imported only when the command
runs. So ``--help``, a bad flag and every pre-flight error answer without importing
Lightning, torch or Prefect's engine. A command may still pass the flow object itself
(slower start: its whole module tree is imported to build the parser).

This module builds the parsers and runs the commands; :mod:`flows.cli_params` holds
:class:`Command` and the flow's parameters as flags, :mod:`flows.cli_source` reads a flow's
signature from its source, :mod:`flows.cli_config` the ``--config`` / ``--set`` /
``--print-config`` layer, :mod:`flows.cli_commands` the commands every vertical shares.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import os
import sys
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel

from flows.cli_commands import approval_commands, champion_commands, evidence_command, given, lazy_exports
from flows.cli_config import config_yaml, validated_kwargs
from flows.cli_params import (
    Built,
    Command,
    Leaf,
    UserError,
    command_leaves,
    description_of,
    flag_name,
    is_mapping,
    unwrap_optional,
)
from flows.cli_source import flow_doc, load_flow, signature_from_source, with_defaults
from infra.errors import IndusflowError
from infra.prefect_env import prefect_cli_settings

#: The verticals' command-line modules import from here only: what this module defines, and
#: (from the modules it is split into) Command, UserError and the flow readers their tests use.
__all__ = [
    "HELP_FLAGS", "Command", "UserError", "approval_commands", "champion_commands", "check_commands",
    "command_flags", "evidence_command", "flow_doc", "flow_kwargs", "given", "lazy_exports", "load_flow",
    "make_main", "parse_mapping", "preflight", "run_flow", "signature_from_source",
]


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one ``error:`` line (exit 2), with the closest
    known flag for each unrecognized one (Python 3.11's argparse has no ``suggest_on_error``)."""

    def error(self, message: str) -> typing.NoReturn:
        sys.stderr.write(f"error: {message}{self._did_you_mean(message)} (see {self.prog} --help)\n")
        raise SystemExit(2)

    def _did_you_mean(self, message: str) -> str:
        if not message.startswith(_UNRECOGNIZED):
            return ""
        known = self._flags()
        hints = {}  # unknown flag -> the closest known one
        for arg in message.removeprefix(_UNRECOGNIZED).split():
            flag = arg.split("=", 1)[0]
            close = difflib.get_close_matches(flag, known, n=1, cutoff=0.75) if flag.startswith("--") else []
            if close:
                hints[flag] = close[0]
        if len(hints) > 1:
            return "; did you mean " + ", ".join(f"{close} (for {flag})" for flag, close in hints.items()) + "?"
        return "".join(f"; did you mean {close}?" for close in hints.values())

    def _flags(self) -> list[str]:
        """The long flags of this parser and of its built sub-commands."""
        parsers = [self] + [p for a in self._actions if isinstance(a, argparse._SubParsersAction)
                            for p in a.choices.values()]
        return sorted({f for p in parsers for f in p._option_string_actions if f.startswith("--")})


_UNRECOGNIZED = "unrecognized arguments: "


# ------------------------------------------------------------------------------------
# leaves -> argparse


def parse_mapping(text: str) -> dict[str, str]:
    """``canonical=SOURCE,...`` into a dict."""
    out: dict[str, str] = {}
    for token in (t.strip() for t in text.split(",")):
        if not token:
            continue
        key, sep, value = token.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise argparse.ArgumentTypeError(f"{token!r} is not of the form name=VALUE")
        out[key.strip()] = value.strip()
    return out


def _fmt_default(value: Any) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items()) or "none"
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value)) or "none"
    return "none" if value is None else str(value)


def _add_leaf(target: Any, leaf: Leaf, flag: str, positional: bool, default_override: Any, shown: bool) -> None:
    inner, optional = unwrap_optional(leaf.annotation)
    default = default_override
    help_ = leaf.help.rstrip(".") if leaf.help else ""
    kwargs: dict[str, Any] = {"default": argparse.SUPPRESS}
    option = f"--{flag}"
    origin = get_origin(inner)
    if inner is bool:
        if default is None or optional or default:
            # on by default: --x turns it on, --no-x off; the help says what the field does
            kwargs["action"] = argparse.BooleanOptionalAction
            option = "--" + flag.removeprefix("no-")
        else:
            kwargs["action"] = "store_true"
            default = None
    elif origin is Literal:
        choices = list(get_args(inner))
        kwargs.update(choices=choices, type=type(choices[0]))
    elif inner in (int, float):
        kwargs["type"] = inner
    elif is_mapping(inner):
        kwargs.update(type=parse_mapping, metavar="NAME=VALUE,...")
    elif origin in (list, tuple, Sequence):
        item = get_args(inner)[0] if get_args(inner) else str
        kwargs.update(nargs="*" if positional else "+", type=item if item in (int, float) else str)
    elif inner is Path:
        kwargs["metavar"] = "PATH"
    if default is not None and kwargs.get("action") not in ("store_true", argparse.BooleanOptionalAction):
        help_ = f"{help_} (default: {_fmt_default(default)})" if help_ else f"default: {_fmt_default(default)}"
    elif kwargs.get("action") is argparse.BooleanOptionalAction and default is not None:
        help_ = f"{help_} (default: {'on' if default else 'off'})"
    if positional:
        if leaf.required:
            kwargs.pop("default")
        elif "nargs" not in kwargs:
            kwargs["nargs"] = "?"  # optional positional: absent means the flow's default
        target.add_argument(leaf.dest, metavar=flag.upper().replace("-", "_"), help=help_ or None, **kwargs)
        return
    if leaf.required:  # checked once the --config file and --set are merged in: it may come from them
        help_ = f"{help_} (required)" if help_ else "required"
    if "metavar" not in kwargs and kwargs.get("action") is None and "choices" not in kwargs:
        # one convention: a parameter named "model" is a registry spec
        kwargs["metavar"] = "NAME[:VERSION|@alias]" if leaf.path[-1] == "model" else flag.upper().replace("-", "_")
    help_ = help_.replace("%", "%%") or None if shown else argparse.SUPPRESS
    target.add_argument(option, dest=leaf.dest, help=help_, **kwargs)


#: The most flags a short ``--help`` shows (``-h`` included); ``--help-all`` shows every flag.
HELP_FLAGS = 15
#: Flags of every command (beside ``-h``): the file and overrides of parameters, the JSON result.
_SHARED_FLAGS = ("config", "set", "print-config", "json", "help-all")
#: The flags a short ``--help`` always shows: the input data and the model (see Command.common).
_ALWAYS_SHOWN = ("data", "model")


def _shown(command: Command, leaves: Sequence[Leaf], flag_of: Mapping[str, str]) -> set[str]:
    """The dotted paths whose flags the short ``--help`` shows (see :attr:`Command.common`)."""
    if command.common:
        chosen = {leaf.dotted for leaf in leaves
                  if any(leaf.dotted == c or leaf.dotted.startswith(c + ".") for c in command.common)}
    elif len(leaves) + len(_SHARED_FLAGS) <= HELP_FLAGS:  # -h and --help-all: one line between them
        chosen = {leaf.dotted for leaf in leaves}
    else:
        chosen = {leaf.dotted for leaf in leaves if len(leaf.path) == 1}
    return chosen | {leaf.dotted for leaf in leaves
                     if leaf.required or leaf.dotted == command.positional or flag_of[leaf.dotted] in _ALWAYS_SHOWN}


def _configure(parser: argparse.ArgumentParser, command: Command, *, full_help: bool = True) -> Built:
    """Add a command's flags to its parser; the short help (``full_help=False``) shows only
    the common ones (:func:`_shown`) and says that ``--help-all`` lists the rest."""
    leaves = command_leaves(command)
    flag_of: dict[str, str] = {}
    seen: dict[str, str] = {"help": "(--help)", **{f: f"(--{f})" for f in _SHARED_FLAGS}}
    for leaf in leaves:
        flag = flag_name(leaf, command)
        names = {flag, flag.removeprefix("no-"), "no-" + flag.removeprefix("no-")} \
            if unwrap_optional(leaf.annotation)[0] is bool else {flag}
        for name in names:
            if name in seen:
                raise RuntimeError(
                    f"command {command.name!r}: parameters {seen[name]} and {leaf.dotted} both want --{name}; "
                    "name one of them in Command.flags"
                )
            seen[name] = leaf.dotted
        flag_of[leaf.dotted] = flag
    unknown = (set(command.flags) | set(command.defaults) | ({command.positional} - {None})) - set(flag_of)
    if unknown:
        raise RuntimeError(f"command {command.name!r}: no parameter {sorted(unknown)} to name")
    shown = {leaf.dotted for leaf in leaves} if full_help else _shown(command, leaves, flag_of)
    groups: dict[str, Any] = {}
    flags: dict[str, str] = {}
    for leaf in leaves:
        flag = flag_of[leaf.dotted]
        flags[leaf.dotted] = flag if leaf.dotted == command.positional else f"--{flag}"
        target = parser
        if leaf.group:
            target = groups.setdefault(leaf.group, parser.add_argument_group(leaf.group))
        default = command.defaults.get(leaf.dotted, leaf.default)
        _add_leaf(target, leaf, flag, leaf.dotted == command.positional, default, leaf.dotted in shown)
    _add_shared_flags(parser, full_help, _set_example(leaves))
    rest = len(leaves) - len(shown & set(flag_of))
    if rest:
        parser.epilog = f"--help-all lists the other {rest} flag(s)."
    return Built(command, leaves, flags)


def _set_example(leaves: Sequence[Leaf]) -> str:
    """A ``--set`` of this command for its help: a training budget if it has one, else a number."""
    numbers = [leaf for leaf in leaves if unwrap_optional(leaf.annotation)[0] in (int, float)
               and isinstance(leaf.default, (int, float))]
    leaf = next((n for n in numbers if n.path[-1] == "max_epochs"), numbers[0] if numbers else None)
    return f" (e.g. {leaf.dotted}={leaf.default})" if leaf else ""


def _add_shared_flags(parser: argparse.ArgumentParser, full_help: bool, example: str) -> None:
    parser.add_argument("--config", metavar="FILE.yaml", dest="cli_config", type=Path,
                        help="the parameters from a YAML file (as --print-config writes it); flags win over it")
    parser.add_argument("--set", metavar="PATH=VALUE", dest="cli_set", action="append", default=[],
                        help=f"set one parameter by its path in --print-config{example}; "
                             "wins over the file and the flags; repeatable")
    parser.add_argument("--print-config", dest="cli_print_config", action="store_true",
                        help="print the effective parameters as YAML (a --config file) and exit without running")
    parser.add_argument(
        "--json", action="store_true",
        help="print the flow's typed result as one JSON object on the last line of stdout",
    )
    parser.add_argument("--help-all", action="help", help="show every flag and exit" if full_help else argparse.SUPPRESS)


# ------------------------------------------------------------------------------------
# checks and running


def preflight(built: Built, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The command's ``check`` of validated keyword arguments, then its ``prepare``."""
    command = built.command
    if command.check is not None:
        try:
            command.check(kwargs)
        except ValueError as exc:
            raise UserError(str(exc)) from None
    return command.prepare(kwargs) if command.prepare else kwargs


def flow_kwargs(built: Built, namespace: argparse.Namespace) -> dict[str, Any]:
    """Validated keyword arguments of the flow from the parsed command line, checked and prepared."""
    return preflight(built, validated_kwargs(built, namespace))


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _prefect_api(url: str | None) -> contextlib.AbstractContextManager[Any]:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    if url is None or PREFECT_API_URL.value() is not None:
        return contextlib.nullcontext()
    return temporary_settings(updates={PREFECT_API_URL: url})


def prefect_api_configured() -> bool:
    """PREFECT_API_URL is set in the environment: runs are to be recorded there. (Read from the
    environment alone: asking Prefect's settings would import Prefect, a second or more of a
    read-only command's start.)"""
    return bool(os.environ.get("PREFECT_API_URL"))


def run_flow(load: Callable[[], Callable[..., BaseModel]], kwargs: Mapping[str, Any], *, as_json: bool,
             summary: Callable[[Any], str], exit_code: Callable[[Any], int] | None = None,
             api_url: str | None = None, prefect: bool = True) -> int:
    """Call ``load()(**kwargs)`` (the flow: ``load`` imports it) under the project's Prefect defaults, against
    ``api_url`` when given and no PREFECT_API_URL is set (else a temporary API server that starts while
    ``load`` imports); print a summary and the JSON result. ``prefect=False``: ``load`` gives a plain
    function (a command's ``local``), called outside Prefect."""
    try:
        with _prefect_api(api_url) if prefect else contextlib.nullcontext(), \
                prefect_cli_settings(prepare=load) if prefect else contextlib.nullcontext(load()) as fn:
            result = fn(**kwargs)
    except IndusflowError as exc:
        print(f"error: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    print(summary(result))
    if as_json:
        sys.stdout.flush()
        print(json.dumps(json.loads(result.model_dump_json()), separators=(",", ":")))
    return exit_code(result) if exit_code is not None else 0


def _chosen_name(argv: Sequence[str], names: Collection[str]) -> str | None:
    """The sub-command an argument list asks for: its first argument that is not an option."""
    for arg in argv:
        if arg == "--":
            return None
        if not arg.startswith("-"):
            return arg if arg in names else None
    return None


def make_main(prog: str, description: str, commands: Sequence[Command]) -> Callable[[list[str] | None], int]:
    """``main(argv) -> exit code`` of a module's commands (one unnamed command: no sub-commands).

    Only the chosen sub-command's flags are built (its flow's parameters resolved); the others
    appear in the command list with their help line, which needs nothing but the docstring.
    """

    def build(argv: Sequence[str]) -> tuple[argparse.ArgumentParser, dict[str | None, Built]]:
        full_help = "--help-all" in argv
        parser = _Parser(prog=prog, description=description,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
        built: dict[str | None, Built] = {}
        if len(commands) == 1 and commands[0].name is None:
            built[None] = _configure(parser, commands[0], full_help=full_help)
            return parser, built
        parser.add_argument("--help-all", action="help", help=argparse.SUPPRESS)
        chosen = _chosen_name(argv, [c.name for c in commands if c.name])
        sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
        for command in commands:
            text = description_of(command.flow)
            p = sub.add_parser(command.name, help=command.help or text.splitlines()[0] if text else None,
                               description=text, formatter_class=argparse.RawDescriptionHelpFormatter)
            if command.name == chosen:
                built[command.name] = _configure(p, command, full_help=full_help)
        return parser, built

    def main(argv: list[str] | None = None) -> int:
        argv = list(sys.argv[1:] if argv is None else argv)
        parser, built = build(argv)
        args = parser.parse_args(argv)
        chosen = built[getattr(args, "command", None)]
        name = f"{prog} {chosen.command.name}" if chosen.command.name else prog
        try:
            kwargs = validated_kwargs(chosen, args)
            if args.cli_print_config:
                print(config_yaml(name, chosen, kwargs), end="")
                return 0
            kwargs = preflight(chosen, kwargs)
            api_url = chosen.command.api_url(kwargs) if chosen.command.api_url is not None else None
        except IndusflowError as exc:
            print(f"error: {_one_line(str(exc))}", file=sys.stderr)
            return 2
        command = chosen.command
        if command.local is not None and api_url is None and not prefect_api_configured():
            return run_flow(lambda: load_flow(command.local), with_defaults(command.flow, kwargs), as_json=args.json,
                            summary=command.summary, exit_code=command.exit_code, prefect=False)
        return run_flow(lambda: load_flow(command.flow), kwargs, as_json=args.json, summary=command.summary,
                        exit_code=command.exit_code, api_url=api_url)

    return main


def command_flags(command: Command) -> list[str]:
    """Every long flag of a command (shown by ``--help`` or not)."""
    parser = _Parser(prog=command.name or "command")
    _configure(parser, command)
    return sorted(f for f in parser._option_string_actions if f.startswith("--"))


def check_commands(commands: Sequence[Command]) -> None:
    """Build every command's flags (resolving each flow's parameters): raises on a clash of
    flag names or a ``Command`` field that names no parameter. For tests; ``main`` builds
    only the chosen command's."""
    for command in commands:
        _configure(_Parser(prog=command.name or "command"), command)
