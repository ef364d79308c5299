"""Connection hygiene: a client cannot hold sockets or memory with headers it never finishes.

Bounded slow clients on loopback against a real uvicorn running ``flows.serve``'s protocol
(``infra.serving.protocol.GuardedHttpProtocol``), with a 1 s header deadline. On the protocol
uvicorn ships, every stalled connection of these tests stays open and the 1 MB header is buffered.
"""

from __future__ import annotations

import select
import socket
import time
from urllib.parse import urlsplit

import httpx

DEADLINE_S = 1.0
# How long a test waits for the server to close a stalled connection. The 408 and the close are the
# events checked; a time far above the deadline keeps a loaded machine from failing them (uvicorn's own
# protocol never closes these connections: it still fails, after this long).
CLOSE_WAIT_S = 30 * DEADLINE_S


def _connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=5)
    return sock


def _read_until_closed(sock: socket.socket, limit_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and when it closed (s)."""
    start = time.monotonic()
    sock.settimeout(limit_s)
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except TimeoutError:
        return got + b"<still open>", time.monotonic() - start
    return got, time.monotonic() - start


def test_stalled_headers_get_408_and_the_socket_back(live_server) -> None:
    live = live_server(header_timeout_s=DEADLINE_S)
    stalled = []
    for i in range(100):
        sock = _connect(live.url)
        if i % 3 == 0:
            pass  # connects and sends nothing
        elif i % 3 == 1:
            sock.sendall(b"POST /v1/toy/score HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never ends its headers
        else:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHo")
        stalled.append(sock)
    # the server still answers others meanwhile
    assert httpx.get(f"{live.url}/healthz", timeout=5).status_code == 200
    started = time.monotonic()
    for sock in stalled:
        got, _ = _read_until_closed(sock, limit_s=max(0.1, started + CLOSE_WAIT_S - time.monotonic()))
        sock.close()
        assert got.startswith(b"HTTP/1.1 408 Request Timeout"), got[:200]
        assert b"connection: close" in got and not got.endswith(b"<still open>")


def test_a_trickle_of_header_bytes_does_not_extend_the_deadline(live_server) -> None:
    live = live_server(header_timeout_s=DEADLINE_S)
    sock = _connect(live.url)
    trickle = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200
    sent, got = 0, b""
    for byte in trickle:
        try:
            sock.sendall(bytes([byte]))  # one byte every 50 ms at least (10 s in all), never the end of the headers
        except OSError:
            break
        sent += 1
        readable, _, _ = select.select([sock], [], [], 0.05)
        if readable:
            got = sock.recv(65536)
            break
    sock.close()
    assert got.startswith(b"HTTP/1.1 408"), got[:200]
    # answered while the trickle went on (a byte every 50 ms, far inside the deadline): the bytes did
    # not restart it (had they, the 408 could only come after the last byte, or never)
    assert sent < len(trickle), (sent, len(trickle))


def test_a_kept_alive_connection_gets_the_deadline_for_its_next_request(live_server) -> None:
    live = live_server(header_timeout_s=DEADLINE_S)
    sock = _connect(live.url)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    sock.settimeout(5)
    first = sock.recv(65536)
    assert first.startswith(b"HTTP/1.1 200"), first[:200]
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 1")  # the second request stalls in its headers
    got, _ = _read_until_closed(sock, limit_s=CLOSE_WAIT_S)
    sock.close()
    assert got.startswith(b"HTTP/1.1 408"), got[:200]  # the header deadline's answer: a keep-alive close sends none


def test_oversized_headers_get_431_and_nothing_is_buffered(live_server) -> None:
    live = live_server(header_timeout_s=30.0, max_header_bytes=16_384)
    sock = _connect(live.url)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    sent = 0
    try:
        while sent < 1_000_000:  # a 1 MB header the client never finishes
            sock.sendall(b"X-Pad: " + b"p" * 8185 + b"\r\n")
            sent += 8194
    except OSError:
        pass  # the server closed the connection before the client was done: as it should
    got, _ = _read_until_closed(sock, limit_s=5)
    sock.close()
    assert got.startswith(b"HTTP/1.1 431 Request Header Fields Too Large"), got[:200]
    # complete headers over the cap, arriving in one read, are refused the same way
    sock = _connect(live.url)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"p" * 20_000 + b"\r\n\r\n")
    got, _ = _read_until_closed(sock, limit_s=5)
    sock.close()
    assert got.startswith(b"HTTP/1.1 431"), got[:200]
    # a request with ordinary headers and a large body (body bytes are not header bytes) still works
    body = b'{"rows": [' + b",".join(b'{"x": 1.0}' for _ in range(20_000)) + b"]}"
    response = httpx.post(f"{live.url}/healthz", content=body, timeout=10)
    assert response.status_code in (405, 413), response.status_code  # the route's answer, not 431
    assert httpx.get(f"{live.url}/healthz", headers={"X-Ok": "y" * 8000}, timeout=5).status_code == 200
