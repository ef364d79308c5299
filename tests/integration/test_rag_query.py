"""Queries against the real engines: a Chinese round trip, filters, and the LLM path against a
local chat-completions server (non-streaming and streaming)."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from flows.rag.steps import answer_question, ingest_sources
from infra.llm import ChatClient, ChatMessage, LLMError
from infra.settings import LLMSettings
from solutions.rag.config import AskParams, ChunkParams, IngestParams

ZH_DOCS = {
    "beijing.txt": "北京是中华人民共和国的首都，是全国的政治中心和文化中心。故宫位于北京市中心，是明清两代的皇家宫殿。",
    "shanghai.txt": "上海是中国的经济中心，位于长江入海口。浦东新区的陆家嘴是著名的金融区。上海港的集装箱吞吐量位居世界前列。",
    "panda.txt": "大熊猫主要生活在四川、陕西和甘肃的山区，以竹子为主要食物。大熊猫是中国的国宝。",
    "rust.txt": "Rust is a systems programming language focused on memory safety without a garbage collector.",
    "milvus.txt": "Milvus is a vector database. It supports dense vectors and BM25 full text search for hybrid retrieval.",
}


@pytest.fixture(scope="module")
def kb(tmp_path_factory: pytest.TempPathFactory, milvus, embedder) -> str:
    folder = tmp_path_factory.mktemp("zh")
    for name, text in ZH_DOCS.items():
        (folder / name).write_text(text, encoding="utf-8")
    params = IngestParams(collection="it_query", chunk=ChunkParams(tokens=128, overlap=32))
    result = ingest_sources([str(folder)], params, client=milvus, embedder=embedder)
    assert result.chunked_documents == len(ZH_DOCS)
    return "it_query"


@pytest.mark.parametrize("mode", ["bm25", "hybrid"])
def test_chinese_round_trip(kb: str, milvus, embedder, mode: str) -> None:
    params = AskParams(collection=kb, mode=mode, llm=False)
    result = answer_question("大熊猫主要吃什么食物？", params, client=milvus, embedder=embedder)
    top5 = [Path(h.path).name for h in result.hits[:5]]
    assert "panda.txt" in top5 and top5[0] == "panda.txt"
    assert result.answer_kind == "extractive" and "竹子" in result.answer
    assert result.citations and Path(result.citations[0].path).name == "panda.txt"
    assert result.answered and result.support is not None and result.support.answered
    if mode == "hybrid":
        assert result.weights["dense"] < 0.5  # the English-only embedder barely covers Chinese


def test_english_dense_and_filters(kb: str, milvus, embedder) -> None:
    res = answer_question("Which database supports hybrid retrieval?", AskParams(collection=kb, mode="dense", llm=False),
                          client=milvus, embedder=embedder)
    assert Path(res.hits[0].path).name == "milvus.txt"
    res = answer_question("database", AskParams(collection=kb, mode="bm25", language="zh", llm=False),
                          client=milvus, embedder=embedder)
    assert all(Path(h.path).suffix == ".txt" and Path(h.path).name in {"beijing.txt", "shanghai.txt", "panda.txt"}
               for h in res.hits)
    res = answer_question("Rust", AskParams(collection=kb, mode="hybrid", path_prefix="/nowhere", llm=False),
                          client=milvus, embedder=embedder)
    assert res.hits == []


def test_a_follow_up_is_resolved_against_the_previous_questions(kb: str, milvus, embedder) -> None:
    """``python -m flows.rag ask "它吃什么？" --previous "大熊猫主要生活在哪里？"``: without an LLM the
    follow-up carries the previous question's key terms."""
    params = AskParams(collection=kb, mode="bm25", llm=False)
    res = answer_question("它吃什么？", params, client=milvus, embedder=embedder, previous=["大熊猫主要生活在哪里？"])
    assert res.question == "它吃什么？" and res.retrieval_question.startswith("它吃什么？")
    assert "大熊猫" in res.retrieval_question
    assert Path(res.hits[0].path).name == "panda.txt" and "竹子" in res.answer
    alone = answer_question("它吃什么？", params, client=milvus, embedder=embedder)
    assert alone.retrieval_question == "" and "竹子" not in alone.answer


@pytest.mark.parametrize("question", ["What is the recommended dose of amoxicillin for children?",
                                      "儿童服用阿莫西林的推荐剂量是多少？"])
def test_what_the_documents_do_not_hold_is_not_answered(kb: str, milvus, embedder, question: str) -> None:
    res = answer_question(question, AskParams(collection=kb, llm=False), client=milvus, embedder=embedder)
    assert not res.answered and res.answer_kind == "none" and res.citations == []
    assert res.answer == f"The documents in {kb} do not answer this." and res.hits  # the closest, as related
    assert res.support is not None and res.support.probability < res.support.threshold
    assert "do not support" in res.support.reason


class _ChatHandler(BaseHTTPRequestHandler):
    requests: ClassVar[list[dict]] = []

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        if body["model"] == "broken":
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b"boom")
            return
        answer = "大熊猫以竹子为主要食物 [1]。"
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for piece in ("大熊猫以", "竹子为主要食物", " [1]。"):
                chunk = {"choices": [{"index": 0, "delta": {"content": piece}}]}
                self.wfile.write(f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            return
        payload = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": answer}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture(scope="module")
def chat_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ChatHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


@pytest.mark.parametrize("stream", [False, True])
def test_llm_answer_with_citations(kb: str, milvus, embedder, chat_server: str, monkeypatch, stream: bool) -> None:
    monkeypatch.setenv("INDUSFLOW_LLM_URL", chat_server)
    monkeypatch.setenv("INDUSFLOW_LLM_MODEL", "tiny")
    monkeypatch.setenv("INDUSFLOW_LLM_API_KEY", "sk-test-secret")
    _ChatHandler.requests.clear()
    out = io.StringIO()
    res = answer_question("大熊猫主要吃什么食物？", AskParams(collection=kb, mode="bm25", stream=stream),
                          client=milvus, embedder=embedder, out=out)
    assert res.answer_kind == "llm" and res.answer == "大熊猫以竹子为主要食物 [1]。"
    assert [c.number for c in res.citations] == [1] and Path(res.citations[0].path).name == "panda.txt"
    req = _ChatHandler.requests[-1]
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer sk-test-secret"
    assert req["body"]["stream"] is stream and "[1]" in req["body"]["messages"][1]["content"]
    assert out.getvalue() == (res.answer if stream else "")


def test_llm_errors_are_named(chat_server: str) -> None:
    client = ChatClient(LLMSettings(url=chat_server, model="broken"))
    with pytest.raises(LLMError, match="HTTP 500"):
        client.complete([ChatMessage("user", "hi")])
    with pytest.raises(LLMError, match="HTTP 500"):
        list(client.stream([ChatMessage("user", "hi")]))


@pytest.mark.parametrize("mode", ["bm25", "hybrid", "dense"])
def test_a_collection_without_rows_yet_retrieves_nothing(milvus, mode: str) -> None:
    """A first ingest creates the collection before it writes: a search meanwhile (the API serves
    while a child process ingests) finds nothing, where Milvus's BM25 would fail on 0/0."""
    import numpy as np

    from infra.milvus import ensure_collection
    from tasks.retrieve import retrieve

    name = f"empty_{mode}"
    ensure_collection(milvus, name, 8)
    milvus.load_collection(name)
    vectors = None if mode == "bm25" else np.ones((1, 8), dtype=np.float32)
    assert retrieve(milvus, name, ["inspection interval of the pump"], vectors, mode=mode, top_k=3) == [[]]
