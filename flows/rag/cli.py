"""``python -m flows.rag {ingest,ask,eval,feedback-export}``: the RAG commands, generated from the flows.

Each command accepts ``--json`` and then prints the flow's typed result as one JSON object on
the last line of stdout.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from flows.cli import Command, make_main
from infra.pii import redact_path, redact_text

if TYPE_CHECKING:
    from solutions.rag.feedback import FeedbackExport
    from solutions.rag.results import AskResult, EvalResult
    from tasks.ingest import IngestResult

#: The flows, by entrypoint: imported only when a command runs (see flows/cli.py).
INGEST = "flows.rag.ingest:rag_ingest"
ASK = "flows.rag.ask:rag_ask"
EVAL = "flows.rag.evaluate:rag_eval"
FEEDBACK_EXPORT = "flows.rag.feedback:rag_feedback_export"
#: ``ask`` reads only: without a Prefect API it calls the flow's step directly (no flow run, no
#: temporary Prefect server: seconds instead of half a minute per question)
ASK_LOCAL = "flows.rag.answer:answer_question"

CHUNK_FLAGS = {"chunk.tokens": "chunk-tokens", "chunk.overlap": "chunk-overlap"}
WEIGHT_FLAGS = {"weights.dense": "dense-weight", "weights.bm25": "bm25-weight"}


def _ingest_summary(r: IngestResult) -> str:
    from solutions.rag.library import quarantined_files
    from tasks.documents import reason_text

    files = quarantined_files(r.quarantined, reason_text)  # as the /kb page's documents list counts and words them
    members = sum(1 for q in r.quarantined if q.file_indexed)
    lines = [
        (f"ingested into {r.collection}: {r.files} files ({r.unchanged} unchanged), {r.parsed} documents parsed, "
         f"{r.chunked_documents} chunked, {len(files)} files quarantined"
         + (f", {members} archive members of indexed files not indexed" if members else "")),
        (f"  chunks written {r.chunks_written}, rows deleted {r.rows_deleted}, writes {r.writes}, "
         f"in collection {r.total_chunks}, {r.seconds:.1f} s"),
    ]
    lines += [f"  quarantined {path} ({why})" for path, why in files.items()]
    lines += [f"  OCR {i.engine:<9} {i.pages_ocr} pages {i.path}" for i in r.ocr]
    if r.coverage and r.coverage.poor:
        lines.append(f"  warning: {r.coverage.advice}")
    return "\n".join(lines)


def _ask_summary(r: AskResult) -> str:
    lines = [""] if r.streamed else [r.answer, ""]  # a streamed answer is on the console already
    if r.retrieval_question:
        lines.insert(0, f"(searched for: {r.retrieval_question})")
    for m in r.glossary:  # the glossary entries that widened the query
        lines.insert(0, f"(glossary: {m.matched} = {m.term}; also searched for {', '.join(m.added)})")
    for c in r.citations:
        where = f"chunk {c.chunk_index}" + (f", page {c.page}" if c.page else "")
        lines.append(f"[{c.number}] {c.path} ({where}, chars {c.start_char}-{c.end_char})")
        lines += [f"    > {' '.join(q.split())[:200]}" for q in c.quotes]  # the sentence the answer rests on
    if not r.answered:
        if r.support is not None and r.support.reason:
            lines.append(f"(not answered: {r.support.reason})")
        if r.hits:
            lines.append("Related passages, not an answer:")
    if not r.citations:
        lines += [f"[{h.number}] {h.path} (chunk {h.chunk_index})" for h in r.hits]
    return "\n".join(lines)


def _eval_summary(r: EvalResult) -> str:
    from solutions.rag.evaluation import render_eval

    return render_eval(r)


def _feedback_summary(r: FeedbackExport) -> str:
    keys = ", ".join(f"{k} {n}" for k, n in list(r.keys.items())[:10]) + (", ..." if len(r.keys) > 10 else "")
    return (f"{r.collection}: {r.votes} votes ({r.up} up, {r.down} down) by {len(r.keys)} keys ({keys}); "
            f"{r.questions} questions written to {r.out}\n"
            f"  evaluate with: python -m flows.rag eval --data {r.out} --collection {r.collection}")


def _milvus_free(kwargs: dict[str, Any]) -> None:
    """The Milvus Lite file is not held by another process (a running server, say)."""
    from infra.milvus import check_lite_free

    check_lite_free()


def _sources_exist(kwargs: dict[str, Any]) -> None:
    missing = [s for s in kwargs.get("sources") or [] if not Path(s).expanduser().exists()]
    if missing:
        raise ValueError(f"source not found: {', '.join(redact_path(m) for m in missing)}")
    _milvus_free(kwargs)


def _data_exists(kwargs: dict[str, Any]) -> None:
    path = Path(kwargs["data"]).expanduser()
    if not path.is_file():
        raise ValueError(f"--data: QA file not found: {kwargs['data']}")
    _milvus_free(kwargs)


def _collection_name(kwargs: dict[str, Any]) -> None:
    from solutions.rag.collections import check_collection_name

    try:
        if "collection" in kwargs:  # else the flow's default
            check_collection_name(kwargs["collection"])
    except ValueError as exc:
        raise ValueError(f"--collection: {exc}") from None
    if kwargs.get("min_voters", 1) < 1:
        raise ValueError("--min-voters: at least 1 (the keys that must have voted a question up)")


def _redacted_question(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The question (and a path prefix) redacted before they become flow parameters, which the
    Prefect database keeps and its UI shows."""
    out = dict(kwargs)
    out["question"] = redact_text(kwargs["question"])
    if kwargs.get("previous"):
        out["previous"] = [redact_text(q) for q in kwargs["previous"]]
    params = kwargs.get("params")
    if params is not None and params.path_prefix:
        out["params"] = params.model_copy(update={"path_prefix": redact_path(params.path_prefix)})
    return out


COMMANDS = [
    Command(
        "ingest", INGEST, _ingest_summary, help="parse, redact, chunk, embed and index documents",
        positional="sources",
        flags={"sources": "source", **{f"params.{k}": v for k, v in CHUNK_FLAGS.items()},
               **{f"params.redaction.{kind}": f"no-redact-{kind.replace('_', '-')}"
                  for kind in ("email", "cn_id", "bank_card", "mobile")}},
        common=("params.collection", "params.chunk", "params.prune", "job"),
        check=_sources_exist,
    ),
    Command(
        "ask", ASK, _ask_summary, help="answer a question with citations", positional="question",
        flags={f"params.{k}": v for k, v in WEIGHT_FLAGS.items()}, prepare=_redacted_question,
        common=("params.collection", "params.mode", "params.top_k", "params.llm", "params.language", "previous"),
        check=_milvus_free, local=ASK_LOCAL,
    ),
    Command(
        "eval", EVAL, _eval_summary, help="recall@k and MRR of dense, BM25 and hybrid on a QA set",
        flags={**CHUNK_FLAGS, **WEIGHT_FLAGS}, check=_data_exists,
    ),
    Command(
        "feedback-export", FEEDBACK_EXPORT, _feedback_summary,
        help="the thumbs-up answers of the /kb page as a QA set for `eval`", check=_collection_name,
    ),
]

main = make_main("python -m flows.rag", "RAG knowledge base: ingest documents, ask questions, evaluate retrieval.",
                 COMMANDS)
