"""The wire format of the knowledge-base API (:mod:`flows.serve.kb`): request and response bodies of
search, ask and feedback (``docs/kb_api.md``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from solutions.rag.conversation import MAX_TURNS
from solutions.rag.glossary import GlossaryMatch

Retriever = Literal["hybrid", "dense", "bm25"]
#: A passage's ``chunk_id`` as the index makes them (``<doc id>-<content hash>-<index>``).
ChunkId = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,128}$")]


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
