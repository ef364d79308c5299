"""Defaults of the RAG vertical (flow parameters), one pydantic model per flow."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

RetrieverMode = Literal["dense", "bm25", "hybrid"]


class RedactionParams(BaseModel):
    """Compliance redaction, on/off per kind."""

    model_config = ConfigDict(frozen=True)

    email: bool = True
    cn_id: bool = Field(default=True, description="Mainland China resident ID numbers (checksum verified).")
    bank_card: bool = Field(default=True, description="Bank card numbers (Luhn verified).")
    mobile: bool = True


class ChunkParams(BaseModel):
    """Token windows of the embedding model's own tokenizer."""

    model_config = ConfigDict(frozen=True)

    tokens: int = Field(default=512, ge=16, le=8192, description="Window size in tokens.")
    overlap: int = Field(default=256, ge=0, description="Tokens shared by consecutive windows.")


class IngestParams(BaseModel):
    """Parameters of ``rag-ingest``."""

    model_config = ConfigDict(frozen=True)

    collection: str = Field(default="rag_chunks", description="Milvus collection of the knowledge base.")
    chunk: ChunkParams = ChunkParams()
    redaction: RedactionParams = RedactionParams()
    prune: bool = Field(default=False, description="Remove chunks of documents no longer under the sources.")
    batch_docs: int = Field(default=16, ge=1, description="Documents per parse/embed/write batch.")
    max_archive_members: int = Field(default=1000, ge=1, description="Inner documents taken from one archive.")


class HybridWeights(BaseModel):
    """Hybrid fusion and its weights; ``auto`` lowers dense when the embedder covers the query poorly."""

    model_config = ConfigDict(frozen=True)

    dense: float | Literal["auto"] = "auto"
    bm25: float = 1.0
    fusion: Literal["score", "rrf"] = Field(
        default="score",
        description="'score': weighted sum of max-normalised BM25 and cosine; 'rrf': weighted reciprocal-rank fusion.",
    )
    rrf_k: int = Field(default=60, ge=1)


class AskParams(BaseModel):
    """Parameters of ``rag-ask``."""

    model_config = ConfigDict(frozen=True)

    collection: str = "rag_chunks"
    mode: RetrieverMode = "hybrid"
    top_k: int = Field(default=5, ge=1, le=100)
    weights: HybridWeights = HybridWeights()
    content_type: str | None = Field(default=None, description="Keep chunks whose content type starts with this.")
    path_prefix: str | None = Field(default=None, description="Keep chunks whose document path starts with this.")
    language: str | None = None
    created_from: str | None = Field(default=None, description="ISO date: documents created on/after.")
    created_to: str | None = Field(default=None, description="ISO date: documents created on/before.")
    llm: bool = Field(default=True, description="Use the configured chat endpoint when there is one.")
    stream: bool = Field(default=False, description="Stream the LLM answer to stdout as it comes.")
