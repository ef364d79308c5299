"""A flow's signature and docstring read from its source, without importing its module.

Building a command's parser needs only the flow's parameters (names, annotations, defaults)
and docstring: :func:`signature_from_source` parses the flow's module and imports only the
names its annotations and defaults use (light modules such as ``solutions/<vertical>/config.py``),
so ``--help`` and pre-flight errors answer without Lightning, torch or Prefect's engine
(see :mod:`flows.cli`).
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import importlib.util
import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


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
