"""An import-linter contract type of our own: no module uses another module's private names.

A name with one leading underscore (``_helper``, ``_Bench``) belongs to the module that
defines it; a private module (``pkg._impl``) belongs to its package. This contract fails
when a module

- imports a private name from another module (``from flows.fraud import _data_args``),
- reaches one through a module alias (``import flows.fraud as F`` ... ``F._config_from(...)``),
- or imports a private module from outside its package.

Registered in ``pyproject.toml`` (``contract_types``) and run by ``lint-imports`` with the
other contracts (``make test``). Import-linter puts the working directory on ``sys.path``,
so this module is found as ``tests.lint_contracts`` from the project root.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass

from importlinter import Contract, ContractCheck, fields, output


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


@dataclass(frozen=True)
class Violation:
    """One use of a private name across a module boundary."""

    importer: str
    line: int
    what: str

    def text(self) -> str:
        return f"{self.importer}:{self.line}: {self.what}"


def _module_file(module: str) -> str | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    origin = spec.origin if spec else None
    return origin if origin and origin.endswith(".py") else None


def _resolve_relative(importer: str, is_package: bool, level: int, module: str | None) -> str:
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _private_module_ok(importer: str, target: str) -> bool:
    """A private module ``a.b._c`` (or anything under it) may be imported from package ``a.b``."""
    parts = target.split(".")
    for i, part in enumerate(parts):
        if _private(part):
            package = ".".join(parts[:i])
            return importer == package or importer.startswith(package + ".")
    return True


def violations(module: str, source: str, internal: tuple[str, ...]) -> Iterator[Violation]:
    """The private-name uses of ``module`` (its ``source``) towards modules of ``internal`` packages."""
    tree = ast.parse(source)
    path = _module_file(module) or ""
    is_package = path.endswith("__init__.py")

    def ours(name: str) -> bool:
        return name.split(".")[0] in internal

    aliases: dict[str, str] = {}  # local name -> internal module
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not ours(alias.name):
                    continue
                if not _private_module_ok(module, alias.name):
                    yield Violation(module, node.lineno, f"imports private module {alias.name}")
                if alias.asname:
                    aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            source_module = (
                _resolve_relative(module, is_package, node.level, node.module) if node.level else node.module or ""
            )
            if not ours(source_module) or source_module == module:
                continue
            if not _private_module_ok(module, source_module):
                yield Violation(module, node.lineno, f"imports from private module {source_module}")
            for alias in node.names:
                if _private(alias.name):
                    full = f"{source_module}.{alias.name}"
                    if _module_file(full) is not None and _private_module_ok(module, full):
                        continue  # a private submodule of the importer's own package
                    yield Violation(module, node.lineno, f"imports private name {alias.name} of {source_module}")
                elif _module_file(f"{source_module}.{alias.name}") is not None:
                    aliases[alias.asname or alias.name] = f"{source_module}.{alias.name}"
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and _private(node.attr)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and aliases[node.value.id] != module
        ):
            yield Violation(module, node.lineno, f"uses private name {node.attr} of {aliases[node.value.id]}")


class PrivateNamesContract(Contract):
    """No module of the ``source_packages`` uses a private name of another module."""

    source_packages = fields.ListField(subfield=fields.StringField())

    def check(self, graph, verbose: bool) -> ContractCheck:
        internal = tuple(str(p) for p in self.source_packages)
        found: list[Violation] = []
        for module in sorted(graph.modules):
            if module.split(".")[0] not in internal:
                continue
            path = _module_file(module)
            if path is None:
                continue
            with open(path, encoding="utf-8") as handle:
                found.extend(violations(module, handle.read(), internal))
        unique = sorted(set(found), key=lambda v: (v.importer, v.line, v.what))
        return ContractCheck(kept=not unique, metadata={"violations": [v.text() for v in unique]})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for line in check.metadata["violations"]:
            output.print_error(line)
