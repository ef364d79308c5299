"""``POST /v1/kb/search`` and ``POST /v1/kb/ask`` as predictors (:mod:`infra.serving.predictor`),
served by the generic :class:`~infra.serving.model_route.ModelRoute` like the fraud and sensor models.

The model of both is the :class:`~flows.serve.kb_engine.KbEngine` (an embedder, a Milvus client and
the configured chat endpoint, each loaded on first use): no registry version (``registered = False``),
so there is no hot reload, challenger or score log, and the route's breaker counts the engine's own
failures (an upstream's failure is the upstream's: it answers 502 with its status, as before).

* search is batched: concurrent searches share one embedder call for their vectors and one Milvus
  call per collection, retriever, depth and fusion weights (:meth:`KbEngine.search_many`);
* ask is not (``batchable = False``): an LLM answer takes seconds, and the batch's one thread would
  serialise every question behind it; each question is its own call on the thread pool.

What stays outside the predictors, and why:

* the streamed answer (``stream: true``): tokens go out as the LLM writes them, while a predictor's
  ``predict`` returns one finished output per request; :class:`AskRoute` answers a stream itself (no
  batch, no breaker: a failure mid-stream is an ``error`` event after the 200) and builds its final
  events with the same :func:`ask_response` as the JSON answer;
* per-collection access is the request's own check, so it is part of ``decode_request`` (403/404
  before the request reaches the engine), as the fraud and sensor scopes are;
* the abstention (``answered``, ``support``) is part of the answer the engine returns; votes on
  answers are no model call (``POST /v1/kb/feedback``, :mod:`flows.serve.kb`).
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar

import numpy as np
from fastapi import Request
from fastapi.responses import StreamingResponse

from flows.serve.kb_collection_routes import PREFIX, KbPrincipal
from flows.serve.kb_engine import KbEngine, Search
from flows.serve.kb_models import AskRequest, AskResponse, PassageOut, SearchRequest, SearchResponse
from infra.pii import redact_text
from infra.registry import ModelRef
from infra.secrets import UpstreamError
from infra.serving.audit import annotate_audit
from infra.serving.breaker import USER_ERRORS
from infra.serving.model_route import ModelRoute
from infra.serving.predictor import Answer, Audit, Encoded, Predictor, Rows
from solutions.rag.collections import KbCollection
from solutions.rag.conversation import Turn, standalone_question
from solutions.rag.evidence import highlight_spans
from solutions.rag.glossary import GlossaryMatch
from solutions.rag.library import error_text
from solutions.rag.support import Support
from tasks.retrieve import Retrieved

log = logging.getLogger(__name__)

_WORDS = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\u3000-\u303f\uff00-\uffef]|[^\s\u3400-\u4dbf\u4e00-\u9fff\u3000-\u303f\uff00-\uffef]+\s*|\s+")
#: ``openapi_extra`` of ask: JSON, or server-sent events
ASK_OPENAPI: dict[str, Any] = {"responses": {"200": {
    "content": {"text/event-stream": {}},
    "description": "JSON, or with stream=true server-sent events: token*, citations, done (with 'answered') (or error)."}}}

#: ``allowed(principal, collection, read=True)``: the collection if the key may read it (else 403/404)
Access = Callable[..., KbCollection]


def sse(event: str, data: dict[str, Any]) -> bytes:
    """One server-sent event."""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def words(text: str) -> list[str]:
    """``text`` in the pieces an extractive answer is streamed in: words with their following
    space, and CJK characters one by one."""
    return _WORDS.findall(text)


def passages_out(hits: Sequence[Retrieved], name_of: Callable[[str, str], str],
                 cited: Sequence[int] = (), answer: str = "") -> list[PassageOut]:
    """The hits as numbered passages, every text redacted again (rows of older rule sets too);
    ``name_of(source, path)`` names a chunk's document as the documents list does. With the
    ``answer``, each cited passage carries the spans of its text the answer rests on."""
    texts = {n: redact_text(str(h.fields.get("text", ""))) for n, h in enumerate(hits, 1)}
    spans = highlight_spans(answer, {n: texts[n] for n in cited}) if answer and cited else {}
    out = []
    for n, h in enumerate(hits, 1):
        f = h.fields
        out.append(PassageOut(
            n=n, score=round(float(h.score), 6),
            document=redact_text(name_of(str(f.get("source", "")), str(f.get("path", "")))),
            title=redact_text(str(f.get("title") or "")), page=int(f.get("page") or 0) or None,
            chunk_id=str(h.id), chunk_index=int(f.get("chunk_index", 0)), text=texts[n],
            cited=n in cited, highlight=spans.get(n, []),
        ))
    return out


def names_in(engine: KbEngine, col: KbCollection) -> Callable[[str, str], str]:
    """``name_of`` of :func:`passages_out` for ``col``."""
    return lambda source, path: engine.document_name(col, source, path)


def one_request(output: object) -> Rows:
    """A request of the knowledge base is one row of its batch (never in the score log)."""
    return Rows(subjects=(), ids=[""], scores=np.zeros(1), logged=False)


# ------------------------------------------------------------------------------------
# search


Body = TypeVar("Body", SearchRequest, AskRequest)


@dataclass(frozen=True)
class InCollection(Generic[Body]):
    """A request the key may make of one collection (its access checked): the collection and the body."""

    col: KbCollection
    body: Body


Query: TypeAlias = InCollection[SearchRequest]  # a search
Question: TypeAlias = InCollection[AskRequest]  # a question


@dataclass(frozen=True)
class Found:
    """A search's hits and the glossary entries its query matched."""

    hits: list[Retrieved]
    glossary: list[GlossaryMatch]


class KbSearchPredictor(Predictor[Query, KbEngine, Found]):
    """Passages of one collection with their scores (retriever: hybrid, dense or bm25)."""

    path, route_name, tag, response_model = f"{PREFIX}/search", "search", "kb", SearchResponse
    registered = False

    def __init__(self, engine: KbEngine, allowed: Access, on_query: Callable[[str, str, str], None]) -> None:
        super().__init__("kb-search")
        self.engine, self.allowed, self.on_query = engine, allowed, on_query

    def setup(self, ref: ModelRef | None) -> KbEngine:
        return self.engine  # its client and embedder load on first use

    async def decode_request(self, body: SearchRequest, request: Request, principal: KbPrincipal) -> Query:
        """The body, once the key may read its collection (403/404 otherwise)."""
        col = self.allowed(principal, body.collection, read=True)
        annotate_audit(request, collection=col.name, retriever=body.retriever, top_k=body.top_k)
        return InCollection(col, body)

    def predict(self, model: KbEngine, items: list[Query], challenger: KbEngine | None = None) -> list[Found | Exception]:
        found = model.search_many([Search(q.col, q.body.query, q.body.top_k, q.body.retriever) for q in items])
        return [Found(hits, list(expansion.matches)) for hits, expansion in found]

    def encode_response(self, decoded: Query, answer: Answer[Found]) -> Encoded:
        found, col, body = answer.output, decoded.col, decoded.body
        assert isinstance(found, Found)
        self.on_query(col.name, "search", body.retriever)
        return Encoded(SearchResponse(collection=col.name, retriever=body.retriever, glossary=found.glossary,
                                      passages=passages_out(found.hits, names_in(self.engine, col))),
                       Audit(1, {}, fields={"passages": len(found.hits)}))

    def user_errors(self) -> tuple[type[BaseException], ...]:
        return (*USER_ERRORS, UpstreamError)

    rows = staticmethod(one_request)


# ------------------------------------------------------------------------------------
# ask


@dataclass(frozen=True)
class Answered:
    """What the engine answered (:meth:`KbEngine.answer`), the question retrieval used and the
    glossary entries it matched."""

    text: str
    mode: str
    hits: list[Retrieved]
    cited: list[int]
    support: Support
    asked: str
    glossary: list[GlossaryMatch]


def retrieval_question(engine: KbEngine, body: AskRequest) -> str:
    """The question retrieval uses (redacted): a follow-up resolved against the history."""
    if not body.history:
        return redact_text(body.question)
    return standalone_question(body.question, [Turn(t.question, t.answer) for t in body.history], engine.chat())


def answer_question(engine: KbEngine, q: Question, **stream: Any) -> Answered:
    """``q`` answered over its collection (``stream``: :meth:`KbEngine.answer`'s ``stream_to`` and
    ``on_extractive``)."""
    asked = retrieval_question(engine, q.body)
    text, mode, hits, cited, support = engine.answer(q.col, asked, top_k=q.body.top_k, mode=q.body.retriever, **stream)
    return Answered(text, mode, hits, cited, support, asked, list(engine.expansion(q.col, asked).matches))


def ask_response(engine: KbEngine, q: Question, a: Answered) -> AskResponse:
    """The JSON answer (a stream's ``citations`` and ``done`` events say the same)."""
    shown = "" if a.asked.strip() == redact_text(q.body.question).strip() else a.asked
    return AskResponse(collection=q.col.name, answer=a.text, mode=a.mode, answered=a.support.answered,
                       support=a.support.probability, reason=a.support.reason,
                       citations=passages_out(a.hits, names_in(engine, q.col), a.cited, a.text),
                       retrieval_question=shown, glossary=a.glossary)


def answer_audit(a: Answered) -> dict[str, Any]:
    """What an answer adds to its audit line (counts only)."""
    return {"passages": len(a.hits), "cited": len(a.cited), "answer_mode": a.mode, "answered": a.support.answered}


class KbAskPredictor(Predictor[Question, KbEngine, Answered]):
    """Answer a question from one collection with numbered citations ([n] = passage n)."""

    path, route_name, tag, response_model = f"{PREFIX}/ask", "ask", "kb", AskResponse
    openapi_extra = ASK_OPENAPI
    batchable = False  # an LLM answer takes seconds: the batch's one thread would queue every question
    registered = False

    def __init__(self, engine: KbEngine, allowed: Access, on_query: Callable[[str, str, str], None]) -> None:
        super().__init__("kb-ask")
        self.engine, self.allowed, self.on_query = engine, allowed, on_query

    def setup(self, ref: ModelRef | None) -> KbEngine:
        return self.engine

    async def decode_request(self, body: AskRequest, request: Request, principal: KbPrincipal) -> Question:
        """The body, once the key may read its collection (403/404 otherwise)."""
        col = self.allowed(principal, body.collection, read=True)
        self.on_query(col.name, "ask", body.retriever)
        annotate_audit(request, collection=col.name, retriever=body.retriever, top_k=body.top_k, stream=body.stream,
                       turns=len(body.history))
        return InCollection(col, body)

    def predict(self, model: KbEngine, items: list[Question],
                challenger: KbEngine | None = None) -> list[Answered | Exception]:
        return [answer_question(model, q) for q in items]

    def encode_response(self, decoded: Question, answer: Answer[Answered]) -> Encoded:
        assert isinstance(answer.output, Answered)
        return Encoded(ask_response(self.engine, decoded, answer.output), Audit(1, {}, fields=answer_audit(answer.output)))

    def user_errors(self) -> tuple[type[BaseException], ...]:
        return (*USER_ERRORS, UpstreamError)

    rows = staticmethod(one_request)


class QueueWriter(io.TextIOBase):
    """A text stream whose writes land in an asyncio queue (from the answer's worker thread)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, q: asyncio.Queue[tuple[str, Any]]) -> None:
        self.loop, self.q = loop, q

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if text:
            self.loop.call_soon_threadsafe(self.q.put_nowait, ("token", text))
        return len(text)


class AskRoute(ModelRoute[Question, KbEngine, Answered]):
    """Ask's route: a JSON answer through :class:`ModelRoute`, a streamed one (``stream: true``) here,
    as server-sent events: its tokens as they come, then the citations and ``done``."""

    predictor: KbAskPredictor

    async def answer(self, request: Request, decoded: Question) -> Any:
        if not decoded.body.stream:
            # an upstream's failure (UpstreamError) answers 502 with its status only (EXCEPTION_HANDLERS)
            return await super().answer(request, decoded)
        return StreamingResponse(self.events(decoded, request), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    async def events(self, q: Question, request: Request) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        worker = loop.run_in_executor(None, self.answer_into, q, loop, queue)
        try:
            while True:
                kind, data = await queue.get()
                if kind == "token":
                    yield sse("token", {"text": data})
                elif kind == "error":
                    # an upstream's message (scrubbed) names what failed; any other is logged by its type only
                    log.error("kb ask stream failed: %s", data if isinstance(data, UpstreamError) else type(data).__name__)
                    annotate_audit(request, failed=type(data).__name__)
                    yield sse("error", {"message": error_text(data)})
                    return
                else:
                    annotate_audit(request, **answer_audit(data))
                    body = ask_response(self.predictor.engine, q, data)
                    yield sse("citations", {"citations": [c.model_dump() for c in body.citations]})
                    yield sse("done", {"mode": body.mode, "answer": body.answer, "answered": body.answered,
                                       "support": body.support, "reason": body.reason,
                                       "retrieval_question": body.retrieval_question,
                                       "glossary": [m.model_dump() for m in body.glossary]})
                    return
        finally:
            if not worker.done():
                worker.cancel()

    def answer_into(self, q: Question, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[tuple[str, Any]]) -> None:
        """Answer in this (worker) thread, each token, the end or the error put on ``queue``."""
        def extractive(text: str) -> None:
            for piece in words(text):
                loop.call_soon_threadsafe(queue.put_nowait, ("token", piece))

        try:
            answered = answer_question(self.predictor.engine, q, stream_to=QueueWriter(loop, queue),
                                       on_extractive=extractive)
            loop.call_soon_threadsafe(queue.put_nowait, ("end", answered))
        except Exception as exc:  # noqa: BLE001 - reported to the caller as an error event
            loop.call_soon_threadsafe(queue.put_nowait, ("error", exc))
