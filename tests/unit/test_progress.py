"""The progress helper: i/N, rate and ETA; throttled lines without a terminal; publication."""

from __future__ import annotations

import logging
import re

from tasks.progress import Progress, progress_line


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_line_has_i_of_n_rate_and_eta() -> None:
    assert progress_line("ingest kb", 12, 67, 24.0, "files") == \
        "ingest kb: 12/67 files (18%), 2.0 s/file, elapsed 00:24, ETA 01:50"
    assert progress_line("score x", 30, 40, 10.0, "files") == \
        "score x: 30/40 files (75%), 3.00 files/s, elapsed 00:10, ETA 00:03"
    assert progress_line("ingest kb", 0, 5, 1.0, "files").endswith("? files/s, elapsed 00:01, ETA ?")


def test_without_a_terminal_a_line_every_few_seconds_or_percent_never_per_item(caplog) -> None:
    clock, published = Clock(), []
    logger = logging.getLogger("test.progress")
    caplog.set_level(logging.INFO, logger="test.progress")
    with Progress(1000, "ingest kb", "files", publish=published.append, live=False, every_s=30, every_pct=10,
                  publish_every_s=2, logger=logger, clock=clock) as p:
        for _ in range(1000):
            clock.now += 0.01  # 10 s in all: the 10% steps decide
            p.advance()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == p.lines
    assert 10 <= len(lines) <= 12  # 0/1000, each 10%, and the last one: not 1000 lines
    assert lines[0].startswith("ingest kb: 0/1000 files (0%)")
    assert lines[-1].startswith("ingest kb: 1000/1000 files (100%)") and "ETA 00:00" in lines[-1]
    assert not lines[-2].startswith("ingest kb: 1000/1000")  # the end is said once, not again at close
    assert all(re.match(r"ingest kb: \d+/1000 files \(\d+%\), ", line) for line in lines)
    assert published[0] == 0.0 and published[-1] == 100.0
    assert len(published) <= 10 / 2 + 3  # at most every 2 s, plus the first and the last


def test_a_slow_job_logs_on_time_and_a_failing_publisher_never_stops_the_work(caplog) -> None:
    clock = Clock()
    caplog.set_level(logging.INFO, logger="test.progress")

    def broken(percent: float) -> None:
        raise RuntimeError("API down")

    p = Progress(3, "train run", "epochs", publish=broken, live=False, every_s=30, every_pct=100,
                 logger=logging.getLogger("test.progress"), clock=clock)
    p.start()
    clock.now = 40.0
    p.advance()  # 40 s since the last line: one more line
    clock.now = 50.0
    p.advance()  # 10 s: none
    p.close()  # stopped at 2/3: the last line says so
    assert [line.split(" (")[0] for line in p.lines] == ["train run: 0/3 epochs", "train run: 1/3 epochs",
                                                         "train run: 2/3 epochs"]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "API down" in warnings[0].getMessage()


def test_quiet_loggers_drop_info_while_open_keep_warnings_and_errors_and_are_restored() -> None:
    """The per-item INFO lines a progress replaces (Prefect's ``Finished in state Completed()``
    per task run) are dropped while it is open; warnings and errors still show."""
    engine = logging.getLogger("test.progress.engine")
    engine.setLevel(logging.DEBUG)
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(f"{record.levelname} {record.getMessage()}")  # type: ignore[method-assign]
    engine.addHandler(handler)
    try:
        with Progress(2, "ingest kb", "files", live=False, quiet=(engine.name,)):
            engine.info("Finished in state Completed()")
            engine.warning("slow parse")
            engine.error("Finished in state Failed('boom')")
        engine.info("after the progress")
    finally:
        engine.removeHandler(handler)
    assert seen == ["WARNING slow parse", "ERROR Finished in state Failed('boom')", "INFO after the progress"]
    assert engine.level == logging.DEBUG
