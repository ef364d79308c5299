"""Prefect set-up for runs started from the command line.

On a fresh Prefect home the ephemeral API runs its database migrations while the
server's telemetry writes a session row, and SQLite answers ``database is locked``
(an ERROR line with a traceback). Turning the server analytics off removes that insert;
a longer start-up timeout covers a slow first migration on 2 cores. Users' own
``PREFECT_*`` environment variables always win over these defaults.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

from infra.settings import get_core_settings, get_prefect_setup_settings

#: Our stdlib loggers, routed to Prefect's console and API handlers (the UI shows them).
PROJECT_LOGGERS = ("infra", "tasks", "solutions", "flows")


def route_project_logs(level: str | None = None) -> None:
    """Give the project's loggers Prefect's handlers (as ``PREFECT_LOGGING_EXTRA_LOGGERS`` does)."""
    extra = logging.getLogger("prefect.extra")
    level_name = (level or get_core_settings().log_level).upper()
    for name in PROJECT_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(level_name)
        for handler in extra.handlers:  # the API handler: logs show in the Prefect UI
            if handler not in logger.handlers:
                logger.addHandler(handler)
        # the console comes from the root logger's Prefect console handler (propagation)


@contextmanager
def prefect_cli_settings() -> Iterator[None]:
    """Apply the project's Prefect defaults for the duration of a command-line run."""
    from prefect.settings import (
        PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        temporary_settings,
    )

    setup = get_prefect_setup_settings()
    updates: dict = {}
    if "PREFECT_SERVER_ANALYTICS_ENABLED" not in os.environ:
        updates[PREFECT_SERVER_ANALYTICS_ENABLED] = setup.analytics_enabled
    if "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS" not in os.environ:
        updates[PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS] = setup.ephemeral_startup_timeout_s
    if "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW" not in os.environ:
        # project loggers also log outside flow runs (plain functions): no API, no warning
        updates[PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW] = "ignore"
    route_project_logs()
    with temporary_settings(updates=updates):
        yield
