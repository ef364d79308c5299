"""Unit tests stay below the flows: they never import ``flows`` nor start a Prefect API.

The guard watches each unit test module while pytest imports it (collection) and each unit
test while it runs (set-up, call, tear-down):

- an ``import flows...`` / ``from flows... import`` statement, even of a module another
  test already imported (the import statements are watched, not only new modules), and
  any ``flows`` module that appears in ``sys.modules`` meanwhile;
- a Prefect API server (the ephemeral ``SubprocessASGIServer``) started meanwhile.

A finding fails the tests it belongs to (all tests of a module that imports flows at the
top, or the one test that does it in its body) with the offending module named. Tests
deselected with ``-k`` never run and so never fail. Tests outside ``tests/unit``
(``tests/flows``, ``tests/integration``) import flows freely, before or after the unit
tests in the same session: only what happens inside a unit module or test counts.
"""

from __future__ import annotations

import builtins
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

UNIT_DIR = Path(__file__).resolve().parent
FLOWS = "flows"
RULE = "unit tests never import flows nor start Prefect (move the code under test below flows/, or the test to tests/flows)"

#: unit test module path -> what importing it did
_module_findings: dict[Path, list[str]] = {}


def _is_unit(path: Path | str) -> bool:
    return Path(path).resolve().is_relative_to(UNIT_DIR)


def _is_flows(name: str | None) -> bool:
    return bool(name) and (name == FLOWS or name.startswith(FLOWS + "."))


def _flows_modules() -> set[str]:
    return {name for name in sys.modules if _is_flows(name)}


def _running_servers() -> set[int]:
    """Ids of the Prefect API servers this process runs (none if Prefect's server code was never imported)."""
    server = sys.modules.get("prefect.server.api.server")
    if server is None:
        return set()
    instances = getattr(server.SubprocessASGIServer, "_instances", {})
    return {id(s) for s in instances.values() if getattr(s, "running", False)}


@contextmanager
def _watch() -> Iterator[list[str]]:
    """Collect what the enclosed code did against the rule (a list of findings)."""
    findings: list[str] = []
    flows_before, servers_before = _flows_modules(), _running_servers()
    real_import: Callable[..., Any] = builtins.__import__

    def watching_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and _is_flows(name):
            findings.append(f"imports {name}")
        return real_import(name, globals, locals, fromlist, level)

    builtins.__import__ = watching_import
    try:
        yield findings
    finally:
        builtins.__import__ = real_import
        if not findings:  # no import statement seen: a module loaded another way (importlib)
            findings.extend(f"imports {name}" for name in sorted(_flows_modules() - flows_before))
        if _running_servers() - servers_before:
            findings.append("starts a Prefect API server")


def _summary(findings: list[str]) -> str:
    return ", ".join(dict.fromkeys(findings))  # unique, in order


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    """Watch the import of each unit test module (pytest imports it while collecting)."""
    if not (isinstance(collector, pytest.Module) and _is_unit(collector.path)):
        return (yield)
    with _watch() as findings:
        report = yield
    if findings:
        _module_findings[Path(collector.path).resolve()] = findings
    return report


def _check(item: pytest.Item, findings: list[str]) -> None:
    if findings:
        pytest.fail(f"{item.nodeid} {_summary(findings)}: {RULE}", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    if not _is_unit(item.path):
        return (yield)
    with _watch() as findings:
        result = yield
    _check(item, findings)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    if not _is_unit(item.path):
        return (yield)
    module_findings = _module_findings.get(Path(item.path).resolve())
    if module_findings:  # the test module itself imported flows: its tests do not run
        module = Path(item.path).resolve().relative_to(UNIT_DIR.parents[1])
        pytest.fail(f"{module} {_summary(module_findings)} when imported: {RULE}", pytrace=False)
    with _watch() as findings:
        result = yield
    _check(item, findings)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if not _is_unit(item.path):
        return (yield)
    with _watch() as findings:
        result = yield
    _check(item, findings)
    return result
