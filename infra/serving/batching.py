"""Dynamic batching: concurrent requests share one model call.

A route awaits ``batcher.submit(items)``; the batcher collects what the other requests submit
meanwhile (up to ``max_batch_size`` items and, when a ``weight`` is given, ``max_batch_rows``
rows) and calls ``fn(all_items)`` once in its worker thread. It is adaptive: a submission that
finds nothing else waiting runs at once (a lone client pays no wait); when others were waiting
(concurrent clients), the batch takes them and waits at most ``max_wait_ms`` after the first
for more. The event loop keeps accepting requests meanwhile; each request gets back its own
results, in order. Batches run one after the other in
that single thread, in arrival order, so a stateful ``fn`` (the fraud online state) sees the
items exactly in the order they were submitted. While one batch runs, the next one fills up:
under load the batches grow by themselves, with no extra waiting.

``max_batch_size=1`` switches batching off (each submission alone: the baseline of the bench).
An exception raised by ``fn`` fails the requests of that batch only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

I = TypeVar("I")  # noqa: E741 (I for the inputs, R for the results)
R = TypeVar("R")


@dataclass
class _Submission(Generic[I, R]):
    items: list[I]
    future: asyncio.Future[list[R]]
    rows: int = 0


class DynamicBatcher(Generic[I, R]):
    """Coalesces concurrent submissions into one call of ``fn``.

    Args:
        fn: ``fn(items) -> results``, one result per item, same order; runs in a worker thread.
        max_batch_size: most items per call (a larger single submission still runs, alone).
            1 disables batching.
        max_wait_ms: longest a batch that already holds several submissions waits for more to join
            (a submission that finds nothing else waiting runs at once).
        on_batch: called with each batch's item count (the metrics hook).
        name: the worker thread's name.
        weight: rows of one item (e.g. the transactions of a request); with ``max_batch_rows``,
            a call holds at most that many rows (a larger single submission still runs, alone),
            so one model call stays bounded however large the requests are.
        max_batch_rows: most rows per call (needs ``weight``; None: no row cap).
    """

    def __init__(self, fn: Callable[[list[I]], Sequence[R]], max_batch_size: int, max_wait_ms: float, *,
                 on_batch: Callable[[int], None] | None = None, name: str = "batcher",
                 weight: Callable[[I], int] | None = None, max_batch_rows: int | None = None) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1; got {max_batch_size}")
        if max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0; got {max_wait_ms}")
        if max_batch_rows is not None and (max_batch_rows < 1 or weight is None):
            raise ValueError(f"max_batch_rows must be >= 1 and comes with a weight; got {max_batch_rows}")
        self.fn = fn
        self.weight = weight
        self.max_batch_rows = int(max_batch_rows) if max_batch_rows is not None else None
        self.max_batch_size = int(max_batch_size)
        self.max_wait_s = float(max_wait_ms) / 1000.0
        self.on_batch = on_batch
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._queue: asyncio.Queue[_Submission[I, R]] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _ensure_worker(self) -> asyncio.Queue[_Submission[I, R]]:
        loop = asyncio.get_running_loop()
        if self._queue is None or self._loop is not loop or self._worker is None or self._worker.done():
            self._loop = loop
            self._queue = asyncio.Queue()
            self._worker = loop.create_task(self._collect(self._queue))
        return self._queue

    async def submit(self, items: Sequence[I]) -> list[R]:
        """Score ``items`` together with whatever else is waiting; their results, in order."""
        items = list(items)
        if not items:
            return []
        queue = self._ensure_worker()
        future: asyncio.Future[list[R]] = asyncio.get_running_loop().create_future()
        rows = sum(self.weight(item) for item in items) if self.weight is not None else len(items)
        await queue.put(_Submission(items, future, rows))
        return await future

    async def _collect(self, queue: asyncio.Queue[_Submission[I, R]]) -> None:
        loop = asyncio.get_running_loop()
        carry: _Submission[I, R] | None = None
        getter: asyncio.Task[_Submission[I, R]] | None = None  # a pending get survives a timeout
        try:
            while True:
                if carry is not None:
                    first, carry = carry, None
                elif getter is not None:
                    first, getter = await getter, None
                else:
                    first = await queue.get()
                batch = [first]
                size, rows = len(first.items), first.rows
                max_rows = self.max_batch_rows
                deadline = loop.time() + self.max_wait_s
                while size < self.max_batch_size and (max_rows is None or rows < max_rows):
                    if getter is None and not queue.empty():
                        nxt = queue.get_nowait()
                    elif len(batch) == 1:
                        break  # nobody else was waiting: a lone client's request runs at once
                    else:
                        timeout = deadline - loop.time()
                        if timeout <= 0:
                            break
                        getter = getter or loop.create_task(queue.get())
                        done, _ = await asyncio.wait({getter}, timeout=timeout)
                        if not done:
                            break
                        nxt, getter = getter.result(), None
                    if size + len(nxt.items) > self.max_batch_size or (
                            max_rows is not None and rows + nxt.rows > max_rows):
                        carry = nxt  # starts the next batch
                        break
                    batch.append(nxt)
                    size += len(nxt.items)
                    rows += nxt.rows
                live = [s for s in batch if not s.future.done()]  # timed-out requests drop out
                if live:
                    await self._run(loop, live)
        finally:
            if getter is not None:
                getter.cancel()

    async def _run(self, loop: asyncio.AbstractEventLoop, batch: list[_Submission[I, R]]) -> None:
        flat = [item for s in batch for item in s.items]
        try:
            results = await loop.run_in_executor(self._executor, self.fn, flat)
            results = list(results)
            if len(results) != len(flat):
                raise RuntimeError(f"the batch function returned {len(results)} results for {len(flat)} items")
        except Exception as exc:  # noqa: BLE001 - handed to the batch's requests
            for s in batch:
                if not s.future.done():
                    s.future.set_exception(exc)
            return
        if self.on_batch is not None:
            try:
                self.on_batch(len(flat))
            except Exception:
                log.exception("batch metrics hook failed")
        start = 0
        for s in batch:
            part = results[start : start + len(s.items)]
            start += len(s.items)
            if not s.future.done():
                s.future.set_result(part)

    def close(self) -> None:
        """Stop the collector and the worker thread (pending requests are cancelled)."""
        if self._worker is not None and not self._worker.done():
            self._worker.cancel()
        self._worker = None
        self._queue = None
        self._executor.shutdown(wait=False, cancel_futures=True)
