"""Defaults of the RAG vertical (flow parameters), one pydantic model per flow.

Every field has a description: it is the help of its command-line flag and of the field in
the Prefect UI's run form.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from infra.store import check_name

RetrieverMode = Literal["dense", "bm25", "hybrid"]


def _collection(value: str | None) -> str | None:
    return None if value is None else check_name(value, "collection name")


class RedactionParams(BaseModel):
    """Compliance redaction, on/off per kind."""

    model_config = ConfigDict(frozen=True)

    email: bool = Field(default=True, description="Redact e-mail addresses.")
    cn_id: bool = Field(default=True, description="Redact mainland China resident ID numbers (checksum verified).")
    bank_card: bool = Field(default=True, description="Redact bank card numbers (Luhn verified).")
    mobile: bool = Field(default=True, description="Redact mobile phone numbers.")


class ChunkParams(BaseModel):
    """Token windows of the embedding model's own tokenizer; by default as long as the model's window."""

    model_config = ConfigDict(frozen=True)

    tokens: int | None = Field(
        default=None, ge=16, le=8192,
        description="Window size in tokens (default: what the embedding model sees at once, less its special "
        "and prefix tokens: 508 for multilingual-e5-small, 254 for all-MiniLM-L6-v2).",
    )
    overlap: int | None = Field(
        default=None, ge=0, description="Tokens shared by consecutive windows (default: half the window; < the window)."
    )

    @model_validator(mode="after")
    def _overlap_below_window(self) -> ChunkParams:
        if self.tokens is not None and self.overlap is not None and self.overlap >= self.tokens:
            raise ValueError(f"the chunk overlap ({self.overlap}) must be smaller than the window ({self.tokens} tokens)")
        return self

    def resolved(self, window: int) -> ChunkParams:
        """These parameters with the defaults filled in for an embedder that sees ``window`` content tokens."""
        tokens = self.tokens if self.tokens is not None else window
        overlap = self.overlap if self.overlap is not None else tokens // 2
        if overlap >= tokens:
            raise ValueError(f"the chunk overlap ({overlap}) must be smaller than the window ({tokens} tokens, "
                             "the embedding model's): lower --chunk-overlap or set --chunk-tokens")
        return ChunkParams(tokens=tokens, overlap=overlap)


class IngestParams(BaseModel):
    """Parameters of ``rag-ingest``."""

    model_config = ConfigDict(frozen=True)

    collection: str | None = Field(
        default=None,
        description="Knowledge-base collection (e.g. legal: its own Milvus collection and watched folder "
        "<home>/inbox/kb/legal). Default: 'default', the Milvus collection INDUSFLOW_MILVUS_COLLECTION and "
        "the folder <home>/inbox/docs.",
    )
    chunk: ChunkParams = ChunkParams()
    redaction: RedactionParams = RedactionParams()
    prune: bool = Field(default=False, description="Remove chunks of documents no longer under the sources.")
    batch_docs: int = Field(default=16, ge=1, description="Source files per parse/embed/write batch.")
    max_archive_members: int = Field(default=1000, ge=1, description="Inner documents taken from one archive.")

    @field_validator("collection")
    @classmethod
    def _valid_collection(cls, value: str | None) -> str | None:
        return _collection(value)


class HybridWeights(BaseModel):
    """Hybrid weights (weighted standardised scores, ``tasks.retrieve.fuse``); ``auto`` lowers dense
    when the embedder covers the query poorly."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dense: float | Literal["auto"] = Field(
        default="auto",
        description="Hybrid weight of dense retrieval: a number, or 'auto' (lowered when the embedder "
        "covers the question poorly).",
    )
    bm25: float = Field(default=1.0, ge=0, description="Hybrid weight of BM25.")


class AskParams(BaseModel):
    """Parameters of ``rag-ask``."""

    model_config = ConfigDict(frozen=True)

    collection: str | None = Field(
        default=None,
        description="Knowledge-base collection to ask (e.g. legal). Default: 'default' (INDUSFLOW_MILVUS_COLLECTION).",
    )
    mode: RetrieverMode = Field(default="hybrid", description="Retriever: dense, bm25 or hybrid.")
    top_k: int = Field(default=5, ge=1, le=100, description="Chunks retrieved.")
    weights: HybridWeights = HybridWeights()
    content_type: str | None = Field(default=None, description="Keep chunks whose content type starts with this.")
    path_prefix: str | None = Field(default=None, description="Keep chunks whose document path starts with this.")
    language: str | None = Field(default=None, description="Keep chunks of this language (zh, en, ...).")
    created_from: str | None = Field(default=None, description="ISO date: documents created on/after.")
    created_to: str | None = Field(default=None, description="ISO date: documents created on/before.")
    llm: bool = Field(default=True, description="Use the configured chat endpoint when there is one.")
    glossary: bool = Field(default=True, description="Expand the question with the collection's glossary "
                           "(<home>/rag/glossary/<collection>.yaml or .csv) when it has one.")
    stream: bool = Field(default=False, description="Print the LLM answer to stdout as it is generated.")

    @field_validator("collection")
    @classmethod
    def _valid_collection(cls, value: str | None) -> str | None:
        return _collection(value)

    @field_validator("created_from", "created_to")
    @classmethod
    def _iso_date(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            dt.datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError(f"{value!r} is not an ISO date (YYYY-MM-DD or YYYY-MM-DDTHH:MM:SS)") from None
        return value
