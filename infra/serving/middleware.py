"""The HTTP concerns every request shares, as one pure ASGI middleware (no per-request task).

In order: the IP allow-list (403), the body-size limit (413, from ``Content-Length`` and while
the body streams in), authentication of the API's paths (``/v1/...``, ``/metrics``: 401, before
the app reads any body — FastAPI reads a body before it runs a route's dependencies, so an
unauthenticated client could otherwise hold a connection for a route's whole timeout by
trickling one) and a per-address rate limit on every other path but the probes (``/docs``,
``/openapi.json``, unknown paths: 429, so requests no credential answers for cannot flood the
audit log), the concurrency caps of a route and of one key on it (:class:`RouteGate`: 503 / 429),
the per-request timeout (504), then — whatever the outcome — the request
metrics and one audit line with the client address (probes ``/healthz`` and ``/readyz`` are
counted but not audited; ``/metrics`` and every refusal, 401/403/429 included, are). Plus the
exception handlers that turn an open breaker or a model not yet loaded into a 503 with a reason
and ``Retry-After``, and a request the code finds invalid past FastAPI's own validation (a
:class:`~infra.errors.DataValidationError`, a malformed multipart body) into a 4xx that says what
is wrong, never a 500.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import json
import logging
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fastapi import HTTPException, Request
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.routing import Match

from infra.errors import DataValidationError
from infra.secrets import UpstreamError
from infra.serving.auth import RATE_COUNTED, authenticate_request, client_address, count_request
from infra.serving.breaker import BreakerOpen
from infra.serving.quotas import Refusal, RouteGate
from infra.serving.runtime import Services
from infra.serving.slot import ModelNotReady

log = logging.getLogger(__name__)

#: Liveness and readiness probes: counted in the metrics, not audited (an orchestrator calls them
#: every few seconds, without a credential, and they reveal nothing). ``/metrics`` is audited.
PROBES = frozenset({"/healthz", "/readyz"})
#: Paths whose every route needs a credential: authenticated here, before any body is read.
AUTHENTICATED_PREFIXES = ("/v1/", "/metrics")
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def parse_networks(entries: Sequence[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """Networks of the allow-list (``10.0.0.0/8``, ``127.0.0.1``); ValueError names a bad entry."""
    out = []
    for entry in entries:
        try:
            out.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(f"INDUSFLOW_SERVE_IP_ALLOW_LIST: {entry!r} is not an address or network") from None
    return out


async def _send_json(send: Send, status: int, body: dict[str, Any], headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    payload = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": payload})


def _has_body(scope: Scope) -> bool:
    """Whether a request announces a body (a length above 0, or chunks)."""
    headers = dict(scope["headers"])
    return headers.get(b"content-length", b"0") != b"0" or b"transfer-encoding" in headers


def _route_of(scope: Scope) -> Any:
    """The route a request refused before routing (401, 429) would have reached, for its audit line
    and metrics (None: no route matches)."""
    app = scope.get("app")
    for route in getattr(getattr(app, "router", None), "routes", ()):
        if route.matches(scope)[0] == Match.FULL:
            return route
    return None


def _refusal(exc: HTTPException) -> Refusal:
    return exc.status_code, {"detail": exc.detail}, dict(exc.headers or {})


class ServingMiddleware:
    """IP allow-list, body-size limit, authentication, route caps, timeout, metrics and audit around the app."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], services: Services) -> None:
        self.app = app
        self.services = services
        self.networks = parse_networks(services.settings.allowed_networks())
        self.gate = RouteGate()

    async def _admit(self, scope: Scope, state: dict[str, Any]) -> Refusal | None:
        """Authenticate a request to the API's paths before its body is read (the principal is left
        on its state for the route's dependency), or count a request to any other path but the
        probes against its client address (the default key rate: docs pages load several files)."""
        path = scope["path"]
        services = self.services
        try:
            if path.startswith(AUTHENTICATED_PREFIXES):
                state["principal"] = await authenticate_request(services, scope, Headers(scope=scope))
            elif path not in PROBES:
                await count_request(services, f"public:{client_address(scope)}", None, "public")
        except HTTPException as exc:
            return _refusal(exc)
        return None

    async def _count_unrouted(self, state: dict[str, Any]) -> None:
        """Count an authenticated request that ended before its route counted it (a 404, a body
        refused by validation) against its key's limit: every request of a key counts once."""
        principal = state.get("principal")
        if principal is None or state.get(RATE_COUNTED):
            return
        try:
            await self.services.limiter.hit(principal.key_id, principal.rate_limit)
        except Exception as exc:  # noqa: BLE001 - the answer is sent; a down counter store is logged
            log.warning("rate limiter unavailable: %s", type(exc).__name__)

    def _allowed(self, scope: Scope) -> bool:
        if not self.networks:
            return True
        client = scope.get("client")
        if not client:
            return False
        try:
            address = ipaddress.ip_address(client[0])
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped  # ::ffff:10.1.2.3 on a dual-stack socket
        return any(address in net for net in self.networks)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        max_body, timeout_s = self.services.limits_for(scope["path"])
        state = scope.setdefault("state", {})
        status = {"code": 500, "started": False, "refused": False, "accounted": False}

        async def send_wrapper(message: dict[str, Any]) -> None:
            if status["refused"]:
                return  # the body-size answer was sent: the app's own answer is dropped
            if message["type"] == "http.response.start":
                status["code"], status["started"] = message["status"], True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                # the audit line is written before the caller has the answer
                status["accounted"] = True
                self._account(scope, state, status["code"], time.perf_counter() - start)
            await send(message)

        received = 0

        async def receive_wrapper() -> dict[str, Any]:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request" and not status["refused"]:
                received += len(message.get("body", b""))
                if received > max_body:
                    if not status["started"]:
                        await _send_json(send_wrapper, 413, {"detail": f"request body over {max_body} bytes"})
                    status["refused"] = True
                    return {"type": "http.disconnect"}  # the app stops reading and its answer is dropped
            return message

        try:
            if not self._allowed(scope):
                await _send_json(send_wrapper, 403, {"detail": "this client address is not allowed"})
                return
            length = dict(scope["headers"]).get(b"content-length")
            if length is not None and (not length.isdigit() or int(length) > max_body):
                await _send_json(send_wrapper, 413, {"detail": f"request body over {max_body} bytes"})
                return
            refused = await self._admit(scope, state)
            leave = None
            if refused is None:
                principal = state.get("principal")
                prefix, limits = self.services.route_limits_for(scope["path"])
                entered = self.gate.enter(prefix, limits, principal.key_id if principal is not None else None)
                refused, leave = (entered, None) if isinstance(entered, tuple) else (None, entered)
            if refused is not None:
                code, body, headers = refused
                # the body is never read: the connection closes after the answer, so a client that
                # trickles one holds nothing (uvicorn honours "connection: close")
                extra = [(b"connection", b"close")] if _has_body(scope) else []
                await _send_json(send_wrapper, code, body,
                                 [*((k.lower().encode(), v.encode()) for k, v in headers.items()), *extra])
                return
            try:
                await self._run(scope, receive_wrapper, send_wrapper, status, timeout_s)
            finally:
                if leave is not None:
                    leave()
                await self._count_unrouted(state)
        finally:
            if not status["accounted"]:
                self._account(scope, state, status["code"], time.perf_counter() - start)

    async def _run(self, scope: Scope, receive: Receive, send: Send, status: dict[str, Any], timeout_s: float) -> None:
        """The app within the request's time limit: 504 past it, 500 for any failure (logged)."""
        try:
            async with asyncio.timeout(timeout_s):
                await self.app(scope, receive, send)
        except TimeoutError:
            if not status["started"]:
                await _send_json(send, 504, {"detail": f"request took over {timeout_s} s"})
        except Exception as exc:  # noqa: BLE001 - any failure of a route becomes a 500, logged
            if status["refused"]:
                return
            # the traceback without the message: a message may quote request data
            log.error("%s %s failed: %s\n%s", scope["method"], scope["path"], type(exc).__name__,
                      "".join(traceback.format_tb(exc.__traceback__)))
            if not status["started"]:
                await _send_json(send, 500, {"detail": f"internal error ({type(exc).__name__})"})

    def _account(self, scope: Scope, state: dict[str, Any], code: int, elapsed: float) -> None:
        route = scope.get("route") or _route_of(scope)
        endpoint = getattr(route, "path", None) or "unmatched"
        metrics = self.services.metrics
        metrics.requests.labels(endpoint=endpoint, method=scope["method"], status=str(code)).inc()
        metrics.latency.labels(endpoint=endpoint).observe(elapsed)
        if scope["path"] in PROBES:
            return
        principal = state.get("principal")
        entry: dict[str, Any] = {
            "time": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
            "request_id": uuid.uuid4().hex,
            "key_id": getattr(principal, "key_id", None),
            "client": client_address(scope),
            "method": scope["method"],
            "endpoint": endpoint,
            "status": code,
            "latency_ms": round(elapsed * 1000, 3),
        }
        entry.update(state.get("audit") or {})
        try:
            self.services.audit.write(entry)
        except OSError as exc:  # a full disk must not turn answers into errors; it is logged
            log.error("audit log write failed: %s", exc)


async def breaker_open_handler(request: Request, exc: Exception) -> JSONResponse:
    """503 with the breaker's reason and the cool-down left."""
    assert isinstance(exc, BreakerOpen)
    return JSONResponse({"detail": str(exc), "reason": exc.reason}, status_code=503,
                        headers={"Retry-After": str(max(1, round(exc.retry_after_s)))})


async def not_ready_handler(request: Request, exc: Exception) -> JSONResponse:
    """503 while the model is not loaded."""
    return JSONResponse({"detail": str(exc), "reason": "model not loaded"}, status_code=503,
                        headers={"Retry-After": "5"})


async def invalid_data_handler(request: Request, exc: Exception) -> JSONResponse:
    """422 naming the offending column and rows (the message is already redacted)."""
    assert isinstance(exc, DataValidationError)
    return JSONResponse({"detail": {"error": str(exc), "column": exc.column, "rows": exc.rows}}, status_code=422)


async def malformed_form_handler(request: Request, exc: Exception) -> JSONResponse:
    """400 for a multipart/form-data body that cannot be parsed."""
    return JSONResponse({"detail": f"malformed multipart/form-data body: {exc}"}, status_code=400)


async def upstream_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """502 naming the failed service and its status; its (scrubbed) message goes to the log only."""
    assert isinstance(exc, UpstreamError)
    log.error("%s %s: %s", request.method, request.url.path, exc)
    return JSONResponse({"detail": exc.public_text()}, status_code=502)


def _form_errors() -> dict[type[Exception], Callable[[Request, Exception], Awaitable[JSONResponse]]]:
    try:
        from python_multipart.exceptions import FormParserError
    except ImportError:  # python-multipart comes with the upload routes' extra
        return {}
    return {FormParserError: malformed_form_handler}


EXCEPTION_HANDLERS: dict[type[Exception], Callable[[Request, Exception], Awaitable[JSONResponse]]] = {
    BreakerOpen: breaker_open_handler,
    ModelNotReady: not_ready_handler,
    DataValidationError: invalid_data_handler,
    UpstreamError: upstream_error_handler,
    **_form_errors(),
}
