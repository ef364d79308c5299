"""Every environment variable of the settings classes is documented in the README, none invented."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic_settings import BaseSettings

import infra.settings as settings_module
from infra.settings import ALL_SETTINGS, environment_variables, markdown_table

README = Path(__file__).resolve().parents[2] / "README.md"
START, END = "<!-- settings-table:start -->", "<!-- settings-table:end -->"


def _readme_table() -> str:
    text = README.read_text(encoding="utf-8")
    assert START in text and END in text, f"{README.name} lacks the {START} ... {END} markers"
    return text.split(START, 1)[1].split(END, 1)[0].strip()


def test_every_settings_class_is_in_the_table() -> None:
    classes = {
        obj for obj in vars(settings_module).values()
        if isinstance(obj, type) and issubclass(obj, BaseSettings) and obj is not BaseSettings
    }
    assert classes == set(ALL_SETTINGS)


def test_readme_table_is_the_generated_one() -> None:
    documented = set(re.findall(r"`(INDUSFLOW_[A-Z0-9_]+)`", _readme_table()))
    real = {var for var, _, _ in environment_variables()}
    assert not real - documented, f"undocumented: {sorted(real - documented)}"
    assert not documented - real, f"documented but no such setting: {sorted(documented - real)}"
    assert _readme_table() == markdown_table(), "regenerate it: python -m infra.settings"


def test_no_indusflow_variable_is_read_outside_the_settings_module() -> None:
    root = Path(__file__).resolve().parents[2]
    real = {var for var, _, _ in environment_variables()}
    for folder in ("flows", "tasks", "solutions", "infra"):
        for path in (root / folder).rglob("*.py"):
            for var in re.findall(r"INDUSFLOW_[A-Z0-9_]+", path.read_text(encoding="utf-8")):
                if var.endswith("_"):
                    continue  # a prefix, as in "INDUSFLOW_TRAIN_*"
                assert var in real, f"{path.relative_to(root)} names {var}, which no settings class defines"
