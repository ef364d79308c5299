"""Load held through a replica kill: two ``python -m flows.serve`` replicas on one Redis, one of
them killed (``kill -9``) under a fixed request rate. Prints one JSON line.

serve_bench's small fraud model is registered in a throwaway home; two replicas of the real
server command (serve_bench's :func:`start_server`: keys, rate limits, audit log, metrics and the
score log on) share that home and the online feature state in a throwaway ``redis-server``
(``INDUSFLOW_SERVE_REDIS_URL``), each on its own loopback port. ``--streams`` clients each own
their accounts and terminals and send their transactions in time order, one request at a time
(an account's transactions must arrive in order), on a fixed schedule that adds up to ``--rate``
requests/s; request ``i`` goes first to replica ``i mod 2`` (a client alternating between them),
and a request that fails (connection refused or reset, 502/503/504) is sent again, same body and
same transaction ids, to the other replica. ``--kill-at`` seconds in, replica 0 is killed with
SIGKILL (``--kill-in-update``: at the first moment after that when it is inside an update,
holding the state's lock, the worst moment: the survivor waits for the lock to expire); the
clients keep alternating (a request to the dead replica is refused at once and retried on the
survivor).

Figures: requests sent, the share answered 200, retries, and p50/p99/max latency before the kill
(requests answered before it), during it (requests in flight at the kill or scheduled in the
``--during`` seconds after it) and after, each measured from the request's scheduled send time to
its final answer (retries included; a client held up by a slow answer does not hide the delay of
its next requests). Then the online state is read back from Redis through the store's own API
and compared with a single-process replay of the same transactions through the same solution
functions (each client's requests in its order; clients share no account or terminal, so their
interleaving changes nothing): transactions lost or applied twice, whether the stored state
equals the replay's (the score stored with each row aside: a row scored in one model call with
others differs from the replay's in the last bits), and the largest differences of the served
and stored scores from the replay's. ``os.getloadavg()`` before and after (2 shared cores here:
read the latencies with it).

Usage: ``python bench/replica_kill_bench.py [--rate 40] [--seconds 30] [--kill-at 10] [--during 5]
[--streams 8] [--rows 1] [--kill-in-update] [--out bench/results/replica_kill_bench.json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import datetime as dt
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from loadgen import free_port, stop_server, summary
from serve_bench import MODEL, register_model, start_server

#: Answers after which the client sends the same request to the other replica.
RETRYABLE = frozenset({502, 503, 504, 599})  # 599: no answer (connection refused or reset, timeout)


# ------------------------------------------------------------------------------------
# the set-up (also used by tests/servers/test_serving_replicas.py)


@contextmanager
def redis_server() -> Iterator[str]:
    """A throwaway ``redis-server`` on 127.0.0.1 (no persistence); yields its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    proc = subprocess.Popen([binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def transaction_streams(streams: int, requests: int, rows: int) -> list[list[list[dict[str, Any]]]]:
    """Per client, its requests (each ``rows`` transactions): client ``s`` owns accounts
    ``A<s>-0..5`` and terminals ``T<s>-0..3``; transaction ids are unique, timestamps one minute
    apart in each client's order (all inside one month: every row stays in the windows)."""
    base = dt.datetime(2025, 3, 1)
    out: list[list[list[dict[str, Any]]]] = []
    for s in range(streams):
        reqs = []
        for j in range(requests):
            batch = []
            for k in range(rows):
                n = j * rows + k
                batch.append({
                    "transaction_id": f"s{s}-tx{n}", "account_id": f"A{s}-{n % 6}",
                    "timestamp": (base + dt.timedelta(minutes=n)).isoformat(),
                    "amount": round(5.0 + (n * 7919 + s * 104729) % 40_000 / 100.0, 2),
                    "terminal_id": f"T{s}-{(n * 3 + n // 7) % 4}", "channel": ("pos", "web")[n % 5 == 0],
                    "category": ("grocery", "fuel", "travel")[n % 3], "age": 25 + (n % 6) * 7,
                    "occupation": "teacher", "account_age_days": 100 + (n % 6) * 90})
            reqs.append(batch)
        out.append(reqs)
    return out


def start_replicas(home: Path, redis_url: str, count: int = 2,
                   extra_env: dict[str, str] | None = None) -> list[tuple[subprocess.Popen[bytes], str]]:
    """``count`` replicas of serve_bench's server (batching at the defaults) on one home and one
    Redis, started together; each writes its own audit folder, as the Kubernetes manifest does
    (``extra_env``: more settings for every replica)."""
    from infra.settings import ServeSettings

    defaults = ServeSettings()

    def one(i: int) -> tuple[subprocess.Popen[bytes], str]:
        return start_server(home, defaults.batch_max_size, {
            "INDUSFLOW_SERVE_REDIS_URL": redis_url, "INDUSFLOW_SERVE_AUDIT_DIR": str(home / "audit" / f"replica-{i}"),
            "INDUSFLOW_SERVE_FRAUD_CHALLENGER_MODE": "off", **(extra_env or {})})

    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(one, i) for i in range(count)]
        started = []
        for future in futures:
            try:
                started.append(future.result())
            except Exception:
                for other in futures:
                    if other.done() and other.exception() is None:
                        stop_server(other.result()[0])
                raise
    return started


def group_processes(pgid: int) -> list[int]:
    """Live processes of the process group ``pgid`` (a server starts in a session of its own)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(entry.name))
    return found


def kill_replica(proc: subprocess.Popen[bytes]) -> int:
    """``kill -9`` the replica's process group; its exit status once reaped."""
    os.killpg(proc.pid, signal.SIGKILL)
    return proc.wait(timeout=10)


def check_state(home: Path, redis_url: str, streams: list[list[list[dict[str, Any]]]]) -> dict[str, Any]:
    """The online state in Redis against one process replaying ``streams`` (each client's requests
    in its order) through the same solution functions, with the champion the replicas served.

    Returns ``lost`` and ``doubled`` (transaction ids missing from, or stored more than once in, an
    account's rows or a terminal's rows), ``equal`` (the stored accounts and terminals equal the
    replay's, floats exactly, but for the score kept with each account row: a row scored in a
    batch with others may differ from the replay's in the last bits), ``stored_score_diff`` (the
    largest difference of those), ``versions`` (the versions stored with the rows) and ``scores``:
    per client, per request, the replay's scores.
    """
    from flows.serve.fraud import HISTORY_LEN
    from infra.online_state.redis_store import RedisStateStore
    from infra.online_state.rocks import RocksStateStore
    from infra.registry import ModelRegistry
    from solutions.fraud import pipeline as P
    from solutions.fraud.online import (
        ACCOUNT,
        TERMINAL,
        OnlineFraudModel,
        OnlineFraudState,
        score_requests,
    )

    registry = ModelRegistry(home / "registry")
    ref = registry.get(MODEL)
    net, pre, cfg = P.model_from_params(ref.params, registry.load_state_dict(ref))
    model = OnlineFraudModel.from_registry(net, pre, cfg.seq_len, ref.name, ref.version, ref.params)
    rows = [row for stream in streams for request in stream for row in request]
    accounts = sorted({r["account_id"] for r in rows})
    terminals = sorted({r["terminal_id"] for r in rows})

    def snapshot(store: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        with store.exclusive():
            return store.read(ACCOUNT, accounts), store.read(TERMINAL, terminals)

    with tempfile.TemporaryDirectory(prefix="replica-ref-") as tmp:
        alone = OnlineFraudState.for_model(RocksStateStore(Path(tmp) / "alone"), history_len=HISTORY_LEN)
        scores: list[list[list[float]]] = []
        for stream in streams:
            scores.append([])
            for request in stream:
                [result] = score_requests(model, alone, [request])
                if isinstance(result, Exception):
                    raise result
                scores[-1].append(result.tolist())
        expected = snapshot(alone.store)
        alone.store.close()
    shared = RedisStateStore(redis_url)
    try:
        stored = snapshot(shared)
    finally:
        shared.close()
    want = Counter(r["transaction_id"] for r in rows)
    held_a = Counter(row[5] for doc in stored[0].values() for row in doc["recent"])
    held_t = Counter(row[2] for doc in stored[1].values() for row in doc["rows"])
    lost = sorted(tx for tx in want if held_a[tx] == 0 or held_t[tx] == 0)
    doubled = sorted(tx for tx in want if held_a[tx] > 1 or held_t[tx] > 1)
    counted = {a: doc["n"] for a, doc in stored[0].items()}
    sent = Counter(r["account_id"] for r in rows)

    def without_scores(accounts: dict[str, Any]) -> dict[str, Any]:
        return {a: {**doc, "recent": [row[:6] for row in doc["recent"]]} for a, doc in accounts.items()}

    pairs = [(x, y) for a in accounts for x, y in zip(stored[0].get(a, {}).get("recent", []),
                                                        expected[0].get(a, {}).get("recent", []), strict=False)]
    return {"transactions": len(rows), "lost": lost, "doubled": doubled,
            "unknown": sorted(set(held_a) - set(want)), "account_counts_match": counted == dict(sent),
            "equal": (without_scores(stored[0]), stored[1]) == (without_scores(expected[0]), expected[1]),
            "stored_score_diff": max((abs(x[6] - y[6]) for x, y in pairs if len(x) > 7), default=None),
            "rows_without_score": sum(len(x) <= 7 for x, _ in pairs),
            "versions": sorted({x[7] for x, _ in pairs if len(x) > 7}), "scores": scores}


# ------------------------------------------------------------------------------------
# the bench


@dataclass
class Answer:
    """One request as the client saw it."""

    stream: int
    index: int
    scheduled: float  # seconds from the start
    done: float = 0.0
    attempts: list[tuple[int, int]] = field(default_factory=list)  # (replica, status)
    scores: list[float] | None = None


async def run_load(urls: list[str], key: str, streams: list[list[list[dict[str, Any]]]], rate: float,
                   kill_at: float, on_kill: Any, in_update: Any = None,
                   max_attempts: int = 4) -> tuple[list[Answer], float, bool]:
    """Send every client's requests on its schedule (``rate`` requests/s in all); at ``kill_at``
    seconds call ``on_kill`` (with ``in_update``: once ``in_update(in_flight)`` says replica 0 is
    inside an update, 5 s at most). Returns the answers, the kill's time (seconds from the start)
    and whether ``in_update`` held at the kill."""
    import aiohttp

    n = len(streams)
    answers: list[Answer] = []
    killed: list[float] = []
    caught: list[bool] = []
    in_flight = [0, 0]  # requests open per replica (read by the killer's thread)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout, headers={"X-API-Key": key}) as client:
        start = time.perf_counter()

        async def post(replica: int, body: list[dict[str, Any]]) -> tuple[int, Any]:
            try:
                async with client.post(f"{urls[replica]}/v1/fraud/score", json={"transactions": body}) as response:
                    data = await response.read()
                    return response.status, data
            except (aiohttp.ClientError, TimeoutError):
                return 599, None

        async def client_loop(s: int) -> None:
            for j, body in enumerate(streams[s]):
                i = j * n + s  # the request's place in the whole schedule
                answer = Answer(s, j, i / rate)
                delay = start + answer.scheduled - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                replica = i % 2
                while len(answer.attempts) < max_attempts:
                    in_flight[replica] += 1
                    try:
                        status, data = await post(replica, body)
                    finally:
                        in_flight[replica] -= 1
                    answer.attempts.append((replica, status))
                    if status == 200:
                        answer.scores = [r["score"] for r in json.loads(data)["results"]]
                        break
                    if status not in RETRYABLE:
                        break
                    replica = 1 - replica
                answer.done = time.perf_counter() - start
                answers.append(answer)

        def kill() -> None:
            give_up = time.perf_counter() + 5.0
            while in_update is not None and time.perf_counter() < give_up:
                if in_update(in_flight):
                    caught.append(True)
                    break
                time.sleep(0.0002)
            killed.append(time.perf_counter() - start)
            on_kill()

        async def killer() -> None:
            await asyncio.sleep(max(0.0, start + kill_at - time.perf_counter()))
            await asyncio.get_running_loop().run_in_executor(None, kill)

        await asyncio.gather(killer(), *(client_loop(s) for s in range(n)))
    return answers, killed[0], bool(caught)


def phase(answers: list[Answer], seconds: float) -> dict[str, Any]:
    """Latency (scheduled send to final answer), statuses and retries of some answers."""
    statuses = Counter(a.attempts[-1][1] for a in answers)
    out = summary([a.done - a.scheduled for a in answers], statuses, seconds, 1)
    out.pop("rows_per_s")
    out["max_ms"] = round(max(a.done - a.scheduled for a in answers) * 1000, 2) if answers else None
    out["answered_share"] = round(statuses.get(200, 0) / len(answers), 4) if answers else None
    out["retried"] = sum(len(a.attempts) > 1 for a in answers)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=40.0, help="requests/s from all clients together")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the schedule")
    parser.add_argument("--kill-at", type=float, default=10.0, help="seconds in when replica 0 is killed")
    parser.add_argument("--during", type=float, default=5.0, help="seconds after the kill reported as 'during'")
    parser.add_argument("--streams", type=int, default=8, help="clients (each owns its accounts and terminals)")
    parser.add_argument("--rows", type=int, default=1, help="transactions per request")
    parser.add_argument("--kill-in-update", action="store_true",
                        help="kill replica 0 inside an update (it holds the state's lock: replica 0 has a request "
                        "open, replica 1 none, and the lock is taken), the worst moment, instead of at --kill-at "
                        "sharp (looks for it for 5 s)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON line to this file")
    args = parser.parse_args()
    if not 0 < args.kill_at < args.seconds:
        parser.error("--kill-at must lie inside --seconds")

    from redis import Redis

    from infra.online_state.redis_store import RedisStateStore
    from infra.serving.auth import KeyStore

    load_before = os.getloadavg()
    per_stream = max(1, round(args.rate * args.seconds / args.streams))
    streams = transaction_streams(args.streams, per_stream, args.rows)
    tmp = Path(tempfile.mkdtemp(prefix="replica-kill-bench-"))
    replicas: list[tuple[subprocess.Popen[bytes], str]] = []
    try:
        with redis_server() as redis_url:
            register_model(tmp)
            key, _ = KeyStore(tmp / "serving" / "keys.json").add("bench", ["fraud:score"])
            t0 = time.perf_counter()
            replicas = start_replicas(tmp, redis_url)
            ready_s = time.perf_counter() - t0
            victim = replicas[0][0]
            status: list[int] = []
            lock = Redis.from_url(redis_url)
            names = RedisStateStore(redis_url)  # the store names its lock
            lock_key = names.lock_key
            names.close()

            def in_update(in_flight: list[int]) -> bool:
                return in_flight[0] > 0 and in_flight[1] == 0 and bool(lock.exists(lock_key))

            answers, killed_at, caught = asyncio.run(run_load(
                [url for _, url in replicas], key, streams, args.rate, args.kill_at,
                lambda: status.append(kill_replica(victim)), in_update if args.kill_in_update else None))
            lock.close()
            survivor_pids = group_processes(replicas[1][0].pid)
            for proc, _ in replicas:
                stop_server(proc)
            orphans = [pid for proc, _ in replicas for pid in group_processes(proc.pid)]
            state = check_state(tmp, redis_url, streams)
    finally:
        for proc, _ in replicas:
            if proc.poll() is None:
                stop_server(proc)
        shutil.rmtree(tmp, ignore_errors=True)
    answers.sort(key=lambda a: a.scheduled)
    end = max(a.scheduled for a in answers)
    during_end = killed_at + args.during
    diff = max((abs(x - y) for a in answers if a.scores is not None
                for x, y in zip(a.scores, state["scores"][a.stream][a.index], strict=True)), default=None)
    attempts = Counter(status for a in answers for _, status in a.attempts)
    result = {
        "bench": "replica_kill", "cores": os.cpu_count(),
        "load_avg": {"before": [round(v, 2) for v in load_before], "after": [round(v, 2) for v in os.getloadavg()]},
        "rate": args.rate, "seconds": args.seconds, "streams": args.streams, "rows_per_request": args.rows,
        "replicas": 2, "ready_s": round(ready_s, 1), "killed_at_s": round(killed_at, 2),
        "killed_exit_status": status[0] if status else None, "during_s": args.during,
        "kill_moment": "in_update" if caught else ("in_update_not_found" if args.kill_in_update else "at_time"),
        "requests": len(answers), "answered_share": round(sum(a.scores is not None for a in answers) / len(answers), 4),
        "retries": sum(len(a.attempts) - 1 for a in answers), "attempt_status": {str(k): v for k, v in
                                                                               sorted(attempts.items())},
        "before": phase([a for a in answers if a.done < killed_at], killed_at),
        "during": phase([a for a in answers if a.done >= killed_at and a.scheduled < during_end], args.during),
        "after": phase([a for a in answers if a.scheduled >= during_end], max(end - during_end, 1e-9)),
        "survivor_processes": len(survivor_pids), "processes_left": len(orphans),
        "state": {"transactions": state["transactions"], "lost": len(state["lost"]), "doubled": len(state["doubled"]),
                  "unknown": len(state["unknown"]), "account_counts_match": state["account_counts_match"],
                  "equal_to_single_process_replay": state["equal"], "rows_without_score": state["rows_without_score"],
                  "stored_versions": state["versions"],
                  "max_served_score_diff_vs_replay": None if diff is None else float(f"{diff:.3g}"),
                  "max_stored_score_diff_vs_replay": None if state["stored_score_diff"] is None
                  else float(f"{state['stored_score_diff']:.3g}")},
    }
    line = json.dumps(result)
    print(line)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(line + "\n")


if __name__ == "__main__":
    main()
