"""DynamicBatcher: concurrent submissions share one call, results come back in order, a failing
call fails only its own batch, batch size 1 switches batching off."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from infra.serving.batching import DynamicBatcher


def _run(coro):
    return asyncio.run(coro)


def test_concurrent_submissions_are_coalesced_and_ordered() -> None:
    calls: list[list[int]] = []
    threads: set[str] = set()

    def fn(items: list[int]) -> list[int]:
        calls.append(list(items))
        threads.add(threading.current_thread().name)
        time.sleep(0.01)
        return [i * 10 for i in items]

    sizes: list[int] = []
    batcher = DynamicBatcher(fn, max_batch_size=64, max_wait_ms=50, on_batch=sizes.append)

    async def main() -> list[list[int]]:
        subs = [[i, i + 100] for i in range(20)]
        return await asyncio.gather(*(batcher.submit(s) for s in subs))

    try:
        results = _run(main())
    finally:
        batcher.close()
    assert results == [[i * 10, (i + 100) * 10] for i in range(20)]
    assert len(calls) < 20 and max(len(c) for c in calls) > 2  # coalesced
    flat = [x for c in calls for x in c]
    assert flat == [x for i in range(20) for x in (i, i + 100)]  # arrival order kept across calls
    assert sizes == [len(c) for c in calls]
    assert threads and threading.main_thread().name not in threads  # off the event loop


def test_max_batch_size_bounds_a_call_and_one_disables_batching() -> None:
    calls: list[int] = []

    def fn(items: list[int]) -> list[int]:
        calls.append(len(items))
        return items

    async def main(batcher: DynamicBatcher) -> list[list[int]]:
        return await asyncio.gather(*(batcher.submit([i]) for i in range(12)))

    capped = DynamicBatcher(fn, max_batch_size=5, max_wait_ms=50)
    try:
        assert _run(main(capped)) == [[i] for i in range(12)]
    finally:
        capped.close()
    assert max(calls) <= 5 and sum(calls) == 12
    calls.clear()
    single = DynamicBatcher(fn, max_batch_size=1, max_wait_ms=50)
    try:
        assert _run(main(single)) == [[i] for i in range(12)]
    finally:
        single.close()
    assert calls == [1] * 12


def test_an_exception_fails_only_the_requests_of_its_batch() -> None:
    def fn(items: list[int]) -> list[int]:
        if -1 in items:
            raise RuntimeError("model failure")
        return items

    batcher = DynamicBatcher(fn, max_batch_size=2, max_wait_ms=30)

    async def main() -> list[object]:
        return await asyncio.gather(
            batcher.submit([-1]), batcher.submit([1]), batcher.submit([2]), batcher.submit([3]),
            return_exceptions=True,
        )

    try:
        results = _run(main())
    finally:
        batcher.close()
    assert isinstance(results[0], RuntimeError) and isinstance(results[1], RuntimeError)
    assert results[2:] == [[2], [3]]


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="max_batch_size"):
        DynamicBatcher(lambda x: x, max_batch_size=0, max_wait_ms=1)


def test_max_batch_rows_bounds_the_rows_of_a_call() -> None:
    """Requests weigh their rows: 10 requests of 300 rows under a 1,000-row cap give calls of at
    most 3 requests (900 rows); a single request over the cap still runs, alone."""
    calls: list[int] = []

    def fn(items: list[list[int]]) -> list[int]:
        calls.append(sum(len(rows) for rows in items))
        time.sleep(0.005)
        return [len(rows) for rows in items]

    batcher = DynamicBatcher(fn, max_batch_size=64, max_wait_ms=50, weight=len, max_batch_rows=1000)

    async def main() -> list[list[int]]:
        big = batcher.submit([list(range(1500))])
        return await asyncio.gather(big, *(batcher.submit([list(range(300))]) for _ in range(10)))

    try:
        results = _run(main())
    finally:
        batcher.close()
    assert results == [[1500]] + [[300]] * 10
    assert calls[0] == 1500 and max(calls[1:]) == 900 and sum(calls) == 1500 + 3000
    with pytest.raises(ValueError, match="max_batch_rows"):
        DynamicBatcher(fn, max_batch_size=4, max_wait_ms=1, max_batch_rows=10)  # no weight


def test_a_lone_submission_runs_at_once_and_concurrent_ones_still_coalesce() -> None:
    """Adaptive: nothing else waiting, no wait (a lone client would otherwise pay max_wait_ms on
    every request); submissions that find others waiting still share a call. The lone client's
    batcher waits up to a minute for company: a submission that waited for it would time out."""
    calls: list[int] = []

    def fn(items: list[int]) -> list[int]:
        calls.append(len(items))
        time.sleep(0.002)
        return items

    patient = DynamicBatcher(fn, max_batch_size=64, max_wait_ms=60_000)
    batcher = DynamicBatcher(fn, max_batch_size=64, max_wait_ms=400)

    async def lone() -> None:
        for i in range(5):
            assert await asyncio.wait_for(patient.submit([i]), timeout=30) == [i]

    async def burst() -> list[list[int]]:
        return await asyncio.gather(*(batcher.submit([i]) for i in range(30)))

    try:
        _run(lone())
        assert calls == [1] * 5
        calls.clear()
        assert _run(burst()) == [[i] for i in range(30)]
    finally:
        patient.close()
        batcher.close()
    assert max(calls) > 1 and sum(calls) == 30
