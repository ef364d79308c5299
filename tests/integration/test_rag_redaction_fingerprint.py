"""Redaction settings and rules are part of the ingest fingerprint: changing them re-processes documents."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from flows.rag.steps import ingest_sources
from infra import pii as redact_mod
from infra.milvus import query_all
from solutions.rag.config import ChunkParams, IngestParams, RedactionParams

sys.path.insert(0, str(Path(__file__).parent))
from _hash_embedder import HashEmbedder

pytest.importorskip("iscc_tika")


def _texts(client, collection: str) -> str:
    return " ".join(r["text"] for r in query_all(client, collection, ("id", "text")))


def test_redaction_changes_reprocess_without_a_version_bump(tmp_path: Path, milvus, monkeypatch) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(2):
        (corpus / f"doc{i}.txt").write_text(f"Record {i} for the audit. " * 10
                                            + f"Write to clerk{i}@example.com or call 1381234567{i}.")
    embedder = HashEmbedder()
    params = IngestParams(collection="it_redaction_fp", chunk=ChunkParams(tokens=64, overlap=16))
    first = ingest_sources([str(corpus)], params, client=milvus, embedder=embedder)
    assert first.redactions == {"email": 2, "mobile": 2}
    assert ingest_sources([str(corpus)], params, client=milvus, embedder=embedder).writes == 0

    off = params.model_copy(update={"redaction": RedactionParams(email=False)})
    turned_off = ingest_sources([str(corpus)], off, client=milvus, embedder=embedder)
    assert turned_off.processed == 2 and turned_off.redactions == {"mobile": 2}
    assert "clerk0@example.com" in _texts(milvus, "it_redaction_fp")
    turned_on = ingest_sources([str(corpus)], params, client=milvus, embedder=embedder)
    assert turned_on.processed == 2 and "@example.com" not in _texts(milvus, "it_redaction_fp")

    # a rule edit (here: the mobile pattern) changes the fingerprint on its own
    monkeypatch.setattr(redact_mod, "_MOBILE", re.compile(r"(?<!\d)1[3-9]\d{9}(?!\d)(?=NEVER)"))
    edited = ingest_sources([str(corpus)], params, client=milvus, embedder=embedder)
    assert edited.processed == 2 and edited.redactions == {"email": 2}
    assert "13812345670" in _texts(milvus, "it_redaction_fp")
    assert ingest_sources([str(corpus)], params, client=milvus, embedder=embedder).writes == 0
