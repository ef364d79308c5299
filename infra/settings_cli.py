"""``python -m infra.settings``: every effective setting and where it came from, secrets masked.

Three outputs of the same settings classes (:mod:`infra.settings`): the effective values as a table
(default), the same as JSON (``--json``), and the configuration reference of docs/configuration.md
(``--markdown``, the table a test keeps equal to the classes). ``--init`` writes a commented settings
file into the home, readable by its owner only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from pydantic_settings import BaseSettings, EnvSettingsSource

from infra.secrets import scrub, url_credentials
from infra.settings import (
    ALL_SETTINGS,
    SettingsFileError,
    markdown_table,
    settings_file,
    settings_table,
)

MASK = "**********"


@dataclass(frozen=True)
class EffectiveSetting:
    """One setting as this process reads it now."""

    variable: str  #: its environment variable
    table: str  #: its table in the settings file
    key: str  #: its key in that table (the field name)
    value: str  #: as shown: secrets masked, ``unset`` for none
    source: str  #: ``environment``, ``settings.toml`` or ``default``


def shown(value: Any) -> str:
    """A value for display: a set secret and a URL's credentials are masked, lists are JSON, booleans lower-case."""
    if value is None:
        return "unset"
    if isinstance(value, SecretStr):
        return MASK if value.get_secret_value() else ""
    if isinstance(value, bool):
        return str(value).lower()
    text = json.dumps(value) if isinstance(value, list | dict) else str(value)
    return scrub(text) if url_credentials(text) else text  # a password inside a plain URL setting


def _file_tables() -> dict[str, Any]:
    import tomllib

    path = settings_file()
    if not path.is_file():
        return {}
    with open(path, "rb") as fh:
        return tomllib.load(fh)  # already checked by the settings classes, which read it first


def effective_settings() -> list[EffectiveSetting]:
    """Every setting of every class, in class order, with its value and source."""
    instances = [cls() for cls in ALL_SETTINGS]  # reads (and checks) the settings file
    tables = _file_tables()
    rows = []
    for cls, instance in zip(ALL_SETTINGS, instances, strict=True):
        table = settings_table(cls)
        from_env = EnvSettingsSource(cls)()
        from_file = tables.get(table, {})
        prefix = str(cls.model_config.get("env_prefix", ""))
        for key in cls.model_fields:
            source = "environment" if key in from_env else "settings.toml" if key in from_file else "default"
            rows.append(EffectiveSetting(f"{prefix}{key}".upper(), table, key, shown(getattr(instance, key)), source))
    return rows


def render_table(rows: list[EffectiveSetting]) -> str:
    """Aligned columns: variable, value, source."""
    width = max(len(r.variable) for r in rows)
    value_width = min(40, max(len(r.value) for r in rows))
    return "\n".join(f"{r.variable:<{width}}  {r.value:<{value_width}}  {r.source}" for r in rows)


def _toml_value(value: Any) -> str | None:
    if value is None or isinstance(value, SecretStr):
        return None
    if isinstance(value, Path):
        value = str(value)
    return json.dumps(value)  # JSON strings, numbers, booleans and lists of them are TOML too


def settings_template(classes: tuple[type[BaseSettings], ...] = ALL_SETTINGS) -> str:
    """A settings file with every table and key commented out at its default."""
    lines = ["# indusflow settings: one table per area, keys are the settings' names (docs/configuration.md).",
             "# The environment wins over this file, this file over the defaults. Uncomment a key to set it.",
             "# Secrets (keys, tokens, salts) are read only while this file is owner-only (chmod 600)."]
    for cls in classes:
        lines += ["", f"# [{settings_table(cls)}]"]
        for key, info in cls.model_fields.items():
            if cls.__name__ == "CoreSettings" and key == "home":
                continue  # the file lives in the home: INDUSFLOW_HOME moves it
            value = _toml_value(info.get_default(call_default_factory=True))
            lines.append(f"# {key} = {value}" if value is not None else f"# {key} =   (unset)")
    return "\n".join(lines) + "\n"


def write_template(path: Path) -> None:
    """Write :func:`settings_template` to ``path`` (mode 0600); an existing file is never replaced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(settings_template())


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m infra.settings``."""
    p = argparse.ArgumentParser(
        prog="python -m infra.settings",
        description="Show every effective setting and its source (environment > <home>/settings.toml > default), "
        "secrets masked.")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="the same as a JSON list")
    out.add_argument("--markdown", action="store_true",
                     help="the configuration table of docs/configuration.md (defaults, not effective values)")
    out.add_argument("--init", action="store_true",
                     help="write a commented settings.toml into the home (mode 0600); never replaces one")
    p.add_argument("tables", nargs="*", metavar="TABLE", help="only these tables (serve, kb, llm, ...)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the command; a bad settings file or table name exits 2 with one ``error:`` line."""
    args = parser().parse_args(argv)
    if args.markdown:
        print(markdown_table())
        return 0
    if args.init:
        path = settings_file()
        if path.exists():
            print(f"error: {path} exists already; edit it (or remove it first)", file=sys.stderr)
            return 2
        write_template(path)
        print(f"wrote {path} (mode 0600)")
        return 0
    known = [settings_table(cls) for cls in ALL_SETTINGS]
    if unknown := [t for t in args.tables if t not in known]:
        print(f"error: no settings table {unknown[0]!r}; the tables are {', '.join(known)}", file=sys.stderr)
        return 2
    try:
        rows = [r for r in effective_settings() if not args.tables or r.table in args.tables]
    except SettingsFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
    else:
        path = settings_file()
        print(f"settings file: {path}" + ("" if path.is_file() else " (none)"))
        print(render_table(rows))
    return 0
