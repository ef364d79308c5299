"""RAG benchmark: prints one JSON line.

- ingestion: docs/s and chunks/s over a folder (default ../shared/data/docs), plain pipeline
  (no Prefect), a fresh Milvus Lite file; then the unchanged re-ingest (writes, seconds, ratio);
- embedding: the embed stage's chunks/s vs calling the sentence-transformers model directly on
  the same chunks (ratio, target >= 0.9);
- query latency p50/p95 at N chunks (default 20k; ingested chunks tiled with jittered vectors)
  for dense, BM25 and hybrid search (query embedding and LLM excluded; reported apart),
  beside numpy brute force over the same vectors.

Usage: python bench/rag_bench.py [--docs DIR] [--chunks 20000] [--queries 100]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np


def _pct(values: list[float]) -> dict[str, float]:
    arr = np.asarray(values) * 1000
    return {"p50_ms": round(float(np.percentile(arr, 50)), 2), "p95_ms": round(float(np.percentile(arr, 95)), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "docs"))
    parser.add_argument("--chunks", type=int, default=20000)
    parser.add_argument("--queries", type=int, default=100)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    home = Path(tempfile.mkdtemp(prefix="rag-bench-"))
    os.environ["INDUSFLOW_HOME"] = str(home)
    from flows.rag.steps import ingest_sources
    from infra.embeddings import LocalEmbedder
    from infra.milvus import ensure_collection, open_client, query_all
    from solutions.rag.config import IngestParams
    from tasks.embed import embed_texts
    from tasks.index import IndexRow, write_source
    from tasks.retrieve import bm25_search, dense_search, retrieve

    out: dict = {"bench": "rag", "threads": torch.get_num_threads()}
    embedder = LocalEmbedder()
    t = time.perf_counter()
    embedder.warm_up()
    out["model_load_s"] = round(time.perf_counter() - t, 2)
    client = open_client(uri=str(home / "bench.db"))

    # -- ingestion
    params = IngestParams(collection="bench_docs")
    first = ingest_sources([args.docs], params, client=client, embedder=embedder)
    again = ingest_sources([args.docs], params, client=client, embedder=embedder)
    out["ingest"] = {
        "files": first.files, "parsed": first.parsed, "quarantined": len(first.quarantined),
        "quarantine_counts": first.quarantine_counts, "chunked_documents": first.chunked_documents,
        "chunks": first.chunks_written, "seconds": first.seconds,
        "docs_per_s": round(first.parsed / first.seconds, 2), "chunks_per_s": round(first.chunks_written / first.seconds, 2),
        "reingest_writes": again.writes, "reingest_seconds": again.seconds,
        "reingest_ratio": round(again.seconds / first.seconds, 4),
    }

    # -- embedding stage vs the model called directly
    rows = query_all(client, "bench_docs", ("id", "text"))
    texts = [r["text"] for r in rows][:200]
    model = embedder.model
    model.encode(texts[:8], batch_size=32)  # warm
    direct, stage = [], []
    for _ in range(3):  # alternate and keep the best of each: the machine is shared
        t = time.perf_counter()
        model.encode(texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True)
        direct.append(time.perf_counter() - t)
        t = time.perf_counter()
        embed_texts(embedder, texts, batch_size=32)
        stage.append(time.perf_counter() - t)
    out["embedding"] = {"chunks": len(texts), "direct_chunks_per_s": round(len(texts) / min(direct), 2),
                        "stage_chunks_per_s": round(len(texts) / min(stage), 2),
                        "ratio": round(min(direct) / min(stage), 3)}
    if hasattr(os, "getloadavg"):
        out["load_avg_1min"] = round(os.getloadavg()[0], 2)

    # -- query latency at N chunks
    base_rows = query_all(client, "bench_docs", ("id", "text", "doc_id"))
    base_vecs = embedder.encode([r["text"] for r in base_rows], batch_size=32)
    rng = np.random.default_rng(0)
    n = args.chunks
    idx = rng.integers(0, len(base_rows), n)
    vecs = base_vecs[idx] + rng.normal(0, 0.02, (n, base_vecs.shape[1])).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    ensure_collection(client, "bench_20k", embedder.dim)
    t = time.perf_counter()
    for start in range(0, n, 2000):
        part = []
        for j in range(start, min(start + 2000, n)):
            r = base_rows[idx[j]]
            part.append(IndexRow(
                id=f"b{j:06d}", doc_id=f"d{j % 500}", content_hash="h", source=f"s{j % 500}", source_hash="h",
                path=f"/bench/{j % 500}.txt", title="", author="", content_type="text/plain", language="en",
                created="", modified="", chunk_index=j, n_chunks=n, n_docs=1, created_ts=0, modified_ts=0, page=0,
                start_char=0, end_char=len(r["text"]), tokens=0, text=r["text"][:4000]))
        write_source(client, "bench_20k", f"bench-{start}", "h", part, vecs[start : start + len(part)])
    out["index_20k_insert_s"] = round(time.perf_counter() - t, 2)
    words = [w for r in base_rows[:200] for w in r["text"].split() if w.isalpha() and len(w) > 4]
    q_texts = [" ".join(rng.choice(words, 3)) for _ in range(args.queries)]
    t = time.perf_counter()
    q_vecs = embedder.encode(q_texts, batch_size=1)
    out["query_embedding_ms"] = round((time.perf_counter() - t) / len(q_texts) * 1000, 2)
    client.load_collection("bench_20k")
    dense_search(client, "bench_20k", q_vecs[:1], 5)  # warm
    bm25_search(client, "bench_20k", q_texts[:1], 5)
    lat: dict[str, list[float]] = {"dense": [], "bm25": [], "hybrid": [], "numpy": []}
    for q, v in zip(q_texts, q_vecs, strict=True):
        t = time.perf_counter()
        dense_search(client, "bench_20k", v[None, :], 5)
        lat["dense"].append(time.perf_counter() - t)
        t = time.perf_counter()
        bm25_search(client, "bench_20k", [q], 5)
        lat["bm25"].append(time.perf_counter() - t)
        t = time.perf_counter()
        retrieve(client, "bench_20k", [q], v[None, :], mode="hybrid", top_k=5, weights={"dense": 1.0, "bm25": 1.0})
        lat["hybrid"].append(time.perf_counter() - t)
        t = time.perf_counter()
        np.argpartition(-(vecs @ v), 5)[:5]
        lat["numpy"].append(time.perf_counter() - t)
    out["query_latency_at"] = n
    out["query"] = {k: _pct(v) for k, v in lat.items()}
    out["target_dense_p50_ms"] = 50
    import milvus_lite
    import pymilvus

    out["versions"] = {"pymilvus": pymilvus.__version__, "milvus_lite": getattr(milvus_lite, "__version__", "?")}
    client.close()
    print(json.dumps(out, separators=(",", ":")))


if __name__ == "__main__":
    main()
