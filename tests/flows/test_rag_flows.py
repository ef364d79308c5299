"""The RAG flows from the command line (``--json``) against the test Prefect API."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("milvus_lite")
pytest.importorskip("iscc_tika")

import flows.rag as R
from flows.rag.cli import main


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


class _StreamingChat(BaseHTTPRequestHandler):
    """A chat-completions endpoint that streams a fixed answer in three pieces."""

    bodies: list[dict] = []  # noqa: RUF012 - shared by the handler instances of one test

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for piece in ("Bearing faults show ", "as vibration at twice the shaft speed", " [1]."):
            chunk = {"choices": [{"index": 0, "delta": {"content": piece}}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture()
def chat_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StreamingChat)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_ingest_ask_eval_cli(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch, chat_url: str) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("INDUSFLOW_MILVUS_URI", str(tmp_path / "flows.db"))
    corpus = tmp_path / "kb"
    corpus.mkdir()
    (corpus / "a.txt").write_text("The turbine bearing fault shows as vibration at twice the shaft speed. "
                                  "Call 13812345678 for the maintenance team.")
    (corpus / "b.txt").write_text("Invoices are paid within thirty days of receipt by bank transfer.")
    (corpus / "broken.pdf").write_bytes(b"%PDF-1.4 this is not really a pdf")

    assert main(["ingest", str(corpus), "--collection", "kb_cli", "--json"]) == 0
    out = capsys.readouterr().out
    first = _last_json(out)
    assert first["chunked_documents"] == 2 and first["redactions"] == {"mobile": 1}
    assert ", 1 files quarantined" in out.splitlines()[0]  # files, in the /kb page's words
    assert any(line.startswith("  quarantined ") and line.endswith(("broken.pdf (damaged or not a valid file)",
                                                                     "broken.pdf (no text found)"))
               for line in out.splitlines()), out
    assert [q["reason"] for q in first["quarantined"]] in (["corrupt"], ["empty"])
    assert main(["ingest", str(corpus), "--collection", "kb_cli", "--json"]) == 0
    again = _last_json(capsys.readouterr().out)
    assert again["writes"] == 0 and again["unchanged"] == 3

    assert main(["ask", "what does a bearing fault look like?", "--collection", "kb_cli", "--top-k", "2", "--json"]) == 0
    out = capsys.readouterr().out
    ask = _last_json(out)
    assert Path(ask["hits"][0]["path"]).name == "a.txt" and ask["answer_kind"] == "extractive"
    assert "[1]" in ask["answer"] and ask["citations"][0]["number"] == 1
    assert ask["citations"][0]["page"] is None  # a text file has no pages
    assert ask["citations"][0]["quotes"] == ["The turbine bearing fault shows as vibration at twice the shaft speed."]
    assert main(["ask", "what does a bearing fault look like?", "--collection", "kb_cli", "--top-k", "2"]) == 0
    assert "    > The turbine bearing fault shows as vibration at twice the shaft speed." in capsys.readouterr().out
    assert ask["answered"] is True and ask["support"]["answered"] is True
    assert "13812345678" not in out

    assert main(["ask", "What is the recommended dose of amoxicillin for children?", "--collection", "kb_cli",
                 "--json"]) == 0
    out = capsys.readouterr().out
    ask = _last_json(out)
    assert ask["answered"] is False and ask["answer_kind"] == "none" and ask["citations"] == []
    assert ask["answer"] == "The documents in kb_cli do not answer this."
    assert "Related passages, not an answer:" in out and "(not answered: the retrieved passages" in out

    # --stream: the tokens are printed as they come, once
    monkeypatch.setenv("INDUSFLOW_LLM_URL", chat_url)
    monkeypatch.setenv("INDUSFLOW_LLM_MODEL", "tiny")
    _StreamingChat.bodies.clear()
    assert main(["ask", "what does a bearing fault look like?", "--collection", "kb_cli", "--top-k", "2",
                 "--stream", "--json"]) == 0
    out = capsys.readouterr().out
    streamed = _last_json(out)
    answer = "Bearing faults show as vibration at twice the shaft speed [1]."
    assert streamed["answer"] == answer and streamed["answer_kind"] == "llm" and streamed["streamed"] is True
    assert out.count(answer) == 2  # once streamed, once inside the JSON line; the summary does not repeat it
    assert _StreamingChat.bodies[-1]["stream"] is True
    assert "bearing fault" in _StreamingChat.bodies[-1]["messages"][1]["content"]
    monkeypatch.delenv("INDUSFLOW_LLM_URL")

    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"question": "when are invoices paid?", "answers": ["thirty days"]}) + "\n")
    assert main(["eval", "--data", str(qa), "--collection", "kb_cli", "--json"]) == 0
    ev = _last_json(capsys.readouterr().out)
    assert set(ev["scores"]) >= {"dense", "bm25", "hybrid"}
    assert ev["scores"]["bm25"]["recall_at_1"] == 1.0


def test_help_for_every_command(capsys: pytest.CaptureFixture) -> None:
    for command in ("ingest", "ask", "eval", "feedback-export"):
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--help"])
        assert exit_info.value.code == 0
        assert "--json" in capsys.readouterr().out


def _bad_invocations(tmp_path: Path) -> list[tuple[list[str], str]]:
    qa = tmp_path / "qa.jsonl"
    qa.write_text('{"question": "q?", "answers": ["a"]}\n')
    return [
        (["ingest", str(tmp_path / "missing")], "source not found"),
        (["ingest", str(tmp_path), "--chunk-tokens", "64", "--chunk-overlap", "64"], "must be smaller"),
        (["ingest", str(tmp_path), "--collection", "a/b"], "--collection: invalid collection name"),
        (["ingest", str(tmp_path), "--batch-docs", "0"], "--batch-docs"),
        (["ask"], "QUESTION"),
        (["ask", "q?", "--created-from", "yesterday"], "--created-from: 'yesterday' is not an ISO date"),
        (["ask", "q?", "--mode", "sparse"], "invalid choice"),
        (["ask", "q?", "--dense-weight", "heavy"], "--dense-weight"),
        (["ask", "q?", "--top-k", "0"], "--top-k"),
        (["eval"], "required: --data"),
        (["eval", "--data", str(tmp_path / "missing.jsonl")], "--data: QA file not found"),
        (["eval", "--data", str(qa), "--chunk-tokens", "8"], "--chunk-tokens"),
        (["eval", "--qa", str(qa)], "unrecognized arguments: --qa"),  # the old flag name is gone
        (["feedback-export", "--collection", "../x"], "--collection: collection name"),
        (["feedback-export", "--min-voters", "0"], "--min-voters: at least 1"),
    ]


def test_bad_invocations_exit_2_with_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for argv, expected in _bad_invocations(tmp_path):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
        captured = capsys.readouterr()
        assert code == 2, argv
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], (argv, captured.err)
        assert "Traceback" not in captured.out + captured.err, argv


def test_ingest_without_sources_reads_the_watched_folder(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                         monkeypatch) -> None:
    from infra.home import home_layout

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("INDUSFLOW_MILVUS_URI", str(tmp_path / "watched.db"))
    monkeypatch.setenv("INDUSFLOW_MILVUS_COLLECTION", "kb_watched")  # the default collection comes from it
    inbox = home_layout().inbox("docs")
    inbox.mkdir(parents=True, exist_ok=True)
    (inbox / "note.txt").write_text("The compressor valve is replaced every two thousand hours.")
    assert main(["ingest", "--json"]) == 0
    result = _last_json(capsys.readouterr().out)
    assert result["collection"] == "kb_watched" and result["files"] >= 1 and result["chunked_documents"] >= 1

    # a named collection: its own watched folder and Milvus collection; `ask` sees only its documents
    legal = home_layout().kb_inbox("legal")
    (legal / "lease.txt").write_text("The tenant gives ninety-seven days of notice before leaving the warehouse.")
    assert main(["ingest", "--collection", "legal", "--json"]) == 0
    result = _last_json(capsys.readouterr().out)
    assert result["collection"] == "legal" and result["files"] == 1 and result["chunked_documents"] == 1
    assert main(["ask", "How often is the compressor valve replaced?", "--collection", "legal", "--json"]) == 0
    asked = _last_json(capsys.readouterr().out)
    hits = asked["hits"]
    assert hits and {Path(h["path"]).name for h in hits} == {"lease.txt"}
    assert asked["answered"] is False  # the lease says nothing of valves: related, not an answer


def test_parse_batches_fan_out_on_a_local_dask_cluster(tmp_path: Path, monkeypatch) -> None:
    """Parse batches run ahead on the configured task runner; the result equals in-line parsing."""
    pytest.importorskip("prefect_dask")
    from infra.runners import make_task_runner
    from solutions.rag.config import IngestParams

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("INDUSFLOW_MILVUS_URI", str(tmp_path / "fanout.db"))
    corpus = tmp_path / "docs"
    corpus.mkdir()
    for i, topic in enumerate(["pump seals", "gearbox oil", "belt tension", "motor current", "valve leaks"]):
        (corpus / f"note-{i}.txt").write_text(f"Maintenance note {i} about {topic}. " * 20)
    (corpus / "broken.pdf").write_bytes(b"%PDF-1.4 not a pdf")
    fanned = R.rag_ingest.with_options(task_runner=make_task_runner("dask", workers=2))(
        [str(corpus)], params=IngestParams(collection="kb_dask", batch_docs=2))
    inline = R.rag_ingest([str(corpus)], params=IngestParams(collection="kb_inline", batch_docs=6))
    assert fanned.chunked_documents == inline.chunked_documents == 5
    assert fanned.total_chunks == inline.total_chunks > 0
    assert [q.path for q in fanned.quarantined] == [q.path for q in inline.quarantined] == [str(corpus / "broken.pdf")]
