"""A bank waits for the federation server to listen instead of dying on its first refusal
(a CI run hung: both banks started before the server listened, were refused and exited, and the
server waited for them)."""

from __future__ import annotations

import socket
import threading

import pytest

from solutions.fraud.flower_apps import wait_for_server


def test_a_bank_waits_until_the_server_listens(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there yet

    tries: list[int] = []
    refused_twice = threading.Event()
    connect = socket.create_connection

    def counted(*args, **kwargs):  # the bank's connection attempts, counted
        tries.append(1)
        try:
            return connect(*args, **kwargs)
        finally:
            if len(tries) >= 2:
                refused_twice.set()

    monkeypatch.setattr(socket, "create_connection", counted)

    def listen_later() -> None:
        refused_twice.wait(30)
        server.bind(("127.0.0.1", port))
        server.listen()

    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    thread = threading.Thread(target=listen_later)
    thread.start()
    try:
        wait_for_server(f"127.0.0.1:{port}", timeout_s=60)
        assert len(tries) >= 3  # refused (nothing listened) and tried again, not gone on the first refusal
        server.settimeout(10)
        server.accept()[0].close()  # it returned on a connection the listening server accepted
    finally:
        refused_twice.set()
        thread.join()
        server.close()


def test_a_bank_gives_up_with_a_clear_error() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    with pytest.raises(RuntimeError, match="accepted no connection within 0.5 s"):
        wait_for_server(f"127.0.0.1:{port}", timeout_s=0.5)
