"""Shared command-line plumbing of the flows: ``--json`` output and error reporting."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from infra.errors import IndusflowError
from infra.prefect_env import prefect_cli_settings

log = logging.getLogger(__name__)


def add_common(parser: argparse.ArgumentParser) -> None:
    """Options every flow command takes."""
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the flow's typed result as one JSON object on the last line of stdout",
    )


def parse_columns(text: str | None) -> dict[str, str]:
    """``canonical=SOURCE,...`` into a dict (validated by the solution's mapping)."""
    if not text:
        return {}
    out: dict[str, str] = {}
    for token in text.split(","):
        token = token.strip()
        if not token:
            continue
        if "=" not in token:
            raise SystemExit(f"--columns: {token!r} is not of the form canonical=SOURCE_COLUMN")
        key, value = (part.strip() for part in token.split("=", 1))
        out[key] = value
    return out


def run_command(fn: Callable[[], BaseModel], *, as_json: bool, summary: Callable[[Any], str]) -> int:
    """Run a flow under the project's Prefect defaults; print a summary or the JSON result."""
    try:
        with prefect_cli_settings():
            result = fn()
    except IndusflowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(summary(result))
    if as_json:
        sys.stdout.flush()
        print(json.dumps(json.loads(result.model_dump_json()), separators=(",", ":")))
    return 0
