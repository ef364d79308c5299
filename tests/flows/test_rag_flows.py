"""The RAG flows from the command line (``--json``) against the test Prefect API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("milvus_lite")
pytest.importorskip("iscc_tika")

import flows.rag as R


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_ingest_ask_eval_cli(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("INDUSFLOW_MILVUS_URI", str(tmp_path / "flows.db"))
    corpus = tmp_path / "kb"
    corpus.mkdir()
    (corpus / "a.txt").write_text("The turbine bearing fault shows as vibration at twice the shaft speed. "
                                  "Call 13812345678 for the maintenance team.")
    (corpus / "b.txt").write_text("Invoices are paid within thirty days of receipt by bank transfer.")
    (corpus / "broken.pdf").write_bytes(b"%PDF-1.4 this is not really a pdf")

    assert R.main(["ingest", str(corpus), "--collection", "kb_cli", "--json"]) == 0
    first = _last_json(capsys.readouterr().out)
    assert first["chunked_documents"] == 2 and first["redactions"] == {"mobile": 1}
    assert [q["reason"] for q in first["quarantined"]] in (["corrupt"], ["empty"])
    assert R.main(["ingest", str(corpus), "--collection", "kb_cli", "--json"]) == 0
    again = _last_json(capsys.readouterr().out)
    assert again["writes"] == 0 and again["unchanged"] == 3

    assert R.main(["ask", "what does a bearing fault look like?", "--collection", "kb_cli", "--top-k", "2", "--json"]) == 0
    out = capsys.readouterr().out
    ask = _last_json(out)
    assert Path(ask["hits"][0]["path"]).name == "a.txt" and ask["answer_kind"] == "extractive"
    assert "[1]" in ask["answer"] and ask["citations"][0]["number"] == 1
    assert "13812345678" not in out

    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"question": "when are invoices paid?", "answers": ["thirty days"]}) + "\n")
    assert R.main(["eval", "--qa", str(qa), "--collection", "kb_cli", "--json"]) == 0
    ev = _last_json(capsys.readouterr().out)
    assert set(ev["scores"]) >= {"dense", "bm25", "hybrid"}
    assert ev["scores"]["bm25"]["recall_at_1"] == 1.0


def test_help_for_every_command(capsys: pytest.CaptureFixture) -> None:
    for command in ("ingest", "ask", "eval"):
        with pytest.raises(SystemExit) as exit_info:
            R.main([command, "--help"])
        assert exit_info.value.code == 0
        assert "--json" in capsys.readouterr().out


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
