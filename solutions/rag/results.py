"""Typed results of the RAG flows ``rag-ask`` and ``rag-eval`` (``rag-ingest`` returns the
generic :class:`tasks.ingest.IngestResult`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from infra.embeddings import CoverageReport
from solutions.rag.glossary import GlossaryMatch
from solutions.rag.support import Support


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
    highlight: list[tuple[int, int]] = Field(default_factory=list, description="Spans [start, end) of the passage's "
                                             "(redacted) text that the answer's sentences citing it rest on.")
    quotes: list[str] = Field(default_factory=list, description="The passage text of those spans.")


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
    answer_kind: str = Field(description="'llm', 'extractive', or 'none' when the KB did not answer.")
    citations: list[Citation]
    hits: list[AskHit]
    seconds: float
    streamed: bool = Field(default=False, description="The answer was printed to stdout as it was generated.")
    answered: bool = Field(default=True, description="The retrieved passages support the answer; false: the KB "
                           "says the documents do not answer, and the hits are related passages, not an answer.")
    support: Support | None = Field(default=None, description="The support decision behind 'answered'.")
    retrieval_question: str = Field(default="", description="The question retrieval used when it is not the "
                                    "question itself: a follow-up resolved against the earlier questions.")
    glossary: list[GlossaryMatch] = Field(default_factory=list, description="The collection's glossary entries "
                                          "the question matched; their other forms were added to the query.")


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
