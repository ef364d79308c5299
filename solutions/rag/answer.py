"""Answers with citations: the numbered context for an LLM, the citations [n] mapped back to
document and position, and the offline extractive answer (best-matching sentences).

:func:`generate_answer` asks the LLM (or answers extractively) and redacts the answer;
:func:`ask_result` turns the retrieved chunks and the answer into the typed result.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TextIO

from infra.llm import ChatClient, ChatMessage
from infra.pii import redact_text
from solutions.rag.evidence import highlight_spans
from solutions.rag.redact import RedactionConfig, StreamRedactor, redact
from solutions.rag.results import AskHit, AskResult, Citation
from solutions.rag.support import Support, abstention_text, assess, llm_abstained
from solutions.rag.text import query_terms, sentence_spans

SYSTEM_PROMPT = (
    "You answer questions from the numbered context passages only. Cite every claim with the "
    "passage number in square brackets, e.g. [1] or [2][3]. If the passages do not contain the "
    "answer, say so. Answer in the language of the question."
)
_CITATION = re.compile(r"\[(\d{1,3})\]")


@dataclass(frozen=True)
class Passage:
    """One retrieved chunk as the answer step sees it (numbered from 1 in rank order)."""

    number: int
    text: str
    doc_id: str
    path: str
    chunk_index: int
    page: int | None = None
    title: str | None = None


def build_context(passages: Sequence[Passage], max_chars: int = 12000) -> str:
    """The numbered context block sent to the LLM."""
    parts, used = [], 0
    for p in passages:
        source = p.title or p.path.rsplit("/", 1)[-1]
        head = f"[{p.number}] ({source}" + (f", page {p.page}" if p.page else "") + ")"
        body = p.text.strip()[: max(0, max_chars - used)]
        parts.append(f"{head}\n{body}")
        used += len(body)
        if used >= max_chars:
            break
    return "\n\n".join(parts)


def build_messages(question: str, passages: Sequence[Passage]) -> list[tuple[str, str]]:
    """``(role, content)`` pairs of the chat request."""
    user = f"Context:\n{build_context(passages)}\n\nQuestion: {question}"
    return [("system", SYSTEM_PROMPT), ("user", user)]


def cited_numbers(answer: str, n_passages: int) -> list[int]:
    """The passage numbers an answer cites, in order of first use, within range."""
    seen: list[int] = []
    for m in _CITATION.finditer(answer):
        n = int(m.group(1))
        if 1 <= n <= n_passages and n not in seen:
            seen.append(n)
    return seen


_END_PUNCT = ".!?;:…。！？；："
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]")


def is_heading(sentence: str, title: str | None = None) -> bool:
    """Whether a "sentence" is a heading or a title line rather than a statement: a Markdown
    heading, the passage's document title, an all-capitals line, or a short line with no
    closing punctuation and no figure (``Centrifugal pump P-200: maintenance`` ends in a figure
    and is caught by being a ``#`` heading or the title; ``Maintenance schedule`` by its length)."""
    text = " ".join(sentence.split())
    if not text:
        return False
    if text.startswith("#"):
        return True
    if title and text.casefold().strip(" #") == " ".join(title.split()).casefold():
        return True
    if text[-1] in _END_PUNCT:
        return False
    letters = [c for c in text if c.isalpha() and not _CJK.match(c)]
    if len(letters) >= 4 and sum(c.isupper() for c in letters) / len(letters) > 0.7:
        return True
    if any(c.isdigit() for c in text):
        return False
    return len(text) <= 10 if _CJK.search(text) else len(text.split()) <= 6


def covering_sentences(candidates: Sequence[tuple[float, int, int, str]], chosen: Sequence[tuple[float, int, int, str]],
                       q_terms: set[str], max_extra: int = 1) -> list[tuple[float, int, int, str]]:
    """Up to ``max_extra`` more ``(score, passage, start, sentence)`` candidates, best first, each
    from a passage no chosen sentence comes from and holding a question term none of the chosen
    sentences holds: an answer then combines passages only where another one adds to it."""
    covered = {t for c in chosen for t in set(query_terms(c[3])) & q_terms}
    numbers = {c[1] for c in chosen}
    extra: list[tuple[float, int, int, str]] = []
    for cand in candidates:
        if len(extra) >= max_extra:
            break
        if cand[1] in numbers or any(cand[3] in c[3] or c[3] in cand[3] for c in (*chosen, *extra)):
            continue
        new = (set(query_terms(cand[3])) & q_terms) - covered
        if new:
            extra.append(cand)
            covered |= new
            numbers.add(cand[1])
    return extra


def extractive_answer(question: str, passages: Sequence[Passage], max_sentences: int = 2,
                      max_extra: int = 1) -> str:
    """The sentences that share the most (idf-weighted) terms with the question, each cited.

    ``max_extra`` more sentences may come from other passages when they hold question terms the
    chosen ones lack (:func:`covering_sentences`); the answer quotes them in passage order, each
    followed by its own ``[n]``.

    Sentence weight: sum over the question terms it contains of ``idf * len(term)``, divided by
    ``sqrt`` of its term count; ties go to the higher-ranked passage. Headings and title lines
    (:func:`is_heading`) are only quoted when no statement shares a term with the question.
    """
    q_terms = set(query_terms(question))
    if not passages:
        return "No passage matched the question."
    candidates: list[tuple[float, int, int, str]] = []
    headings: list[tuple[float, int, int, str]] = []
    sentence_terms: list[set[str]] = []
    rows = []
    for p in passages:
        for a, b in sentence_spans(p.text):
            sent = p.text[a:b].strip()
            if len(sent) < 2:
                continue
            terms = set(query_terms(sent))
            rows.append((p.number, a, sent, terms, is_heading(sent, p.title)))
            sentence_terms.append(terms)
    df = Counter(t for terms in sentence_terms for t in terms & q_terms)
    n = max(len(sentence_terms), 1)
    for number, start, sent, terms, heading in rows:
        overlap = terms & q_terms
        if not overlap:
            continue
        score = sum(math.log(1 + n / (1 + df[t])) * min(len(t), 4) for t in overlap) / math.sqrt(len(terms) + 1)
        (headings if heading else candidates).append((score, number, start, sent))
    candidates = candidates or headings
    if not candidates:
        first = passages[0]
        sentences = [first.text[a:b].strip() for a, b in sentence_spans(first.text)]
        statements = [sent for sent in sentences if not is_heading(sent, first.title)] or sentences
        return (statements[0] if statements else first.text[:200]) + f" [{first.number}]"
    candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
    chosen: list[tuple[float, int, int, str]] = []
    for cand in candidates:  # skip sentences that repeat one already chosen (titles, headers)
        if not any(cand[3] in c[3] or c[3] in cand[3] for c in chosen):
            chosen.append(cand)
        if len(chosen) == max_sentences:
            break
    chosen += covering_sentences(candidates, chosen, q_terms, max_extra)
    picked = sorted(chosen, key=lambda c: (c[1], c[2]))
    return " ".join(f"{sent} [{number}]" for _, number, _, sent in picked)


class RetrievedChunk(Protocol):
    """A retrieved chunk as the retriever hands it over (``tasks.retrieve.Retrieved``)."""

    @property
    def score(self) -> float: ...

    @property
    def ranks(self) -> dict[str, int]: ...

    @property
    def fields(self) -> dict[str, Any]: ...


def passages_from(hits: Sequence[RetrievedChunk]) -> list[Passage]:
    """The retrieved chunks as numbered passages (1 = best)."""
    return [
        Passage(number=n, text=h.fields.get("text", ""), doc_id=h.fields.get("doc_id", ""),
                path=h.fields.get("path", ""), chunk_index=int(h.fields.get("chunk_index", 0)),
                page=int(h.fields.get("page") or 0) or None, title=h.fields.get("title") or None)
        for n, h in enumerate(hits, 1)
    ]


def _streamed(chat: ChatClient, messages: list[ChatMessage], out: TextIO) -> str:
    """The LLM's answer, written to ``out`` piece by piece (redacted on the fly) as it comes."""
    pieces: list[str] = []
    guard = StreamRedactor(RedactionConfig())
    for piece in chat.stream(messages):
        pieces.append(piece)
        shown = guard.feed(piece)
        if shown:
            out.write(shown)
            out.flush()
    out.write(guard.flush())
    out.flush()
    return "".join(pieces)


def generate_answer(question: str, passages: Sequence[Passage], chat: ChatClient | None = None,
                    stream_to: TextIO | None = None) -> tuple[str, str]:
    """The redacted answer and its kind (``"llm"`` or ``"extractive"``).

    Args:
        question: The (already redacted or harmless) question.
        passages: The numbered passages to answer from.
        chat: The chat endpoint; None (or no passage) answers extractively.
        stream_to: Where to write the LLM's answer as it is generated (None: ask for it whole).
    """
    if chat is None or not passages:
        text, kind = extractive_answer(question, passages), "extractive"
    else:
        # the one boundary before the LLM: question, passages and their labels (rows stored by an
        # older rule set included)
        messages = [ChatMessage(role, redact_text(content)) for role, content in build_messages(question, passages)]
        text = _streamed(chat, messages, stream_to) if stream_to is not None else chat.complete(messages)
        kind = "llm"
    return redact(text, RedactionConfig())[0], kind


class SupportedChunk(RetrievedChunk, Protocol):
    """A retrieved chunk with its raw per-retriever scores (what the support check reads)."""

    @property
    def scores(self) -> dict[str, float]: ...


#: ``mode`` of an answer the KB did not generate: the passages do not support one.
ABSTAINED = "none"


def answer_or_abstain(question: str, hits: Sequence[SupportedChunk], chat: ChatClient | None, *, collection: str,
                      embedder: str | None, n_chunks: int | None, mode: str = "hybrid",
                      content_bm25: float | None = None, stream_to: TextIO | None = None,
                      ) -> tuple[str, str, Support]:
    """The answer, its kind and the support decision: an answer only when the retrieved passages
    support one (:func:`solutions.rag.support.assess`), otherwise the abstention sentence and
    kind ``"none"`` (no LLM call); ``n_chunks`` (the collection's size), ``mode`` (the
    retriever) and ``content_bm25`` are those of :func:`solutions.rag.support.support_signals`.
    An LLM answer that cites no passage, or says the passages do not hold the answer, is kept
    but marked not answered."""
    support = assess(question, hits, embedder, n_chunks, mode, content_bm25)
    if not support.answered:
        return abstention_text(collection), ABSTAINED, support
    text, kind = generate_answer(question, passages_from(hits), chat, stream_to=stream_to)
    if kind == "llm" and llm_abstained(text, cited_numbers(text, len(hits))):
        support = support.model_copy(update={
            "answered": False, "reason": "the LLM's answer cites no passage or says the passages do not answer"})
    return text, kind, support


def ask_result(question: str, mode: str, weights: dict[str, float], answer: tuple[str, str],
               hits: Sequence[RetrievedChunk], *, seconds: float, streamed: bool = False,
               support: Support | None = None) -> AskResult:
    """The typed result of one question: the answer, its citations and the hits, every text in it
    redacted (the question, paths, titles and snippets as well as the answer)."""
    text, kind = answer
    passages = [replace(p, text=redact_text(p.text), path=redact_text(p.path), title=redact_text(p.title or "") or None)
                for p in passages_from(hits)]
    numbers = cited_numbers(text, len(passages)) if kind != ABSTAINED else []
    spans = highlight_spans(text, {n: passages[n - 1].text for n in numbers})
    citations = [
        Citation(number=n, path=passages[n - 1].path, title=passages[n - 1].title or "",
                 chunk_index=passages[n - 1].chunk_index, page=passages[n - 1].page,
                 start_char=int(hits[n - 1].fields.get("start_char", 0)),
                 end_char=int(hits[n - 1].fields.get("end_char", 0)), highlight=spans.get(n, []),
                 quotes=[passages[n - 1].text[a:b] for a, b in spans.get(n, [])])
        for n in numbers
    ]
    views = [
        AskHit(number=p.number, score=round(h.score, 6), ranks=h.ranks, path=p.path, title=p.title or "",
               content_type=h.fields.get("content_type", ""), chunk_index=p.chunk_index, page=p.page,
               snippet=p.text[:240])
        for p, h in zip(passages, hits, strict=True)
    ]
    return AskResult(question=redact_text(question), mode=mode, weights=weights, answer=text, answer_kind=kind,
                     citations=citations, hits=views, seconds=seconds, streamed=streamed and kind == "llm",
                     answered=support.answered if support is not None else True, support=support)

