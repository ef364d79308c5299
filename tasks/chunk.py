"""Token-window chunking with the embedding model's own tokenizer.

Sliding windows of ``size`` tokens sharing ``overlap`` tokens, cut at sentence boundaries when
a boundary falls inside the window (the caller passes the sentence splitter, e.g. one that knows
Chinese 。！？；); a sentence longer than a window is cut at token boundaries. Each chunk keeps
its document id, position (index, character span) and page where the format gives one: in a
paginated document (PDF pages, OCR'd pages) no window spans a page break, so a cited passage's
page is the page its sentences are on.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

SentenceSplitter = Callable[[str], list[tuple[int, int]]]


@dataclass(frozen=True)
class Chunk:
    """One window of a document."""

    doc_id: str
    index: int
    text: str
    start_char: int
    end_char: int
    tokens: int
    page: int | None = None


def token_offsets(tokenizer: Any, text: str) -> list[tuple[int, int]]:
    """Character spans of the tokens of ``text`` (no special tokens), from a fast tokenizer."""
    if not text:
        return []
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, truncation=False, verbose=False)
    return [(int(a), int(b)) for a, b in enc["offset_mapping"] if b > a]


def _windows(units: list[tuple[int, int, int, int]], size: int, overlap: int,
             pages: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """Group units ``(char_start, char_end, tok_start, tok_end)`` into windows of whole units;
    with ``pages`` (the page of each unit) a window never spans two pages and the first window
    of a page starts at the page's first unit (no overlap across a page break).

    Returns ``(first_unit, last_unit_exclusive)`` pairs.
    """
    out: list[tuple[int, int]] = []
    i, n = 0, len(units)
    while i < n:
        j = i
        while j < n and units[j][3] - units[i][2] <= size and (pages is None or pages[j] == pages[i]):
            j += 1
        j = max(j, i + 1)
        out.append((i, j))
        if j >= n:
            break
        if pages is not None and pages[j] != pages[j - 1]:
            i = j
            continue
        # the next window starts at the first unit whose tokens all fall in the last `overlap`
        # tokens, and late enough that it still holds unit j: every window brings text the one
        # before lacked (short sentences before a long one gave windows that each dropped one
        # short sentence and ended where the one before ended: near-copies that crowded search)
        tail_start = units[j - 1][3] - overlap
        k = j
        while k - 1 > i and units[k - 1][2] >= tail_start and units[j][3] - units[k - 1][2] <= size:
            k -= 1
        i = max(k, i + 1)
    return out


def chunk_text(
    text: str,
    offsets: Sequence[tuple[int, int]],
    sentences: Sequence[tuple[int, int]],
    *,
    size: int = 512,
    overlap: int = 256,
    page_breaks: Sequence[int] = (),
) -> list[tuple[int, int, int]]:
    """Windows over ``text`` as ``(start_char, end_char, n_tokens)``.

    Args:
        text: The document text.
        offsets: Character span of every token (see :func:`token_offsets`).
        sentences: Character spans of the sentences.
        size: Tokens per window.
        overlap: Tokens shared by consecutive windows (< size).
        page_breaks: Sorted offsets where a new page starts (paginated sources): no window
            spans one, so every window lies on one page.
    """
    if overlap >= size:
        raise ValueError(f"overlap ({overlap}) must be smaller than the window size ({size})")
    if not offsets:
        return []
    starts = [a for a, _ in offsets]
    units: list[tuple[int, int, int, int]] = []
    for a, b in split_at(sentences or [(0, len(text))], page_breaks):
        t0 = bisect.bisect_left(starts, a)
        t1 = bisect.bisect_left(starts, b)
        if t1 <= t0:
            continue
        if t1 - t0 <= size:
            units.append((a, b, t0, t1))
            continue
        step = max(size - overlap, 1)  # a sentence longer than a window: cut by tokens
        for s in range(t0, t1, step):
            e = min(s + size, t1)
            units.append((offsets[s][0], offsets[e - 1][1], s, e))
            if e == t1:
                break
    pages = [bisect.bisect_right(page_breaks, u[0]) for u in units] if page_breaks else None
    out = []
    for i, j in _windows(units, size, overlap, pages):
        t0, t1 = units[i][2], max(u[3] for u in units[i:j])
        out.append((units[i][0], offsets[t1 - 1][1], t1 - t0))
    return out


def split_at(spans: Sequence[tuple[int, int]], breaks: Sequence[int]) -> list[tuple[int, int]]:
    """``spans`` with any span that holds a break cut in two there."""
    out: list[tuple[int, int]] = []
    for a, b in spans:
        for k in breaks[bisect.bisect_right(breaks, a): bisect.bisect_left(breaks, b)]:
            out.append((a, k))
            a = k
        out.append((a, b))
    return out


def snap_page_starts(text: str, page_starts: Sequence[int], sentences: Sequence[tuple[int, int]],
                     reach: int = 200) -> list[int]:
    """The page breaks of a document (every page start but the first's), each moved to the
    nearest sentence start within ``reach`` characters, else to the nearest whitespace: page
    starts estimated from per-page character counts (PDF) then cut between sentences."""
    sentence_starts = [a for a, _ in sentences]
    out: list[int] = []
    for start in page_starts[1:]:
        start = max(0, min(len(text), start))
        k = bisect.bisect_left(sentence_starts, start)
        near = [sentence_starts[x] for x in (k - 1, k) if 0 <= x < len(sentence_starts)]
        best = min(near, key=lambda s: abs(s - start), default=None)
        if best is None or abs(best - start) > reach:
            space = [p for p in (text.rfind(" ", 0, start), text.find(" ", start)) if p >= 0]
            best = min(space, key=lambda p: abs(p - start)) + 1 if space else start
        if 0 < best < len(text) and (not out or best > out[-1]):
            out.append(best)
    return out


def embedder_window(embedder: Any) -> int:
    """Content tokens a chunk may have so that the embedder sees all of it: the model's window less
    its two special tokens and the tokens of the passage prefix it adds (E5's ``"passage: "``).

    A remote model counted with a stand-in tokenizer (``exact_tokenizer`` false) gets 512: its
    real window is unknown here.
    """
    if not getattr(embedder, "exact_tokenizer", True):
        return 512
    prefix = int(getattr(embedder, "passage_prefix_tokens", 0) or 0)
    return max(16, int(embedder.max_tokens) - 2 - prefix)


def chunk_document(
    doc_id: str,
    text: str,
    tokenizer: Any,
    split_sentences: SentenceSplitter,
    *,
    size: int = 512,
    overlap: int = 256,
    page_at: Callable[[int], int | None] | None = None,
    page_starts: Sequence[int] = (),
) -> list[Chunk]:
    """The chunks of one document. With ``page_starts`` (the start offset of every page, two
    pages or more) no chunk spans a page break and each chunk's page is the page it lies on;
    else ``page_at`` gives the page of a chunk's first character."""
    sentences = split_sentences(text)
    breaks = snap_page_starts(text, page_starts, sentences) if len(page_starts) > 1 else []
    spans = chunk_text(text, token_offsets(tokenizer, text), sentences, size=size, overlap=overlap,
                       page_breaks=breaks)
    if breaks:
        page_at = lambda offset: bisect.bisect_right(breaks, offset) + 1
    return [
        Chunk(doc_id=doc_id, index=i, text=text[a:b].strip(), start_char=a, end_char=b, tokens=n,
              page=page_at(a) if page_at else None)
        for i, (a, b, n) in enumerate(spans)
        if text[a:b].strip()
    ]

