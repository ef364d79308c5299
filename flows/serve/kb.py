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

import logging
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from prometheus_client import Counter

from flows.serve.kb_collection_routes import (
    PREFIX,
    KbPrincipal,
    add_evidence_routes,
    add_glossary_routes,
)
from flows.serve.kb_engine import MAX_ACTIVE_JOBS, KbEngine
from flows.serve.kb_evidence import source_scope
from flows.serve.kb_models import FeedbackRequest
from flows.serve.kb_predictors import AskRoute, KbAskPredictor, KbSearchPredictor
from infra.embeddings import Embedder
from infra.serving.audit import annotate_audit
from infra.serving.auth import Principal
from infra.serving.model_route import ModelRoute
from infra.serving.runtime import RouteLimits, Services, Vertical
from infra.settings import KbSettings, get_kb_settings
from solutions.rag.collections import KbCollection, configured_collections
from solutions.rag.feedback import CitedPassage, VoteBudget, VoteLimit, feedback_path, feedback_record
from solutions.rag.library import IngestJob, UploadRefused
from solutions.rag.upload import FILES_FIELD, UploadParser, multipart_boundary
from tasks.documents import archive_members

log = logging.getLogger(__name__)

MULTIPART_OVERHEAD = 64 * 1024
#: Most archive members in one upload request, all its archives (zip, tar, 7z) together, nested ones counting too
#: (422 above): the ingest caps each file's members at its own limit (tasks.containers.ArchiveLimits).
MAX_UPLOAD_MEMBERS = 1000

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


class KbApi:
    """The knowledge base's routes over one :class:`KbEngine`: search and ask as predictors on the
    generic model route (:mod:`flows.serve.kb_predictors`), every other route a method; what they share
    (the collections, the metrics, the vote budget) held here; :meth:`mount` adds them to a router."""

    def __init__(self, services: Services, engine: KbEngine, settings: KbSettings, metrics: KbMetrics) -> None:
        self.services = services
        self.engine = engine
        self.collections = engine.collections
        self.settings = settings
        self.metrics = metrics
        self.votes = VoteBudget()  # bytes of votes per key and collection
        on_query = self.count_query
        #: search and ask: predictors served by the generic model route (:mod:`flows.serve.kb_predictors`)
        self.routes = [ModelRoute(services, KbSearchPredictor(engine, self.allowed, on_query)),
                       AskRoute(services, KbAskPredictor(engine, self.allowed, on_query))]

    def count_query(self, collection: str, kind: str, retriever: str) -> None:
        self.metrics.queries.labels(collection=collection, kind=kind, retriever=retriever).inc()

    def close(self) -> None:
        """Stop the search batcher, then the engine."""
        for route in self.routes:
            route.close()
        self.engine.close()

    def mount(self, router: APIRouter) -> None:
        """Add every route of the knowledge base to ``router``."""
        router.add_api_route(f"{PREFIX}/collections", self.list_collections, methods=["GET"])
        for route in self.routes:
            route.mount(router)
        router.add_api_route(f"{PREFIX}/feedback", self.feedback, methods=["POST"], status_code=201)
        router.add_api_route(f"{PREFIX}/documents", self.upload, methods=["POST"], status_code=202,
                             openapi_extra=UPLOAD_OPENAPI)
        router.add_api_route(f"{PREFIX}/jobs/{{job_id}}", self.get_job, methods=["GET"])
        router.add_api_route(f"{PREFIX}/documents", self.list_documents, methods=["GET"])
        router.add_api_route(f"{PREFIX}/documents/{{name:path}}", self.delete_document, methods=["DELETE"])
        add_glossary_routes(router, self.engine, self.allowed)
        add_evidence_routes(router, self.engine, self.collections)

    # -- what the routes share
    def allowed(self, principal: Principal, name: str, *, read: bool = False, write: bool = False) -> KbCollection:
        """The collection ``name`` if the principal may read (``read``) or write (``write``) it
        (either one when both are asked). 403 otherwise, whether it exists or not; only a key
        that could use it (admin) learns that it does not exist (404)."""
        scopes = [s for s, wanted in ((f"kb:{name}:read", read), (f"kb:{name}:write", write)) if wanted]
        if not any(principal.allows(s) for s in scopes):
            raise HTTPException(403, f"this credential may not {'read' if read else 'write'} collection {name!r}")
        col = self.collections.get(name)
        if col is None:
            raise HTTPException(404, f"no collection {name!r} is served (INDUSFLOW_KB_COLLECTIONS)")
        return col

    def queue_room(self, col: KbCollection) -> None:
        """429 while the collection's job queue is full."""
        if self.engine.queue_full(col):
            raise HTTPException(429, f"collection {col.name!r} already has {MAX_ACTIVE_JOBS} ingest jobs queued or "
                                "running; upload again when one has finished", headers={"Retry-After": "30"})

    def cited_passages(self, col: KbCollection, chunk_ids: list[str]) -> list[CitedPassage]:
        """The chunks of ``col`` among ``chunk_ids`` (others are ignored), with their names and paths."""
        client = self.engine.client()
        ids = list(dict.fromkeys(chunk_ids))
        if not ids or not client.has_collection(col.milvus):
            return []
        rows = {str(r["id"]): r for r in client.get(col.milvus, ids=ids, output_fields=["source", "path"])}
        return [CitedPassage(chunk_id=i, path=str(rows[i].get("path", "")), document=self.engine.document_name(
                    col, str(rows[i].get("source", "")), str(rows[i].get("path", ""))))
                for i in ids if i in rows]

    # -- the routes
    async def list_collections(self, request: Request, principal: KbPrincipal) -> dict[str, Any]:
        """The collections this key may read or write, with their document counts (the rows of
        their documents list, by status)."""
        out = []
        for col in self.collections.values():
            read, write = principal.allows(col.read_scope), principal.allows(col.write_scope)
            if read or write:
                docs = await run_in_threadpool(self.engine.documents, col)
                by_status = {s: sum(1 for d in docs if d.status == s) for s in ("indexed", "quarantined", "pending")}
                out.append({"name": col.name, "read": read, "write": write, "source": principal.allows(source_scope(col)),
                            "documents": len(docs), **by_status})
        annotate_audit(request, collections=len(out))
        return {"collections": out}

    async def feedback(self, body: FeedbackRequest, request: Request, principal: KbPrincipal) -> dict[str, Any]:
        """Record a thumbs-up or -down on an answer (redacted, in the home, with the key's id; never
        its secret; bounded per vote and per key: 429 past the key's share). The votes become an
        evaluation set with ``python -m flows.rag feedback-export`` (one vote per key and question)."""
        col = self.allowed(principal, body.collection, read=True)
        passages = await run_in_threadpool(self.cited_passages, col, body.chunk_ids)
        record = feedback_record(col.name, body.vote, body.question, body.answer, passages,
                                 retrieval_question=body.retrieval_question, answered=body.answered, mode=body.mode,
                                 key_id=principal.key_id)
        try:
            await run_in_threadpool(self.votes.append, feedback_path(self.services.layout.kb_feedback(), col.name),
                                    record)
        except VoteLimit as exc:
            raise HTTPException(429, str(exc)) from None
        annotate_audit(request, collection=col.name, vote=body.vote, passages=len(passages))
        return {"recorded": True, "vote": body.vote, "passages": len(passages)}

    async def upload(self, request: Request, principal: KbPrincipal,
                     collection: Annotated[str | None, Query(description="The collection (or the form field).")] = None,
                     ) -> JSONResponse:
        """Upload one or more files (multipart: ``collection`` first, then ``files``; or
        ``?collection=``) into a collection's watched folder and start its ingest; 202 with the
        job id to poll."""
        if collection is not None:  # known before the body is read: refuse early
            self.queue_room(self.allowed(principal, collection, write=True))
        try:
            parser = UploadParser(multipart_boundary(request.headers.get("content-type")),
                                  lambda name: self.allowed(principal, name, write=True), query_collection=collection,
                                  max_bytes=self.settings.max_upload_bytes, max_files=self.settings.max_upload_files,
                                  max_members=MAX_UPLOAD_MEMBERS, count_members=archive_members)
            staged = await parser.feed(request.stream())
            if staged.collection is None or not staged.files:
                raise UploadRefused(f"the form holds no {FILES_FIELD!r}")
            try:
                self.queue_room(staged.collection)
                written = await run_in_threadpool(staged.commit)
            except BaseException:
                staged.discard()
                raise
        except UploadRefused as exc:
            raise HTTPException(exc.status, str(exc)) from None
        col, names = staged.collection, [f.name for f in staged.files]
        job = await run_in_threadpool(self.engine.submit, col, names)  # creates its flow run
        self.metrics.uploads.labels(collection=col.name).inc(len(names))
        annotate_audit(request, collection=col.name, files=len(names), bytes=written, members=staged.members,
                       job_id=job.job_id)
        return JSONResponse(job.public() | {"files": [{"name": n, "status": "queued"} for n in names]},
                            status_code=202)

    async def get_job(self, job_id: str, request: Request, principal: KbPrincipal) -> dict[str, Any]:
        """An ingest job: queued, running, done or failed, with the status of each of its files."""
        job = self.engine.job(job_id)
        if job is None or not (principal.allows(f"kb:{job.collection}:write")
                               or principal.allows(f"kb:{job.collection}:read")):
            raise HTTPException(404, "no such job (or not one of a collection this key may use)")
        annotate_audit(request, collection=job.collection, job_state=job.state)
        return job.public()

    async def list_documents(self, request: Request, principal: KbPrincipal,
                             collection: Annotated[str, Query(description="The collection.")]) -> dict[str, Any]:
        """Each document of a collection: indexed (with its chunk count), quarantined (with the
        reason) or pending (not ingested yet, or being ingested)."""
        col = self.allowed(principal, collection, read=True, write=True)
        if principal.allows(col.write_scope):
            self.engine.start_runner()  # (once, in the background) an upload may follow: Prefect's runner
        docs = await run_in_threadpool(self.engine.documents, col)
        annotate_audit(request, collection=col.name, documents=len(docs))
        return {"collection": col.name, "documents": [d.public() for d in docs]}

    async def delete_document(self, name: str, request: Request, principal: KbPrincipal,
                              collection: Annotated[str, Query(description="The collection.")]) -> dict[str, Any]:
        """Remove a document: its chunks from the index (dense and BM25), its quarantine record
        and its file in the watched folder."""
        col = self.allowed(principal, collection, write=True)
        result = await run_in_threadpool(self.engine.delete, col, name)
        if result is None:
            raise HTTPException(404, "no such document in this collection")
        doc, removed = result
        annotate_audit(request, collection=col.name, chunks_removed=removed)
        return {"deleted": doc.name, "chunks_removed": removed, "file_removed": doc.in_folder}


class KbMetrics:
    """The knowledge base's counters, on the server's metrics registry."""

    def __init__(self, registry: Any) -> None:
        self.queries = Counter("indusflow_kb_queries_total", "Knowledge-base searches and questions.",
                               ["collection", "kind", "retriever"], registry=registry)
        self.uploads = Counter("indusflow_kb_uploaded_files_total", "Documents uploaded.", ["collection"],
                               registry=registry)
        self.jobs = Counter("indusflow_kb_ingest_jobs_total", "Ingest jobs finished, by outcome.",
                            ["collection", "state"], registry=registry)
        self.chunks = Counter("indusflow_kb_chunks_written_total", "Chunks written by ingest jobs.", ["collection"],
                              registry=registry)

    def finished(self, job: IngestJob) -> None:
        """Count a finished ingest job and the chunks it wrote."""
        self.jobs.labels(collection=job.collection, state=job.state).inc()
        self.chunks.labels(collection=job.collection).inc(job.counts.get("chunks_written", 0))


def build(services: Services, *, client: Any = None, embedder: Embedder | None = None,
          ingest_in_thread: bool = False) -> Vertical | None:
    """The knowledge-base vertical of the API (its collections from ``INDUSFLOW_KB_COLLECTIONS``).

    Args:
        services: the server's shared objects.
        client: a Milvus client (tests); default: the configured one, opened on first use.
        embedder: an embedder (tests); default: the configured one, loaded on first use.
        ingest_in_thread: run upload ingests on a thread of this process with ``client`` and ``embedder``
            (tests with fakes); default: outside it, as a deployment's flow run.
    """
    settings = get_kb_settings()
    metrics = KbMetrics(services.metrics.registry)
    engine = KbEngine(configured_collections(services.layout), services.layout, settings, client=client,
                      embedder=embedder, on_job=metrics.finished, ingest_in_thread=ingest_in_thread)
    engine.recover()  # jobs a crashed or restarted server left queued or running
    services.route_limits[PREFIX] = RouteLimits(timeout_s=settings.request_timeout_s)
    services.route_limits[f"{PREFIX}/documents"] = RouteLimits(
        max_body_bytes=settings.max_upload_bytes + MULTIPART_OVERHEAD, timeout_s=settings.request_timeout_s)
    for slow in SLOW_ROUTES:  # each holds a worker thread while the LLM or the retriever works
        services.route_limits[f"{PREFIX}/{slow}"] = RouteLimits(
            timeout_s=settings.request_timeout_s, concurrency=SLOW_ROUTE_CONCURRENCY, per_key=SLOW_ROUTE_PER_KEY)
    router = APIRouter(tags=["knowledge base"])
    api = KbApi(services, engine, settings, metrics)
    api.mount(router)
    return Vertical("kb", router, [], on_stop=api.close)
