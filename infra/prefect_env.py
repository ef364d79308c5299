"""Prefect set-up for runs started from the command line.

On a fresh Prefect home the temporary API runs its database migrations while the
server's telemetry writes a session row, and SQLite answers ``database is locked``
(an ERROR line with a traceback). Turning the server analytics off removes that insert;
a longer start-up timeout covers a slow first migration on 2 cores. Flow-run heartbeats
are off (Prefect's ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` turns them on): Prefect 3.9 ends every flow
run by waiting for its heartbeat thread's current 1-s sleep. Users' own ``PREFECT_*``
environment variables always win over these defaults, which is why none of them has an
``INDUSFLOW_*`` variable of its own.

A command-line run ends while Prefect still has work in flight: the client's events
worker may hold unsent events (drained at interpreter exit, with an ``EventsWorker -
Still processing items`` warning) and the temporary server's task-run recorder may still be
writing task-run states when the server is stopped (``Error flushing 1 events`` with a
traceback, and task runs left ``Running`` in the UI). :func:`settle_prefect` waits for both
while the API is still up, so a normal run ends quietly and completely. The temporary server
starts while the command imports its flow and exits with the command, even when the command is
killed (:mod:`infra.ephemeral_api`).

Still needed with Prefect 3.9.1 (re-measured 2026-12-06, load ~7 on 2 cores): without the wait, a
200-task fan-out ended with ``Error flushing 100 events`` (the recorder's shutdown flush cancelled
by the consumer's cancel scope); ``tests/unit/test_prefect_settle.py`` runs that case. Upstream's
nearest: https://github.com/PrefectHQ/prefect/issues/21057 (task-run events stranded, fixed for the
periodic flush by https://github.com/PrefectHQ/prefect/pull/22441, not for shutdown). The wait
uses only public API: the client's ``request`` on the REST route ``POST /task_runs/count`` and
``EventsWorker.wait_until_empty``.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, TypeVar

from infra import PROJECT_LOGGERS
from infra.settings import get_core_settings

#: How long to wait for the temporary API to start (the first start on a new home runs the
#: database migrations: 20-40 s on 2 cores). Prefect's PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS wins.
EPHEMERAL_STARTUP_TIMEOUT_S = 120
#: Longest wait for Prefect's in-flight events at the end of a command-line run (seconds).
SETTLE_TIMEOUT_S = 15.0
#: Pause between two looks at the temporary server's task-run records (seconds).
SETTLE_POLL_S = 0.25
#: The temporary server's task-run recorder writes events in batches (Prefect writes them
#: one by one by default: a fan-out of 200 tasks left it ~20 s behind on 2 cores) and
#: flushes a partial batch after this many seconds (whole seconds: Prefect truncates).
RECORDER_BATCH_SIZE = 100
RECORDER_FLUSH_INTERVAL_S = 1

log = logging.getLogger(__name__)
T = TypeVar("T")

if TYPE_CHECKING:
    from infra.ephemeral_api import TemporaryAPI


def route_project_logs(level: str | None = None) -> None:
    """Give the project's loggers Prefect's handlers (as ``PREFECT_LOGGING_EXTRA_LOGGERS`` does).

    Prefect configures its logging when a flow is first imported, often after this runs (a command
    imports its flow module lazily): ``ensure_logging_setup`` configures it now, or else
    ``prefect.extra`` has no handler yet and the run's Logs tab gets none of the project's lines.
    """
    from prefect.logging.configuration import ensure_logging_setup

    ensure_logging_setup()
    extra = logging.getLogger("prefect.extra")
    level_name = (level or get_core_settings().log_level).upper()
    for name in PROJECT_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(level_name)
        for handler in extra.handlers:  # the API handler: logs show in the Prefect UI
            if handler not in logger.handlers:
                logger.addHandler(handler)
        # the console comes from the root logger's Prefect console handler (propagation)


def server_defaults() -> dict:
    """Settings of every temporary Prefect server the project starts (a command's ephemeral API, the KB
    ingest runner's server): the analytics off unless the user's environment sets them, since their
    telemetry insert races the server's own writes on SQLite ('database is locked', an ERROR line with a
    traceback; seen on a fresh home's migrations and, 2026-12-07, on the KB runner's server)."""
    from prefect.settings import PREFECT_SERVER_ANALYTICS_ENABLED

    return {} if "PREFECT_SERVER_ANALYTICS_ENABLED" in os.environ else {PREFECT_SERVER_ANALYTICS_ENABLED: False}


@contextmanager
def prefect_cli_settings(prepare: Callable[[], T] | None = None) -> Iterator[T | None]:
    """Apply the project's Prefect defaults for the duration of a command-line run.

    Without ``PREFECT_API_URL`` the run gets a temporary API server of its own
    (:class:`~infra.ephemeral_api.TemporaryAPI`, stopped at the end); ``prepare`` (the command's
    imports of its flow) runs while that server starts, and its result is what the block receives.
    """
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE,
        PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL,
        PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_READ_BATCH_SIZE,
        temporary_settings,
    )

    updates: dict = server_defaults()
    if "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS" not in os.environ:
        updates[PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS] = EPHEMERAL_STARTUP_TIMEOUT_S
    if not {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "PREFECT_RUNNER_HEARTBEAT_FREQUENCY"} & set(os.environ):
        # Prefect's heartbeat thread sleeps in 1-s steps and every sync flow run joins it at
        # its end (0.5 s on average, a third of a 100k-row batch-scoring run): off unless asked for
        # (nothing here consumes heartbeats)
        updates["flows.heartbeat_frequency"] = None
    if "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW" not in os.environ:
        # project loggers also log outside flow runs (plain functions): no API, no warning
        updates[PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW] = "ignore"
    recorder = {  # read by the temporary server, which gets the settings when it starts
        PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE: RECORDER_BATCH_SIZE,
        PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_READ_BATCH_SIZE: RECORDER_BATCH_SIZE,
        PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL: RECORDER_FLUSH_INTERVAL_S,
    }
    updates.update({setting: value for setting, value in recorder.items() if setting.name not in os.environ})
    route_project_logs()
    started = datetime.now(UTC)
    with temporary_settings(updates=updates):
        api = start_temporary_api()
        try:
            prepared = prepare() if prepare is not None else None
            url = api.wait_ready(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()) if api else None
            with temporary_settings(updates={PREFECT_API_URL: url}) if url else nullcontext():
                try:
                    yield prepared
                except Exception:
                    settle_prefect(since=started, temporary=api is not None)  # a failed run's states belong in the UI too
                    raise
                settle_prefect(since=started, temporary=api is not None)
        finally:
            if api is not None:
                api.stop()


def start_temporary_api() -> TemporaryAPI | None:
    """Start a temporary API server for this process's runs when they have none (no ``PREFECT_API_URL``,
    and Prefect's ephemeral mode allowed), with the current Prefect settings; it exits with this process,
    even one killed with SIGKILL (:mod:`infra.ephemeral_api`)."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_ALLOW_EPHEMERAL_MODE, get_current_settings

    from infra.ephemeral_api import TemporaryAPI

    if PREFECT_API_URL.value() or not PREFECT_SERVER_ALLOW_EPHEMERAL_MODE.value():
        return None
    return TemporaryAPI(get_current_settings().to_environment_variables(exclude_unset=True)).start()


def _ephemeral_server_running() -> bool:
    """Whether Prefect's client started its own ephemeral API server in this process (a flow called
    outside :func:`prefect_cli_settings`, as the tests do) and still runs it."""
    module = sys.modules.get("prefect.server.api.server")
    if module is None:  # never imported: no run asked for an ephemeral API
        return False
    return bool(module.SubprocessASGIServer().running)


def _wait_for_events_worker(timeout_s: float) -> None:
    """Wait until the client's events worker has sent what it holds (at most ``timeout_s``)."""
    from prefect.events.worker import EventsWorker

    worker = EventsWorker.instance()  # the run's worker: same settings, same instance
    waiter = threading.Thread(target=worker.wait_until_empty, name="settle-events", daemon=True)
    waiter.start()
    waiter.join(timeout_s)


def _flush_run_logs() -> None:
    """Send the run's log lines Prefect's API handler still holds (``logging.Handler.flush``: it waits at
    most 5 s)."""
    from prefect.logging.handlers import APILogHandler

    handler = next((h for name in ("prefect.flow_runs", "prefect.task_runs", "prefect.extra")
                    for h in logging.getLogger(name).handlers if isinstance(h, APILogHandler)), None)
    if handler is not None:  # one flush sends every handler's lines (one worker for all)
        handler.flush()


def _task_run_counts(client, since: datetime) -> tuple[int, int]:
    """(task runs, unfinished task runs) the API holds for flow runs started since ``since``."""
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterStartTime,
        TaskRunFilter,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    runs = FlowRunFilter(start_time=FlowRunFilterStartTime(after_=since)).model_dump(
        mode="json", exclude_unset=True
    )
    unfinished = TaskRunFilter(
        state=TaskRunFilterState(
            type=TaskRunFilterStateType(any_=[StateType.PENDING, StateType.RUNNING, StateType.SCHEDULED])
        )
    ).model_dump(mode="json", exclude_unset=True)
    total = client.request("POST", "/task_runs/count", json={"flow_runs": runs}).json()
    open_ = client.request("POST", "/task_runs/count", json={"flow_runs": runs, "task_runs": unfinished}).json()
    return int(total), int(open_)


def _wait_for_task_run_records(since: datetime, deadline: float) -> None:
    """Wait until the server's task-run recorder has caught up with the run's events.

    Task runs are written from the events the client sent, in batches; caught up means
    no task run of this command's flow runs is unfinished and their number has not changed
    for longer than the recorder's flush interval (so no partial batch is still waiting).
    """
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL

    quiet_s = float(PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL.value()) + SETTLE_POLL_S
    with get_client(sync_client=True) as client:
        seen, seen_at = -1, time.monotonic()
        while time.monotonic() < deadline:
            total, unfinished = _task_run_counts(client, since)
            now = time.monotonic()
            if total != seen:
                seen, seen_at = total, now
            elif unfinished == 0 and now - seen_at >= quiet_s:
                return
            time.sleep(SETTLE_POLL_S)
    log.debug("Prefect's task-run records had not caught up after %.0f s", SETTLE_TIMEOUT_S)


def settle_prefect(since: datetime | None = None, timeout_s: float = SETTLE_TIMEOUT_S, *,
                   temporary: bool = False) -> None:
    """Let Prefect finish the run's background work while its API is still up.

    Waits (at most ``timeout_s`` in all) for the client's events worker to send its
    queue and, when the API is a temporary server this process stops (``temporary``: its
    :func:`start_temporary_api`, or Prefect's own ephemeral server), for the server to record
    the task runs of the flow runs started since ``since``. Without an API in use there is
    nothing to wait for; a failure to look is logged, never raised.
    """
    from prefect.settings import PREFECT_API_URL

    # Prefect's own ephemeral server serves runs only while no API URL is set, and stops at exit
    ephemeral = temporary or (PREFECT_API_URL.value() is None and _ephemeral_server_running())
    if PREFECT_API_URL.value() is None and not ephemeral:
        return  # no flow run talked to an API
    deadline = time.monotonic() + timeout_s
    try:
        _wait_for_events_worker(timeout_s)
        if ephemeral:
            _flush_run_logs()  # before the server stops, not at interpreter exit after it
        if ephemeral and since is not None:
            _wait_for_task_run_records(since - timedelta(seconds=1), deadline)
    except Exception as exc:  # noqa: BLE001 - settling is a courtesy: the run itself has finished
        log.debug("could not settle Prefect's background work: %s", exc)
