"""Every environment variable of the settings classes is documented in the docs' configuration page, none invented."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic_settings import BaseSettings

import infra.settings as settings_module
from infra.settings import ALL_SETTINGS, environment_variables, markdown_table

CONFIG_PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
START, END = "<!-- settings-table:start -->", "<!-- settings-table:end -->"


def _documented_table() -> str:
    text = CONFIG_PAGE.read_text(encoding="utf-8")
    assert START in text and END in text, f"{CONFIG_PAGE.name} lacks the {START} ... {END} markers"
    return text.split(START, 1)[1].split(END, 1)[0].strip()


def test_every_settings_class_is_in_the_table() -> None:
    classes = {
        obj for obj in vars(settings_module).values()
        if isinstance(obj, type) and issubclass(obj, BaseSettings) and obj is not BaseSettings
    }
    assert classes == set(ALL_SETTINGS)


def test_documented_table_is_the_generated_one() -> None:
    documented = set(re.findall(r"`(INDUSFLOW_[A-Z0-9_]+)`", _documented_table()))
    real = {var for var, _, _ in environment_variables()}
    assert not real - documented, f"undocumented: {sorted(real - documented)}"
    assert not documented - real, f"documented but no such setting: {sorted(documented - real)}"
    assert _documented_table() == markdown_table(), "regenerate it into docs/configuration.md: python -m infra.settings --markdown"


def test_no_indusflow_variable_is_read_outside_the_settings_module() -> None:
    root = Path(__file__).resolve().parents[2]
    real = {var for var, _, _ in environment_variables()}
    for folder in ("flows", "tasks", "solutions", "infra"):
        for path in (root / folder).rglob("*.py"):
            for var in re.findall(r"INDUSFLOW_[A-Z0-9_]+", path.read_text(encoding="utf-8")):
                if var.endswith("_"):
                    continue  # a prefix, as in "INDUSFLOW_TRAIN_*"
                assert var in real, f"{path.relative_to(root)} names {var}, which no settings class defines"
