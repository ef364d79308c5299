"""Loopback HTTP load for the serving benches: closed-loop clients and a fixed-rate phase.

Closed loop: ``concurrency`` clients each send their next request when the previous one is
answered, for ``seconds``. Fixed rate: requests start on a fixed schedule (open loop, so a slow
server cannot slow the offered load down), bounded by ``max_in_flight``. Both only ever talk to
127.0.0.1. The client is aiohttp: httpx's connection pool slowed down so much past ~16 concurrent
requests here (a bare FastAPI route fell from ~100 to ~30 requests/s at 64) that it measured
itself, not the server. Latencies are measured from send to the full answer. A request the client gave up on
(30 s timeout, connection error) is counted as status ``599``, apart from the server's 5xx.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp


def summary(latencies: list[float], statuses: Counter[int], elapsed: float, rows_per_request: int) -> dict[str, Any]:
    """requests/s, rows/s, p50/p99 (ms) and status counts of one phase."""
    ok = statuses.get(200, 0)
    lat = sorted(latencies)

    def pct(p: float) -> float | None:
        return round(lat[min(len(lat) - 1, int(p * len(lat)))] * 1000, 2) if lat else None

    return {
        "requests": sum(statuses.values()),
        "req_per_s": round(ok / elapsed, 1),
        "rows_per_s": round(ok * rows_per_request / elapsed, 1),
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "mean_ms": round(statistics.fmean(lat) * 1000, 2) if lat else None,
        "status": {str(k): v for k, v in sorted(statuses.items())},
    }


@dataclass(frozen=True)
class Tagged:
    """A request body with a tag: a phase counts the answers' statuses per tag (e.g. valid/bad)."""

    body: Any
    tag: str


async def _post(client: aiohttp.ClientSession, url: str, body: Any) -> int:
    """POST ``body`` (JSON, or bytes sent as they are), read the whole answer; its status, or 599
    when the client gave up."""
    try:
        post = (client.post(url, data=body, headers={"Content-Type": "application/json"})
                if isinstance(body, bytes) else client.post(url, json=body))
        async with post as response:
            await response.read()
            return response.status
    except (aiohttp.ClientError, TimeoutError):
        return 599


async def closed_loop(url: str, make_body: Callable[[int], Any], *, concurrency: int, seconds: float,
                      rows_per_request: int, headers: dict[str, str] | None = None,
                      warmup_s: float = 0.5) -> dict[str, Any]:
    """``concurrency`` clients, each one request at a time, for ``seconds`` (after a warm-up)."""
    if not url.startswith("http://127.0.0.1:"):
        raise ValueError(f"the benches only load the loopback address; got {url}")
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    by_tag: dict[str, Counter[int]] = {}
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as client:
        counter = 0
        stop_at = time.perf_counter() + warmup_s + seconds
        start_measure = time.perf_counter() + warmup_s

        async def one_client() -> None:
            nonlocal counter
            while True:
                now = time.perf_counter()
                if now >= stop_at:
                    return
                counter += 1
                body, tag = make_body(counter), None
                if isinstance(body, Tagged):
                    body, tag = body.body, body.tag
                t0 = time.perf_counter()
                code = await _post(client, url, body)
                t1 = time.perf_counter()
                if start_measure <= t1 <= stop_at:  # answers completed inside the window
                    if tag is not None:
                        by_tag.setdefault(tag, Counter())[code] += 1
                    if tag is None or tag == "valid":
                        latencies.append(t1 - t0)
                        statuses[code] += 1

        await asyncio.gather(*(one_client() for _ in range(concurrency)))
    out = summary(latencies, statuses, seconds, rows_per_request)
    if by_tag:  # the figures above count the valid requests; here every tag's statuses
        out["status_by_tag"] = {tag: {str(k): v for k, v in sorted(c.items())} for tag, c in sorted(by_tag.items())}
    return out


async def fixed_rate(url: str, make_body: Callable[[int], Any], *, rate: float, seconds: float,
                     rows_per_request: int, headers: dict[str, str] | None = None,
                     max_in_flight: int = 256) -> dict[str, Any]:
    """Start ``rate`` requests per second for ``seconds`` (at most ``max_in_flight`` open at once)."""
    if not url.startswith("http://127.0.0.1:"):
        raise ValueError(f"the benches only load the loopback address; got {url}")
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    gate = asyncio.Semaphore(max_in_flight)
    skipped = 0
    connector = aiohttp.TCPConnector(limit=max_in_flight)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as client:

        async def one(i: int) -> None:
            t0 = time.perf_counter()
            code = await _post(client, url, make_body(i))
            latencies.append(time.perf_counter() - t0)
            statuses[code] += 1
            gate.release()

        tasks = []
        start = time.perf_counter()
        total = int(rate * seconds)
        for i in range(total):
            target = start + i / rate
            delay = target - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if gate.locked():
                skipped += 1  # the server is behind by max_in_flight: count it, do not queue without bound
                continue
            await gate.acquire()
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
    out = summary(latencies, statuses, elapsed, rows_per_request)
    out.update(offered_rate=rate, seconds=seconds, not_sent_over_in_flight_cap=skipped,
               errors_5xx=sum(v for k, v in statuses.items() if 500 <= k < 599),
               client_gave_up=statuses.get(599, 0))
    return out


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn_server(cmd: list[str], *, env: dict[str, str], cwd: Path, log: Path, ready_url: str,
                 timeout_s: float = 180.0) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in its own session, its stderr to ``log``, and wait until ``ready_url`` answers 200."""
    import httpx

    with open(log, "wb") as handle:  # a file, not a pipe: a chatty server never blocks on a full pipe
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=handle,
                                start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(ready_url, timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_server(proc)
            raise RuntimeError(f"the server did not become ready at {ready_url}: {log.read_text()[-2000:]}")
        time.sleep(0.2)


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """Stop the server's process group, then kill what is left (workers outlive a parent that exited)."""
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            time.sleep(0.5)
            break
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
