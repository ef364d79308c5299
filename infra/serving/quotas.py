"""Per-key rate limits (the ``limits`` library) and the row-count limit of one request.

A key's limit is a ``limits`` string (``1000/minute``); the moving-window strategy counts the
key's requests over the last period, in memory by default, in Redis when a URL is configured
(every replica then shares one count per key). The asyncio flavour of ``limits`` is used: its
memory storage expires entries in an asyncio task (the threaded one starts a timer thread per
quiet request, ~1 ms each here) and its Redis client does not block the event loop.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from fastapi import HTTPException, Request
from limits import RateLimitItem, parse
from limits.aio.storage import MemoryStorage, RedisStorage, Storage
from limits.aio.strategies import MovingWindowRateLimiter


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
