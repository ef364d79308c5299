"""``rag-eval``: recall@k and MRR of dense, BM25 and hybrid retrieval on a QA set."""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from flows.rag.steps import evaluate_qa_task
from solutions.rag.config import ChunkParams, HybridWeights
from solutions.rag.evaluation import render_eval
from solutions.rag.results import EvalResult
from tasks.evaluate import artifact_key, publish_eval_report_task


@flow(name="rag-eval", log_prints=True)
def rag_eval(data: str, collection: str | None = None, chunk: ChunkParams = ChunkParams(),  # noqa: B008 - a frozen typed default renders a UI form
             weights: HybridWeights = HybridWeights()) -> EvalResult:  # noqa: B008 - a frozen typed default renders a UI form
    """Evaluate retrieval on a QA set (JSONL or SQuAD JSON): recall@1/5/10 and MRR@10 for dense,
    BM25 and hybrid side by side. SQuAD passages are ingested into their own collection first.

    Args:
        data: QA file: JSONL of {question, answers|gold_ids}, or SQuAD JSON.
        collection: Collection to query (default: a new one for SQuAD passages, else
            INDUSFLOW_MILVUS_COLLECTION).
        chunk: Token windows of the SQuAD passages.
        weights: Hybrid weights of dense and BM25.
    """
    result = evaluate_qa_task(Path(data), collection=collection, chunk=chunk, weights=weights)
    publish_eval_report_task(render_eval(result), key=artifact_key(f"rag-eval-{Path(data).stem}"),
                             description="Retrieval recall and MRR per retriever")
    return result
