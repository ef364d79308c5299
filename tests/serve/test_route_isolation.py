"""Routes and clients are isolated from each other (issue 46).

* A slow route (the knowledge base's ask, its LLM stuck) holds at most its cap of requests in
  flight, and one key at most its own cap: 45 concurrent slow asks left the fraud labels route and
  the registry approvals without a worker thread (504) on main's code. Here the slow route is a
  stand-in whose handler blocks in the worker pool until the test releases it, with the caps the
  knowledge base declares; asserted on statuses and counts, never on wall-clock time.
* Authentication happens before any body is read: an unauthenticated client trickling a body gets
  its 401 at once instead of holding the connection for the route's timeout.
* Requests no route counts (a 404, a malformed body, ``/openapi.json``) are rate-limited too, so
  they cannot flood the audit log.
* A JWT whose ``exp`` is a numeric string gets 401 (it answered 500).
* ``/readyz`` answers 503 while the champion's breaker is open.
"""

from __future__ import annotations

import datetime as dt
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any

import httpx
import jwt
import pytest
from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel

from flows.serve import registry as serve_registry
from flows.serve.app import create_app
from flows.serve.kb import SLOW_ROUTE_CONCURRENCY, SLOW_ROUTE_PER_KEY
from infra.home import HomeLayout
from infra.registry import ModelRegistry
from infra.serving.auth import Principal, require_scope
from infra.serving.runtime import RouteLimits, ServeTuning, Services, Vertical, key_store
from infra.settings import ServeSettings
from tests.serve.conftest import ToyControl, register_toy, toy_builder
from tests.serve.kb_helpers import serving

BODY = {"rows": [{"account_id": "A1", "x": [1.0, 2.0, 3.0, 4.0]}]}
SLOW = "/v1/slow/ask"
ASKS = 45


class Question(BaseModel):
    question: str


class StuckUpstream:
    """What the slow route waits on: callers block in the worker pool until :meth:`release`."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.waiting = 0
        self.most_waiting = 0
        self._lock = threading.Lock()

    def call(self) -> None:
        with self._lock:
            self.waiting += 1
            self.most_waiting = max(self.most_waiting, self.waiting)
        try:
            assert self.released.wait(60), "the test never released the upstream"
        finally:
            with self._lock:
                self.waiting -= 1

    def release(self) -> None:
        self.released.set()


def slow_builder(upstream: StuckUpstream) -> Callable[[Services], Vertical]:
    def build(services: Services) -> Vertical:
        services.route_limits[SLOW] = RouteLimits(concurrency=SLOW_ROUTE_CONCURRENCY, per_key=SLOW_ROUTE_PER_KEY)
        router = APIRouter()

        @router.post(SLOW)
        async def ask(body: Question, request: Request,
                      principal: Annotated[Principal, Depends(require_scope("slow:ask"))]) -> dict[str, str]:
            await run_in_threadpool(upstream.call)  # as the KB's ask waits on its LLM
            return {"answer": body.question}

        return Vertical("slow", router)

    return build


@pytest.fixture
def server(tmp_path) -> Iterator[tuple[str, HomeLayout, StuckUpstream, Any]]:
    home = HomeLayout(tmp_path / "home")
    registry = ModelRegistry(home.registry())
    registry.set_alias("toy", "champion", register_toy(registry, 1.0).version)
    upstream = StuckUpstream()
    settings = ServeSettings(audit_salt="test-salt", request_timeout_s=30, default_rate_limit="5/minute")
    app = create_app(settings, layout=home, registry=registry,
                     tuning=ServeTuning(reload_poll_s=0.1, unauthenticated_rate_limit="3/minute"),
                     build_verticals=[toy_builder(ToyControl()), serve_registry.build, slow_builder(upstream)])
    try:
        with serving(app, lifespan="on") as url:
            deadline = time.monotonic() + 20
            while not all(s.ready for s in app.state.serving.slots):
                assert time.monotonic() < deadline, "the toy model did not load"
                time.sleep(0.02)
            yield url, home, upstream, app
    finally:
        upstream.release()


def _key(home: HomeLayout, *scopes: str, rate: str | None = "1000/minute") -> str:
    return key_store(home).add("isolation", scopes, rate)[0]


def test_slow_asks_cannot_starve_the_other_routes(server) -> None:
    url, home, upstream, _ = server
    askers = [_key(home, "slow:ask") for _ in range(9)]  # 5 asks each
    scorer, approver = _key(home, "toy:score"), _key(home, "registry:approve")

    def ask(i: int) -> httpx.Response:
        with httpx.Client(timeout=60) as client:
            return client.post(f"{url}{SLOW}", json={"question": f"q{i}"}, headers={"X-API-Key": askers[i % 9]})

    with ThreadPoolExecutor(ASKS) as pool:
        futures = [pool.submit(ask, i) for i in range(ASKS)]
        deadline = time.monotonic() + 60  # a failure detector, not a measurement
        while sum(f.done() for f in futures) < ASKS - SLOW_ROUTE_CONCURRENCY:
            assert time.monotonic() < deadline, "the asks over the caps were not refused"
            time.sleep(0.02)
        refused = [f.result() for f in futures if f.done()]
        assert upstream.waiting == SLOW_ROUTE_CONCURRENCY  # the route's cap, all in the worker pool
        assert {r.status_code for r in refused} <= {429, 503}, {r.status_code for r in refused}
        assert all(r.headers["Retry-After"] == "1" for r in refused)
        # while the slow route holds everything it may: every other route answers, several times
        with httpx.Client(timeout=30) as client:
            for _ in range(3):
                scored = client.post(f"{url}/v1/toy/score", json=BODY, headers={"X-API-Key": scorer})
                assert scored.status_code == 200, scored.text
                approvals = client.get(f"{url}/v1/registry/approvals", headers={"X-API-Key": approver})
                assert approvals.status_code == 200, approvals.text
        upstream.release()
        answered = [f.result() for f in futures if f.result() not in refused]
    assert [r.status_code for r in answered] == [200] * SLOW_ROUTE_CONCURRENCY
    assert upstream.most_waiting == SLOW_ROUTE_CONCURRENCY


def test_one_key_gets_at_most_its_share_of_a_slow_route(server) -> None:
    url, home, upstream, _ = server
    greedy, other = _key(home, "slow:ask"), _key(home, "slow:ask")

    def ask(key: str) -> httpx.Response:
        with httpx.Client(timeout=60) as client:
            return client.post(f"{url}{SLOW}", json={"question": "q"}, headers={"X-API-Key": key})

    with ThreadPoolExecutor(10) as pool:
        greedy_asks = [pool.submit(ask, greedy) for _ in range(10)]
        deadline = time.monotonic() + 60
        while sum(f.done() for f in greedy_asks) < 10 - SLOW_ROUTE_PER_KEY:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert {f.result().status_code for f in greedy_asks if f.done()} == {429}
        other_ask = pool.submit(ask, other)  # another key still gets in
        while upstream.waiting < SLOW_ROUTE_PER_KEY + 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        upstream.release()
        assert other_ask.result().status_code == 200


def test_an_unauthenticated_trickled_body_is_answered_401_before_it_is_read(server) -> None:
    url, *_ = server
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"POST {SLOW} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                     "Content-Length: 100000\r\n\r\n{\"question\": \"".encode())
        answer = sock.recv(4096)  # the client has sent 14 of the 100,000 bytes and sends no more
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        assert b"connection: close" in answer.lower()
        while answer:  # and the server closes the connection (a timeout here fails the test)
            answer = sock.recv(4096)


def test_requests_no_route_counts_are_rate_limited(server) -> None:
    url, home, *_ = server
    key = _key(home, "toy:score", rate="3/minute")
    with httpx.Client(timeout=30) as client:
        # a key's malformed bodies and unknown paths count against its limit like its other requests
        bad = [client.post(f"{url}/v1/toy/score", content=b"{not json", headers={
            "X-API-Key": key, "content-type": "application/json"}).status_code for _ in range(2)]
        assert bad == [422, 422]
        assert client.get(f"{url}/v1/no-such-route", headers={"X-API-Key": key}).status_code == 404
        assert client.post(f"{url}/v1/toy/score", json=BODY, headers={"X-API-Key": key}).status_code == 429
        # without a credential: malformed bodies get 401 (never parsed), then 429 per address
        codes = [client.post(f"{url}/v1/toy/score", content=b"{not json").status_code for _ in range(4)]
        assert codes == [401, 401, 401, 429], codes
        # paths that need no credential: the default key rate, per address (5/minute here)
        public = [client.get(f"{url}{path}").status_code
                  for path in ("/openapi.json", "/nope", "/openapi.json", "/nope", "/openapi.json", "/nope")]
        assert public == [200, 404, 200, 404, 200, 429], public
        assert client.get(f"{url}/healthz").status_code == 200  # probes are never limited


def test_a_jwt_whose_exp_is_a_numeric_string_gets_401(tmp_path) -> None:
    secret = "s3cret-for-tests-only-32-bytes-long!"
    home = HomeLayout(tmp_path / "home")
    registry = ModelRegistry(home.registry())
    registry.set_alias("toy", "champion", register_toy(registry, 1.0).version)
    app = create_app(ServeSettings(audit_salt="test-salt", jwt_hs256_secret=secret), layout=home, registry=registry,
                     build_verticals=[toy_builder(ToyControl())])
    exp = str(int((dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)).timestamp()))
    token = jwt.encode({"sub": "svc", "scope": "toy:score", "exp": exp}, secret, algorithm="HS256")
    with serving(app, lifespan="on") as url, httpx.Client(timeout=30) as client:
        r = client.post(f"{url}/v1/toy/score", json=BODY, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 401, r.text


def test_readyz_answers_503_while_the_champion_breaker_is_open(server) -> None:
    url, _, _, app = server
    [slot] = app.state.serving.slots
    with httpx.Client(timeout=30) as client:
        assert client.get(f"{url}/readyz").status_code == 200
        for _ in range(slot.breaker.min_calls):
            slot.breaker.record(False, "RuntimeError")
        r = client.get(f"{url}/readyz")
        assert r.status_code == 503, r.text
        assert "breaker" in r.json()["waiting"]["toy"]
