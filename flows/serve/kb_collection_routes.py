"""Routes under ``/v1/kb/collections/{collection}/`` of the knowledge-base API (:mod:`flows.serve.kb`):
a collection's glossary, and the evidence behind a cited passage (its stored text, its original file).
Also the names every knowledge-base route shares: the path prefix and the caller's dependency.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse
from pydantic import BaseModel, Field

from flows.serve.kb_engine import KbEngine
from flows.serve.kb_evidence import chunk_row, chunk_source, original_file, source_scope
from infra.pii import redact_text
from infra.serving.audit import annotate_audit
from infra.serving.auth import ADMIN, Principal, require_any_scope
from solutions.rag.collections import KbCollection
from solutions.rag.glossary import GlossaryError, save_glossary

PREFIX = "/v1/kb"
SCOPE_PREFIX = "kb:"
#: The caller of a knowledge-base route: authenticated, rate-limited, holding some ``kb:`` scope
#: (or ``admin``); each route then checks the scope of the collection it is asked about.
KbPrincipal = Annotated[Principal, Depends(require_any_scope(SCOPE_PREFIX))]


# ------------------------------------------------------------------------------------
# glossary: the terms, synonyms and abbreviations a collection's questions are expanded with


GLOSSARY_FORMATS = {"application/yaml": "yaml", "application/x-yaml": "yaml", "text/yaml": "yaml",
                    "text/x-yaml": "yaml", "text/csv": "csv"}


def glossary_refused(exc: GlossaryError) -> HTTPException:
    """422 naming the glossary file and, for each problem, its line and what is wrong."""
    return HTTPException(422, {"message": str(exc), "file": exc.source,
                               "problems": [{"line": line, "problem": what} for line, what in exc.problems]})


def add_glossary_routes(router: APIRouter, engine: KbEngine,
                        allowed: Callable[..., KbCollection]) -> None:
    """``PUT .../collections/{c}/glossary`` (scope ``kb:<c>:write``): a YAML or CSV glossary,
    checked before it replaces the old one (422 naming each bad line); ``GET`` (``kb:<c>:read``):
    its entries (:mod:`solutions.rag.glossary`)."""

    @router.put(f"{PREFIX}/collections/{{collection}}/glossary",
                openapi_extra={"requestBody": {"required": True, "content": {
                    "application/yaml": {"schema": {"type": "string"}}, "text/csv": {"schema": {"type": "string"}}}}})
    async def put_glossary(collection: str, request: Request, principal: KbPrincipal) -> dict[str, Any]:
        """Replace the collection's glossary (body: YAML ``terms: [{term, synonyms, abbreviations}]``
        with ``Content-Type: application/yaml``, or CSV ``term,synonyms,abbreviations`` with
        ``text/csv``; several forms in a CSV cell separated by ``|``). Questions are expanded with
        it from the next one on."""
        col = allowed(principal, collection, write=True)
        kind = GLOSSARY_FORMATS.get(request.headers.get("content-type", "").split(";")[0].strip().lower())
        if kind is None:
            raise HTTPException(415, "send the glossary as application/yaml or text/csv")
        try:
            text = (await request.body()).decode("utf-8")
        except UnicodeDecodeError:
            raise HTTPException(422, "the glossary is not UTF-8 text") from None
        try:
            glossary = await run_in_threadpool(save_glossary, col.name, text, kind, engine.layout)
        except GlossaryError as exc:
            raise glossary_refused(exc) from None
        annotate_audit(request, collection=col.name, terms=len(glossary.entries))
        return {"collection": col.name, "terms": len(glossary.entries), "format": kind}

    @router.get(f"{PREFIX}/collections/{{collection}}/glossary")
    async def get_glossary(collection: str, request: Request, principal: KbPrincipal) -> dict[str, Any]:
        """The collection's glossary entries (404 when it has none; 422 when its file is bad)."""
        col = allowed(principal, collection, read=True)
        try:
            glossary = await run_in_threadpool(engine.glossary, col)
        except GlossaryError as exc:
            raise glossary_refused(exc) from None
        if glossary is None:
            raise HTTPException(404, f"collection {col.name!r} has no glossary")
        annotate_audit(request, collection=col.name, terms=len(glossary.entries))
        return {"collection": col.name, "file": glossary.source,
                "terms": [{"term": e.term, "synonyms": list(e.synonyms), "abbreviations": list(e.abbreviations)}
                          for e in glossary.entries]}


# ------------------------------------------------------------------------------------
# evidence: the stored text around a cited passage, and its original file


class SourceTextOut(BaseModel):
    """The stored (redacted) text around a passage: ``before`` + ``text`` + ``after``."""

    collection: str
    chunk_id: str
    document: str = Field(description="The document's name in the collection (as the documents list names it).")
    title: str
    page: int | None = Field(description="The passage's first page (paginated sources: PDF pages, OCR'd pages).")
    pages: list[int] = Field(description="The pages the text shown spans, as far as the store knows them.")
    chunk_index: int
    chunks: int = Field(description="Chunks of the document.")
    before: str
    text: str
    after: str
    original: bool = Field(description="This key may download the original file (scope kb:<collection>:source); "
                           "whether the file is still in the collection's folder is known on download.")


def add_evidence_routes(router: APIRouter, engine: KbEngine, collections: dict[str, KbCollection]) -> None:
    """``GET .../chunks/{chunk_id}/source`` (scope ``kb:<c>:read``) and ``.../file`` (scope
    ``kb:<c>:source``); both audited with the collection only (no document name, no text)."""

    def permitted(principal: Principal, name: str, scope_of: Callable[[KbCollection], str], what: str) -> KbCollection:
        col = collections.get(name)
        if col is None:
            if ADMIN in principal.scopes:
                raise HTTPException(404, f"no collection {name!r} is served (INDUSFLOW_KB_COLLECTIONS)")
            raise HTTPException(403, f"this credential may not {what} collection {name!r}")
        if not principal.allows(scope_of(col)):
            raise HTTPException(403, f"this credential may not {what} collection {name!r}")
        return col

    @router.get(f"{PREFIX}/collections/{{collection}}/chunks/{{chunk_id}}/source", response_model=SourceTextOut)
    async def chunk_text(collection: str, chunk_id: str, request: Request, principal: KbPrincipal,
                         around: Annotated[int, Query(ge=0, le=3, description="Neighbouring chunks on each side.")] = 1,
                         ) -> SourceTextOut:
        """The stored, redacted text of a passage's document around it (its neighbouring chunks)."""
        col = permitted(principal, collection, lambda c: c.read_scope, "read")
        got = await run_in_threadpool(chunk_source, engine, col, chunk_id, around)
        annotate_audit(request, collection=col.name, found=got is not None)
        if got is None:
            raise HTTPException(404, "no such passage in this collection")
        row = got.row
        name = engine.document_name(col, str(row.get("source", "")), str(row.get("path", "")))
        return SourceTextOut(
            collection=col.name, chunk_id=chunk_id, document=redact_text(name), title=redact_text(str(row.get("title") or "")),
            page=int(row.get("page") or 0) or None, pages=list(got.pages), chunk_index=int(row.get("chunk_index", 0)),
            chunks=int(row.get("n_chunks", 0)), before=redact_text(got.text.before), text=redact_text(got.text.passage),
            after=redact_text(got.text.after), original=principal.allows(source_scope(col)))

    @router.get(f"{PREFIX}/collections/{{collection}}/chunks/{{chunk_id}}/file",
                responses={200: {"content": {"application/octet-stream": {}}, "description": "The original file."}})
    async def chunk_file(collection: str, chunk_id: str, request: Request, principal: KbPrincipal) -> FileResponse:
        """The original file a passage comes from (an archive member: its archive), from the
        collection's watched folder. Needs ``kb:<collection>:source`` (or admin)."""
        col = permitted(principal, collection, source_scope, "download the original files of")
        row = await run_in_threadpool(chunk_row, engine, col, chunk_id)
        found = await run_in_threadpool(original_file, engine, col, row) if row is not None else None
        if found is None:
            annotate_audit(request, collection=col.name, found=False)
            raise HTTPException(404, "no original file of this passage in the collection's folder")
        doc, path = found
        size = path.stat().st_size
        annotate_audit(request, collection=col.name, found=True, bytes=size)
        return FileResponse(path, filename=doc.name.rsplit("/", 1)[-1], media_type="application/octet-stream",
                            headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})
