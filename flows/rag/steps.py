"""Thin domain steps of the RAG vertical: the solution's rules, weights and answers joined to
the generic tasks (parse, chunk, embed, index, retrieve).

Each step is a plain function (tests and the benchmark call it with their own Milvus client
and embedder) and, where a flow calls it as one step, a ``@task`` over it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from flows.rag.answer import answer_question
from infra.embeddings import CoverageReport, Embedder, coverage_report, embedder_from_settings, encode_queries
from infra.milvus import default_collection, open_client
from infra.settings import TikaSettings
from solutions.rag.collections import milvus_collection, watched_folder_of
from solutions.rag.config import ChunkParams, HybridWeights, IngestParams, RedactionParams
from solutions.rag.evaluation import QASet, load_qa, qa_collection, retriever_configs, retriever_scores
from solutions.rag.ingest import document_rules
from solutions.rag.results import EvalResult
from solutions.rag.weights import corpus_weights
from tasks.chunk import embedder_window
from tasks.ingest import IngestResult, IngestStages, ingest_texts, run_ingest, text_documents
from tasks.retrieve import retrieve_batched

EVAL_DEPTH = 30  # chunks retrieved per question when evaluating (deduplicated to 10 documents)
EVAL_BATCH = 64  # questions per retrieval call when evaluating


# ------------------------------------------------------------------------------------
# ingest


def watched_folder(collection: str | None = None) -> str:
    """The watched folder of a knowledge-base collection, created if missing: ``<home>/inbox/docs``
    for the default one (what the scheduled re-ingest reads), ``<home>/inbox/kb/<name>`` else."""
    return str(watched_folder_of(collection))


def ingest_sources(
    sources: Sequence[str],
    params: IngestParams,
    *,
    client: Any,
    embedder: Embedder,
    tika_settings: TikaSettings | None = None,
    stages: IngestStages | None = None,
    show_progress: bool = False,
    on_source_written: Callable[[str], None] | None = None,
) -> IngestResult:
    """Ingest files/folders under the knowledge base's redaction and chunking rules."""
    return run_ingest(
        sources, document_rules(params.chunk, params.redaction, embedder.name, embedder_window(embedder)),
        collection=default_collection(milvus_collection(params.collection)), client=client, embedder=embedder,
        batch_docs=params.batch_docs, max_archive_members=params.max_archive_members, prune=params.prune,
        tika_settings=tika_settings, stages=stages or IngestStages(), show_progress=show_progress,
        on_source_written=on_source_written,
    )


# ------------------------------------------------------------------------------------
# ask

answer_question_task = task(name="answer-question", cache_policy=NONE)(answer_question)


# ------------------------------------------------------------------------------------
# eval


def ingest_qa_passages(qa: QASet, collection: str, chunk: ChunkParams, *, client: Any,
                       embedder: Embedder) -> tuple[int, CoverageReport | None]:
    """Write a QA set's own passages (SQuAD contexts) to ``collection``; returns the passages
    written and the embedder's coverage of them."""
    rules = document_rules(chunk, RedactionParams(), embedder.name, embedder_window(embedder))
    docs = text_documents([(p.pid, p.title, p.text) for p in qa.passages], f"qa://{qa.name}")
    written, _ = ingest_texts(docs, rules, collection=collection, client=client, embedder=embedder)
    coverage = None
    if getattr(embedder, "exact_tokenizer", True):  # else the stand-in tokenizer says nothing of the model
        coverage = coverage_report(embedder.tokenizer, [d.text for d in docs[:500]], embedder.max_tokens, embedder.name)
    return written, coverage


def evaluate_qa(qa_path: Path, *, collection: str | None, chunk: ChunkParams, weights: HybridWeights,
                client: Any = None, embedder: Embedder | None = None) -> EvalResult:
    """recall@1/5/10 and MRR@10 of dense, BM25 and hybrid retrieval on a QA set."""
    started = time.perf_counter()
    qa = load_qa(qa_path)
    client = client or open_client()
    embedder = embedder or embedder_from_settings()
    ingested, coverage = 0, None
    if qa.passages:
        collection = collection or qa_collection(qa)
        ingested, coverage = ingest_qa_passages(qa, collection, chunk, client=client, embedder=embedder)
    collection = default_collection(collection)
    client.load_collection(collection)
    questions = [it.question for it in qa.items]
    vectors = encode_queries(embedder, questions, batch_size=EVAL_BATCH)
    auto = corpus_weights(embedder, questions, weights)
    scores = {}
    for name, (mode, w) in retriever_configs(auto).items():
        hits = retrieve_batched(client, collection, questions, vectors, batch=EVAL_BATCH, mode=mode, top_k=EVAL_DEPTH,
                                weights=w or None, depth=EVAL_DEPTH)
        scores[name] = retriever_scores(qa.items, [[h.fields for h in per_question] for per_question in hits])
    return EvalResult(qa_file=str(qa_path), collection=collection, questions=len(questions),
                      passages_ingested=ingested, scores=scores, hybrid_weights=auto, coverage=coverage,
                      seconds=round(time.perf_counter() - started, 2))


evaluate_qa_task = task(name="evaluate-retrievers", cache_policy=NONE)(evaluate_qa)
