"""Token-window chunking: window size, overlap, sentence boundaries, long sentences, pages."""

from __future__ import annotations

import itertools
import re

import pytest

from solutions.rag.text import sentence_spans, split_sentences
from tasks.chunk import chunk_document, chunk_text


class WordTokenizer:
    """A stand-in fast tokenizer: one token per word or CJK character."""

    def __call__(self, text: str, **_: object) -> dict:
        spans = [(m.start(), m.end()) for m in re.finditer(r"[\u4e00-\u9fff]|[A-Za-z0-9]+|[^\sA-Za-z0-9\u4e00-\u9fff]", text)]
        return {"offset_mapping": spans, "input_ids": list(range(len(spans)))}


def test_sentence_boundaries_chinese_and_english() -> None:
    text = "第一句。第二句！第三句？第四句；Fifth one. Sixth? Seventh\nEighth"
    assert split_sentences(text) == ["第一句。", "第二句！", "第三句？", "第四句；", "Fifth one.", "Sixth?", "Seventh", "Eighth"]
    assert "".join(text[a:b] for a, b in sentence_spans(text)).replace("\n", "") == text.replace("\n", "").replace(" ", "", 0)


def test_hard_wrapped_lines_join_but_headings_and_items_end_a_sentence() -> None:
    text = ("Pump manual\n"
            "The impeller of the feed pump must be inspected every 1,500 operating\n"
            "hours, or sooner when the bearing runs hot. Replace the seal kit when it\n"
            "leaks at rated pressure for more than a minute in any test run\n"
            "- drain the pump\n"
            "- open the casing")
    assert [" ".join(s.split()) for s in split_sentences(text)] == [
        "Pump manual",
        ("The impeller of the feed pump must be inspected every 1,500 operating hours, or sooner when the "
        "bearing runs hot."),
        "Replace the seal kit when it leaks at rated pressure for more than a minute in any test run",
        "- drain the pump",
        "- open the casing",
    ]


def test_windows_respect_size_overlap_and_sentences() -> None:
    tok = WordTokenizer()
    sentences = [f"Sentence number {i} has exactly seven tokens." for i in range(40)]  # 7 tokens each (+ '.')
    text = " ".join(sentences)
    chunks = chunk_document("d", text, tok, sentence_spans, size=40, overlap=16)
    assert len(chunks) > 5
    for c in chunks:
        assert c.tokens <= 40
        assert c.text.startswith("Sentence") and c.text.endswith(".")  # cut at sentence boundaries
    for a, b in itertools.pairwise(chunks):
        assert b.start_char < a.end_char  # consecutive windows overlap
        assert a.end_char - b.start_char <= len(text)
    assert chunks[0].start_char == 0 and chunks[-1].end_char == len(text)  # nothing lost at either end
    assert [c.index for c in chunks] == list(range(len(chunks)))


def test_short_sentences_before_a_long_one_give_no_near_copies() -> None:
    """Every window reaches past the one before; none ends where the one before ended."""
    tok = WordTokenizer()
    short = [f"Short {i} here." for i in range(8)]  # 4 tokens each
    long = "Long " + " ".join(f"w{i}" for i in range(30)) + "."  # 32 tokens
    text = " ".join([*short, long, "Tail end here."])
    spans = chunk_text(text, [tuple(o) for o in tok(text)["offset_mapping"]], sentence_spans(text), size=40, overlap=20)
    ends = [e for _, e, _ in spans]
    assert ends == sorted(set(ends)), spans  # the old rule gave four windows ending at the same token
    assert all(n <= 40 for _, _, n in spans)
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    assert len(spans) == 3, spans


def test_sentence_longer_than_a_window_is_cut_by_tokens() -> None:
    tok = WordTokenizer()
    text = "短句。" + "长" * 100 + "。尾句。"
    chunks = chunk_document("d", text, tok, sentence_spans, size=20, overlap=5)
    assert all(c.tokens <= 20 for c in chunks)
    covered = set()
    for c in chunks:
        covered.update(range(c.start_char, c.end_char))
    assert covered >= set(range(len(text) - 1))


def test_page_and_errors() -> None:
    tok = WordTokenizer()
    text = "Page one text. " * 10 + "Page two text. " * 10
    chunks = chunk_document("d", text, tok, sentence_spans, size=12, overlap=4, page_at=lambda off: 1 if off < 150 else 2)
    assert {c.page for c in chunks} == {1, 2}
    with pytest.raises(ValueError, match="overlap"):
        chunk_text(text, tok(text)["offset_mapping"], sentence_spans(text), size=10, overlap=10)
    assert chunk_text("", [], [], size=10, overlap=2) == []


def test_a_paginated_document_is_chunked_page_by_page() -> None:
    tok = WordTokenizer()
    pages = ["Page one says alpha. " * 7, "Page two says beta. " * 7, "Page three says gamma. " * 2]
    text = "".join(pages)
    starts = [0, len(pages[0]) + 5, len(pages[0]) + len(pages[1]) - 3]  # estimates, a few characters off
    chunks = chunk_document("d", text, tok, sentence_spans, size=12, overlap=6, page_starts=starts)
    for c in chunks:  # every chunk on one page, and its page is that page
        words = {"alpha": 1, "beta": 2, "gamma": 3}
        assert {words[w] for w in re.findall(r"alpha|beta|gamma", c.text)} == {c.page}, c
    assert [c.page for c in chunks] == sorted(c.page for c in chunks) and {c.page for c in chunks} == {1, 2, 3}
    # within a page the windows still overlap; across a break they do not
    assert any(a.page == b.page and b.start_char < a.end_char for a, b in itertools.pairwise(chunks))
    assert all(b.start_char >= a.end_char - 1 for a, b in itertools.pairwise(chunks) if a.page != b.page)
    # one page only: no breaks, chunks as before
    single = chunk_document("d", pages[0], tok, sentence_spans, size=12, overlap=6, page_starts=[0])
    assert single == chunk_document("d", pages[0], tok, sentence_spans, size=12, overlap=6)
