"""``python -m flows.serve keys ...`` and ``python -m flows.serve`` (a real server process)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from flows.serve.cli import main
from infra.home import HomeLayout
from infra.serving.runtime import key_store

ROOT = Path(__file__).resolve().parents[2]


def test_keys_add_list_revoke(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("INDUSFLOW_HOME", str(tmp_path))
    assert main(["keys", "add", "bank app", "--scope", "fraud:score", "--scope", "admin",
                 "--rate-limit", "50/minute", "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    added = json.loads(out[-1])
    key = added["key"]
    assert key in out[-2] and added["scopes"] == ["admin", "fraud:score"] and added["rate_limit"] == "50/minute"
    stored = (tmp_path / "serving" / "keys.json").read_text()
    assert key not in stored and key.split("_", 2)[2] not in stored  # only the salted hash is kept
    assert key_store(HomeLayout(tmp_path)).verify(key).key_id == added["key_id"]

    assert main(["keys", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["keys"]
    assert [k["key_id"] for k in listed] == [added["key_id"]] and "sha256" not in listed[0]

    assert main(["keys", "revoke", added["key_id"]]) == 0
    assert key_store(HomeLayout(tmp_path)).verify(key) is None
    capsys.readouterr()

    for argv, text in [
        (["keys", "add", "x", "--scope", "Fraud Score"], "scope 'Fraud Score'"),
        (["keys", "add", "x", "--scope", "fraud:score", "--rate-limit", "lots"], "rate limit 'lots'"),
        (["keys", "revoke", "0123456789ab"], "no API key with id"),
        (["keys", "add", "x"], "--scope"),
        (["--port", "70000"], "--port 70000"),
    ]:
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and text in err[0], (argv, err)


def test_keys_add_grants_every_documented_scope_and_binds_a_person(tmp_path, monkeypatch, capsys) -> None:
    """``kb:<c>:source`` and ``registry:approve:<model>`` can be granted; ``--person`` binds the key,
    and the record names the OS account that made it."""
    from infra.registry import current_actor

    monkeypatch.setenv("INDUSFLOW_HOME", str(tmp_path))
    assert main(["keys", "add", "validator", "--scope", "kb:legal:source", "--scope", "registry:approve:fraud-seq",
                 "--person", "bob", "--json"]) == 0
    added = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert added["scopes"] == ["kb:legal:source", "registry:approve:fraud-seq"]
    assert (added["person"], added["created_by"]) == ("bob", current_actor())
    assert key_store(HomeLayout(tmp_path)).verify(added["key"]).person == "bob"
    assert main(["keys", "add", "x", "--scope", "kb:legal:delete"]) == 2
    assert "read|write|source" in capsys.readouterr().err


def test_server_command_binds_loopback(tmp_path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "INDUSFLOW_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "flows.serve", "--port", str(port)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stdout.read().decode()
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.2)
        assert r.json() == {"status": "ok"}
        assert httpx.get(f"http://127.0.0.1:{port}/docs", timeout=5).status_code == 200
        listening = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
        local = {entry[1] for entry in listening if entry[3] == "0A"}  # LISTEN sockets
        assert f"0100007F:{port:04X}" in local  # 127.0.0.1, not 0.0.0.0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
