"""The HTTP paths against small local servers started by the tests: a Tika server (``PUT /rmeta/text``
through the PyPI ``tika`` client) and an OpenAI-compatible ``/v1/embeddings`` endpoint."""

from __future__ import annotations

import io
import json
import threading
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from infra.embeddings import EmbeddingError, OpenAIEmbedder
from infra.settings import EmbeddingSettings, TikaSettings
from infra.tika import EmbeddedTika, TikaServer
from tasks.documents import discover, parse_sources


@contextmanager
def _serve(handle: Callable[[BaseHTTPRequestHandler, bytes], tuple[int, str]], log: list) -> Iterator[str]:
    """A threaded stdlib HTTP server answering every PUT/POST with ``handle(request, body)``."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            log.append((self.command, self.path, dict(self.headers), body))
            status, text = handle(self, body)
            data = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_PUT = do_POST = _answer

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# ------------------------------------------------------------------------------------
# Tika server


def _rmeta_entry(data: bytes, name: str, resource_path: str | None = None, depth: int = 0) -> dict:
    result = EmbeddedTika().parse(data, name)
    entry = {k: (v[0] if len(v) == 1 else v) for k, v in result.metadata.items()}
    entry["X-TIKA:content"] = result.text
    if resource_path:
        entry["X-TIKA:embedded_resource_path"] = resource_path
        entry["X-TIKA:embedded_depth"] = str(depth)
    return entry


def _fake_tika(request: BaseHTTPRequestHandler, body: bytes) -> tuple[int, str]:
    """Answers like tika-server's /rmeta/text: one metadata object per document, container first.

    The text and metadata come from the embedded parser, so both modes can be compared.
    """
    if request.command != "PUT" or request.path != "/rmeta/text":
        return 404, "{}"
    name = request.headers.get("Content-Disposition", "").rpartition("filename=")[2] or "document"
    try:
        container = _rmeta_entry(body, name)
    except Exception as exc:  # noqa: BLE001 (tika-server answers 422 with the stack trace)
        return 422, f"org.apache.tika.exception.TikaException: {exc}"
    entries = [container]
    if container.get("Content-Type") == "application/zip":
        container["X-TIKA:content"] = ""
        with zipfile.ZipFile(io.BytesIO(body)) as zf:
            for info in zf.infolist():
                entries.append(_rmeta_entry(zf.read(info), info.filename, "/" + info.filename, 1))
    return 200, json.dumps(entries)


@pytest.fixture()
def corpus(tmp_path: Path, docs: Path) -> Path:
    pytest.importorskip("iscc_tika")
    root = tmp_path / "docs"
    root.mkdir()
    for name in ("testPDF.pdf", "testWORD.docx", "testODTEncrypted.odt"):
        (root / name).write_bytes((docs / name).read_bytes())
    (root / "notes.txt").write_text("Plain notes about the quarterly budget and its review. " * 5)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("inner/a.txt", "Inner document alpha about hybrid retrieval. " * 5)
        zf.write(docs / "testPDF.pdf", "inner/testPDF.pdf")
    (root / "bundle.zip").write_bytes(buf.getvalue())
    return root


def _view(result) -> tuple[dict, dict]:
    docs = {d.path: (d.doc_id, d.meta.content_type, d.meta.title, d.text) for d in result.documents}
    return docs, {q.path: q.reason for q in result.quarantined}


def test_tika_server_path_matches_the_embedded_parser(corpus: Path) -> None:
    log: list = []
    sources = discover([corpus])
    with _serve(_fake_tika, log) as url:
        client = TikaServer(url, timeout_s=30)
        served = parse_sources(sources, settings=TikaSettings(server_url=url), client=client)
    embedded = parse_sources(sources, settings=TikaSettings(), client=EmbeddedTika())
    assert _view(served) == _view(embedded)
    docs, quarantined = _view(served)
    assert {Path(p).name for p in docs} == {"testPDF.pdf", "testWORD.docx", "notes.txt", "a.txt"} | {"testPDF.pdf"}
    assert str(corpus / "bundle.zip") + "!/inner/testPDF.pdf" in docs  # split by Tika's /rmeta, not by us
    assert quarantined == {str(corpus / "testODTEncrypted.odt"): "encrypted"}
    assert {(m, p) for m, p, _, _ in log} == {("PUT", "/rmeta/text")}
    assert all(h.get("Accept") == "application/json" for _, _, h, _ in log)
    assert "filename=testPDF.pdf" in " ".join(h.get("Content-Disposition", "") for _, _, h, _ in log)


def test_tika_server_errors_become_quarantine(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("some text that is long enough to be a document")
    answers = iter([(500, "boom"), (200, "not json"), (200, json.dumps({"not": "a list"}))])
    with _serve(lambda req, body: next(answers), []) as url:
        client = TikaServer(url, timeout_s=10)
        results = [parse_sources(discover([tmp_path]), settings=TikaSettings(server_url=url), client=client)
                   for _ in range(3)]
    details = [r.quarantined[0] for r in results]
    assert [q.reason for q in details] == ["corrupt"] * 3
    assert "HTTP 500" in details[0].detail and "not JSON" in details[1].detail and "JSON list" in details[2].detail


# ------------------------------------------------------------------------------------
# OpenAI-compatible embeddings


DIM = 8


def _vector(text: str) -> list[float]:
    rng = np.random.default_rng(sum(text.encode()))
    return (rng.standard_normal(DIM) * 3).tolist()


def _fake_embeddings(request: BaseHTTPRequestHandler, body: bytes) -> tuple[int, str]:
    if request.path != "/v1/embeddings":
        return 404, "{}"
    texts = json.loads(body)["input"]
    data = [{"object": "embedding", "index": i, "embedding": _vector(t)} for i, t in enumerate(texts)]
    return 200, json.dumps({"object": "list", "data": data[::-1], "model": "stub"})  # any order: sorted by index


def _embedder(url: str, **kw) -> OpenAIEmbedder:
    return OpenAIEmbedder(EmbeddingSettings(url=url, model="stub-embed", api_key="sk-test-SECRET-123", **kw))


def test_embeddings_endpoint_batches_and_normalises() -> None:
    log: list = []
    texts = [f"text number {i}" for i in range(5)]
    with _serve(_fake_embeddings, log) as url:
        emb = _embedder(url + "/v1")  # a base URL ending in /v1 works as well
        vectors = emb.encode(texts, batch_size=2)
        assert emb.dim == DIM
    assert vectors.shape == (5, DIM)
    expected = np.asarray([_vector(t) for t in texts], dtype=np.float32)
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(vectors, expected, rtol=1e-5)
    batches = [json.loads(body)["input"] for _, _, _, body in log]
    assert batches[:3] == [texts[0:2], texts[2:4], texts[4:5]]
    assert all(h.get("Authorization") == "Bearer sk-test-SECRET-123" for _, _, h, _ in log)
    assert all(json.loads(body)["model"] == "stub-embed" for _, _, _, body in log)


@pytest.mark.parametrize(("status", "answer", "message"), [
    (401, "invalid key sk-test-SECRET-123", "HTTP 401"),
    (200, json.dumps({"error": "overloaded"}), "without an OpenAI 'data' list"),
    (200, json.dumps({"data": [{"index": 0, "embedding": [1.0, 2.0]}]}), "1 vectors"),
])
def test_embeddings_endpoint_errors_name_the_url_not_the_key(status: int, answer: str, message: str) -> None:
    with _serve(lambda req, body: (status, answer), []) as url:
        emb = _embedder(f"http://user:pw@{url.removeprefix('http://')}")
        with pytest.raises(EmbeddingError) as err:
            emb.encode(["one", "two"])
    text = str(err.value)
    assert message in text and url + "/v1/embeddings" in text
    assert "SECRET" not in text and "user:pw" not in text


def test_embeddings_endpoint_unreachable() -> None:
    emb = _embedder("http://127.0.0.1:9", timeout_s=5)
    with pytest.raises(EmbeddingError, match=r"http://127.0.0.1:9/v1/embeddings could not be reached"):
        emb.encode(["one"])
