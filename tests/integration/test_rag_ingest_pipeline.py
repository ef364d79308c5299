"""The overlapped ingest (parse/chunk beside embed beside write) stores exactly what the in-line one does."""

from __future__ import annotations

import shutil
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("iscc_tika")

from flows.rag.steps import ingest_sources
from infra.embeddings import EmbeddingError
from infra.milvus import query_all
from solutions.rag.config import ChunkParams, IngestParams
from tasks.ingest import IngestStages

sys.path.insert(0, str(Path(__file__).parent))
from _hash_embedder import HashEmbedder

FIELDS = ("id", "doc_id", "source", "source_hash", "chunk_index", "n_chunks", "text", "title", "page", "vector")


class ThreadRecordingEmbedder(HashEmbedder):
    """Records the thread each encode runs on; fails on a text containing ``fail_on``."""

    def __init__(self, fail_on: str | None = None) -> None:
        super().__init__()
        self.threads: set[str] = set()
        self.fail_on = fail_on

    def encode(self, texts: list[str], *, batch_size: int = 32, progress: bool = False) -> np.ndarray:
        self.threads.add(threading.current_thread().name)
        if self.fail_on and any(self.fail_on in t for t in texts):
            raise EmbeddingError("test embedder refuses this batch")
        return super().encode(texts, batch_size=batch_size, progress=progress)


def _corpus(folder: Path, docs: Path) -> Path:
    folder.mkdir()
    for i in range(5):
        body = " ".join(f"Report {i} line {j}: pump {i} pressure reading {i * 11 + j} bar." for j in range(25 + 9 * i))
        (folder / f"r{i}.txt").write_text(body + f" Call 1381234567{i}.")
    (folder / "empty.txt").write_text("")
    shutil.copy(docs / "testODTEncrypted.odt", folder / "locked.odt")  # quarantined: encrypted
    return folder


def _rows(client, collection: str) -> list[dict]:
    rows = query_all(client, collection, FIELDS)
    for r in rows:
        r["vector"] = np.round(np.asarray(r["vector"], dtype=np.float32), 5).tolist()
    return sorted(rows, key=lambda r: r["id"])


def test_overlapped_ingest_stores_what_the_in_line_ingest_stores(tmp_path: Path, milvus, docs: Path) -> None:
    corpus = _corpus(tmp_path / "corpus", docs)
    params = IngestParams(collection="it_inline", chunk=ChunkParams(tokens=48, overlap=12), batch_docs=2)
    inline_embedder, piped_embedder = ThreadRecordingEmbedder(), ThreadRecordingEmbedder()
    inline = ingest_sources([str(corpus)], params, client=milvus, embedder=inline_embedder,
                            stages=IngestStages(overlap=0))
    piped = ingest_sources([str(corpus)], params.model_copy(update={"collection": "it_piped"}), client=milvus,
                           embedder=piped_embedder, stages=IngestStages(overlap=2))
    assert inline_embedder.threads == {threading.current_thread().name}
    assert {t.split("_")[0] for t in piped_embedder.threads} == {"ingest-embed"}  # really on the embed thread
    skip = {"collection", "seconds"}
    assert piped.model_dump(exclude=skip) == inline.model_dump(exclude=skip)
    assert inline.chunks_written > 12 and inline.quarantine_counts == {"empty": 1, "encrypted": 1}
    assert inline.redactions == {"mobile": 5}
    assert _rows(milvus, "it_piped") == _rows(milvus, "it_inline")
    again = ingest_sources([str(corpus)], params.model_copy(update={"collection": "it_piped"}), client=milvus,
                           embedder=piped_embedder)
    assert again.writes == 0 and again.unchanged == 7 and again.quarantine_counts == inline.quarantine_counts


def test_an_embedding_error_on_the_pipeline_thread_fails_the_ingest(tmp_path: Path, milvus, docs: Path) -> None:
    corpus = _corpus(tmp_path / "corpus", docs)
    params = IngestParams(collection="it_piped_fail", chunk=ChunkParams(tokens=48, overlap=12), batch_docs=2)
    embedder = ThreadRecordingEmbedder(fail_on="Report 4 line")
    with pytest.raises(EmbeddingError, match="refuses this batch"):
        ingest_sources([str(corpus)], params, client=milvus, embedder=embedder)
    sources = {Path(r["source"]).name for r in query_all(milvus, "it_piped_fail", ("source",))}
    assert "r4.txt" not in sources  # the failed batch wrote nothing
    rerun = ingest_sources([str(corpus)], params, client=milvus, embedder=ThreadRecordingEmbedder())
    assert "r4.txt" in {Path(r["source"]).name for r in query_all(milvus, "it_piped_fail", ("source",))}
    assert rerun.processed + rerun.unchanged == 7 and rerun.total_chunks == rerun.chunks_written + sum(
        1 for r in query_all(milvus, "it_piped_fail", ("source",)) if Path(r["source"]).name in sources)
