"""A command's parameters: the :class:`Command` declaration and its flow's parameters as
:class:`Leaf` s (one per flag, models walked field by field); see :mod:`flows.cli`."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, get_args, get_origin

from pydantic import BaseModel

from flows.cli_source import flow_doc, flow_function
from infra.errors import IndusflowError

PREFIX = "p__"


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
    local: str | None = None


@dataclass(frozen=True)
class Leaf:
    """One flag: a parameter (or a field of a model parameter, by its path) of the flow."""

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
        return PREFIX + "__".join(self.path)


class UserError(IndusflowError):
    """A command-line mistake: reported as one ``error:`` line, exit code 2."""


# ------------------------------------------------------------------------------------
# parameters -> leaves


def unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    """(inner type, allows None) of ``X | None``."""
    if get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [a for a in get_args(annotation) if a is not type(None)]
        optional = len(inner) < len(get_args(annotation))
        if len(inner) == 1:
            return inner[0], optional
        return typing.Union[tuple(inner)], optional  # noqa: UP007 - runtime construction
    return annotation, False


def model_of(annotation: Any) -> type[BaseModel] | None:
    inner, _ = unwrap_optional(annotation)
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
          group: str | None, hidden: Collection[str]) -> list[Leaf]:
    dotted = ".".join(path)
    if any(dotted == h or dotted.startswith(h + ".") for h in hidden):
        return []
    model = model_of(annotation)
    if model is None:
        return [Leaf(path, annotation, default, required, help_, group)]
    if default is None or not isinstance(default, model):
        return []  # a model parameter with no instance to start from is not offered
    title = (inspect.getdoc(model) or model.__name__).splitlines()[0].rstrip(".")
    leaves: list[Leaf] = []
    for name, info in type(default).model_fields.items():
        leaves += _walk(path + (name,), info.annotation, getattr(default, name), False,
                        info.description or "", title, hidden)
    return leaves


def command_leaves(command: Command) -> list[Leaf]:
    fn = flow_function(command.flow)
    hints = typing.get_type_hints(fn)
    docs = docstring_args(fn)
    leaves: list[Leaf] = []
    for name, param in inspect.signature(fn).parameters.items():
        required = param.default is inspect.Parameter.empty
        default = None if required else param.default
        leaves += _walk((name,), hints.get(name, Any), default, required, docs.get(name, ""), None, command.hidden)
    return leaves


def flag_name(leaf: Leaf, command: Command) -> str:
    if leaf.dotted in command.flags:
        return command.flags[leaf.dotted]
    base = leaf.path[-1].replace("_", "-")
    inner, _ = unwrap_optional(leaf.annotation)
    if inner is bool and leaf.default is True:
        return "no-" + base
    return base


def is_mapping(annotation: Any) -> bool:
    inner, _ = unwrap_optional(annotation)
    return get_origin(inner) in (dict, Mapping) or inner is dict


@dataclass
class Built:
    """A command's parser built: its leaves and the flag of each (dotted path -> ``--flag``)."""

    command: Command
    leaves: list[Leaf]
    flags: dict[str, str]  # dotted path -> --flag
