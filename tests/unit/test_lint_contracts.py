"""The private-names import contract (tests/lint_contracts.py) on small sources."""

from __future__ import annotations

from tests.lint_contracts import violations

INTERNAL = ("flows", "tasks", "solutions", "infra")


def _found(module: str, source: str) -> list[str]:
    return [v.what for v in violations(module, source, INTERNAL)]


def test_private_names_of_another_module_are_violations() -> None:
    src = (
        "import infra.store as S\n"
        "from infra.registry import _something, ModelRegistry\n"
        "from infra import store\n"
        "S._SAFE_NAME.match('x')\n"
        "store._SAFE_NAME\n"
    )
    assert _found("tasks.data", src) == [
        "imports private name _something of infra.registry",
        "uses private name _SAFE_NAME of infra.store",
        "uses private name _SAFE_NAME of infra.store",
    ]


def test_public_names_own_privates_and_outside_packages_are_fine() -> None:
    src = (
        "import numpy as np\n"
        "from infra.store import safe_join\n"
        "np._core\n"
        "def _mine():\n    return 1\n"
        "_mine()\n"
    )
    assert _found("tasks.data", src) == []


def test_private_modules_belong_to_their_package() -> None:
    assert _found("infra.store", "from infra._impl import helper\n") == []
    assert _found("tasks.data", "from infra._impl import helper\n") == ["imports from private module infra._impl"]
    assert _found("tasks.data", "import infra._impl\n") == ["imports private module infra._impl"]
