"""Fixtures of the serving tests: a real uvicorn server on 127.0.0.1, a tiny registered model,
API keys, and a Redis server when the binary is installed.

The toy model scores a row ``x`` (4 floats) as ``version * sum(x)``, so every response shows
which version scored it; a test can make it fail or slow down through :class:`ToyControl`.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import pytest
import torch
import uvicorn
from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from flows.serve.app import create_app
from infra.home import HomeLayout
from infra.registry import ModelRef, ModelRegistry
from infra.serving.audit import record_audit
from infra.serving.auth import Principal, require_scope
from infra.serving.protocol import GuardedHttpProtocol
from infra.serving.quotas import check_rows
from infra.serving.runtime import ServeTuning, Services, Vertical, key_store
from infra.settings import ServeSettings

TOY = "toy"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class ToyControl:
    """Switches the tests flip while the server runs (same process)."""

    fail: bool = False
    delay_s: float = 0.0
    load_delay_s: float = 0.0


class ToyRow(BaseModel):
    account_id: str
    x: list[float] = Field(min_length=4, max_length=4)


class ToyRequest(BaseModel):
    rows: list[ToyRow]


def register_toy(registry: ModelRegistry, weight: float) -> ModelRef:
    """A version whose weights are all ``weight``."""
    return registry.register(TOY, {"w": torch.full((4,), float(weight))}, params={}, metrics={"m": weight},
                             primary_metric="m")


def toy_builder(control: ToyControl) -> Callable[[Services], Vertical]:
    def build(services: Services) -> Vertical:
        def loader(ref: ModelRef) -> torch.Tensor:
            time.sleep(control.load_delay_s)
            return services.registry.load_state_dict(ref)["w"]

        slot = services.slot(TOY, loader)
        router = APIRouter()

        @router.post("/v1/toy/score")
        def score(body: ToyRequest, request: Request,
                  principal: Annotated[Principal, Depends(require_scope("toy:score"))]) -> dict[str, Any]:
            check_rows(request, len(body.rows))
            ref, weights = slot.current()
            with slot.breaker.guard():
                if control.fail:
                    raise RuntimeError("toy model failure")
                if control.delay_s:
                    time.sleep(control.delay_s)
                x = torch.tensor([r.x for r in body.rows])
                scores = (x @ weights).tolist()
            services.metrics.observe_batch(TOY, len(body.rows))
            flagged = sum(s > 10 for s in scores)
            record_audit(request, model=TOY, model_version=ref.version, rows=len(scores),
                         decisions={"flagged": flagged, "passed": len(scores) - flagged},
                         subjects=[r.account_id for r in body.rows])
            return {"model": TOY, "model_version": ref.version, "scores": scores}

        return Vertical(TOY, router, [slot])

    return build


@dataclass
class Live:
    """A running server."""

    url: str
    app: Any
    layout: HomeLayout
    registry: ModelRegistry
    control: ToyControl

    @property
    def services(self) -> Services:
        return self.app.state.serving

    def register(self, weight: float, promote: bool = True) -> ModelRef:
        """Register a toy version (weights all ``weight``); make it champion unless told not to."""
        ref = register_toy(self.registry, weight)
        if promote:
            self.registry.set_alias(TOY, "champion", ref.version)
        return ref

    def add_key(self, *scopes: str, rate_limit: str | None = None) -> str:
        key, _ = key_store(self.layout).add("test", scopes or ("toy:score",), rate_limit)
        return key


@pytest.fixture
def home(tmp_path: Path) -> HomeLayout:
    return HomeLayout(tmp_path / "home")


@pytest.fixture
def live_server(home: HomeLayout) -> Iterator[Callable[..., Live]]:
    """``live_server(**settings) -> Live``: a real uvicorn on 127.0.0.1 serving the toy vertical."""
    servers: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(champion: float | None = 1.0, control: ToyControl | None = None, **overrides: Any) -> Live:
        registry = ModelRegistry(home.registry())
        if champion is not None and TOY not in registry.models():
            ref = register_toy(registry, champion)
            registry.set_alias(TOY, "champion", ref.version)
        control = control or ToyControl()
        values = {"reload_poll_s": 0.1, "audit_salt": "test-salt", **overrides}
        tuning = ServeTuning(**{k: values.pop(k) for k in list(values) if k in ServeTuning.__dataclass_fields__})
        # the protocol `python -m flows.serve` runs, with this server's header limits
        header_limits = {k: values.pop(k) for k in ("header_timeout_s", "max_header_bytes") if k in values}
        settings = ServeSettings(**values)
        app = create_app(settings, build_verticals=[toy_builder(control)], layout=home, registry=registry,
                         tuning=tuning)
        port = free_port()
        protocol = type("TestGuardedHttpProtocol", (GuardedHttpProtocol,), header_limits)
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error",
                                               access_log=False, lifespan="on", http=protocol))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        servers.append((server, thread))
        deadline = time.monotonic() + 20
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        live = Live(f"http://127.0.0.1:{port}", app, home, registry, control)
        if champion is not None:
            deadline = time.monotonic() + 20
            while not all(s.ready for s in live.services.slots):
                assert time.monotonic() < deadline, "the toy model did not load"
                time.sleep(0.02)
        return live

    yield start
    for server, _thread in servers:
        server.should_exit = True
    for _server, thread in servers:
        thread.join(timeout=10)


@pytest.fixture
def redis_url() -> Iterator[str]:
    """A throwaway ``redis-server`` on 127.0.0.1 (skipped when the binary is not installed)."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (CI installs it: apt-get install redis-server)")
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
                assert proc.poll() is None and time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
