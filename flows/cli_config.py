"""Configuration of a command: flow defaults < ``--config`` file < flags < ``--set``.

Reads a ``--config`` YAML file and ``--set PATH=VALUE`` overrides against a command's
parameters (an unknown name gets the nearest known one), merges them with the flags, validates
them with pydantic (an error names the file key, flag or ``--set`` it came from) and prints
the effective parameters as such a file (``--print-config``); see :mod:`flows.cli`.
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from flows.cli_params import PREFIX, Built, Leaf, UserError, is_mapping, model_of
from flows.cli_source import flow_function


def _leaf_tree(leaves: Sequence[Leaf]) -> dict[str, Any]:
    """The parameters as a nested mapping: name -> sub-mapping, or the :class:`Leaf` at its end."""
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


def _unknown(where: str, path: Sequence[str], built: Built) -> UserError:
    dotted = ".".join(path)
    if any(dotted == h or dotted.startswith(h + ".") for h in built.command.hidden):
        return UserError(f"{where}{dotted!r} is not a parameter of this command (the command sets it or does "
                         "not use it)")
    near = _nearest(dotted, _known_paths(_leaf_tree(built.leaves)))
    hint = f"; did you mean {near!r}?" if near else " (--print-config lists the parameters)"
    return UserError(f"{where}unknown parameter {dotted!r}{hint}")


def _flatten(value: Any, node: Any, path: tuple[str, ...], where: str,
             built: Built) -> list[tuple[tuple[str, ...], Any]]:
    """``(path, value)`` of every parameter a nested mapping sets; a name that is no parameter
    of the command raises :class:`UserError` with the nearest one."""
    if isinstance(node, Leaf):
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


def read_config(file: Path, built: Built) -> list[tuple[tuple[str, ...], Any]]:
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


def parse_set(text: str, built: Built) -> list[tuple[tuple[str, ...], Any]]:
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
        if isinstance(node, Leaf):
            if is_mapping(node.annotation) and i == len(path) - 1:
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

    def where(self, path: tuple[str, ...], built: Built) -> str | None:
        for cut in range(len(path), 0, -1):
            label = self.source.get(path[:cut]) or built.flags.get(".".join(path[:cut]))
            if label:
                return label
        return None


def _given(built: Built, namespace: argparse.Namespace) -> _Given:
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
        if key.startswith(PREFIX):
            path = tuple(key[len(PREFIX):].split("__"))
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


def _explain(exc: ValidationError, prefix: tuple[str, ...], built: Built, given_: _Given) -> str:
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


def validated_kwargs(built: Built, namespace: argparse.Namespace) -> dict[str, Any]:
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
        model = model_of(annotation)
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


def effective_config(built: Built, kwargs: Mapping[str, Any]) -> dict[str, Any]:
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


def config_yaml(prog: str, built: Built, kwargs: Mapping[str, Any]) -> str:
    """The effective parameters as a YAML ``--config`` file."""
    import yaml

    return f"# {prog}: effective parameters (use with --config FILE.yaml)\n" + \
        yaml.safe_dump(effective_config(built, kwargs), sort_keys=False, allow_unicode=True)

