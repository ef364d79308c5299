"""Evidence for an answer: which sentence of each cited passage the answer rests on, and the
stored text around a passage.

- :func:`answer_claims` splits an answer into its claims, each with the passages it cites
  (``... [1][3]`` cites 1 and 3).
- :func:`highlight_spans` locates, for every cited passage, the sentence(s) of the passage a claim
  citing it quotes (an extractive answer's sentence is found verbatim) or, failing that, the
  passage sentence sharing most terms with the claim (an LLM's paraphrase). The spans are
  character offsets into the passage text as the caller shows it, so a page can wrap them in a
  ``<mark>``.
- :func:`surrounding_text` stitches a chunk and its stored neighbours (overlapping windows of
  one document) into the text before it, the chunk and the text after it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from solutions.rag.text import query_terms, sentence_spans

_CITES = re.compile(r"(?:\s*\[\d{1,3}\])+")
_NUMBER = re.compile(r"\[(\d{1,3})\]")
_SPACE = re.compile(r"\s+")
#: A claim shares at least this share of its terms with a passage sentence to highlight it.
MIN_OVERLAP = 0.34


@dataclass(frozen=True)
class Claim:
    """One piece of an answer and the passage numbers that cite it."""

    text: str
    numbers: tuple[int, ...]


def answer_claims(answer: str) -> list[Claim]:
    """The answer's text pieces each followed by citation markers: ``A [1]. B [2][3]`` gives
    ``("A", (1,))`` and ``(". B", (2, 3))``; text after the last marker cites nothing."""
    claims, start = [], 0
    for m in _CITES.finditer(answer):
        text = answer[start:m.start()].strip().lstrip(".;,。；， ").strip()
        numbers = tuple(dict.fromkeys(int(n) for n in _NUMBER.findall(m.group(0))))
        if text:
            claims.append(Claim(text, numbers))
        start = m.end()
    return claims


def _normalised(text: str) -> tuple[str, list[int]]:
    """``text`` with runs of whitespace made one space, and the original index of each character."""
    out, index, space = [], [], False
    for i, ch in enumerate(text):
        if ch.isspace():
            if not space and out:
                out.append(" ")
                index.append(i)
            space = True
            continue
        space = False
        out.append(ch)
        index.append(i)
    return "".join(out), index


def _verbatim(claim: str, passage: str) -> tuple[int, int] | None:
    """Where ``claim`` (a quoted sentence, whitespace aside) occurs in ``passage``."""
    needle = _SPACE.sub(" ", claim).strip()
    if len(needle) < 8:
        return None
    hay, index = _normalised(passage)
    at = hay.find(needle)
    if at < 0 and needle[-1:] in ".。!?！？":  # an LLM may drop or add the final stop
        needle = needle[:-1]
        at = hay.find(needle)
    if at < 0:
        return None
    end = index[at + len(needle) - 1] + 1
    if end < len(passage) and passage[end] in ".。!?！？;；":  # the sentence's own stop
        end += 1
    return index[at], end


def _best_sentence(claim: str, passage: str) -> tuple[int, int] | None:
    """The passage sentence sharing most terms with ``claim`` (ties: the earlier one), trimmed of
    surrounding whitespace; None below :data:`MIN_OVERLAP` of the claim's terms."""
    wanted = set(query_terms(claim))
    if not wanted:
        return None
    best, best_score = None, 0.0
    for a, b in sentence_spans(passage):
        shared = wanted & set(query_terms(passage[a:b]))
        score = len(shared) / len(wanted)
        if score > best_score:
            best, best_score = (a, b), score
    if best is None or best_score < MIN_OVERLAP:
        return None
    a, b = best
    while a < b and passage[a].isspace():
        a += 1
    while b > a and passage[b - 1].isspace():
        b -= 1
    return a, b


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def highlight_spans(answer: str, passages: Mapping[int, str]) -> dict[int, list[tuple[int, int]]]:
    """For each passage number the answer cites, the spans ``[start, end)`` of the passage text
    (``passages[n]``) that the claims citing it rest on; a cited passage no claim could be
    located in gets no entry."""
    spans: dict[int, list[tuple[int, int]]] = {}
    for claim in answer_claims(answer):
        for n in claim.numbers:
            text = passages.get(n)
            if not text:
                continue
            found = _verbatim(claim.text, text) or _best_sentence(claim.text, text)
            if found is not None:
                spans.setdefault(n, []).append(found)
    return {n: _merged(s) for n, s in spans.items()}


@dataclass(frozen=True)
class StoredChunk:
    """A stored chunk of one document: its index, first page, character span in the document
    (as parsed, before redaction) and its stored (redacted) text."""

    index: int
    page: int | None
    start_char: int
    end_char: int
    text: str


@dataclass(frozen=True)
class SourceText:
    """The stored text around a chunk: ``before`` + ``passage`` + ``after`` read on from one
    another (neighbouring windows overlap; the overlap is shown once)."""

    before: str
    passage: str
    after: str
    first_index: int
    last_index: int


def _cut_word(text: str, at: int, keep_head: bool) -> str:
    """``text[:at]`` (``keep_head``) or ``text[at:]``, moved to the nearest space so that no word
    is cut (stored offsets are those before redaction and may be off by a few characters)."""
    at = max(0, min(len(text), at))
    if at in (0, len(text)) or text[at].isspace() or text[at - 1].isspace():  # already between words
        return text[:at].rstrip() if keep_head else text[at:].lstrip()
    if keep_head:
        space = text.rfind(" ", 0, at + 1)
        return text[: space if space > at - 40 else at].rstrip()
    space = text.find(" ", at)
    return text[space if 0 <= space < at + 40 else at:].lstrip()


def surrounding_text(chunk: StoredChunk, neighbours: Sequence[StoredChunk]) -> SourceText:
    """The text of the chunks before and after ``chunk`` (its neighbours of the same document, any
    order) that ``chunk`` does not hold itself, around ``chunk``'s text."""
    before_parts: list[str] = []
    covered = chunk.start_char
    for c in sorted((c for c in neighbours if c.index < chunk.index), key=lambda c: -c.index):
        if c.start_char >= covered:
            continue
        before_parts.insert(0, _cut_word(c.text, covered - c.start_char, keep_head=True))
        covered = c.start_char
    after_parts: list[str] = []
    reached = chunk.end_char
    for c in sorted((c for c in neighbours if c.index > chunk.index), key=lambda c: c.index):
        if c.end_char <= reached:
            continue
        after_parts.append(_cut_word(c.text, reached - c.start_char, keep_head=False))
        reached = c.end_char
    indexes = [chunk.index] + [c.index for c in neighbours]
    return SourceText(before="\n".join(p for p in before_parts if p), passage=chunk.text,
                      after="\n".join(p for p in after_parts if p), first_index=min(indexes),
                      last_index=max(indexes))
