"""A circuit breaker per model: a model that keeps failing answers 503 for a cool-down.

Closed, it counts the outcomes of the model calls over a sliding window; when at least
``min_calls`` calls fall in the window and the failed share reaches ``error_share``, it opens
and refuses calls (:class:`BreakerOpen`, 503 with the reason and ``Retry-After``) for
``cooldown_s``. Then it lets one trial call through (half-open): a success closes it, a
failure opens it again. Requests never queue behind a broken model.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from fastapi import HTTPException

from infra.errors import DataValidationError

#: Exceptions that are the caller's fault: they do not count against the model.
USER_ERRORS: tuple[type[BaseException], ...] = (DataValidationError, HTTPException)


class BreakerOpen(Exception):
    """The model's breaker is open; retry after ``retry_after_s``."""

    def __init__(self, model: str, reason: str, retry_after_s: float) -> None:
        super().__init__(f"model {model} is unavailable: {reason}")
        self.model = model
        self.reason = reason
        self.retry_after_s = retry_after_s


class CircuitBreaker:
    """Error-share breaker over a time window.

    Args:
        model: name for messages and metrics.
        error_share: failed share that opens the breaker (0.3 = 30 %).
        window_s: the window the share is measured over.
        min_calls: calls in the window before the breaker may open.
        cooldown_s: how long it stays open.
        on_change: called with True/False when it opens/closes (metrics).
        clock: monotonic clock (tests pass a fake).
    """

    def __init__(self, model: str, *, error_share: float = 0.3, window_s: float = 30.0, min_calls: int = 10,
                 cooldown_s: float = 30.0, on_change: Callable[[bool], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.model = model
        self.error_share = error_share
        self.window_s = window_s
        self.min_calls = min_calls
        self.cooldown_s = cooldown_s
        self.on_change = on_change
        self.clock = clock
        self._calls: collections.deque[tuple[float, bool]] = collections.deque()
        self._failed = 0  # failed calls in _calls
        self._opened_at: float | None = None
        self._reason = ""
        self._trial = False
        self._lock = threading.Lock()

    @property
    def is_open(self) -> bool:
        """True while calls are refused."""
        with self._lock:
            return self._opened_at is not None and self.clock() - self._opened_at < self.cooldown_s

    def before_call(self) -> None:
        """Raise :class:`BreakerOpen` while open; after the cool-down let one trial call pass."""
        with self._lock:
            if self._opened_at is None:
                return
            left = self.cooldown_s - (self.clock() - self._opened_at)
            if left > 0 or self._trial:
                raise BreakerOpen(self.model, self._reason, max(left, 1.0))
            self._trial = True  # half-open: this call decides

    def record(self, ok: bool, reason: str = "") -> None:
        """Count one model call's outcome."""
        changed = None
        with self._lock:
            now = self.clock()
            if self._opened_at is not None:
                self._trial = False
                if ok:
                    self._opened_at, self._reason, changed = None, "", False
                    self._calls.clear()
                    self._failed = 0
                else:
                    self._opened_at, self._reason = now, f"trial call after the cool-down failed: {reason}"
            else:
                self._calls.append((now, ok))
                self._failed += not ok
                while self._calls and now - self._calls[0][0] > self.window_s:
                    self._failed -= not self._calls.popleft()[1]
                failed = self._failed  # kept in step: summing the window cost O(calls) per call
                if len(self._calls) >= self.min_calls and failed / len(self._calls) >= self.error_share:
                    self._opened_at = now
                    self._reason = (f"{failed} of the last {len(self._calls)} model calls failed "
                                    f"(last error: {reason})")
                    changed = True
        if changed is not None and self.on_change is not None:
            self.on_change(changed)

    @contextmanager
    def guard(self, ignore: tuple[type[BaseException], ...] = USER_ERRORS) -> Iterator[None]:
        """``with breaker.guard(): model(...)``: refuse while open, count the outcome.

        Exceptions in ``ignore`` are the caller's fault: they pass through uncounted.
        """
        self.before_call()
        try:
            yield
        except ignore:
            self.record(True)
            raise
        except Exception as exc:
            self.record(False, type(exc).__name__)
            raise
        self.record(True)

    def retry_after(self) -> int:
        """Seconds until the breaker lets a trial call through (at least 1)."""
        with self._lock:
            if self._opened_at is None:
                return 1
            return max(1, math.ceil(self.cooldown_s - (self.clock() - self._opened_at)))
