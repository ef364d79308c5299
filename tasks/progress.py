"""Progress of long work (files ingested, files scored, epochs trained): i/N, rate and ETA.

:class:`Progress` is the plain part (no Prefect): it counts, formats one line
(``ingest rag_chunks: 12/67 files (18%), 0.41 files/s, elapsed 00:29, ETA 02:14``) and shows it

- on a terminal: as a live tqdm bar on stderr (tqdm, not rich: it is already installed with
  Lightning, whose own training bar is tqdm's, and it writes nothing when disabled);
- elsewhere (a log file, CI, a worker): as a log line at most every ``every_s`` seconds or every
  ``every_pct`` percent, whichever comes first, plus the first and the last, so a long run reads
  as a few lines, never one per item;
- to ``publish(percent)`` when given, at most once per ``publish_every_s`` (and at the end).

While it is open it can quiet other loggers' per-item INFO lines (``quiet``): inside a Prefect
run, :func:`track` quiets the task-run engine's ``Finished in state Completed()`` line of every
task of the fan-out (93 of them for an ingest of the shared documents), which the progress line
replaces; a task that fails still logs its ERROR line, and warnings still show.

:func:`track` is the thin Prefect wrapper: inside a flow or task run it publishes to a Prefect
progress artifact (``create_progress_artifact`` once, then ``update_progress_artifact``), which
the UI shows on the run's page. The UI is a convenience: a failure to publish is logged once
and never stops the work.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Self

log = logging.getLogger(__name__)


def format_interval(seconds: float) -> str:
    """``mm:ss`` (``h:mm:ss`` from one hour), as tqdm writes it."""
    from tqdm import tqdm

    return tqdm.format_interval(max(0.0, seconds))


def progress_line(label: str, done: int, total: int, elapsed_s: float, unit: str = "items") -> str:
    """``label: i/N unit (p%), rate, elapsed, ETA`` (rate and ETA ``?`` before the first item)."""
    pct = 100.0 * done / total if total else 100.0
    if done > 0 and elapsed_s > 0:
        per_s = done / elapsed_s
        rate = f"{per_s:.2f} {unit}/s" if per_s >= 1 else f"{elapsed_s / done:.1f} s/{unit.rstrip('s') or unit}"
        eta = format_interval((total - done) / per_s) if total >= done else "?"
    else:
        rate, eta = f"? {unit}/s", "?"
    return f"{label}: {done}/{total} {unit} ({pct:.0f}%), {rate}, elapsed {format_interval(elapsed_s)}, ETA {eta}"


class Progress:
    """Counts finished items of one piece of work and reports them (see the module docstring).

    Args:
        total: items to do (N).
        label: what the work is (``ingest rag_chunks``); no personal data.
        unit: what an item is (``files``, ``epochs``).
        publish: called with the percentage done (an artifact, a dashboard); optional.
        live: a tqdm bar instead of log lines; default: whether stderr is a terminal.
        every_s, every_pct: without a bar, a line at most this often (either threshold).
        publish_every_s: ``publish`` at most this often (and always at 0 and 100).
        logger: where the lines go (default: this module's logger, routed to Prefect's).
        quiet: names of loggers whose INFO lines the progress replaces: raised to WARNING while
            it is open (between ``start`` and ``close``), then restored.
    """

    def __init__(self, total: int, label: str, unit: str = "items", *,
                 publish: Callable[[float], None] | None = None, live: bool | None = None,
                 every_s: float = 30.0, every_pct: float = 10.0, publish_every_s: float = 2.0,
                 logger: logging.Logger | None = None, clock: Callable[[], float] = time.monotonic,
                 quiet: Sequence[str] = ()) -> None:
        self.total, self.label, self.unit = max(0, int(total)), label, unit
        self.publish, self.every_s, self.every_pct, self.publish_every_s = publish, every_s, every_pct, publish_every_s
        self.live = sys.stderr.isatty() if live is None else live
        self.logger = logger or log
        self._clock = clock
        self.done = 0
        self.lines: list[str] = []  # what was logged (tests and reports read it)
        self._t0 = clock()
        self._logged_at, self._logged_pct, self._logged_done = self._t0, 0.0, -1
        self._published_at: float | None = None
        self._published_failed = False
        self._bar: Any = None
        self._closed = False
        self.quiet = tuple(quiet)
        self._quieted: dict[str, int] = {}  # logger name -> its level before start

    # -- counting
    def __enter__(self) -> Self:
        self.start()
        return self

    def start(self) -> None:
        """Show 0/N (a bar on a terminal, one line elsewhere) and publish 0."""
        for name in self.quiet:
            logger = logging.getLogger(name)
            self._quieted[name] = logger.level
            logger.setLevel(max(logging.WARNING, logger.level))
        if self.live:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, desc=self.label, unit=self.unit.rstrip("s") or self.unit,
                             file=sys.stderr, dynamic_ncols=True, mininterval=0.5, leave=False)
        else:
            self._log()
        self._publish(force=True)

    def advance(self, n: int = 1) -> None:
        """``n`` more items finished."""
        self.done = min(self.total, self.done + n) if self.total else self.done + n
        if self._bar is not None:
            self._bar.update(n)
        elif self.done >= self.total or self._due():
            self._log()
        self._publish(force=self.done >= self.total)

    def close(self) -> None:
        """The last line (``i/N`` as far as it got) and the last publication."""
        if self._closed:
            return
        self._closed = True
        for name, level in self._quieted.items():
            logging.getLogger(name).setLevel(level)
        if self._bar is not None:
            self._bar.close()
            self._log()  # one line in the log of a terminal run too
        elif self._logged_done != self.done:  # stopped early, between two lines
            self._log()
        self._publish(force=True)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- reporting
    @property
    def percent(self) -> float:
        return 100.0 * self.done / self.total if self.total else 100.0

    def line(self) -> str:
        return progress_line(self.label, self.done, self.total, self._clock() - self._t0, self.unit)

    def _due(self) -> bool:
        now = self._clock()
        return now - self._logged_at >= self.every_s or self.percent - self._logged_pct >= self.every_pct

    def _log(self) -> None:
        text = self.line()
        self.lines.append(text)
        self.logger.info("%s", text)
        self._logged_at, self._logged_pct, self._logged_done = self._clock(), self.percent, self.done

    def _publish(self, force: bool = False) -> None:
        if self.publish is None or self._published_failed:
            return
        now = self._clock()
        if not force and self._published_at is not None and now - self._published_at < self.publish_every_s:
            return
        self._published_at = now
        try:
            self.publish(round(self.percent, 2))
        except Exception as exc:  # noqa: BLE001 - the UI is a convenience, the work goes on
            self._published_failed = True
            self.logger.warning("could not publish the progress of %s: %s", self.label, exc)


# ------------------------------------------------------------------------------------
# Prefect


def in_prefect_run() -> bool:
    """Whether the caller runs inside a Prefect flow or task run."""
    from prefect.context import FlowRunContext, TaskRunContext

    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


#: The logger of Prefect's task-run engine (one ``Finished in state ...`` line per task run).
TASK_RUN_LOGGER = "prefect.task_runs"


class ProgressArtifact:
    """A Prefect progress artifact: created on the first call, updated on the next ones."""

    def __init__(self, description: str, key: str | None = None) -> None:
        self.description, self.key = description, key
        self.id: Any = None

    def __call__(self, percent: float) -> None:
        from prefect.artifacts import create_progress_artifact, update_progress_artifact

        value = min(100.0, max(0.0, float(percent)))
        if self.id is None:
            self.id = create_progress_artifact(progress=value, key=self.key, description=self.description)
        else:
            update_progress_artifact(self.id, value)


def track(total: int, label: str, unit: str = "items", *, description: str | None = None,
          artifact: bool | None = None, **kwargs: Any) -> Progress:
    """A :class:`Progress` that, inside a Prefect run (or with ``artifact=True``), also moves a
    progress artifact described by ``description`` (default: ``label: % of N unit done``).
    Inside a Prefect run the task runs' INFO lines are quiet while it is open: its line reports them."""
    running = in_prefect_run()
    if artifact is None:
        artifact = running
    publish = ProgressArtifact(description or f"{label}: % of {total} {unit} done") if artifact else None
    kwargs.setdefault("quiet", (TASK_RUN_LOGGER,) if running else ())
    return Progress(total, label, unit, publish=publish, **kwargs)
