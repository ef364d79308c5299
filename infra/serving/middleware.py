"""The HTTP concerns every request shares, as one pure ASGI middleware (no per-request task).

In order: the IP allow-list (403), the body-size limit (413, from ``Content-Length`` and while
the body streams in), the per-request timeout (504), then — whatever the outcome — the request
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

from fastapi import Request
from fastapi.responses import JSONResponse

from infra.errors import DataValidationError
from infra.secrets import UpstreamError
from infra.serving.auth import client_address
from infra.serving.breaker import BreakerOpen
from infra.serving.runtime import Services
from infra.serving.slot import ModelNotReady

log = logging.getLogger(__name__)

#: Liveness and readiness probes: counted in the metrics, not audited (an orchestrator calls them
#: every few seconds, without a credential, and they reveal nothing). ``/metrics`` is audited.
PROBES = frozenset({"/healthz", "/readyz"})
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


class ServingMiddleware:
    """IP allow-list, body-size limit, timeout, metrics and audit around the app."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], services: Services) -> None:
        self.app = app
        self.services = services
        self.networks = parse_networks(services.settings.allowed_networks())

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
            try:
                async with asyncio.timeout(timeout_s):
                    await self.app(scope, receive_wrapper, send_wrapper)
            except TimeoutError:
                if not status["started"]:
                    await _send_json(send_wrapper, 504, {"detail": f"request took over {timeout_s} s"})
            except Exception as exc:  # noqa: BLE001 - any failure of a route becomes a 500, logged
                if status["refused"]:
                    return
                # the traceback without the message: a message may quote request data
                log.error("%s %s failed: %s\n%s", scope["method"], scope["path"], type(exc).__name__,
                          "".join(traceback.format_tb(exc.__traceback__)))
                if not status["started"]:
                    await _send_json(send_wrapper, 500, {"detail": f"internal error ({type(exc).__name__})"})
        finally:
            if not status["accounted"]:
                self._account(scope, state, status["code"], time.perf_counter() - start)

    def _account(self, scope: Scope, state: dict[str, Any], code: int, elapsed: float) -> None:
        route = scope.get("route")
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
