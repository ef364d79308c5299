"""Serving replicas that survive a kill (issue 29): two ``python -m flows.serve`` processes share
one home and one Redis; a client alternates between them at a bounded rate; one replica is killed
with SIGKILL in the middle of a request: inside its update (holding the online state's lock, the
update not written), or after its update was written and before it answered; the client sends
the request it lost to the other replica (same body, same transaction ids).

Then: every request got exactly one 200, the lost one on its first retry (answered from the
stored scores when the dead replica had written it); the survivor answered everything after the
kill; the online state in Redis, read back through the store's own API, equals one process
replaying the same transactions through the same solution functions (none lost, none applied
twice) and so do the served scores; the killed process is gone and, once the survivor is
stopped, no process of either replica is left.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from redis import Redis

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))  # the servers start as the benches start them

from loadgen import stop_server
from replica_kill_bench import (
    check_state,
    group_processes,
    start_replicas,
    transaction_streams,
)
from serve_bench import register_model

pytestmark = pytest.mark.servers

REQUESTS = 90  # of 3 transactions each, over 6 accounts and 4 terminals
ROWS = 3
RATE = 30.0  # requests/s at most
KILL_FROM = 30  # the kill is armed from this request on
BUDGET_S = 300.0  # a guard against a hang (about 40 s quiet), not a target
# How long a replica and the client wait for one answer: far above any answer on a loaded machine,
# so that the only failed attempts are the kill's. At the defaults (the server's 504 after 10 s, the
# client's 15 s), a first attempt that timed out on a loaded machine (load 11-15, the replicas, Redis
# and this client pinned to one core) had its update written after the 504: its retry on the other
# replica was rightly answered from the stored scores ("replayed"), and the check below that only
# the killed request is replayed failed ([34, 38, 48]) though nothing was applied twice.
ANSWER_WAIT_S = 120.0
POLL_S = 0.001  # the kill's watcher reads Redis this often (a busy loop starved the replicas' core)


class Replicas:
    """The client: request ``i`` goes to replica ``i mod 2`` first, a failed one to the other."""

    def __init__(self, urls: list[str], key: str) -> None:
        self.urls = urls
        self.http = httpx.Client(headers={"X-API-Key": key}, timeout=ANSWER_WAIT_S)
        self.attempts: list[list[tuple[int, int]]] = []  # per request: (replica, status)
        self.answers: list[dict[str, Any] | None] = []  # per request: its 200 answer

    def post(self, replica: int, body: list[dict[str, Any]]) -> tuple[int, dict[str, Any] | None]:
        try:
            response = self.http.post(f"{self.urls[replica]}/v1/fraud/score", json={"transactions": body})
        except httpx.TransportError:
            return 599, None  # refused, reset, or no answer in time
        return response.status_code, response.json() if response.status_code == 200 else None

    def send(self, i: int, body: list[dict[str, Any]],
             first: tuple[int, dict[str, Any] | None] | None = None) -> None:
        """Send request ``i`` (``first``: the outcome of its first attempt, made elsewhere)."""
        replica = i % 2
        attempts: list[tuple[int, int]] = []
        answer = None
        for _ in range(4):
            status, answer = first if first is not None and not attempts else self.post(replica, body)
            attempts.append((replica, status))
            if status not in (502, 503, 504, 599):
                break
            replica = 1 - replica
        self.attempts.append(attempts)
        self.answers.append(answer)


def kill_in_flight(client: Replicas, proc: Any, i: int, body: list[dict[str, Any]], store: Any, store_url: str,
                   moment: str, deadline: float) -> tuple[bool, float] | None:
    """Send request ``i`` to replica 0 and SIGKILL it at ``moment`` of the request: ``update`` once
    the online state's lock is held and nothing is written yet, ``answer`` once the update is
    written (the generation moved) and the answer not received. The client sends one request at a
    time, so the lock holder and the writer are replica 0. Returns whether the update was written
    before the kill and the seconds from the kill to the request's final answer; None when the
    request ended before that moment came (no kill; recorded as request ``i``)."""
    redis = Redis.from_url(store_url)
    try:
        generation = int(redis.get(store.generation_key) or 0)
        outcome: list[tuple[int, dict[str, Any] | None]] = []
        sender = threading.Thread(target=lambda: outcome.append(client.post(0, body)))
        sender.start()
        killed = False
        while sender.is_alive() and time.monotonic() < deadline:
            written = int(redis.get(store.generation_key) or 0) > generation
            if written if moment == "answer" else not written and redis.exists(store.lock_key):
                os.killpg(proc.pid, signal.SIGKILL)
                killed, at = True, time.monotonic()
                break
            time.sleep(POLL_S)
        sender.join(timeout=20)
        assert outcome, "the request to replica 0 neither finished nor failed"
        committed = int(redis.get(store.generation_key) or 0) > generation
    finally:
        redis.close()
    client.send(i, body, first=outcome[0])
    return (committed, time.monotonic() - at) if killed else None


@pytest.mark.parametrize("moment", ["update", "answer"])
def test_a_replica_killed_under_load_loses_no_transaction_and_applies_none_twice(tmp_path: Path, redis_url: str,
                                                                                 moment: str) -> None:
    from infra.online_state.redis_store import RedisStateStore
    from infra.serving.auth import KeyStore

    started = time.monotonic()
    deadline = started + BUDGET_S
    home = tmp_path / "home"
    register_model(home)
    key, _ = KeyStore(home / "serving" / "keys.json").add("replicas", ["fraud:score"])
    [requests] = transaction_streams(1, REQUESTS, ROWS)
    replicas = start_replicas(home, redis_url, extra_env={"INDUSFLOW_SERVE_REQUEST_TIMEOUT_S": str(ANSWER_WAIT_S)})
    (victim, _), (survivor, survivor_url) = replicas
    store = RedisStateStore(redis_url)
    client = Replicas([url for _, url in replicas], key)
    kill: tuple[bool, float] | None = None
    killed_request = -1
    try:
        t0 = time.monotonic()
        for i, body in enumerate(requests):
            assert time.monotonic() < deadline, f"over {BUDGET_S} s at request {i}"
            time.sleep(max(0.0, t0 + i / RATE - time.monotonic()))
            if kill is None and i >= KILL_FROM and i % 2 == 0:
                kill = kill_in_flight(client, victim, i, body, store, redis_url, moment, deadline)
                killed_request = i if kill is not None else -1
                continue
            client.send(i, body)
        assert kill is not None, f"replica 0 was never caught at the moment {moment!r}"
        assert victim.wait(timeout=10) == -signal.SIGKILL
        assert group_processes(victim.pid) == []  # the killed replica is gone
        assert httpx.get(f"{survivor_url}/readyz", timeout=5).status_code == 200
        survivor_pid = survivor.pid
    finally:
        client.http.close()
        store.close()
        for proc, _ in replicas:
            stop_server(proc)
    assert group_processes(survivor_pid) == []  # no process of either replica is left

    statuses = [[status for _, status in attempts] for attempts in client.attempts]
    assert all(s[-1] == 200 and s.count(200) == 1 for s in statuses), [
        (i, a) for i, a in enumerate(client.attempts) if a[-1][1] != 200]
    committed, retried_s = kill
    # before the kill every request was answered on its first attempt (a retry there would be the
    # machine's slowness, not the kill, and its answer may rightly be a replay)
    assert all(len(a) == 1 for a in client.attempts[:killed_request]), [
        (i, a) for i, a in enumerate(client.attempts[:killed_request]) if len(a) > 1]
    # the lost request: answered by the survivor on the first retry, within the lock's expiry (2 s)
    # when the dead replica held it; from the stored scores when its update was written (nothing
    # applied again). (Caught after the commit, the kill comes within a Redis round trip of it; the
    # answer has the lock's release, the route and the audit line ahead of it.)
    # At the moment "answer" the SIGKILL is sent from outside once the generation moved: now and
    # then the answer is already on its way (seen in 1 of 2 runs of this module at load ~3). That
    # request is then answered once by the dead replica and replayed by nobody; what this test
    # guards (nothing lost, nothing applied twice, the scores) is checked below either way. So at the
    # moment "update" when the update was written after all (the poller's two reads, generation then
    # lock, are not one atomic look: at load ~4.6 the replica wrote and answered between them, CI
    # 2026-12-07): that kill came at the moment "answer".
    lost = client.attempts[killed_request]
    beaten = committed and lost == [(0, 200)]
    assert beaten or lost == [(0, 599), (1, 200)], lost
    assert [i for i, a in enumerate(client.answers) if a and a.get("replayed")] == (
        [killed_request] if committed and not beaten else [])
    after = client.attempts[killed_request + 1:]
    assert all(a[-1] == (1, 200) for a in after)  # the survivor answered everything after the kill
    assert all(a == [(0, 599), (1, 200)] for a in after[1::2])  # and the dead replica nothing

    state = check_state(home, redis_url, [requests])
    assert state["lost"] == [] and state["doubled"] == [] and state["unknown"] == []
    assert state["account_counts_match"] and state["equal"]
    for i, (answer, want) in enumerate(zip(client.answers, state["scores"][0], strict=True)):
        assert answer is not None
        np.testing.assert_allclose([r["score"] for r in answer["results"]], want, atol=1e-5, err_msg=f"request {i}")
    print(f"replica killed at request {killed_request} ({moment}), update written: {committed}, answer sent "
          f"before the kill: {beaten}, answered "
          f"{retried_s:.2f} s after the kill; test {time.monotonic() - started:.1f} s")
