"""Answer a question from a knowledge-base collection: a plain function without Prefect.

The ``rag-ask`` flow runs it as its one task (:mod:`flows.rag.steps`); ``python -m flows.rag ask``
calls it directly when no Prefect API is set (a read-only query: no flow run to record, so no
temporary Prefect server and no Prefect import), and the tests call it with their own client.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from infra.embeddings import Embedder, embedder_from_settings, encode_queries
from infra.llm import ChatClient
from infra.milvus import VectorStoreError, default_collection, open_client, row_count
from infra.pii import redact_path, redact_text
from infra.settings import get_llm_settings
from solutions.rag.answer import answer_or_abstain, ask_result
from solutions.rag.collections import DEFAULT, milvus_collection
from solutions.rag.config import AskParams
from solutions.rag.conversation import Turn, standalone_question
from solutions.rag.glossary import collection_glossary, expand, in_passage_words
from solutions.rag.results import AskResult
from solutions.rag.support import content_query
from solutions.rag.weights import query_weights
from tasks.retrieve import best_bm25, build_filter, retrieve


def chat_client(use_llm: bool) -> ChatClient | None:
    """The configured chat endpoint, or None (not configured, or not wanted)."""
    settings = get_llm_settings()
    return ChatClient(settings) if use_llm and settings.configured() else None


def answer_question(question: str, params: AskParams, *, client: Any = None, embedder: Embedder | None = None,
                    out: TextIO | None = None, previous: Sequence[str] = ()) -> AskResult:
    """Retrieve the top-k chunks for ``question`` and answer with numbered citations.

    The question is redacted first (:func:`infra.pii.redact_text`): the stored chunks hold
    placeholders, so nothing is lost for retrieval, and the raw text reaches neither the
    embedder, the LLM nor the result. With ``params.stream`` the LLM's answer is written to
    ``out`` (default: stdout) as it comes. With ``previous`` questions (the conversation, oldest
    first) a follow-up is resolved against them first (:func:`solutions.rag.conversation.standalone_question`)
    and retrieval and the answer use the standalone question. With ``params.glossary`` the
    collection's glossary adds the other forms of each term the question names to the query BM25
    and the embedder see (:mod:`solutions.rag.glossary`), the answer step reads the question in
    the passages' words, and the result lists the entries matched.
    """
    started = time.perf_counter()
    asked = redact_text(question)
    chat = chat_client(params.llm)
    question = standalone_question(asked, [Turn(q) for q in previous], chat) if previous else asked
    if params.path_prefix:  # stored paths are redacted: compare like with like
        params = params.model_copy(update={"path_prefix": redact_path(params.path_prefix)})
    client = client or open_client()
    embedder = embedder or embedder_from_settings(few_queries=True)
    collection = default_collection(milvus_collection(params.collection))
    if not client.has_collection(collection):
        raise VectorStoreError(f"collection {collection!r} does not exist: run `python -m flows.rag ingest` first")
    client.load_collection(collection)
    expansion = expand(collection_glossary(params.collection or DEFAULT) if params.glossary else None, question)
    weights = query_weights(embedder, question, params.weights) if params.mode == "hybrid" else {}
    vectors = encode_queries(embedder, [expansion.query]) if params.mode != "bm25" else None
    expr = build_filter(content_type=params.content_type, path_prefix=params.path_prefix, language=params.language,
                        created_from=params.created_from, created_to=params.created_to)
    hits = retrieve(client, collection, [expansion.query], vectors, mode=params.mode, top_k=params.top_k, expr=expr,
                    weights=weights)[0]
    stream_to = (out or sys.stdout) if params.stream else None
    worded = in_passage_words(expansion, [str(h.fields.get("text", "")) for h in hits])  # 心梗 -> 心肌梗死
    text, kind, support = answer_or_abstain(worded, hits, chat,
                                            collection=params.collection or DEFAULT,
                                            embedder=embedder.name if params.mode != "bm25" else None,
                                            n_chunks=row_count(client, collection), mode=params.mode,
                                            content_bm25=best_bm25(client, collection, content_query(worded), expr)
                                            if params.mode != "dense" else None, stream_to=stream_to)
    result = ask_result(question, params.mode, weights, (text, kind), hits, streamed=params.stream,
                        seconds=round(time.perf_counter() - started, 3), support=support)
    if expansion.matches:
        result = result.model_copy(update={"glossary": list(expansion.matches)})
    if question.strip() == asked.strip():
        return result
    return result.model_copy(update={"question": asked, "retrieval_question": question})
