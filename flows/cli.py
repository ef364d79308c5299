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
        common: parameter paths (or prefixes) whose flags the short ``--help`` shows beside the
            ones every command shows (``--data``, ``--model``, ``--config``, ``--set``,
            ``--print-config``, ``--json``, required flags); empty: every flag when they fit in
            :data:`HELP_FLAGS`, else the flow's top-level parameters. ``--help-all`` shows all.
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
    common: Collection[str] = ()


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


def _add_leaf(target: Any, leaf: _Leaf, flag: str, positional: bool, default_override: Any, shown: bool) -> None:
    inner, optional = _unwrap_optional(leaf.annotation)
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
    elif _is_mapping(inner):
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


@dataclass
class _Built:
    command: Command
    leaves: list[_Leaf]
    flags: dict[str, str]  # dotted path -> --flag


def _shown(command: Command, leaves: Sequence[_Leaf], flag_of: Mapping[str, str]) -> set[str]:
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


def _configure(parser: argparse.ArgumentParser, command: Command, *, full_help: bool = True) -> _Built:
    """Add a command's flags to its parser; the short help (``full_help=False``) shows only
    the common ones (:func:`_shown`) and says that ``--help-all`` lists the rest."""
    leaves = _leaves(command)
    flag_of: dict[str, str] = {}
    seen: dict[str, str] = {"help": "(--help)", **{f: f"(--{f})" for f in _SHARED_FLAGS}}
    for leaf in leaves:
        flag = _flag_name(leaf, command)
        names = {flag, flag.removeprefix("no-"), "no-" + flag.removeprefix("no-")} \
            if _unwrap_optional(leaf.annotation)[0] is bool else {flag}
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
    return _Built(command, leaves, flags)


def _set_example(leaves: Sequence[_Leaf]) -> str:
    """A ``--set`` of this command for its help: a training budget if it has one, else a number."""
    numbers = [leaf for leaf in leaves if _unwrap_optional(leaf.annotation)[0] in (int, float)
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
# configuration: flow defaults < --config file < flags < --set


def _is_mapping(annotation: Any) -> bool:
    inner, _ = _unwrap_optional(annotation)
    return get_origin(inner) in (dict, Mapping) or inner is dict


def _leaf_tree(leaves: Sequence[_Leaf]) -> dict[str, Any]:
    """The parameters as a nested mapping: name -> sub-mapping, or the :class:`_Leaf` at its end."""
    tree: dict[str, Any] = {}
    for leaf in leaves:
        node = tree
        for part in leaf.path[:-1]:
            node = node.setdefault(part, {})
        node[leaf.path[-1]] = leaf
    return tree


def _known_paths(tree: Mapping[str, Any], prefix: str = "") -> list[str]:
    out = []
    for name, node in tree.items():
        out.append(prefix + name)
        if isinstance(node, Mapping):
            out += _known_paths(node, prefix + name + ".")
    return out


def _nearest(dotted: str, known: Sequence[str]) -> str | None:
    """The known path closest to a mistaken one: the same last name elsewhere, else the closest spelling."""
    last = dotted.rsplit(".", 1)[-1]
    same_name = [k for k in known if k.rsplit(".", 1)[-1] == last]
    if same_name:
        return same_name[0]
    close = difflib.get_close_matches(dotted, known, n=1, cutoff=0.6)
    if close:
        return close[0]
    by_last = {k.rsplit(".", 1)[-1]: k for k in reversed(known)}
    close = difflib.get_close_matches(last, list(by_last), n=1, cutoff=0.75)
    return by_last[close[0]] if close else None


def _unknown(where: str, path: Sequence[str], built: _Built) -> UserError:
    dotted = ".".join(path)
    if any(dotted == h or dotted.startswith(h + ".") for h in built.command.hidden):
        return UserError(f"{where}{dotted!r} is not a parameter of this command (the command sets it or does "
                         "not use it)")
    near = _nearest(dotted, _known_paths(_leaf_tree(built.leaves)))
    hint = f"; did you mean {near!r}?" if near else " (--print-config lists the parameters)"
    return UserError(f"{where}unknown parameter {dotted!r}{hint}")


def _flatten(value: Any, node: Any, path: tuple[str, ...], where: str,
             built: _Built) -> list[tuple[tuple[str, ...], Any]]:
    """``(path, value)`` of every parameter a nested mapping sets; a name that is no parameter
    of the command raises :class:`UserError` with the nearest one."""
    if isinstance(node, _Leaf):
        return [(path, value)]
    if not isinstance(value, Mapping):
        fields = ", ".join(list(node)[:6]) + (", ..." if len(node) > 6 else "")
        what = ".".join(path) if path else "the file"
        raise UserError(f"{where}{what}: expected a mapping of its parameters ({fields}), got {value!r}")
    out = []
    for key, item in value.items():
        if str(key) not in node:
            raise _unknown(where, path + (str(key),), built)
        out += _flatten(item, node[str(key)], path + (str(key),), where, built)
    return out


def read_config(file: Path, built: _Built) -> list[tuple[tuple[str, ...], Any]]:
    """The parameters a ``--config`` YAML file sets, checked against the command's (its
    names; their values are validated with the command line's)."""
    import yaml

    try:
        text = file.expanduser().read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"--config: no such file: {file}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"--config {file}: cannot read it: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise UserError(f"{file}: not a YAML file{at}: {getattr(exc, 'problem', None) or exc}") from None
    return _flatten({} if data is None else data, _leaf_tree(built.leaves), (), f"{file}: ", built)


def parse_set(text: str, built: _Built) -> list[tuple[tuple[str, ...], Any]]:
    """The parameters a ``--set PATH=VALUE`` sets (VALUE read as YAML: a number, a list, ...);
    PATH may name one key of a mapping parameter (``--set columns.amount=TX_AMOUNT``)."""
    import yaml

    dotted, sep, raw = text.partition("=")
    if not sep or not dotted.strip():
        raise UserError(f"--set {text}: expected PATH=VALUE, e.g. config.model.lr=0.001")
    path = tuple(dotted.strip().split("."))
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise UserError(f"--set {dotted}: the value {raw!r} is not YAML: {getattr(exc, 'problem', None) or exc}") \
            from None
    node: Any = _leaf_tree(built.leaves)
    for i, part in enumerate(path):
        if isinstance(node, _Leaf):
            if _is_mapping(node.annotation) and i == len(path) - 1:
                return [(path, value)]
            raise _unknown("--set: ", path, built)
        if part not in node:
            raise _unknown("--set: ", path, built)
        node = node[part]
    return _flatten(value, node, path, f"--set {dotted}: ", built)


@dataclass
class _Given:
    """The parameters given so far, as a nested mapping, and where each was given (for errors)."""

    tree: dict[str, Any] = field(default_factory=dict)
    source: dict[tuple[str, ...], str] = field(default_factory=dict)

    def put(self, path: tuple[str, ...], value: Any, source: str) -> None:
        node = self.tree
        for part in path[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[path[-1]] = value
        self.source[path] = source

    def where(self, path: tuple[str, ...], built: _Built) -> str | None:
        for cut in range(len(path), 0, -1):
            label = self.source.get(path[:cut]) or built.flags.get(".".join(path[:cut]))
            if label:
                return label
        return None


def _given(built: _Built, namespace: argparse.Namespace) -> _Given:
    """Every parameter given, each layer over the one before: the command's defaults, the
    ``--config`` file, the flags, the ``--set`` overrides."""
    given_ = _Given()
    for dotted, value in built.command.defaults.items():
        given_.put(tuple(dotted.split(".")), value, built.flags[dotted])
    file = getattr(namespace, "cli_config", None)
    if file is not None:
        for path, value in read_config(file, built):
            given_.put(path, value, f"{file}: {'.'.join(path)}")
    for key, value in vars(namespace).items():
        if key.startswith(_PREFIX):
            path = tuple(key[len(_PREFIX):].split("__"))
            given_.put(path, value, built.flags[".".join(path)])
    for text in getattr(namespace, "cli_set", None) or ():
        for path, value in parse_set(text, built):
            given_.put(path, value, f"--set {'.'.join(path)}")
    return given_


def _merge(base: Any, overrides: Any) -> Any:
    if isinstance(base, dict) and isinstance(overrides, dict):
        out = dict(base)
        for key, value in overrides.items():
            out[key] = _merge(base.get(key), value)
        return out
    return overrides


def _explain(exc: ValidationError, prefix: tuple[str, ...], built: _Built, given_: _Given) -> str:
    problems = []
    for err in exc.errors():
        path = prefix + tuple(str(p) for p in err["loc"])
        where = given_.where(path, built)
        message = str(err["msg"]).removeprefix("Value error, ")
        if where:
            problems.append(f"{where}: {message}")
        else:  # a check across fields of a model: name where its fields were given, else their flags
            inside = [label for p, label in given_.source.items() if p[:len(path)] == path] or \
                [f for d, f in built.flags.items() if d.startswith(".".join(path) + ".")]
            problems.append(f"{message}" + (f" ({', '.join(inside)})" if inside else ""))
    return "; ".join(problems)


def validated_kwargs(built: _Built, namespace: argparse.Namespace) -> dict[str, Any]:
    """The flow's keyword arguments from the command line, validated (before the command's
    ``check`` and ``prepare``)."""
    given_ = _given(built, namespace)
    fn = flow_function(built.command.flow)
    hints = typing.get_type_hints(fn)
    kwargs: dict[str, Any] = {}
    for name, param in inspect.signature(fn).parameters.items():
        if name not in given_.tree:
            if param.default is inspect.Parameter.empty:
                raise UserError(f"the following arguments are required: {built.flags.get(name, name)} "
                                "(or set it in --config / --set)")
            continue
        annotation = hints.get(name, Any)
        model = _model_of(annotation)
        try:
            if model is not None and isinstance(given_.tree[name], dict):
                base = param.default if isinstance(param.default, BaseModel) else model()
                merged = _merge(base.model_dump(mode="python"), given_.tree[name])
                kwargs[name] = type(base).model_validate(merged)
            else:
                kwargs[name] = TypeAdapter(annotation).validate_python(given_.tree[name])
        except ValidationError as exc:
            raise UserError(_explain(exc, (name,), built, given_)) from None
    return kwargs


def preflight(built: _Built, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The command's ``check`` of validated keyword arguments, then its ``prepare``."""
    command = built.command
    if command.check is not None:
        try:
            command.check(kwargs)
        except ValueError as exc:
            raise UserError(str(exc)) from None
    return command.prepare(kwargs) if command.prepare else kwargs


def flow_kwargs(built: _Built, namespace: argparse.Namespace) -> dict[str, Any]:
    """Validated keyword arguments of the flow from the parsed command line, checked and prepared."""
    return preflight(built, validated_kwargs(built, namespace))


def effective_config(built: _Built, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Every parameter the command offers, with its value (given, else the flow's default),
    nested as the flow's parameters are: what ``--print-config`` prints, ``--config`` reads."""
    fn = flow_function(built.command.flow)
    hints = typing.get_type_hints(fn)
    dumped: dict[str, Any] = {}
    for name, param in inspect.signature(fn).parameters.items():
        if name in kwargs or param.default is not inspect.Parameter.empty:
            value = kwargs.get(name, param.default)
            dumped[name] = TypeAdapter(hints.get(name, Any)).dump_python(value, mode="json")
    tree: dict[str, Any] = {}
    for leaf in built.leaves:
        value: Any = dumped
        for part in leaf.path:
            value = value.get(part) if isinstance(value, dict) else None
        node = tree
        for part in leaf.path[:-1]:
            node = node.setdefault(part, {})
        node[leaf.path[-1]] = value
    return tree


def config_yaml(prog: str, built: _Built, kwargs: Mapping[str, Any]) -> str:
    """The effective parameters as a YAML ``--config`` file."""
    import yaml

    return f"# {prog}: effective parameters (use with --config FILE.yaml)\n" + \
        yaml.safe_dump(effective_config(built, kwargs), sort_keys=False, allow_unicode=True)


# ------------------------------------------------------------------------------------
# running


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _prefect_api(url: str | None) -> contextlib.AbstractContextManager[Any]:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    if url is None or PREFECT_API_URL.value() is not None:
        return contextlib.nullcontext()
    return temporary_settings(updates={PREFECT_API_URL: url})


def run_flow(fn: Callable[[], BaseModel], *, as_json: bool, summary: Callable[[Any], str],
             exit_code: Callable[[Any], int] | None = None, api_url: str | None = None) -> int:
    """Run a flow under the project's Prefect defaults (against ``api_url`` when given and no
    PREFECT_API_URL is set); print a summary and the JSON result."""
    try:
        with _prefect_api(api_url), prefect_cli_settings():
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
        full_help = "--help-all" in argv
        parser = _Parser(prog=prog, description=description,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
        built: dict[str | None, _Built] = {}
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
        return run_flow(lambda: load_flow(chosen.command.flow)(**kwargs), as_json=args.json, summary=chosen.command.summary,
                        exit_code=chosen.command.exit_code, api_url=api_url)

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
