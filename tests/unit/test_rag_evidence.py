"""Evidence of an answer: the cited sentence located in each passage, multi-passage extractive
answers, and the stored text around a passage."""

from __future__ import annotations

from solutions.rag.answer import Passage, cited_numbers, extractive_answer
from solutions.rag.evidence import StoredChunk, answer_claims, highlight_spans, surrounding_text

PUMP = ("P-200 feed pump\n\nThe impeller of the P-200 feed pump must be inspected every 1,500 operating hours. "
        "The seal kit is replaced when leakage exceeds five drops per minute.")
COOLING = "The cooling water circuit is flushed once a year before the summer shutdown."


def test_claims_split_at_citation_markers() -> None:
    claims = answer_claims("The impeller is inspected every 1,500 hours [1]. Seals are replaced [2][3]. Tail")
    assert [(c.text, c.numbers) for c in claims] == [("The impeller is inspected every 1,500 hours", (1,)),
                                                     ("Seals are replaced", (2, 3))]


def test_extractive_sentence_is_highlighted_verbatim() -> None:
    passages = [Passage(1, PUMP, "d1", "manual.html", 0), Passage(2, COOLING, "d2", "plant.html", 0)]
    answer = extractive_answer("How often is the impeller of the feed pump inspected?", passages)
    spans = highlight_spans(answer, {p.number: p.text for p in passages})
    assert set(spans) == set(cited_numbers(answer, 2)) and 1 in spans
    (a, b), = spans[1]
    assert PUMP[a:b] == "The impeller of the P-200 feed pump must be inspected every 1,500 operating hours."


def test_a_paraphrase_highlights_the_closest_sentence_and_nothing_unrelated() -> None:
    spans = highlight_spans("Inspect the impeller every 1500 operating hours [1]. Bananas are yellow [2].",
                            {1: PUMP, 2: COOLING})
    (a, b), = spans[1]
    assert PUMP[a:b].startswith("The impeller") and 2 not in spans


def test_extractive_answer_adds_a_passage_that_covers_more_of_the_question() -> None:
    passages = [Passage(1, "The impeller is inspected every 1,500 operating hours.", "d1", "a.txt", 0),
                Passage(2, "The impeller inspection is logged in the plant logbook.", "d2", "b.txt", 0),
                Passage(3, "Cooling water is flushed yearly; the seal kit is replaced after leaks.", "d3", "c.txt", 0)]
    answer = extractive_answer("How often is the impeller inspected and when is the seal kit replaced?", passages,
                               max_sentences=1)
    assert cited_numbers(answer, 3) == [1, 3]  # each sentence with its own [n], in passage order
    assert answer.index("[1]") < answer.index("seal kit")
    only = extractive_answer("How often is the impeller inspected?", passages, max_sentences=1)
    assert cited_numbers(only, 3) == [1]  # nothing the first lacks: one passage


def test_surrounding_text_shows_overlap_once() -> None:
    doc = " ".join(f"w{i:03d}" for i in range(300))
    def chunk(i: int, a: int, b: int) -> StoredChunk:
        return StoredChunk(i, 1, a, b, doc[a:b].strip())
    prev, cur, nxt = chunk(0, 0, 600), chunk(1, 300, 900), chunk(2, 600, 1199)
    got = surrounding_text(cur, [nxt, prev])
    assert got.passage == cur.text and got.before.endswith("w059") and got.after.startswith("w180")
    assert f"{got.before} {got.passage} {got.after}" == doc[:1199]
    assert (got.first_index, got.last_index) == (0, 2)
