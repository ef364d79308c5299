"""Per-key rate limits (the ``limits`` library), the row-count limit of one request, and the
concurrency caps of a slow route (:class:`RouteGate`, anyio capacity limiters).

A key's limit is a ``limits`` string (``1000/minute``); the moving-window strategy counts the
key's requests over the last period, in memory by default, in Redis when a URL is configured
(every replica then shares one count per key). The asyncio flavour of ``limits`` is used: its
memory storage expires entries in an asyncio task (the threaded one starts a timer thread per
quiet request, ~1 ms each here) and its Redis client does not block the event loop.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
from fastapi import HTTPException, Request
from limits import RateLimitItem, parse
from limits.aio.storage import MemoryStorage, RedisStorage, Storage
from limits.aio.strategies import MovingWindowRateLimiter


@dataclass(frozen=True)
class RouteLimits:
    """Limits of the routes under one path prefix that differ from the server's defaults
    (an upload route takes bigger bodies, a streamed answer takes longer, a slow route may not
    hold more than its share of the server's worker threads).

    Attributes:
        max_body_bytes: largest request body (None: ``INDUSFLOW_SERVE_MAX_BODY_BYTES``).
        timeout_s: per-request time limit (None: ``INDUSFLOW_SERVE_REQUEST_TIMEOUT_S``).
        concurrency: most requests under the prefix in flight at once (503 with ``Retry-After``
            above; None: no cap). A slow route's cap below the worker-thread pool (anyio's 40
            tokens) leaves threads to every other route.
        per_key: most requests under the prefix in flight at once for one credential (429 with
            ``Retry-After`` above; None: no cap): one client cannot take the whole route.
    """

    max_body_bytes: int | None = None
    timeout_s: float | None = None
    concurrency: int | None = None
    per_key: int | None = None


#: A refusal the middleware answers itself: status, JSON body, headers.
Refusal = tuple[int, dict[str, Any], dict[str, str]]


@dataclass(frozen=True)
class RateDecision:
    """Whether a request may go on, and when to retry if not."""

    allowed: bool
    limit: int
    remaining: int
    retry_after_s: int


def parse_rate(text: str) -> RateLimitItem:
    """A ``limits`` item from ``N/second|minute|hour|day``; ValueError with the expected form."""
    try:
        return parse(text)
    except ValueError:
        raise ValueError(f"rate limit {text!r} is not of the form N/second, N/minute or N/hour") from None


class RateLimiter:
    """Moving-window limits per key id, in memory or in Redis.

    Args:
        default_rate: limit of a key that has none of its own.
        redis_url: ``redis://host:port/db``; None keeps the counts in this process.
    """

    def __init__(self, default_rate: str, redis_url: str | None = None) -> None:
        self.default = parse_rate(default_rate)
        self.storage: Storage = (RedisStorage(f"async+{redis_url}", implementation="redispy") if redis_url
                                 else MemoryStorage())
        self.strategy = MovingWindowRateLimiter(self.storage)
        self._items: dict[str, RateLimitItem] = {}

    def _item(self, rate: str | None) -> RateLimitItem:
        if not rate:
            return self.default
        item = self._items.get(rate)
        if item is None:
            item = self._items[rate] = parse_rate(rate)
        return item

    async def hit(self, key_id: str, rate: str | None = None) -> RateDecision:
        """Count one request of ``key_id`` against its limit."""
        item = self._item(rate)
        allowed = await self.strategy.hit(item, "key", key_id)
        if allowed:
            return RateDecision(True, item.amount, max(item.amount - 1, 0), 0)
        stats = await self.strategy.get_window_stats(item, "key", key_id)
        retry = max(1, math.ceil(stats.reset_time - time.time()))
        return RateDecision(False, item.amount, stats.remaining, retry)


def check_rows(request: Request, rows: int) -> None:
    """Raise 413 when a request carries more rows than the server's ``max_rows``."""
    max_rows = request.app.state.serving.settings.max_rows
    if rows > max_rows:
        raise HTTPException(status_code=413, detail=f"{rows} rows in one request; the limit is {max_rows}")
    if rows < 1:
        raise HTTPException(status_code=422, detail="the request holds no rows")


class RouteGate:
    """The concurrency caps of :class:`~infra.serving.runtime.RouteLimits`: one anyio
    :class:`~anyio.CapacityLimiter` per capped prefix, and one per (prefix, key) while that key has
    requests in flight there (dropped when it has none, so idle keys hold no memory)."""

    def __init__(self) -> None:
        self._routes: dict[str, anyio.CapacityLimiter] = {}
        self._keys: dict[tuple[str, str], anyio.CapacityLimiter] = {}

    def enter(self, prefix: str, limits: RouteLimits, key_id: str | None) -> Callable[[], None] | Refusal:
        """Take a place under ``prefix`` for one request: the function that gives it back, or the
        refusal (429 over the key's cap, 503 over the route's)."""
        token = object()
        taken: list[anyio.CapacityLimiter] = []

        def leave() -> None:
            for limiter in taken:
                limiter.release_on_behalf_of(token)
            if key_id is not None and (prefix, key_id) in self._keys and \
                    self._keys[(prefix, key_id)].borrowed_tokens == 0:
                del self._keys[(prefix, key_id)]

        if limits.per_key is not None and key_id is not None:
            limiter = self._keys.setdefault((prefix, key_id), anyio.CapacityLimiter(limits.per_key))
            try:
                limiter.acquire_on_behalf_of_nowait(token)
            except anyio.WouldBlock:
                leave()
                return 429, {"detail": f"this credential already has {limits.per_key} requests in flight on "
                                       f"{prefix}; wait for one to finish"}, {"Retry-After": "1"}
            taken.append(limiter)
        if limits.concurrency is not None:
            limiter = self._routes.setdefault(prefix, anyio.CapacityLimiter(limits.concurrency))
            try:
                limiter.acquire_on_behalf_of_nowait(token)
            except anyio.WouldBlock:
                leave()
                return 503, {"detail": f"{prefix} is at its limit of {limits.concurrency} requests in flight; "
                                       "retry shortly"}, {"Retry-After": "1"}
            taken.append(limiter)
        return leave
