"""Ingestion against the real engines: quarantine, idempotent re-ingest, change, prune, kill-and-rerun."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("iscc_tika")

from flows.rag.steps import ingest_sources
from infra.milvus import query_all
from solutions.rag.config import ChunkParams, IngestParams
from tasks.documents import discover, parse_sources

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
from _hash_embedder import HashEmbedder

SMALL = ChunkParams(tokens=64, overlap=16)


def _ids(client, collection: str) -> set[str]:
    return {r["id"] for r in query_all(client, collection, ("id",))}


def _write_corpus(folder: Path, n: int = 4) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        body = " ".join(f"Document {i} sentence {j} talks about topic {i * 7 + j}." for j in range(30))
        (folder / f"doc{i}.txt").write_text(body + f" Contact: user{i}@example.com, mobile 1381234567{i}.")


def test_broken_and_encrypted_documents_are_quarantined(docs: Path) -> None:
    names = ["testODTEncrypted.odt", "testWORD_protected_passtika.docx", "testZIP_corrupted_oom.zip",
             "testPDF_malformedXFA.pdf", "testOneNote-fuzz1.one", "testZipEncrypted.zip", "testPDF.pdf",
             "testChm_oom.chm", "test-documents.zip"]
    result = parse_sources(discover([docs / n for n in names]))
    reasons = {Path(q.path.split("!/")[0]).name + ("!/" + q.path.split("!/")[1] if "!/" in q.path else ""): q.reason
               for q in result.quarantined}
    assert reasons["testODTEncrypted.odt"] == "encrypted"
    assert reasons["testWORD_protected_passtika.docx"] == "encrypted"
    assert reasons["testZIP_corrupted_oom.zip"] == "corrupt"
    assert reasons["testChm_oom.chm"] == "corrupt"
    assert reasons["testPDF_malformedXFA.pdf"] in ("empty", "ocr_empty")  # a blank page: OCR (when on) finds nothing
    assert reasons["testOneNote-fuzz1.one"] == "unsupported"
    assert reasons["testZipEncrypted.zip!/encrypted.txt"] == "encrypted"
    parsed = {Path(d.path.split("!/")[0]).name + ("!/" + d.path.split("!/")[1] if "!/" in d.path else "") for d in result.documents}
    assert "testPDF.pdf" in parsed
    assert {"test-documents.zip!/testPDF.pdf", "test-documents.zip!/testWORD.doc"} <= parsed  # inner documents
    pdf = next(d for d in result.documents if d.path.endswith("/testPDF.pdf"))
    assert pdf.meta.content_type == "application/pdf" and pdf.meta.title and pdf.meta.author and pdf.meta.pages == 1
    assert all("\x00" not in d.text for d in result.documents)


def test_slides_and_pdf_pages_are_numbered(docs: Path) -> None:
    """A presentation's slides are its pages (slide 3's text is on page 3); a PDF's pages come from
    Tika's per-page character counts."""
    result = parse_sources(discover([docs / "testPPT.pptx", docs / "testJournalParser.pdf"]))
    deck = next(d for d in result.documents if d.path.endswith("testPPT.pptx"))
    assert len(deck.page_starts) == 3
    assert deck.page_at(deck.text.index("Different words to test against")) == 3
    assert deck.page_at(deck.text.index("This is a test file data")) == 2 and deck.page_at(0) == 1
    pdf = next(d for d in result.documents if d.path.endswith("testJournalParser.pdf"))
    assert pdf.meta.pages == len(pdf.page_starts) == 10 and list(pdf.page_starts) == sorted(pdf.page_starts)


def test_reingest_is_idempotent_and_incremental(tmp_path: Path, milvus, embedder) -> None:
    corpus = tmp_path / "corpus"
    _write_corpus(corpus)
    params = IngestParams(collection="it_incremental", chunk=SMALL, prune=True)
    first = ingest_sources([str(corpus)], params, client=milvus, embedder=embedder)
    assert first.parsed == 4 and first.chunks_written == first.total_chunks > 4 and not first.quarantined
    assert first.redactions == {"email": 4, "mobile": 4}
    stored = query_all(milvus, "it_incremental", ("id", "text"))
    assert not any("@example.com" in r["text"] for r in stored) and any("[EMAIL]" in r["text"] for r in stored)
    again = ingest_sources([str(corpus)], params, client=milvus, embedder=embedder)
    assert again.writes == 0 and again.unchanged == 4 and again.total_chunks == first.total_chunks
    # a changed document has its chunks replaced; a deleted one is pruned
    (corpus / "doc1.txt").write_text("A short replacement text about milvus lite and hybrid retrieval.")
    (corpus / "doc3.txt").unlink()
    changed = ingest_sources([str(corpus)], params, client=milvus, embedder=embedder)
    assert changed.processed == 1 and changed.pruned_sources == 1
    rows = query_all(milvus, "it_incremental", ("id", "source"))
    assert not any(r["source"].endswith("doc3.txt") for r in rows)
    assert sum(r["source"].endswith("doc1.txt") for r in rows) == 1


def test_kill_and_rerun_ends_with_exactly_the_right_chunks(tmp_path: Path, milvus) -> None:
    """A real SIGKILL in the middle of an ingestion, then a re-run: exactly a fresh run's chunks."""
    corpus = tmp_path / "corpus"
    _write_corpus(corpus, n=5)
    db = tmp_path / "kill.db"
    params = IngestParams(collection="it_kill", chunk=SMALL, batch_docs=2)
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from _hash_embedder import HashEmbedder
        from flows.rag.steps import ingest_sources
        from infra.milvus import open_client
        from solutions.rag.config import ChunkParams, IngestParams
        written = []
        def die(source):
            written.append(source)
            if len(written) == 3:
                os.kill(os.getpid(), signal.SIGKILL)
        params = IngestParams(collection="it_kill", chunk=ChunkParams(tokens=64, overlap=16), batch_docs=2)
        ingest_sources([{str(corpus)!r}], params, client=open_client(uri={str(db)!r}), embedder=HashEmbedder(),
                   on_source_written=die)
    """)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, timeout=240,
                          check=False)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    from infra.milvus import open_client

    embedder = HashEmbedder()
    client = open_client(uri=str(db))
    try:
        partial = _ids(client, "it_kill")
        assert partial  # three sources were written before the kill
        rerun = ingest_sources([str(corpus)], params, client=client, embedder=embedder)
        assert rerun.unchanged == 3 and rerun.processed == 2
        fresh = ingest_sources([str(corpus)], params.model_copy(update={"collection": "it_kill_fresh"}), client=milvus,
                           embedder=embedder)
        assert _ids(client, "it_kill") == _ids(milvus, "it_kill_fresh")
        assert rerun.total_chunks == fresh.total_chunks
    finally:
        client.close()


def test_changed_document_killed_between_upsert_and_cleanup_is_repaired(tmp_path: Path, milvus, embedder) -> None:
    corpus = tmp_path / "corpus"
    _write_corpus(corpus, n=2)
    params = IngestParams(collection="it_stale", chunk=SMALL)
    ingest_sources([str(corpus)], params, client=milvus, embedder=embedder)
    (corpus / "doc0.txt").write_text("Completely new content. " * 40)
    # simulate a kill after the upsert of the new rows and before the stale ones are deleted
    from tasks import index as index_mod

    real_delete = index_mod.delete_where
    try:
        index_mod.delete_where = lambda *a, **k: 0
        ingest_sources([str(corpus)], params, client=milvus, embedder=embedder)
    finally:
        index_mod.delete_where = real_delete
    hashes = {r["source_hash"] for r in query_all(milvus, "it_stale", ("id", "source", "source_hash"))
              if r["source"].endswith("doc0.txt")}
    assert len(hashes) == 2  # old and new rows side by side
    repaired = ingest_sources([str(corpus)], params, client=milvus, embedder=embedder)
    assert repaired.processed == 1 and repaired.rows_deleted > 0
    fresh = ingest_sources([str(corpus)], params.model_copy(update={"collection": "it_stale_fresh"}), client=milvus,
                       embedder=embedder)
    assert _ids(milvus, "it_stale") == _ids(milvus, "it_stale_fresh") and repaired.total_chunks == fresh.total_chunks


def test_real_documents_subset_round_trip(tmp_path: Path, docs: Path, milvus, embedder) -> None:
    subset = tmp_path / "docs"
    subset.mkdir()
    for name in ("testPDF.pdf", "testWORD.docx", "testMSG_chinese.msg", "testODTEncrypted.odt"):
        shutil.copy(docs / name, subset / name)
    params = IngestParams(collection="it_docs")
    result = ingest_sources([str(subset)], params, client=milvus, embedder=embedder)
    assert result.parsed == 3 and result.quarantine_counts == {"encrypted": 1} and result.chunks_written >= 3
    assert result.coverage is not None and 0 <= result.coverage.unk_share < 1
    again = ingest_sources([str(subset)], params, client=milvus, embedder=embedder)
    assert again.writes == 0 and again.quarantine_counts == {"encrypted": 1}
