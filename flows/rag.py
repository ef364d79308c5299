"""RAG knowledge base flows: ``ingest``, ``ask`` and ``eval``.

Run ``python -m flows.rag <command> --help``. Each command accepts ``--json`` and then prints
the flow's typed result as one JSON object on the last line of stdout.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from prefect import flow
from pydantic import BaseModel, ConfigDict, Field

from flows._cli import add_common, run_command
from flows._rag_pipeline import (
    IngestResult,
    IngestStages,
    ingest_texts,
    query_weights,
    run_ingest,
    text_documents,
)
from infra.embeddings import embedder_from_settings
from infra.home import home_layout
from infra.llm import ChatClient, ChatMessage
from infra.milvus import open_client
from infra.runners import ConfiguredTaskRunner
from infra.settings import get_llm_settings, get_tika_settings
from infra.store import stable_hash
from solutions.rag.answer import Passage, build_messages, cited_numbers, extractive_answer
from solutions.rag.config import AskParams, ChunkParams, HybridWeights, IngestParams, RedactionParams
from solutions.rag.evaluation import Hit, first_relevant_rank, load_qa, render_eval_table, retrieval_metrics
from solutions.rag.redact import RedactionConfig, StreamRedactor, redact
from tasks.documents import parse_sources_task, render_quarantine
from tasks.embed import CoverageReport, coverage_report, embed_texts_task
from tasks.evaluate import artifact_key, publish_eval_report_task
from tasks.index import write_source_task
from tasks.retrieve import Retrieved, build_filter, retrieve

log = logging.getLogger("flows.rag")  # not __main__ under python -m
TASK_STAGES = IngestStages(parse=parse_sources_task, embed=embed_texts_task, write=write_source_task,
                           submit_parse=parse_sources_task.submit)


# ------------------------------------------------------------------------------------
# results


class Citation(BaseModel):
    """Where a cited passage [n] comes from."""

    model_config = ConfigDict(frozen=True)

    number: int
    path: str
    title: str
    chunk_index: int
    page: int | None
    start_char: int
    end_char: int


class AskHit(BaseModel):
    """One retrieved chunk."""

    model_config = ConfigDict(frozen=True)

    number: int
    score: float
    ranks: dict[str, int]
    path: str
    title: str
    content_type: str
    chunk_index: int
    page: int | None
    snippet: str


class AskResult(BaseModel):
    """What ``rag-ask`` answered."""

    model_config = ConfigDict(frozen=True)

    question: str
    mode: str
    weights: dict[str, float]
    answer: str
    answer_kind: str = Field(description="'llm' or 'extractive'.")
    citations: list[Citation]
    hits: list[AskHit]
    seconds: float


class RetrieverScores(BaseModel):
    """Metrics of one retriever on a QA set."""

    model_config = ConfigDict(frozen=True)

    recall_at_1: float
    recall_at_5: float
    recall_at_10: float
    mrr_at_10: float


class EvalResult(BaseModel):
    """What ``rag-eval`` measured."""

    model_config = ConfigDict(frozen=True)

    qa_file: str
    collection: str
    questions: int
    passages_ingested: int
    scores: dict[str, RetrieverScores]
    hybrid_weights: dict[str, float]
    coverage: CoverageReport | None
    seconds: float


# ------------------------------------------------------------------------------------
# flows


@flow(name="rag-ingest", log_prints=True, task_runner=ConfiguredTaskRunner())
def rag_ingest(sources: list[str] | None = None, params: IngestParams = IngestParams()) -> IngestResult:
    """Parse documents with Apache Tika, redact personal data, chunk by tokens, embed and write
    them to Milvus (dense + BM25). Incremental: unchanged files are skipped, changed ones
    replaced, and with ``prune`` files gone from the sources are removed. Broken, encrypted,
    empty or unsupported documents are quarantined with a reason. Without ``sources`` the
    watched folder ``<home>/inbox/docs`` is ingested (the scheduled re-ingest)."""
    if not sources:
        watched = home_layout().inbox("docs")
        watched.mkdir(parents=True, exist_ok=True)
        sources = [str(watched)]
    client = open_client()
    embedder = embedder_from_settings()
    result = run_ingest(sources, params, client=client, embedder=embedder, tika_settings=get_tika_settings(),
                        stages=TASK_STAGES, show_progress=sys.stderr.isatty())
    publish_eval_report_task(render_ingest(result), key=artifact_key(f"rag-ingest-{params.collection}"),
                             description="Ingestion counts, quarantine and redactions")
    return result


@flow(name="rag-ask", log_prints=False)
def rag_ask(question: str, params: AskParams = AskParams()) -> AskResult:
    """Retrieve the top-k chunks (dense, BM25 or hybrid, with metadata filters) and answer with
    numbered citations: through the configured chat-completions endpoint, or extractively."""
    return answer_question(question, params)


@flow(name="rag-eval", log_prints=True)
def rag_eval(qa_file: str, collection: str | None = None, chunk: ChunkParams = ChunkParams(),
             weights: HybridWeights = HybridWeights()) -> EvalResult:
    """Evaluate retrieval on a QA set (JSONL or SQuAD JSON): recall@1/5/10 and MRR@10 for dense,
    BM25 and hybrid side by side. SQuAD passages are ingested into their own collection first."""
    result = evaluate_qa(Path(qa_file), collection=collection, chunk=chunk, weights=weights)
    publish_eval_report_task(render_eval(result), key=artifact_key(f"rag-eval-{Path(qa_file).stem}"),
                             description="Retrieval recall and MRR per retriever")
    return result


# ------------------------------------------------------------------------------------
# plain implementations (also used by tests and the benchmark)


def _passages(hits: list[Retrieved]) -> list[Passage]:
    return [
        Passage(number=n, text=h.fields.get("text", ""), doc_id=h.fields.get("doc_id", ""),
                path=h.fields.get("path", ""), chunk_index=int(h.fields.get("chunk_index", 0)),
                page=int(h.fields.get("page") or 0) or None, title=h.fields.get("title") or None)
        for n, h in enumerate(hits, 1)
    ]


def answer_question(question: str, params: AskParams, *, client=None, embedder=None, out=None) -> AskResult:
    """Retrieve and answer one question (see :func:`rag_ask`)."""
    started = time.perf_counter()
    client = client or open_client()
    embedder = embedder or embedder_from_settings()
    if not client.has_collection(params.collection):
        from infra.milvus import VectorStoreError

        raise VectorStoreError(f"collection {params.collection!r} does not exist: run `python -m flows.rag ingest` first")
    client.load_collection(params.collection)
    weights = query_weights(embedder, question, params.weights) if params.mode == "hybrid" else {}
    vectors = embedder.encode([question]) if params.mode != "bm25" else None
    expr = build_filter(content_type=params.content_type, path_prefix=params.path_prefix, language=params.language,
                        created_from=params.created_from, created_to=params.created_to)
    hits = retrieve(client, params.collection, [question], vectors, mode=params.mode, top_k=params.top_k, expr=expr,
                    weights=weights, fusion=params.weights.fusion, rrf_k=params.weights.rrf_k)[0]
    passages = _passages(hits)
    llm_settings = get_llm_settings()
    kind = "extractive"
    if params.llm and llm_settings.configured() and passages:
        chat = ChatClient(llm_settings)
        messages = [ChatMessage(role, content) for role, content in build_messages(question, passages)]
        if params.stream:
            pieces = []
            guard = StreamRedactor(RedactionConfig())
            for piece in chat.stream(messages):
                pieces.append(piece)
                shown = guard.feed(piece)
                if out is not None and shown:
                    out.write(shown)
                    out.flush()
            if out is not None:
                out.write(guard.flush())
                out.flush()
            text = "".join(pieces)
        else:
            text = chat.complete(messages)
        kind = "llm"
    else:
        text = extractive_answer(question, passages)
    text, _ = redact(text, RedactionConfig())
    numbers = cited_numbers(text, len(passages))
    citations = [
        Citation(number=n, path=passages[n - 1].path, title=passages[n - 1].title or "",
                 chunk_index=passages[n - 1].chunk_index, page=passages[n - 1].page,
                 start_char=int(hits[n - 1].fields.get("start_char", 0)),
                 end_char=int(hits[n - 1].fields.get("end_char", 0)))
        for n in numbers
    ]
    views = [
        AskHit(number=p.number, score=round(h.score, 6), ranks=h.ranks, path=p.path, title=p.title or "",
               content_type=h.fields.get("content_type", ""), chunk_index=p.chunk_index, page=p.page,
               snippet=p.text[:240])
        for p, h in zip(passages, hits, strict=True)
    ]
    return AskResult(question=question, mode=params.mode, weights=weights, answer=text, answer_kind=kind,
                     citations=citations, hits=views, seconds=round(time.perf_counter() - started, 3))


def _dedupe_docs(hits: list[Retrieved], k: int) -> list[Hit]:
    seen, out = set(), []
    for h in hits:
        path = h.fields.get("path", "")
        if path in seen:
            continue
        seen.add(path)
        out.append(Hit(source_id=path.rsplit("/", 1)[-1] if path.startswith("qa://") else path,
                       text=h.fields.get("text", "")))
        if len(out) == k:
            break
    return out


def evaluate_qa(qa_path: Path, *, collection: str | None = None, chunk: ChunkParams = ChunkParams(),
                weights: HybridWeights = HybridWeights(), client=None, embedder=None,
                extra_weights: dict[str, dict[str, float]] | None = None) -> EvalResult:
    """Retrieval metrics of dense, BM25 and hybrid on a QA set (see :func:`rag_eval`)."""
    started = time.perf_counter()
    qa = load_qa(qa_path)
    client = client or open_client()
    embedder = embedder or embedder_from_settings()
    ingested = 0
    coverage = None
    if qa.passages:
        collection = collection or "eval_" + stable_hash({"qa": qa.name, "n": len(qa.passages)})[:12]
        params = IngestParams(collection=collection, chunk=chunk, redaction=RedactionParams())
        docs = text_documents([(p.pid, p.title, p.text) for p in qa.passages], f"qa://{qa.name}")
        ingested, _ = ingest_texts(docs, params, client=client, embedder=embedder)
        if getattr(embedder, "exact_tokenizer", True):  # else the stand-in tokenizer says nothing of the model
            coverage = coverage_report(embedder.tokenizer, [d.text for d in docs[:500]], embedder.max_tokens, embedder.name)
    elif collection is None:
        collection = "rag_chunks"
    client.load_collection(collection)
    questions = [it.question for it in qa.items]
    vectors = embedder.encode(questions, batch_size=64)
    auto = _corpus_weights(embedder, questions, weights)
    other = "rrf" if weights.fusion == "score" else "score"
    configs: dict[str, tuple[str, dict[str, float], str]] = {
        "dense": ("dense", {}, weights.fusion), "bm25": ("bm25", {}, weights.fusion),
        "hybrid": ("hybrid", auto, weights.fusion), f"hybrid-{other}": ("hybrid", auto, other),
    }
    for name, w in (extra_weights or {}).items():
        fusion, _, _ = name.partition(":")
        configs[name] = ("hybrid", w, fusion if fusion in ("rrf", "score") else weights.fusion)
    depth = 30
    scores: dict[str, RetrieverScores] = {}
    for name, (mode, w, fusion) in configs.items():
        ranks = []
        for start in range(0, len(questions), 64):
            qs = questions[start : start + 64]
            hits = retrieve(client, collection, qs, vectors[start : start + 64], mode=mode, top_k=depth,
                            weights=w or None, fusion=fusion, rrf_k=weights.rrf_k, depth=depth)
            for item, h in zip(qa.items[start : start + 64], hits, strict=True):
                ranks.append(first_relevant_rank(item, _dedupe_docs(h, 10)))
        m = retrieval_metrics(ranks)
        scores[name] = RetrieverScores(recall_at_1=m["recall@1"], recall_at_5=m["recall@5"],
                                       recall_at_10=m["recall@10"], mrr_at_10=m["mrr@10"])
    return EvalResult(qa_file=str(qa_path), collection=collection, questions=len(questions),
                      passages_ingested=ingested, scores=scores, hybrid_weights=auto, coverage=coverage,
                      seconds=round(time.perf_counter() - started, 2))


def _corpus_weights(embedder, questions: list[str], weights: HybridWeights) -> dict[str, float]:
    """One set of fusion weights for a whole QA set: the median per-question auto weight."""
    if weights.dense != "auto":
        return {"dense": float(weights.dense), "bm25": weights.bm25}
    sample = questions[:200]
    dense = sorted(query_weights(embedder, q, weights)["dense"] for q in sample)
    return {"dense": dense[len(dense) // 2] if dense else 1.0, "bm25": weights.bm25}


# ------------------------------------------------------------------------------------
# reports


def render_ingest(r: IngestResult) -> str:
    """Markdown report of one ingestion."""
    lines = [
        f"# rag-ingest: {r.collection}", "",
        f"- files: {r.files} ({r.unchanged} unchanged, {r.processed} processed)",
        (f"- documents parsed: {r.parsed}; chunked: {r.chunked_documents}; quarantined: {len(r.quarantined)} "
         f"{r.quarantine_counts}"),
        f"- chunks written: {r.chunks_written}; rows deleted: {r.rows_deleted}; pruned sources: {r.pruned_sources}",
        f"- chunks in the collection: {r.total_chunks}",
        f"- redactions: {r.redactions or 'none'}",
        f"- seconds: {r.seconds}",
    ]
    if r.coverage:
        c = r.coverage
        lines.append(f"- embedder {c.model}: unknown pieces {c.unk_share:.1%}, chunks over its {c.window}-token "
                     f"window {c.truncated_share:.1%}" + (f" — {c.advice}" if c.poor else ""))
    from tasks.documents import Quarantined

    lines += ["", "## Quarantine", "", render_quarantine([Quarantined(q.path, q.reason, q.detail) for q in r.quarantined])]
    return "\n".join(lines)


def render_eval(r: EvalResult) -> str:
    """Markdown table of an evaluation."""
    rows = {name: {"recall@1": s.recall_at_1, "recall@5": s.recall_at_5, "recall@10": s.recall_at_10,
                   "MRR@10": s.mrr_at_10} for name, s in r.scores.items()}
    notes = [f"{r.questions} questions; collection {r.collection}; hybrid weights {r.hybrid_weights}",
             "hybrid = the configured fusion (default: score fusion); the other fusion is shown beside it"]
    if r.coverage:
        notes.append(f"embedder {r.coverage.model}: unknown pieces {r.coverage.unk_share:.1%}, passages over its "
                     f"window {r.coverage.truncated_share:.1%}")
    return render_eval_table(rows, f"rag-eval: {Path(r.qa_file).name}", notes)


# ------------------------------------------------------------------------------------
# command line


def _ingest_summary(r: IngestResult) -> str:
    lines = [
        (f"ingested into {r.collection}: {r.files} files ({r.unchanged} unchanged), {r.parsed} documents parsed, "
         f"{r.chunked_documents} chunked, {len(r.quarantined)} quarantined {r.quarantine_counts}"),
        (f"  chunks written {r.chunks_written}, rows deleted {r.rows_deleted}, writes {r.writes}, "
         f"in collection {r.total_chunks}, {r.seconds:.1f} s"),
    ]
    lines += [f"  quarantined {q.reason:<11} {q.path}" for q in r.quarantined]
    if r.coverage and r.coverage.poor:
        lines.append(f"  warning: {r.coverage.advice}")
    return "\n".join(lines)


def _ask_summary(r: AskResult, with_answer: bool = True) -> str:
    lines = [r.answer, ""] if with_answer else [""]
    for c in r.citations:
        where = f"chunk {c.chunk_index}" + (f", page {c.page}" if c.page else "")
        lines.append(f"[{c.number}] {c.path} ({where}, chars {c.start_char}-{c.end_char})")
    if not r.citations:
        lines += [f"[{h.number}] {h.path} (chunk {h.chunk_index})" for h in r.hits]
    return "\n".join(lines)


def _eval_summary(r: EvalResult) -> str:
    return render_eval(r)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def main(argv: list[str] | None = None) -> int:
    """``python -m flows.rag {ingest,ask,eval}``."""
    parser = argparse.ArgumentParser(prog="python -m flows.rag", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = IngestParams()

    i = sub.add_parser("ingest", help="parse, redact, chunk, embed and index documents", description=rag_ingest.description)
    i.add_argument("sources", nargs="+", metavar="SOURCE", help="files or folders (archives yield their documents)")
    i.add_argument("--collection", default=d.collection, help="Milvus collection (default %(default)s)")
    i.add_argument("--chunk-tokens", type=_positive_int, default=d.chunk.tokens, help="window size in tokens (default %(default)s)")
    i.add_argument("--chunk-overlap", type=int, default=d.chunk.overlap, help="overlap in tokens (default %(default)s)")
    i.add_argument("--prune", action="store_true", help="remove chunks of files no longer under the sources")
    i.add_argument("--no-redact", action="append", default=[], choices=["email", "cn_id", "bank_card", "mobile"],
                   help="switch one redaction kind off (repeatable)")
    i.add_argument("--batch-docs", type=_positive_int, default=d.batch_docs, help="files per batch (default %(default)s)")
    add_common(i)

    a = sub.add_parser("ask", help="answer a question with citations", description=rag_ask.description)
    a.add_argument("question")
    a.add_argument("--collection", default=d.collection, help="default %(default)s")
    a.add_argument("--mode", choices=["dense", "bm25", "hybrid"], default="hybrid", help="retriever (default %(default)s)")
    a.add_argument("--top-k", type=_positive_int, default=5, help="chunks retrieved (default %(default)s)")
    a.add_argument("--dense-weight", default="auto", help="hybrid weight of dense retrieval: a number or 'auto' "
                   "(lowered when the embedder covers the question poorly; default %(default)s)")
    a.add_argument("--bm25-weight", type=float, default=1.0, help="hybrid weight of BM25 (default %(default)s)")
    a.add_argument("--fusion", choices=["score", "rrf"], default="score",
                   help="hybrid fusion: weighted normalised scores or weighted reciprocal ranks (default %(default)s)")
    a.add_argument("--content-type", help="keep chunks whose content type starts with this (e.g. application/pdf)")
    a.add_argument("--path-prefix", help="keep chunks whose document path starts with this")
    a.add_argument("--language", help="keep chunks of this language (zh, en, ...)")
    a.add_argument("--created-from", metavar="DATE", help="documents created on/after (ISO date)")
    a.add_argument("--created-to", metavar="DATE", help="documents created on/before (ISO date)")
    a.add_argument("--no-llm", action="store_true", help="extractive answer even when an LLM is configured")
    a.add_argument("--stream", action="store_true", help="stream the LLM answer as it is generated")
    add_common(a)

    e = sub.add_parser("eval", help="recall@k and MRR of dense, BM25 and hybrid on a QA set", description=rag_eval.description)
    e.add_argument("--qa", required=True, metavar="FILE", help="JSONL of {question, answers|gold_ids} or SQuAD JSON")
    e.add_argument("--collection", help="collection to query (default: a new one for SQuAD passages, else rag_chunks)")
    e.add_argument("--chunk-tokens", type=_positive_int, default=d.chunk.tokens, help="default %(default)s")
    e.add_argument("--chunk-overlap", type=int, default=d.chunk.overlap, help="default %(default)s")
    e.add_argument("--dense-weight", default="auto", help="hybrid weight of dense retrieval (default %(default)s)")
    e.add_argument("--fusion", choices=["score", "rrf"], default="score", help="hybrid fusion (default %(default)s)")
    add_common(e)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.command == "ingest":
        if args.chunk_overlap >= args.chunk_tokens:
            parser.error("--chunk-overlap must be smaller than --chunk-tokens")
        params = IngestParams(
            collection=args.collection, prune=args.prune, batch_docs=args.batch_docs,
            chunk=ChunkParams(tokens=args.chunk_tokens, overlap=args.chunk_overlap),
            redaction=RedactionParams(**{k: False for k in args.no_redact}),
        )
        return run_command(lambda: rag_ingest(args.sources, params), as_json=args.json, summary=_ingest_summary)
    dense = args.dense_weight if args.dense_weight == "auto" else float(args.dense_weight)
    if args.command == "ask":
        params = AskParams(
            collection=args.collection, mode=args.mode, top_k=args.top_k,
            weights=HybridWeights(dense=dense, bm25=args.bm25_weight, fusion=args.fusion), content_type=args.content_type,
            path_prefix=args.path_prefix, language=args.language, created_from=args.created_from,
            created_to=args.created_to, llm=not args.no_llm, stream=args.stream,
        )
        if args.stream:
            return run_command(lambda: answer_question(args.question, params, out=sys.stdout),
                               as_json=args.json, summary=lambda r: _ask_summary(r, with_answer=False))
        return run_command(lambda: rag_ask(args.question, params), as_json=args.json, summary=_ask_summary)
    return run_command(
        lambda: rag_eval(args.qa, collection=args.collection,
                         chunk=ChunkParams(tokens=args.chunk_tokens, overlap=args.chunk_overlap),
                         weights=HybridWeights(dense=dense, fusion=args.fusion)),
        as_json=args.json, summary=_eval_summary,
    )


if __name__ == "__main__":
    sys.exit(main())
