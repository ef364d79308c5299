"""The API's HTTP/1.1 protocol: uvicorn's httptools protocol with a header deadline and size cap.

uvicorn bounds a request once its headers are in (our 504 timeout, the body cap), and an idle
keep-alive connection (5 s), but not the headers themselves: a client that opens a connection and
never finishes its headers holds the socket for ever (a review left 2,000 of 2,000 open after
27 s), and an unfinished header is buffered however large it grows (20 MB). This protocol adds:

- a deadline for the request line and headers (:data:`HEADER_TIMEOUT_S`), counted
  from the connection (or, on a kept-alive connection, from the next request's first byte) and
  not extended by a trickle of bytes: past it the client gets ``408`` and the connection closes;
- a cap on their size (:data:`MAX_HEADER_BYTES`), counted on the bytes as they
  arrive, before the parser sees them: above it ``431`` and close, and nothing over the cap is
  ever buffered.

Both answers are written directly: there is no request yet for the app (or its audit log) to
see. ``flows.serve`` passes this class as uvicorn's ``http``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

#: After a 408 or 431, how long the connection may stay half-closed while the client stops sending.
LINGER_S = 2.0

#: Longest a client may take to send a request's line and headers, from its connection or its first byte
#: (408 and close after): well above any real client's, and slow or stalled clients hold no socket for long.
HEADER_TIMEOUT_S = 10.0
#: Largest request line plus headers (431 and close above): 64 KiB, four times nginx's default large buffer
#: (4 x 8 KiB), room for long bearer tokens and cookies.
MAX_HEADER_BYTES = 65_536
_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


def _refusal(status: int, message: str) -> bytes:
    body = message.encode("ascii")
    return b"".join([
        b"HTTP/1.1 %d %s\r\n" % (status, _REASONS[status]),
        b"content-type: text/plain; charset=utf-8\r\n",
        b"content-length: %d\r\n" % len(body),
        b"connection: close\r\n\r\n", body])


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with a deadline and a size cap on each request's headers.

    The limits are class attributes (a subclass sets its own, as the tests do).
    """

    header_timeout_s: float = HEADER_TIMEOUT_S
    max_header_bytes: int = MAX_HEADER_BYTES

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._awaiting_headers = True
        self._header_bytes, self._header_tail = 0, b""
        self._header_deadline: asyncio.TimerHandle | None = None
        self._discarding = False

    # -- the deadline ----------------------------------------------------------------------
    def _arm_header_deadline(self) -> None:
        if self._header_deadline is None:
            self._header_deadline = self.loop.call_later(self.header_timeout_s, self._headers_overdue)

    def _disarm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_overdue(self) -> None:
        self._header_deadline = None
        if self._awaiting_headers:
            self._refuse(408, f"request headers not received within {self.header_timeout_s:g} s")

    def _refuse(self, status: int, message: str) -> None:
        self._awaiting_headers = False
        self._disarm_header_deadline()
        if self.transport.is_closing():
            return
        self.transport.write(_refusal(status, message))
        # a lingering close: the answer and a FIN go out, what the client still sends is read and
        # dropped, and the socket closes when the client closes or after LINGER_S. Closing at once
        # with unread bytes makes the kernel reset the connection, and the client never reads the
        # answer.
        self._discarding = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)

    # -- uvicorn's protocol hooks ----------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._discarding or self.transport.is_closing():
            return
        if self._awaiting_headers:
            self._arm_header_deadline()
            # measured before the parser sees the bytes: the headers end at the first empty line
            # (one read may carry their end and the start of the body, which does not count)
            seen = self._header_tail + data
            end = seen.find(b"\r\n\r\n")
            size = self._header_bytes + (end + 4 - len(self._header_tail) if end >= 0 else len(data))
            if size > self.max_header_bytes:
                self._refuse(431, f"request line and headers exceed {self.max_header_bytes} bytes")
                return
            if end < 0:
                self._header_bytes, self._header_tail = size, seen[-3:]
        super().data_received(data)

    def eof_received(self) -> bool | None:
        if self._discarding:
            self.transport.close()
        return super().eof_received()

    def on_headers_complete(self) -> None:
        self._awaiting_headers = False
        self._disarm_header_deadline()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        # the next bytes on this connection begin the next request; uvicorn's keep-alive timeout
        # covers the idle time until they come, the deadline starts with them
        self._awaiting_headers = True
        self._header_bytes, self._header_tail = 0, b""
        super().on_response_complete()
