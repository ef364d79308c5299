"""The secrets boundary: one scrubber for every HTTP client's errors, no credential URL in job variables."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
    env = forwarded_env()
    assert "INDUSFLOW_SERVE_AUDIT_SALT" not in env and "pepper-Salt-77" not in json.dumps(env)
    assert env["INDUSFLOW_EMBED_URL"] == "http://127.0.0.1:8000/v1"  # what is not secret is forwarded
    monkeypatch.setenv("INDUSFLOW_LLM_URL", "https://llm.internal/v1?key=K3y-Val")
    monkeypatch.setenv("INDUSFLOW_TIKA_URL", "http://tika:9998/?lang=en&auth=Au7h-Val")
    with pytest.raises(DeployError) as info:
        forwarded_env()
    message = str(info.value)
    assert "INDUSFLOW_LLM_URL (query in its URL)" in message and "INDUSFLOW_TIKA_URL (query in its URL)" in message
    assert "K3y-Val" not in message and "Au7h-Val" not in message


def test_the_audit_log_and_the_online_state_are_owner_only(tmp_path) -> None:
    import os
    import stat

    from infra.online_state import Journal
    from infra.online_state.rocks import RocksStateStore
    from infra.serving.audit import AuditLog

    def mode(path) -> int:
        return stat.S_IMODE(os.stat(path).st_mode)

    old = os.umask(0o022)  # a usual shell's: files 0644 unless created private
    try:
        log = AuditLog(tmp_path / "serving" / "audit.jsonl", salt=b"s" * 16)
        log.write({"route": "/v1/fraud/score"})
        store = RocksStateStore(tmp_path / "state" / "online")
        with store.exclusive():
            store.commit(Journal(accounts={"k": {"n": 0, "sum": 0.0, "terms": [], "seq": 0}}))
        store.close()
        legacy = tmp_path / "legacy.jsonl"
        legacy.write_text("{}\n")
        os.chmod(legacy, 0o644)
        AuditLog(legacy, salt=b"s" * 16)
    finally:
        os.umask(old)
    assert mode(tmp_path / "serving" / "audit.jsonl") == 0o600
    # RocksDB's files are created with the umask, inside a folder nobody else can open
    assert mode(tmp_path / "state" / "online") == 0o700
    assert any(p.suffix == ".log" for p in (tmp_path / "state" / "online").iterdir())  # its write-ahead log
    assert mode(legacy) == 0o600  # a home from before is made private when the server opens it


# ------------------------------------------------------------------------------------
# every encoding an upstream may echo a key in (issue 46), generated

_KEY_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/+=-_.:~ "


def _html_named(ch: str) -> str:
    import html.entities

    names = [n for n, c in html.entities.html5.items() if c == ch and n.endswith(";")]
    return f"&{names[0]}" if names else ch


#: One character's encodings: as is, JSON, URL-encoded once/twice/either case, HTML decimal/hex/named.
_CHAR_ENCODINGS = {
    "raw": lambda c: c,
    "json": lambda c: json.dumps(c)[1:-1] if c != "/" else "\\/",
    "json-u": lambda c: f"\\u{ord(c):04x}",
    "url": lambda c: "".join(f"%{b:02X}" for b in c.encode()),
    "url-lower": lambda c: "".join(f"%{b:02x}" for b in c.encode()),
    "url-twice": lambda c: "".join(f"%25{b:02X}" for b in c.encode()),
    "html-dec": lambda c: f"&#{ord(c)};",
    "html-hex": lambda c: f"&#x{ord(c):X};",
    "html-hex-lower": lambda c: f"&#x{ord(c):x};",
    "html-named": _html_named,
}


@st.composite
def echoed_keys(draw) -> tuple[str, str]:
    """A key and an upstream's echo of it: one whole-value encoding, or a mix of them per character."""
    import base64
    import html
    from urllib.parse import quote, quote_plus

    key = draw(st.text(alphabet=st.sampled_from(_KEY_CHARS), min_size=12, max_size=40).filter(lambda k: k.strip() == k))
    whole = {"raw": key, "json": json.dumps(key)[1:-1], "url": quote(key, safe=""), "url-plus": quote_plus(key),
             "url-twice": quote(quote(key, safe=""), safe=""), "html": html.escape(key),
             "html-json": json.dumps(html.escape(key))[1:-1].replace("&", "\\u0026"),
             "base64": base64.b64encode(key.encode()).decode(), "base64-url": base64.urlsafe_b64encode(key.encode()).decode(),
             "base64-url-bare": base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")}
    how = draw(st.sampled_from([*whole, "per-character"]))
    if how != "per-character":
        return key, whole[how]
    names = st.sampled_from(sorted(_CHAR_ENCODINGS))
    return key, "".join(_CHAR_ENCODINGS[draw(names)](ch) for ch in key)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(echoed=echoed_keys(), before=st.sampled_from(["", "bad key ", '{"auth": "', "<p>"]),
       after=st.sampled_from(["", " rejected", '"}', "</p>"]))
def test_a_known_key_is_scrubbed_in_every_encoding_an_upstream_may_echo(echoed: tuple[str, str], before: str,
                                                                        after: str) -> None:
    key, echo = echoed
    clean = scrub(f"{before}{echo}{after}", [key])
    assert echo not in clean and "***" in clean, (echo, clean)
    assert clean.startswith(before) and clean.endswith(after), (echo, clean)


def test_the_configured_secrets_are_scrubbed_without_being_named(monkeypatch) -> None:
    from infra.secrets import configured_secrets

    monkeypatch.setenv("INDUSFLOW_EMBED_API_KEY", "Em8/kZ2+qR7vW3/pL4nX")
    monkeypatch.setenv("INDUSFLOW_SERVE_REDIS_URL", "redis://default:Redis-Pass-77@cache:6379/0")
    assert {"Em8/kZ2+qR7vW3/pL4nX", "Redis-Pass-77"} <= set(configured_secrets())
    clean = scrub("tika said: Em8&#x2F;kZ2&#43;qR7vW3%252FpL4nX and Redis-Pass-77")  # no known list given
    assert "kZ2" not in clean and "Redis-Pass" not in clean and clean.startswith("tika said: ")


@pytest.mark.parametrize(("url", "what"), [
    ("https://llm.internal/v1/sk-live-abcdefghijklmnop/chat", "path"),  # a key shape in the path
    ("https://hooks.example.com/services/T0AB12CD/B0XY34ZW/Qx7Lm2Np9Rs4Tv6Wy8Za1Bc3", "path"),  # a random segment
    ("https://api.example.com/token/a1b2c3d4e5", "path"),  # the segment after one named like a credential
    ("https://sso.example.com/callback?code=4f2a9c1e", "query"),  # an OAuth code
    ("https://abc123token@tika.internal:9998", "token"),  # a short token as the user name
])
def test_keys_in_paths_codes_and_short_user_tokens_count_as_credentials(url: str, what: str) -> None:
    assert url_credentials(url) == what  # main's code: None for each


def test_urls_without_credentials_are_still_forwarded() -> None:
    for fine in ("http://tika:9998/tika", "https://llm.internal/v1/models/Meta-Llama-3.1-8B-Instruct",
                 "http://embed:8000/v1/9b2f8c1e-3d4a-4b5c-8d6e-7f8091a2b3c4", "https://sso.example.com/auth/callback",
                 "http://127.0.0.1:8000/v1?model=e5"):
        assert url_credentials(fine) is None, fine


def test_the_milvus_lite_file_and_quarantine_copies_are_owner_only(tmp_path, monkeypatch) -> None:
    """Issue 46: both were world-readable (0644 under a usual umask) on main's code."""
    import os
    import stat

    import tasks.ledger as LG
    from tasks.ledger import FileLedger, InboxFile

    pytest.importorskip("milvus_lite")
    from infra.milvus import open_client

    monkeypatch.setenv("INDUSFLOW_HOME", str(tmp_path / "home"))
    inbox = tmp_path / "in"
    inbox.mkdir()
    bad = inbox / "bad.csv"
    bad.write_text("not,a\nvalid file\n")
    os.chmod(bad, 0o644)
    old = os.umask(0o022)
    try:
        client = open_client(uri=str(tmp_path / "milvus" / "rag.db"))
        client.create_collection("probe", dimension=4)
        client.close()
        file = InboxFile(path=str(bad), sha256="a" * 64, size=bad.stat().st_size, mtime_ns=bad.stat().st_mtime_ns)
        LG.quarantine(file, "unreadable", FileLedger("perm", root=tmp_path / "ledgers"))
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "home" / "quarantine").rglob("*")
             if p.is_file()}
    assert modes and set(modes.values()) == {0o600}, modes
    assert stat.S_IMODE((tmp_path / "milvus" / "rag.db").stat().st_mode) == 0o600
