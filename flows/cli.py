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
  parameters alone can tell (pydantic validation, then the command's ``check``).

A command names its flow by entrypoint (``"flows.fraud.train:fraud_train"``, as the
deployments do). Building the parser reads the flow's signature and docstring from its
source (:func:`flow_signature`: the module is parsed, not imported; only the names its
parameters' annotations and defaults use are imported, from light modules such as
``solutions/<vertical>/config.py``), and the flow module is imported only when the command
runs. So ``--help``, a bad flag and every pre-flight error answer without importing
Lightning, torch or Prefect's engine. A command may still pass the flow object itself
(slower start: its whole module tree is imported to build the parser).
"""

from __future__ import annotations

import argparse
import ast
import builtins
import contextlib
import difflib
import functools
import importlib
import importlib.util
import inspect
import json
import os
import sys
import types
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, TypeAdapter, ValidationError

from infra.errors import IndusflowError
from infra.prefect_env import prefect_cli_settings

_PREFIX = "p__"


@dataclass(frozen=True)
class Command:
    """One sub-command: a flow and how its parameters appear on the command line.

    Attributes:
        name: sub-command name (``train``); None for a single-command module.
        flow: the Prefect flow it runs: its entrypoint ``"module:function"`` (imported only
            when the command runs), or the flow object.
        summary: renders the flow's result for people (printed before ``--json``'s line).
        help: one line for the command list (default: the flow docstring's first line).
        flags: parameter path (``config.data.seed``) -> flag name without dashes, where the
            field name alone would be unclear or would collide.
        hidden: parameter paths (or prefixes) not offered on the command line.
        positional: the one parameter path taken as a positional argument, if any.
        defaults: command-line defaults that differ from the flow's (path -> value).
        check: pre-flight check of the validated keyword arguments; raises
            :class:`~infra.errors.IndusflowError` or ``ValueError`` for a user error.
        prepare: maps the validated keyword arguments to the flow's (e.g. derived values).
        exit_code: the exit code of a finished run from its result (default: 0), e.g. 1 when a
            reproduction is outside its tolerance.
        api_url: the Prefect API the run must use, from the validated keyword arguments (e.g. the
            temporary API of the run an approval resumes); None: the usual (PREFECT_API_URL, else
            an ephemeral API). A set PREFECT_API_URL always wins.
        local: for a read-only command, the entrypoint of a plain function taking the flow's
            parameters and returning its result, called instead of the flow when no Prefect API
            is configured (no flow run to record, so no temporary Prefect server to start).
    """

    name: str | None
    flow: str | Any
    summary: Callable[[Any], str]
    help: str | None = None
    flags: Mapping[str, str] = field(default_factory=dict)
    hidden: Collection[str] = ()
    positional: str | None = None
    defaults: Mapping[str, Any] = field(default_factory=dict)
    check: Callable[[dict[str, Any]], None] | None = None
    prepare: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    exit_code: Callable[[Any], int] | None = None
    api_url: Callable[[dict[str, Any]], str | None] | None = None
    local: str | None = None


@dataclass(frozen=True)
class _Leaf:
    path: tuple[str, ...]
    annotation: Any
    default: Any
    required: bool
    help: str
    group: str | None

    @property
    def dotted(self) -> str:
        return ".".join(self.path)

    @property
    def dest(self) -> str:
        return _PREFIX + "__".join(self.path)


class UserError(IndusflowError):
    """A command-line mistake: reported as one ``error:`` line, exit code 2."""


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
# a flow's signature, read from its source


class _SourceResolver:
    """Evaluates expressions of a module's top level (annotations, defaults) from its source.

    A name is looked up, in this order, in the module's ``import`` / ``from ... import``
    statements (importing only that module), its simple top-level assignments (evaluated
    the same way) and the builtins. Nothing else of the module runs.
    """

    def __init__(self, module: str, tree: ast.Module, filename: str) -> None:
        self.module, self.filename = module, filename
        self.package = module if filename.endswith("__init__.py") else module.rpartition(".")[0]
        self.bindings: dict[str, ast.stmt] = {}
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    self.bindings[alias.asname or alias.name.split(".")[0]] = node
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self.bindings[node.targets[0].id] = node
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                self.bindings[node.target.id] = node
        self.values: dict[str, Any] = {}

    def name(self, name: str) -> Any:
        if name in self.values:
            return self.values[name]
        node = self.bindings.get(name)
        if isinstance(node, ast.ImportFrom):
            alias = next(a for a in node.names if (a.asname or a.name.split(".")[0]) == name)
            source = importlib.util.resolve_name("." * node.level + (node.module or ""), self.package) \
                if node.level else node.module or ""
            module = importlib.import_module(source)
            value = getattr(module, alias.name) if hasattr(module, alias.name) else \
                importlib.import_module(f"{source}.{alias.name}")
        elif isinstance(node, ast.Import):
            alias = next(a for a in node.names if (a.asname or a.name.split(".")[0]) == name)
            value = importlib.import_module(alias.name)
            if alias.asname is None:
                value = importlib.import_module(alias.name.split(".")[0])
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            value = self.expr(node.value)
        elif hasattr(builtins, name):
            value = getattr(builtins, name)
        else:
            raise NameError(f"{self.filename}: {name!r} is not defined at the top level of {self.module}")
        self.values[name] = value
        return value

    def expr(self, node: ast.expr) -> Any:
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        namespace = {"__builtins__": builtins.__dict__, **{n: self.name(n) for n in names}}
        return eval(compile(ast.Expression(node), self.filename, "eval"), namespace)


def _source_of(module: str) -> tuple[str, str]:
    """(source text, file name) of a module, found without importing it (its parents are)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise RuntimeError(f"no Python source for module {module!r}")
    return Path(spec.origin).read_text(encoding="utf-8"), spec.origin


@functools.cache
def _parsed(entrypoint: str) -> tuple[str, str, ast.Module, ast.FunctionDef | ast.AsyncFunctionDef]:
    """(module, file name, module tree, function node) of a ``module:function`` entrypoint."""
    module, sep, name = entrypoint.partition(":")
    if not sep:
        raise RuntimeError(f"flow entrypoint {entrypoint!r} is not of the form module:function")
    text, filename = _source_of(module)
    tree = ast.parse(text, filename)
    node = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name),
                None)
    if node is None:
        raise RuntimeError(f"{filename}: no top-level function {name!r} (entrypoint {entrypoint})")
    return module, filename, tree, node


@functools.cache
def signature_from_source(entrypoint: str) -> Callable[..., Any]:
    """A stand-in for the function named by ``module:function``, built from its source.

    It has the function's name, docstring, ``inspect.signature`` and evaluated annotations
    (so ``typing.get_type_hints`` works as on the real one), and raises if called. The module
    itself is not imported: see :class:`_SourceResolver` for what is.
    """
    module, filename, tree, node = _parsed(entrypoint)
    name = node.name
    resolver = _SourceResolver(module, tree, filename)
    args = node.args
    positional = args.posonlyargs + args.args
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    kinds = [inspect.Parameter.POSITIONAL_ONLY] * len(args.posonlyargs) + \
        [inspect.Parameter.POSITIONAL_OR_KEYWORD] * len(args.args)
    specs = list(zip(positional, defaults, kinds, strict=True)) + [
        (a, d, inspect.Parameter.KEYWORD_ONLY) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
    ]
    params, annotations = [], {}
    for arg, default, kind in specs:
        annotation = resolver.expr(arg.annotation) if arg.annotation is not None else inspect.Parameter.empty
        if annotation is not inspect.Parameter.empty:
            annotations[arg.arg] = annotation
        value = resolver.expr(default) if default is not None else inspect.Parameter.empty
        params.append(inspect.Parameter(arg.arg, kind, default=value, annotation=annotation))

    def stand_in(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError(f"{entrypoint} is read from its source for the command line; import it to run it")

    stand_in.__name__ = stand_in.__qualname__ = name
    stand_in.__module__ = module
    stand_in.__doc__ = ast.get_docstring(node)
    stand_in.__annotations__ = annotations
    stand_in.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return stand_in


def flow_doc(flow: str | Any) -> str:
    """A flow's docstring, cleaned as ``inspect.getdoc`` does (from the source for an
    entrypoint string: no import at all)."""
    if isinstance(flow, str):
        return ast.get_docstring(_parsed(flow)[3]) or ""
    return inspect.getdoc(flow.fn) or ""


def flow_function(flow: str | Any) -> Callable[..., Any]:
    """The function whose parameters make a command's flags: read from source for an
    entrypoint string (nothing heavy imported), the flow's ``fn`` for a flow object."""
    return signature_from_source(flow) if isinstance(flow, str) else flow.fn


def with_defaults(flow: str | Any, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Every parameter of the flow: the given keyword arguments, the flow's defaults for the rest."""
    bound = inspect.signature(flow_function(flow)).bind_partial(**kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def load_flow(flow: str | Any) -> Any:
    """The flow object (an entrypoint string is imported now)."""
    if not isinstance(flow, str):
        return flow
    module, _, name = flow.partition(":")
    return getattr(importlib.import_module(module), name)


def given(kwargs: Mapping[str, Any], flow: str | Any, name: str) -> Any:
    """The value a parameter will have: given on the command line, or the flow's default."""
    if name in kwargs:
        return kwargs[name]
    default = inspect.signature(flow_function(flow)).parameters[name].default
    return None if default is inspect.Parameter.empty else default


def lazy_exports(module: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """PEP 562 ``__getattr__`` and ``__dir__`` of a flows package whose ``exports`` (name ->
    the module defining it) are imported on first use, so that importing a light module of the
    package (its ``cli``) does not import every flow, torch and Lightning."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        setattr(sys.modules[module], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[module])) | set(exports))

    return __getattr__, __dir__


def champion_commands(promote: str, rollback: str) -> tuple[Command, Command]:
    """A vertical's ``promote`` and ``rollback`` commands over its two flows (entrypoints), with
    their pre-flight checks: the version to promote, or the model to roll back, is registered."""

    def check_promote(kwargs: dict[str, Any]) -> None:
        from infra.registry import ModelRegistry
        from tasks.champion import version_spec

        try:
            name, version = version_spec(kwargs["model"])
        except ValueError as exc:
            raise ValueError(f"--model: {exc}") from None
        ModelRegistry().get(name, version)  # RegistryError names the models / versions

    def check_rollback(kwargs: dict[str, Any]) -> None:
        from infra.registry import ModelRegistry
        from tasks.champion import bare_name

        try:
            name = bare_name(given(kwargs, rollback, "model"))
        except ValueError as exc:
            raise ValueError(f"--model: {exc}") from None
        ModelRegistry().get(name)  # RegistryError: unknown model, or no champion yet

    def summary(decision: Any) -> str:
        from tasks.champion import champion_move_summary

        return champion_move_summary(decision)

    return (
        Command("promote", promote, summary, help="make a registered version the champion by hand (NAME:VERSION)",
                check=check_promote),
        Command("rollback", rollback, summary, help="return the champion to the version that was champion before",
                check=check_rollback),
    )


APPROVE = "flows.registry.approve:registry_approve"
APPROVALS = "flows.registry.approve:registry_approvals"


def approval_commands() -> tuple[Command, Command]:
    """The ``approve RUN --reason ...`` and ``approvals`` commands (four eyes on champion moves),
    the same in each vertical and in ``flows.registry``."""

    def run_api(kwargs: dict[str, Any]) -> str | None:
        from tasks.approval import find_request

        return find_request(kwargs["run"]).api_url  # ApprovalError names the waiting runs

    def waiting_api(kwargs: dict[str, Any]) -> str | None:
        from tasks.approval import approval_requests

        waiting = approval_requests("waiting")
        return waiting[-1].api_url if waiting else None  # not a second ephemeral API beside the waiting run's

    def approve_summary(request: Any) -> str:
        outcome = {"waiting": "sent; the run has not recorded it yet (it resumes at its next check)"}.get(
            request.status, f"{request.status} by {request.decided_by}")
        return f"{request.model} v{request.candidate_version} (run {request.run_id}): {outcome}"

    def approvals_summary(result: Any) -> str:
        return "\n".join(
            f"{r.run_id}  {r.model} v{r.candidate_version}  {r.status}  asked by {r.requested_by} at "
            f"{r.requested_at[:19]}" + (f", until {r.expires_at[:19]}" if r.status == "waiting" else
                                        f", {r.decided_by or 'nobody'}: {r.decision_reason}")
            for r in result.requests) or "no approval requests"

    return (
        Command("approve", APPROVE, approve_summary, positional="run", api_url=run_api,
                help="approve (or --reject) the champion move a paused run waits for; four eyes"),
        Command("approvals", APPROVALS, approvals_summary, api_url=waiting_api,
                help="list the champion moves waiting for approval"),
    )


def evidence_command(entrypoint: str, help: str) -> Command:
    """A vertical's ``evidence`` command (its flow returns ``tasks.online_evidence.OnlineEvidence``),
    with its pre-flight check: ``--model`` is a registered bare NAME."""

    def check(kwargs: dict[str, Any]) -> None:
        from infra.registry import ModelRegistry, parse_model_spec

        name = given(kwargs, entrypoint, "model")
        if parse_model_spec(name)[0] != name:
            raise ValueError(f"--model {name!r}: evidence takes a model NAME (its champion and challenger are "
                             "compared)")
        known = ModelRegistry().models()
        if name not in known:
            raise ValueError(f"--model: no registered model {name!r}; registered: {', '.join(known) or 'none'}")

    def summary(result: Any) -> str:
        from tasks.online_evidence import CLASSIFICATION

        classify = result.rule.metric in CLASSIFICATION
        lines = []
        for v in result.versions:
            m = (f"{result.rule.metric} {v.metric.value:.4f} [{v.metric.low:.4f}, {v.metric.high:.4f}]" if v.metric
                 else f"{result.rule.metric} n/a")
            count = f"{v.positives} positive" if classify else f"{v.subjects or 0} {result.subjects_are}"
            lines.append(f"v{v.version} ({', '.join(v.roles)}): scored {v.scored}, labelled {v.labelled} "
                         f"({count}), {m}")
        lines.append(f"{result.recommendation}: {result.reason}")
        if result.promotion is not None:
            lines.append(f"promotion: {result.promotion.reason}")
        return "\n".join(lines)

    return Command("evidence", entrypoint, summary, help=help, check=check)


# ------------------------------------------------------------------------------------
# parameters -> leaves


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    """(inner type, allows None) of ``X | None``."""
    if get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [a for a in get_args(annotation) if a is not type(None)]
        optional = len(inner) < len(get_args(annotation))
        if len(inner) == 1:
            return inner[0], optional
        return typing.Union[tuple(inner)], optional  # noqa: UP007 - runtime construction
    return annotation, False


def _model_of(annotation: Any) -> type[BaseModel] | None:
    inner, _ = _unwrap_optional(annotation)
    return inner if isinstance(inner, type) and issubclass(inner, BaseModel) else None


def docstring_args(fn: Callable[..., Any]) -> dict[str, str]:
    """The ``Args:`` entries of a Google-style docstring (name -> one-line text)."""
    doc = inspect.getdoc(fn) or ""
    out: dict[str, str] = {}
    in_args, current = False, None
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped in {"Args:", "Arguments:", "Parameters:"}:
            in_args = True
            continue
        if not in_args:
            continue
        if stripped.endswith(":") and not line.startswith(" ") and stripped[:-1].isalpha():
            break  # the next section (Returns:, Raises:)
        if not stripped:
            continue
        indent = len(line) - len(line.lstrip())
        name, sep, text = stripped.partition(":")
        if sep and indent <= 4 and name.split(" ")[0].isidentifier():
            current = name.split(" ")[0]
            out[current] = text.strip()
        elif current:
            out[current] += " " + stripped
    return out


def description_of(flow: str | Any) -> str:
    """A flow's docstring without its ``Args:`` section (the command's description)."""
    doc = flow_doc(flow)
    kept = []
    for line in doc.splitlines():
        if line.strip() in {"Args:", "Arguments:", "Parameters:", "Returns:"}:
            break
        kept.append(line)
    return "\n".join(kept).strip()


def _walk(path: tuple[str, ...], annotation: Any, default: Any, required: bool, help_: str,
          group: str | None, hidden: Collection[str]) -> list[_Leaf]:
    dotted = ".".join(path)
    if any(dotted == h or dotted.startswith(h + ".") for h in hidden):
        return []
    model = _model_of(annotation)
    if model is None:
        return [_Leaf(path, annotation, default, required, help_, group)]
    if default is None or not isinstance(default, model):
        return []  # a model parameter with no instance to start from is not offered
    title = (inspect.getdoc(model) or model.__name__).splitlines()[0].rstrip(".")
    leaves: list[_Leaf] = []
    for name, info in type(default).model_fields.items():
        leaves += _walk(path + (name,), info.annotation, getattr(default, name), False,
                        info.description or "", title, hidden)
    return leaves


def _leaves(command: Command) -> list[_Leaf]:
    fn = flow_function(command.flow)
    hints = typing.get_type_hints(fn)
    docs = docstring_args(fn)
    leaves: list[_Leaf] = []
    for name, param in inspect.signature(fn).parameters.items():
        required = param.default is inspect.Parameter.empty
        default = None if required else param.default
        leaves += _walk((name,), hints.get(name, Any), default, required, docs.get(name, ""), None, command.hidden)
    return leaves


def _flag_name(leaf: _Leaf, command: Command) -> str:
    if leaf.dotted in command.flags:
        return command.flags[leaf.dotted]
    base = leaf.path[-1].replace("_", "-")
    inner, _ = _unwrap_optional(leaf.annotation)
    if inner is bool and leaf.default is True:
        return "no-" + base
    return base


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


def _add_leaf(target: Any, leaf: _Leaf, flag: str, positional: bool, default_override: Any) -> None:
    inner, optional = _unwrap_optional(leaf.annotation)
    default = default_override
    help_ = leaf.help.rstrip(".") if leaf.help else ""
    kwargs: dict[str, Any] = {"default": argparse.SUPPRESS}
    origin = get_origin(inner)
    if inner is bool:
        if default is None or optional:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["action"] = "store_false" if default else "store_true"
            help_ = help_ + (" (turns it off)" if default else "")
            default = None
    elif origin is Literal:
        choices = list(get_args(inner))
        kwargs.update(choices=choices, type=type(choices[0]))
    elif inner in (int, float):
        kwargs["type"] = inner
    elif origin in (dict, Mapping) or inner is dict:
        kwargs.update(type=parse_mapping, metavar="NAME=VALUE,...")
    elif origin in (list, tuple, Sequence):
        item = get_args(inner)[0] if get_args(inner) else str
        kwargs.update(nargs="*" if positional else "+", type=item if item in (int, float) else str)
    elif inner is Path:
        kwargs["metavar"] = "PATH"
    if default is not None and kwargs.get("action") not in ("store_true", "store_false"):
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
    if leaf.required:
        kwargs.pop("default")
        kwargs["required"] = True
    if "metavar" not in kwargs and kwargs.get("action") is None and "choices" not in kwargs:
        # one convention: a parameter named "model" is a registry spec
        kwargs["metavar"] = "NAME[:VERSION|@alias]" if leaf.path[-1] == "model" else flag.upper().replace("-", "_")
    target.add_argument(f"--{flag}", dest=leaf.dest, help=help_.replace("%", "%%") or None, **kwargs)


@dataclass
class _Built:
    command: Command
    leaves: list[_Leaf]
    flags: dict[str, str]  # dotted path -> --flag


def _configure(parser: argparse.ArgumentParser, command: Command) -> _Built:
    leaves = _leaves(command)
    flags: dict[str, str] = {}
    seen: dict[str, str] = {"json": "(--json)", "help": "(--help)"}
    groups: dict[str, Any] = {}
    for leaf in leaves:
        flag = _flag_name(leaf, command)
        if flag in seen:
            raise RuntimeError(
                f"command {command.name!r}: parameters {seen[flag]} and {leaf.dotted} both want --{flag}; "
                "name one of them in Command.flags"
            )
        seen[flag] = leaf.dotted
        flags[leaf.dotted] = flag if leaf.dotted == command.positional else f"--{flag}"
        target = parser
        if leaf.group:
            target = groups.setdefault(leaf.group, parser.add_argument_group(leaf.group))
        default = command.defaults.get(leaf.dotted, leaf.default)
        _add_leaf(target, leaf, flag, leaf.dotted == command.positional, default)
    unknown = (set(command.flags) | set(command.defaults) | ({command.positional} - {None})) - {
        leaf.dotted for leaf in leaves
    }
    if unknown:
        raise RuntimeError(f"command {command.name!r}: no parameter {sorted(unknown)} to name")
    parser.add_argument(
        "--json", action="store_true",
        help="print the flow's typed result as one JSON object on the last line of stdout",
    )
    return _Built(command, leaves, flags)


# ------------------------------------------------------------------------------------
# parsed values -> flow keyword arguments


def _set_path(tree: dict[str, Any], path: Sequence[str], value: Any) -> None:
    for part in path[:-1]:
        tree = tree.setdefault(part, {})
    tree[path[-1]] = value


def _merge(base: Any, overrides: Any) -> Any:
    if isinstance(base, dict) and isinstance(overrides, dict):
        out = dict(base)
        for key, value in overrides.items():
            out[key] = _merge(base.get(key), value)
        return out
    return overrides


def _explain(exc: ValidationError, prefix: tuple[str, ...], built: _Built) -> str:
    problems = []
    for err in exc.errors():
        path = prefix + tuple(str(p) for p in err["loc"])
        flag = None
        for cut in range(len(path), 0, -1):
            flag = built.flags.get(".".join(path[:cut]))
            if flag:
                break
        message = str(err["msg"]).removeprefix("Value error, ")
        if flag:
            problems.append(f"{flag}: {message}")
        else:  # a check across fields of a model: name the model's flags
            related = [f for d, f in built.flags.items() if d.startswith(".".join(path) + ".")]
            problems.append(f"{message}" + (f" ({', '.join(related)})" if related else ""))
    return "; ".join(problems)


def flow_kwargs(built: _Built, namespace: argparse.Namespace) -> dict[str, Any]:
    """Validated keyword arguments of the flow from the parsed command line."""
    command = built.command
    overrides: dict[str, Any] = {}
    for dotted, value in command.defaults.items():
        _set_path(overrides, dotted.split("."), value)
    for key, value in vars(namespace).items():
        if key.startswith(_PREFIX):
            _set_path(overrides, key[len(_PREFIX):].split("__"), value)
    fn = flow_function(command.flow)
    hints = typing.get_type_hints(fn)
    kwargs: dict[str, Any] = {}
    for name, param in inspect.signature(fn).parameters.items():
        if name not in overrides:
            continue
        annotation = hints.get(name, Any)
        model = _model_of(annotation)
        try:
            if model is not None and isinstance(overrides[name], dict):
                base = param.default if isinstance(param.default, BaseModel) else model()
                merged = _merge(base.model_dump(mode="python"), overrides[name])
                kwargs[name] = type(base).model_validate(merged)
            else:
                kwargs[name] = TypeAdapter(annotation).validate_python(overrides[name])
        except ValidationError as exc:
            raise UserError(_explain(exc, (name,), built)) from None
    if command.check is not None:
        try:
            command.check(kwargs)
        except ValueError as exc:
            raise UserError(str(exc)) from None
    return command.prepare(kwargs) if command.prepare else kwargs


# ------------------------------------------------------------------------------------
# running


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


def run_flow(fn: Callable[[], BaseModel], *, as_json: bool, summary: Callable[[Any], str],
             exit_code: Callable[[Any], int] | None = None, api_url: str | None = None, prefect: bool = True) -> int:
    """Run a flow under the project's Prefect defaults (against ``api_url`` when given and no
    PREFECT_API_URL is set); print a summary and the JSON result. ``prefect=False``: ``fn``
    calls a plain function (a command's ``local``), outside Prefect."""
    try:
        with _prefect_api(api_url) if prefect else contextlib.nullcontext(), \
                prefect_cli_settings() if prefect else contextlib.nullcontext():
            result = fn()
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

    def build(argv: Sequence[str]) -> tuple[argparse.ArgumentParser, dict[str | None, _Built]]:
        parser = _Parser(prog=prog, description=description,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
        built: dict[str | None, _Built] = {}
        if len(commands) == 1 and commands[0].name is None:
            built[None] = _configure(parser, commands[0])
            return parser, built
        chosen = _chosen_name(argv, [c.name for c in commands if c.name])
        sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
        for command in commands:
            text = description_of(command.flow)
            p = sub.add_parser(command.name, help=command.help or text.splitlines()[0] if text else None,
                               description=text, formatter_class=argparse.RawDescriptionHelpFormatter)
            if command.name == chosen:
                built[command.name] = _configure(p, command)
        return parser, built

    def main(argv: list[str] | None = None) -> int:
        argv = list(sys.argv[1:] if argv is None else argv)
        parser, built = build(argv)
        args = parser.parse_args(argv)
        chosen = built[getattr(args, "command", None)]
        try:
            kwargs = flow_kwargs(chosen, args)
            api_url = chosen.command.api_url(kwargs) if chosen.command.api_url is not None else None
        except IndusflowError as exc:
            print(f"error: {_one_line(str(exc))}", file=sys.stderr)
            return 2
        command = chosen.command
        if command.local is not None and api_url is None and not prefect_api_configured():
            local_kwargs = with_defaults(command.flow, kwargs)
            return run_flow(lambda: load_flow(command.local)(**local_kwargs), as_json=args.json, summary=command.summary,
                            exit_code=command.exit_code, prefect=False)
        return run_flow(lambda: load_flow(command.flow)(**kwargs), as_json=args.json, summary=command.summary,
                        exit_code=command.exit_code, api_url=api_url)

    return main


def check_commands(commands: Sequence[Command]) -> None:
    """Build every command's flags (resolving each flow's parameters): raises on a clash of
    flag names or a ``Command`` field that names no parameter. For tests; ``main`` builds
    only the chosen command's."""
    for command in commands:
        _configure(_Parser(prog=command.name or "command"), command)
