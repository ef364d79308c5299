"""The secrets boundary: one scrubber for every HTTP client's errors, no credential URL in job variables."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from infra.secrets import http_error_text, scrub, url_credentials

KEY = "sk-test-Zx81fQ2LmN7pR4vB9kW3"


def test_scrub_removes_headers_pairs_userinfo_and_known_values() -> None:
    text = (f'{{"echo": {{"headers": {{"Authorization": "Bearer {KEY}"}}}}, "api_key": "abc123xyz"}} '
            "postgresql://svc:hunter2@db:5432/prefect https://h/v1?token=t0k3n&x=1 Basic dXNlcjpwYXNz")
    clean = scrub(text, [KEY])
    for secret in (KEY, "abc123xyz", "hunter2", "svc:", "t0k3n", "dXNlcjpwYXNz"):
        assert secret not in clean, secret
    assert "db:5432/prefect" in clean and "x=1" in clean  # what is not secret stays readable
    # cut by the limit in the middle of the key: the half left is still not shown
    assert KEY[:10] not in http_error_text(401, "x" * 190 + KEY, [KEY])
    assert scrub(f"an unknown sk-live-{'a' * 20} key shape") == "an unknown *** key shape"


def test_scrub_catches_escaped_url_encoded_and_base64_forms_of_known_secrets() -> None:
    import base64
    from urllib.parse import quote, quote_plus

    key = "Q2xm/9vT+rB7kW3pL4nZ8/uX=="
    echoes = [json.dumps({"k": key}).replace("/", "\\/"), json.dumps({"k": key}), quote(key, safe=""),
              quote(key, safe="").replace("%2F", "%2f"), quote_plus(key)]
    for echo in echoes:
        clean = scrub(f"error: {echo} end", [key])
        assert "***" in clean and clean.startswith("error: ") and clean.endswith(" end"), (echo, clean)
        assert not any(key[i:i + 4] in clean for i in range(len(key) - 3)), (echo, clean)
    # base64, alone or inside a longer encoded value: at most the few characters next to the key
    # (which mix its bits with its neighbours') stay
    for prefix in ("", "u:", "Bearer "):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            echo = encode(f"{prefix}{key}!".encode()).decode()
            clean = scrub(f"error: {echo} end", [key])
            left = clean.split()[1]
            assert "***" in left and len(left.replace("***", "")) <= len(prefix) * 4 // 3 + 6, (echo, clean)


def test_url_credentials() -> None:
    assert url_credentials("http://user:pw@milvus:19530") == "password"
    assert url_credentials("postgresql+asyncpg://u:pw@db/x") == "password"
    assert url_credentials("https://tika:9998/?access_token=abc") == "query"
    assert url_credentials("a,https://ghp_abcdefabcdefabcdef1234@github.com/x") == "token"
    for fine in ("http://milvus:19530", "/data/home", "sqlite:///x.db", "http://127.0.0.1:8000/v1"):
        assert url_credentials(fine) is None, fine


def test_apply_refuses_credential_urls_in_job_variables(monkeypatch, capsys) -> None:
    from infra.deploy import main as deploy_main

    monkeypatch.setenv("INDUSFLOW_MILVUS_URI", "http://root:Milvus-Secret-9@milvus:19530")
    monkeypatch.setenv("INDUSFLOW_LLM_URL", "https://llm.internal/v1?api_key=Q9sEcReT")
    monkeypatch.setenv("INDUSFLOW_EMBED_URL", "http://127.0.0.1:8000/v1")  # harmless: would be forwarded
    assert deploy_main(["apply", "--pool", "p", "--only", "nightly-retrain"]) == 2
    err = capsys.readouterr().err
    assert "INDUSFLOW_MILVUS_URI (password in its URL)" in err and "INDUSFLOW_LLM_URL (query in its URL)" in err
    assert "Milvus-Secret-9" not in err and "Q9sEcReT" not in err and "INDUSFLOW_EMBED_URL" not in err
    assert err.startswith("error: ") and "Traceback" not in err


class _EchoingErrors(BaseHTTPRequestHandler):
    """An endpoint that answers 401 with everything it received, headers included."""

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        echo = json.dumps({"error": f"unauthorized: {self.headers.get('Authorization')}", "headers": dict(self.headers),
                           "body": body.decode()})
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(echo.encode())


@pytest.fixture()
def echo_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EchoingErrors)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("stream", [False, True])
def test_an_llm_error_that_echoes_the_key_does_not_carry_it(echo_url, stream, capfd, caplog) -> None:
    from infra.llm import ChatClient, ChatMessage, LLMError
    from infra.settings import LLMSettings

    client = ChatClient(LLMSettings(url=echo_url, model="m", api_key=KEY))
    caplog.set_level(logging.DEBUG)
    with pytest.raises(LLMError) as info:
        if stream:
            list(client.stream([ChatMessage("user", "hi")]))
        else:
            client.complete([ChatMessage("user", "hi")])
    logging.getLogger("indusflow.test").error("ask failed: %s", info.value)
    import traceback

    shown = "".join(traceback.format_exception(info.value))  # what a CLI or Prefect would print
    out, err = capfd.readouterr()
    assert "HTTP 401" in str(info.value) and "unauthorized" in str(info.value)
    for where in (str(info.value), shown, out, err, caplog.text):
        assert KEY not in where and KEY[:12] not in where


def test_an_embeddings_error_that_echoes_the_key_does_not_carry_it(echo_url) -> None:
    from infra.embeddings import EmbeddingError, OpenAIEmbedder
    from infra.settings import EmbeddingSettings

    embedder = OpenAIEmbedder(EmbeddingSettings(url=echo_url, api_key=KEY))
    with pytest.raises(EmbeddingError) as info:
        embedder.encode(["hello"])
    assert "HTTP 401" in str(info.value) and KEY not in str(info.value) and KEY[:12] not in str(info.value)


def test_the_audit_salt_and_query_credentials_never_reach_job_variables(monkeypatch) -> None:
    from infra.deploy import DeployError, forwarded_env

    monkeypatch.setenv("INDUSFLOW_SERVE_AUDIT_SALT", "pepper-Salt-77")
    monkeypatch.setenv("INDUSFLOW_EMBED_URL", "http://127.0.0.1:8000/v1")
    env = forwarded_env("process")
    assert "INDUSFLOW_SERVE_AUDIT_SALT" not in env and "pepper-Salt-77" not in json.dumps(env)
    assert env["INDUSFLOW_EMBED_URL"] == "http://127.0.0.1:8000/v1"  # what is not secret is forwarded
    monkeypatch.setenv("INDUSFLOW_LLM_URL", "https://llm.internal/v1?key=K3y-Val")
    monkeypatch.setenv("INDUSFLOW_TIKA_URL", "http://tika:9998/?lang=en&auth=Au7h-Val")
    with pytest.raises(DeployError) as info:
        forwarded_env("process")
    message = str(info.value)
    assert "INDUSFLOW_LLM_URL (query in its URL)" in message and "INDUSFLOW_TIKA_URL (query in its URL)" in message
    assert "K3y-Val" not in message and "Au7h-Val" not in message


def test_the_audit_log_and_the_online_state_are_owner_only(tmp_path) -> None:
    import os
    import stat

    from infra.serving.audit import AuditLog
    from solutions.fraud.online import SqliteStateStore

    def mode(path) -> int:
        return stat.S_IMODE(os.stat(path).st_mode)

    old = os.umask(0o022)  # a usual shell's: files 0644 unless created private
    try:
        log = AuditLog(tmp_path / "serving" / "audit.jsonl", salt=b"s" * 16)
        log.write({"route": "/v1/fraud/score"})
        store = SqliteStateStore(tmp_path / "state" / "online.sqlite")
        store._conn.execute("INSERT INTO account VALUES ('k', x'00')")  # the WAL file appears on write
        legacy = tmp_path / "legacy.jsonl"
        legacy.write_text("{}\n")
        os.chmod(legacy, 0o644)
        AuditLog(legacy, salt=b"s" * 16)
    finally:
        os.umask(old)
    assert mode(tmp_path / "serving" / "audit.jsonl") == 0o600
    assert mode(tmp_path / "state" / "online.sqlite") == 0o600
    assert mode(tmp_path / "state" / "online.sqlite-wal") == 0o600
    assert mode(legacy) == 0o600  # a home from before is made private when the server opens it
