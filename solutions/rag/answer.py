"""Answers with citations: the numbered context for an LLM, the citations [n] mapped back to
document and position, and the offline extractive answer (best-matching sentences)."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

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


def extractive_answer(question: str, passages: Sequence[Passage], max_sentences: int = 2) -> str:
    """The sentences that share the most (idf-weighted) terms with the question, each cited.

    Sentence weight: sum over the question terms it contains of ``idf * len(term)``, divided by
    ``sqrt`` of its term count; ties go to the higher-ranked passage.
    """
    q_terms = set(query_terms(question))
    if not passages:
        return "No passage matched the question."
    candidates: list[tuple[float, int, int, str]] = []
    sentence_terms: list[set[str]] = []
    rows = []
    for p in passages:
        for a, b in sentence_spans(p.text):
            sent = p.text[a:b].strip()
            if len(sent) < 2:
                continue
            terms = set(query_terms(sent))
            rows.append((p.number, a, sent, terms))
            sentence_terms.append(terms)
    df = Counter(t for terms in sentence_terms for t in terms & q_terms)
    n = max(len(sentence_terms), 1)
    for number, start, sent, terms in rows:
        overlap = terms & q_terms
        if not overlap:
            continue
        score = sum(math.log(1 + n / (1 + df[t])) * min(len(t), 4) for t in overlap) / math.sqrt(len(terms) + 1)
        candidates.append((score, number, start, sent))
    if not candidates:
        first = passages[0]
        sentences = [first.text[a:b].strip() for a, b in sentence_spans(first.text)]
        return (sentences[0] if sentences else first.text[:200]) + f" [{first.number}]"
    candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
    chosen: list[tuple[float, int, int, str]] = []
    for cand in candidates:  # skip sentences that repeat one already chosen (titles, headers)
        if not any(cand[3] in c[3] or c[3] in cand[3] for c in chosen):
            chosen.append(cand)
        if len(chosen) == max_sentences:
            break
    picked = sorted(chosen, key=lambda c: (c[1], c[2]))
    return " ".join(f"{sent} [{number}]" for _, number, _, sent in picked)
