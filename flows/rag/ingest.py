"""``rag-ingest``: documents -> Tika -> redaction -> token chunks -> embeddings -> Milvus."""

from __future__ import annotations

import sys

from prefect import flow

from flows.rag.job import run_kb_job
from flows.rag.steps import ingest_sources, watched_folder
from infra.embeddings import embedder_from_settings
from infra.milvus import open_client
from infra.runners import ConfiguredTaskRunner
from infra.settings import get_tika_settings
from solutions.rag.config import IngestParams
from tasks.evaluate import artifact_key, publish_eval_report_task
from tasks.ingest import IngestResult, render_ingest, task_stages


@flow(name="rag-ingest", log_prints=True, task_runner=ConfiguredTaskRunner())
def rag_ingest(sources: list[str] | None = None, params: IngestParams = IngestParams(),  # noqa: B008 - a frozen typed default renders a UI form
               job: str | None = None) -> IngestResult:
    """Parse documents with Apache Tika, redact personal data, chunk by tokens, embed and write
    them to Milvus (dense + BM25). Incremental: unchanged files are skipped, changed ones
    replaced, and with ``prune`` files gone from the sources are removed. Broken, encrypted,
    empty or unsupported documents are quarantined with a reason.

    Args:
        sources: Files or folders (archives yield their documents); none: the collection's
            watched folder, <home>/inbox/docs for the default one (what the scheduled re-ingest
            reads), <home>/inbox/kb/<collection> for the others.
        params: Collection, chunking, redaction and batching.
        job: An upload's ingest job of the knowledge-base API (its id): ingest that job's
            collection's watched folder, pruned, and record the outcome on the job
            (sources and params are then not used).
    """
    if job:
        result = run_kb_job(job, client=open_client(), embedder=embedder_from_settings(), stages=task_stages())
    else:
        result = ingest_sources(sources or [watched_folder(params.collection)], params, client=open_client(),
                                embedder=embedder_from_settings(), tika_settings=get_tika_settings(),
                                stages=task_stages(), show_progress=sys.stderr.isatty())
    publish_eval_report_task(render_ingest(result, "rag-ingest"), key=artifact_key(f"rag-ingest-{result.collection}"),
                             description="Ingestion counts, quarantine and redactions")
    return result
