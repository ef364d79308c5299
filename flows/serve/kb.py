"""``/v1/kb/*``: the knowledge base over HTTP — search, cited answers (JSON or server-sent
events; a follow-up resolved against the conversation's earlier turns), votes on answers,
document uploads that start an ingest, document status and deletion, per collection.

Access: a key's scopes name the collections it may use, ``kb:<collection>:read`` (collections,
search, ask, documents list, its jobs, the stored text around a passage), ``kb:<collection>:write``
(upload, delete, documents list, jobs) and ``kb:<collection>:source`` (download a passage's
original file); ``admin`` may do everything. A collection the key may not use answers 403 whether it
exists or not. Each collection has its own Milvus collection, so retrieval (dense, BM25 and
hybrid) and answers only ever see the passages of the collection asked.

What reaches the audit log: the key id, route, status, latency, collection, retriever, vote and
counts (turns, passages, files, bytes, chunks). Never a question, an answer, a passage or a
document name. Votes are stored redacted in the home (:mod:`solutions.rag.feedback`).
The wire format is in ``docs/kb_api.md``.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse
from prometheus_client import Counter
from pydantic import BaseModel, ConfigDict, Field

from flows.serve.kb_collection_routes import (
    PREFIX,
    KbPrincipal,
    add_evidence_routes,
    add_glossary_routes,
)
from flows.serve.kb_engine import MAX_ACTIVE_JOBS, KbEngine
from flows.serve.kb_evidence import source_scope
from infra.embeddings import Embedder
from infra.pii import redact_text
from infra.secrets import UpstreamError
from infra.serving.audit import annotate_audit
from infra.serving.auth import Principal
from infra.serving.runtime import RouteLimits, Services, Vertical
from infra.settings import get_kb_settings
from solutions.rag.collections import KbCollection, configured_collections
from solutions.rag.conversation import MAX_TURNS, Turn, standalone_question
from solutions.rag.evidence import highlight_spans
from solutions.rag.feedback import CitedPassage, VoteBudget, VoteLimit, feedback_path, feedback_record
from solutions.rag.glossary import GlossaryMatch
from solutions.rag.library import IngestJob, UploadRefused, error_text
from solutions.rag.upload import FILES_FIELD, UploadParser, multipart_boundary
from tasks.documents import archive_members
from tasks.retrieve import Retrieved

log = logging.getLogger(__name__)

MULTIPART_OVERHEAD = 64 * 1024
#: Most archive members in one upload request, all its archives (zip, tar, 7z) together, nested ones counting too
#: (422 above): the ingest caps each file's members at its own limit (tasks.containers.ArchiveLimits).
MAX_UPLOAD_MEMBERS = 1000
_WORDS = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\u3000-\u303f\uff00-\uffef]|[^\s\u3400-\u4dbf\u4e00-\u9fff\u3000-\u303f\uff00-\uffef]+\s*|\s+")

Retriever = Literal["hybrid", "dense", "bm25"]
#: A passage's ``chunk_id`` as the index makes them (``<doc id>-<content hash>-<index>``).
ChunkId = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,128}$")]
#: The routes that can wait long on an upstream (the LLM, the embedder, Milvus) and their caps: at
#: most 12 requests of each in flight (24 of the 40 worker threads; the rest stay free for every
#: other route: fraud labels, approvals, the collections list) and 4 per key (one client cannot
#: take a route). 45 concurrent asks with an LLM taking 15 s answered labels and approvals 504.
SLOW_ROUTES = ("ask", "search")
SLOW_ROUTE_CONCURRENCY = 12
SLOW_ROUTE_PER_KEY = 4


#: The upload form in the OpenAPI document (the route reads the multipart body itself, after the
#: key is checked, so FastAPI does not declare it).
UPLOAD_OPENAPI: dict[str, Any] = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["files"],
    "properties": {"collection": {"type": "string", "description": "The collection (or ?collection=)."},
                   "files": {"type": "array", "items": {"type": "string", "format": "binary"}}}}}}}}


class SearchRequest(BaseModel):
    """A query over one collection."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "examples": [{"collection": "legal", "query": "notice period for termination", "top_k": 5,
                      "retriever": "hybrid"}]})

    collection: str = Field(min_length=1, max_length=40, description="The collection to search.")
    query: str = Field(min_length=1, max_length=4000, description="What to look for (redacted before use).")
    top_k: int = Field(default=5, ge=1, le=50, description="Passages returned.")
    retriever: Retriever = Field(default="hybrid", description="dense, bm25 or hybrid (weighted fusion).")


class TurnIn(BaseModel):
    """An earlier turn of the conversation (redacted before use, never stored by ``ask``)."""

    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1, max_length=4000, description="The question asked then.")
    answer: str = Field(default="", max_length=8000, description="The answer shown then.")


class AskRequest(BaseModel):
    """A question over one collection, with the conversation before it when it is a follow-up."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "examples": [{"collection": "legal", "question": "What is the notice period?", "top_k": 5,
                      "stream": False}]})

    collection: str = Field(min_length=1, max_length=40, description="The collection to ask.")
    question: str = Field(min_length=1, max_length=4000, description="The question (redacted before use).")
    top_k: int = Field(default=5, ge=1, le=50, description="Passages retrieved and numbered for citation.")
    retriever: Retriever = Field(default="hybrid", description="dense, bm25 or hybrid.")
    stream: bool = Field(default=False, description="Answer as server-sent events (token, citations, done).")
    history: list[TurnIn] = Field(default_factory=list, max_length=MAX_TURNS,
                                  description=f"Earlier turns, oldest first (at most {MAX_TURNS}): a follow-up is "
                                  "resolved against them into the standalone question retrieval uses.")


class FeedbackRequest(BaseModel):
    """A thumbs-up or -down on one answer of the page."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "examples": [{"collection": "legal", "question": "What is the notice period?", "vote": "up",
                      "answer": "Ninety-seven days [1].", "chunk_ids": ["3f2a…"], "answered": True, "mode": "extractive"}]})

    collection: str = Field(min_length=1, max_length=40)
    vote: Literal["up", "down"]
    question: str = Field(min_length=1, max_length=4000, description="The question as asked (redacted before it is stored).")
    retrieval_question: str = Field(default="", max_length=8000, description="The question retrieval used.")
    answer: str = Field(default="", max_length=20000, description="The answer shown (redacted before it is stored).")
    chunk_ids: list[ChunkId] = Field(default_factory=list, max_length=50,
                                     description="The passages the answer cited (their chunk_id).")
    answered: bool = True
    mode: Literal["llm", "extractive", "none", ""] = Field(default="", description="The answer's mode.")


class PassageOut(BaseModel):
    """A retrieved passage, numbered in rank order (``[n]`` in answers)."""

    n: int
    score: float
    document: str = Field(description="The document's name in the collection (archive members: archive!/member).")
    title: str
    page: int | None
    chunk_id: str
    chunk_index: int
    text: str
    cited: bool = Field(default=False, description="The answer cites it (ask only).")
    highlight: list[tuple[int, int]] = Field(
        default_factory=list, description="Character spans [start, end) of 'text' that the answer's sentences "
        "citing this passage rest on (ask only; empty when none could be located).")


class SearchResponse(BaseModel):
    collection: str
    retriever: str
    passages: list[PassageOut]
    glossary: list[GlossaryMatch] = Field(default_factory=list, description="The collection's glossary entries the "
                                          "query matched; their other forms were added to the query.")


class AskResponse(BaseModel):
    collection: str
    answer: str
    mode: str = Field(description="'llm', 'extractive', or 'none' when the KB did not answer.")
    answered: bool = Field(description="The retrieved passages support the answer. False: 'answer' says the "
                           "documents do not answer, and the passages are related, not an answer.")
    support: float = Field(description="Calibrated probability that the documents answer the question.")
    reason: str = Field(default="", description="Why the KB did not answer (empty when it did).")
    citations: list[PassageOut] = Field(description="Every retrieved passage, numbered; 'cited' marks those the answer cites.")
    retrieval_question: str = Field(default="", description="The question retrieval used (redacted) when it is not "
                                    "the question itself: a follow-up resolved against the earlier turns (history).")
    glossary: list[GlossaryMatch] = Field(default_factory=list, description="The collection's glossary entries the "
                                          "question matched; their other forms were added to the query.")


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


def build(services: Services, *, client: Any = None, embedder: Embedder | None = None,
          ingest_in_thread: bool = False) -> Vertical | None:
    """The knowledge-base vertical of the API (its collections from ``INDUSFLOW_KB_COLLECTIONS``).

    Args:
        services: the server's shared objects.
        client: a Milvus client (tests); default: the configured one, opened on first use.
        embedder: an embedder (tests); default: the configured one, loaded on first use.
        ingest_in_thread: run upload ingests on a thread of this process with ``client`` and ``embedder``
            (tests); default: outside it, as a deployment's flow run or a child process.
    """
    settings = get_kb_settings()
    collections = configured_collections(services.layout)
    registry = services.metrics.registry
    queries = Counter("indusflow_kb_queries_total", "Knowledge-base searches and questions.",
                      ["collection", "kind", "retriever"], registry=registry)
    uploads = Counter("indusflow_kb_uploaded_files_total", "Documents uploaded.", ["collection"], registry=registry)
    jobs = Counter("indusflow_kb_ingest_jobs_total", "Ingest jobs finished, by outcome.", ["collection", "state"],
                   registry=registry)
    chunks = Counter("indusflow_kb_chunks_written_total", "Chunks written by ingest jobs.", ["collection"],
                     registry=registry)

    def finished(job: IngestJob) -> None:
        jobs.labels(collection=job.collection, state=job.state).inc()
        chunks.labels(collection=job.collection).inc(job.counts.get("chunks_written", 0))

    engine = KbEngine(collections, services.layout, settings, client=client, embedder=embedder, on_job=finished,
                      ingest_in_thread=ingest_in_thread)
    votes = VoteBudget()  # bytes of votes per key and collection
    engine.recover()  # jobs a crashed or restarted server left queued or running
    services.route_limits[PREFIX] = RouteLimits(timeout_s=settings.request_timeout_s)
    services.route_limits[f"{PREFIX}/documents"] = RouteLimits(
        max_body_bytes=settings.max_upload_bytes + MULTIPART_OVERHEAD, timeout_s=settings.request_timeout_s)
    for slow in SLOW_ROUTES:  # each holds a worker thread while the LLM or the retriever works
        services.route_limits[f"{PREFIX}/{slow}"] = RouteLimits(
            timeout_s=settings.request_timeout_s, concurrency=SLOW_ROUTE_CONCURRENCY, per_key=SLOW_ROUTE_PER_KEY)
    router = APIRouter(tags=["knowledge base"])

    def names_in(col: KbCollection) -> Callable[[str, str], str]:
        return lambda source, path: engine.document_name(col, source, path)

    def allowed(principal: Principal, name: str, *, read: bool = False, write: bool = False) -> KbCollection:
        """The collection ``name`` if the principal may read (``read``) or write (``write``) it
        (either one when both are asked). 403 otherwise, whether it exists or not; only a key
        that could use it (admin) learns that it does not exist (404)."""
        scopes = [s for s, wanted in ((f"kb:{name}:read", read), (f"kb:{name}:write", write)) if wanted]
        if not any(principal.allows(s) for s in scopes):
            raise HTTPException(403, f"this credential may not {'read' if read else 'write'} collection {name!r}")
        col = collections.get(name)
        if col is None:
            raise HTTPException(404, f"no collection {name!r} is served (INDUSFLOW_KB_COLLECTIONS)")
        return col

    @router.get(f"{PREFIX}/collections")
    async def list_collections(request: Request, principal: KbPrincipal) -> dict[str, Any]:
        """The collections this key may read or write, with their document counts (the rows of
        their documents list, by status)."""
        out = []
        for col in collections.values():
            read, write = principal.allows(col.read_scope), principal.allows(col.write_scope)
            if read or write:
                docs = await run_in_threadpool(engine.documents, col)
                by_status = {s: sum(1 for d in docs if d.status == s) for s in ("indexed", "quarantined", "pending")}
                out.append({"name": col.name, "read": read, "write": write, "source": principal.allows(source_scope(col)),
                            "documents": len(docs), **by_status})
        annotate_audit(request, collections=len(out))
        return {"collections": out}

    @router.post(f"{PREFIX}/search", response_model=SearchResponse)
    async def search(body: SearchRequest, request: Request,
                     principal: KbPrincipal) -> SearchResponse:
        """Passages of one collection with their scores (retriever: hybrid, dense or bm25)."""
        col = allowed(principal, body.collection, read=True)
        hits = await run_in_threadpool(engine.search, col, body.query, top_k=body.top_k, mode=body.retriever)
        queries.labels(collection=col.name, kind="search", retriever=body.retriever).inc()
        annotate_audit(request, collection=col.name, retriever=body.retriever, top_k=body.top_k, passages=len(hits))
        return SearchResponse(collection=col.name, retriever=body.retriever,
                              passages=passages_out(hits, names_in(col)), glossary=matched(col, body.query))

    @router.post(f"{PREFIX}/ask", response_model=AskResponse,
                 responses={200: {"content": {"text/event-stream": {}},
                                  "description": "JSON, or with stream=true server-sent events: token*, citations, done "
                                  "(with 'answered') "
                                  "(or error)."}})
    async def ask(body: AskRequest, request: Request,
                  principal: KbPrincipal) -> Any:
        """Answer a question from one collection with numbered citations ([n] = passage n)."""
        col = allowed(principal, body.collection, read=True)
        queries.labels(collection=col.name, kind="ask", retriever=body.retriever).inc()
        annotate_audit(request, collection=col.name, retriever=body.retriever, top_k=body.top_k, stream=body.stream,
                       turns=len(body.history))
        if body.stream:
            return StreamingResponse(stream_answer(body, col, request), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
        # an upstream's failure (UpstreamError) answers 502 with its status only (EXCEPTION_HANDLERS)
        asked = await run_in_threadpool(resolved, body)
        text, kind, hits, cited, support = await run_in_threadpool(engine.answer, col, asked, top_k=body.top_k,
                                                                   mode=body.retriever)
        annotate_audit(request, passages=len(hits), cited=len(cited), answer_mode=kind, answered=support.answered)
        return AskResponse(collection=col.name, answer=text, mode=kind, answered=support.answered,
                           support=support.probability, reason=support.reason,
                           citations=passages_out(hits, names_in(col), cited, text),
                           retrieval_question=shown(body, asked), glossary=matched(col, asked))

    def resolved(body: AskRequest) -> str:
        """The question retrieval uses (redacted): a follow-up resolved against the history."""
        if not body.history:
            return redact_text(body.question)
        return standalone_question(body.question, [Turn(t.question, t.answer) for t in body.history], engine.chat())

    def matched(col: KbCollection, query: str) -> list[GlossaryMatch]:
        """The glossary entries ``query`` matched (what the engine's search expanded it with)."""
        return list(engine.expansion(col, query).matches)

    def shown(body: AskRequest, asked: str) -> str:
        """``retrieval_question`` of a response: empty when it is the question itself."""
        return "" if asked.strip() == redact_text(body.question).strip() else asked

    async def stream_answer(body: AskRequest, col: KbCollection, request: Request) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        writer = QueueWriter(loop, q)

        def extractive(text: str) -> None:
            for piece in words(text):
                loop.call_soon_threadsafe(q.put_nowait, ("token", piece))

        def work() -> None:
            try:
                asked = resolved(body)
                result = engine.answer(col, asked, top_k=body.top_k, mode=body.retriever, stream_to=writer,
                                       on_extractive=extractive)
                loop.call_soon_threadsafe(q.put_nowait, ("end", (*result, asked)))
            except Exception as exc:  # noqa: BLE001 - reported to the caller as an error event
                loop.call_soon_threadsafe(q.put_nowait, ("error", exc))

        worker = loop.run_in_executor(None, work)
        try:
            while True:
                kind, data = await q.get()
                if kind == "token":
                    yield sse("token", {"text": data})
                elif kind == "error":
                    # an upstream's message (scrubbed) names what failed; any other is logged by its type only
                    log.error("kb ask stream failed: %s", data if isinstance(data, UpstreamError) else type(data).__name__)
                    annotate_audit(request, failed=type(data).__name__)
                    yield sse("error", {"message": error_text(data)})
                    return
                else:
                    text, mode, hits, cited, support, asked = data
                    annotate_audit(request, passages=len(hits), cited=len(cited), answer_mode=mode,
                                   answered=support.answered)
                    citations = passages_out(hits, names_in(col), cited, text)
                    yield sse("citations", {"citations": [c.model_dump() for c in citations]})
                    yield sse("done", {"mode": mode, "answer": text, "answered": support.answered,
                                       "support": support.probability, "reason": support.reason,
                                       "retrieval_question": shown(body, asked),
                                       "glossary": [m.model_dump() for m in matched(col, asked)]})
                    return
        finally:
            if not worker.done():
                worker.cancel()

    def cited_passages(col: KbCollection, chunk_ids: list[str]) -> list[CitedPassage]:
        """The chunks of ``col`` among ``chunk_ids`` (others are ignored), with their names and paths."""
        client = engine.client()
        ids = list(dict.fromkeys(chunk_ids))
        if not ids or not client.has_collection(col.milvus):
            return []
        rows = {str(r["id"]): r for r in client.get(col.milvus, ids=ids, output_fields=["source", "path"])}
        return [CitedPassage(chunk_id=i, path=str(rows[i].get("path", "")),
                             document=engine.document_name(col, str(rows[i].get("source", "")), str(rows[i].get("path", ""))))
                for i in ids if i in rows]

    @router.post(f"{PREFIX}/feedback", status_code=201)
    async def feedback(body: FeedbackRequest, request: Request, principal: KbPrincipal) -> dict[str, Any]:
        """Record a thumbs-up or -down on an answer (redacted, in the home, with the key's id; never
        its secret; bounded per vote and per key: 429 past the key's share). The votes become an
        evaluation set with ``python -m flows.rag feedback-export`` (one vote per key and question)."""
        col = allowed(principal, body.collection, read=True)
        passages = await run_in_threadpool(cited_passages, col, body.chunk_ids)
        record = feedback_record(col.name, body.vote, body.question, body.answer, passages,
                                 retrieval_question=body.retrieval_question, answered=body.answered, mode=body.mode,
                                 key_id=principal.key_id)
        try:
            await run_in_threadpool(votes.append, feedback_path(services.layout.kb_feedback(), col.name), record)
        except VoteLimit as exc:
            raise HTTPException(429, str(exc)) from None
        annotate_audit(request, collection=col.name, vote=body.vote, passages=len(passages))
        return {"recorded": True, "vote": body.vote, "passages": len(passages)}

    @router.post(f"{PREFIX}/documents", status_code=202, openapi_extra=UPLOAD_OPENAPI)
    async def upload(request: Request, principal: KbPrincipal,
                     collection: Annotated[str | None, Query(description="The collection (or the form field).")] = None,
                     ) -> JSONResponse:
        """Upload one or more files (multipart: ``collection`` first, then ``files``; or
        ``?collection=``) into a collection's watched folder and start its ingest; 202 with the
        job id to poll."""
        if collection is not None:  # known before the body is read: refuse early
            queue_room(allowed(principal, collection, write=True))
        try:
            parser = UploadParser(multipart_boundary(request.headers.get("content-type")),
                                  lambda name: allowed(principal, name, write=True), query_collection=collection,
                                  max_bytes=settings.max_upload_bytes, max_files=settings.max_upload_files,
                                  max_members=MAX_UPLOAD_MEMBERS, count_members=archive_members)
            staged = await parser.feed(request.stream())
            if staged.collection is None or not staged.files:
                raise UploadRefused(f"the form holds no {FILES_FIELD!r}")
            try:
                queue_room(staged.collection)
                written = await run_in_threadpool(staged.commit)
            except BaseException:
                staged.discard()
                raise
        except UploadRefused as exc:
            raise HTTPException(exc.status, str(exc)) from None
        col, names = staged.collection, [f.name for f in staged.files]
        job = engine.submit(col, names)
        uploads.labels(collection=col.name).inc(len(names))
        annotate_audit(request, collection=col.name, files=len(names), bytes=written, members=staged.members,
                       job_id=job.job_id)
        return JSONResponse(job.public() | {"files": [{"name": n, "status": "queued"} for n in names]},
                            status_code=202)

    def queue_room(col: KbCollection) -> None:
        """429 while the collection's job queue is full."""
        if engine.queue_full(col):
            raise HTTPException(429, f"collection {col.name!r} already has {MAX_ACTIVE_JOBS} ingest jobs queued or "
                                "running; upload again when one has finished", headers={"Retry-After": "30"})

    @router.get(f"{PREFIX}/jobs/{{job_id}}")
    async def get_job(job_id: str, request: Request, principal: KbPrincipal) -> dict[str, Any]:
        """An ingest job: queued, running, done or failed, with the status of each of its files."""
        job = engine.job(job_id)
        if job is None or not (principal.allows(f"kb:{job.collection}:write")
                               or principal.allows(f"kb:{job.collection}:read")):
            raise HTTPException(404, "no such job (or not one of a collection this key may use)")
        annotate_audit(request, collection=job.collection, job_state=job.state)
        return job.public()

    @router.get(f"{PREFIX}/documents")
    async def list_documents(request: Request, principal: KbPrincipal,
                             collection: Annotated[str, Query(description="The collection.")]) -> dict[str, Any]:
        """Each document of a collection: indexed (with its chunk count), quarantined (with the
        reason) or pending (not ingested yet, or being ingested)."""
        col = allowed(principal, collection, read=True, write=True)
        docs = await run_in_threadpool(engine.documents, col)
        annotate_audit(request, collection=col.name, documents=len(docs))
        return {"collection": col.name, "documents": [d.public() for d in docs]}

    @router.delete(f"{PREFIX}/documents/{{name:path}}")
    async def delete_document(name: str, request: Request, principal: KbPrincipal,
                              collection: Annotated[str, Query(description="The collection.")]) -> dict[str, Any]:
        """Remove a document: its chunks from the index (dense and BM25), its quarantine record
        and its file in the watched folder."""
        col = allowed(principal, collection, write=True)
        result = await run_in_threadpool(engine.delete, col, name)
        if result is None:
            raise HTTPException(404, "no such document in this collection")
        doc, removed = result
        annotate_audit(request, collection=col.name, chunks_removed=removed)
        return {"deleted": doc.name, "chunks_removed": removed, "file_removed": doc.in_folder}

    add_glossary_routes(router, engine, allowed)
    add_evidence_routes(router, engine, collections)
    return Vertical("kb", router, [], on_stop=engine.close)
