"""The knowledge base's abstention rule: signals, the calibrated decision, LLM abstentions."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest

from solutions.rag.answer import ABSTAINED, answer_or_abstain
from solutions.rag.support import (
    LEXICAL,
    TERMS,
    Calibration,
    Signals,
    SupportModel,
    abstention_text,
    assess,
    content_query,
    coverage,
    llm_abstained,
    packaged_calibration,
    support_signals,
)


@dataclass(frozen=True)
class Hit:
    text: str
    ranks: dict[str, int]
    scores: dict[str, float]
    fields: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.fields.setdefault("text", self.text)
        self.fields.setdefault("path", "docs/a.txt")

    @property
    def score(self) -> float:
        return self.scores.get("dense", 0.0)


LEASE = Hit("The tenant gives three months notice before the lease ends. Rent is due monthly.",
            {"dense": 1, "bm25": 1}, {"dense": 0.91, "bm25": 7.5})
OFFICE = Hit("Quarterly sales figures by region, with a chart of revenue.", {"dense": 2}, {"dense": 0.78})
#: answered when dense similarity and coverage are both high (a hand-set model, not the packaged one)
MODEL = SupportModel(features=["dense_top", "coverage", "agree"], coef=[10.0, 6.0, 1.0], intercept=-13.0,
                     threshold=0.5)
CAL = Calibration(source="test", models={
    "e5": MODEL,
    "e5:dense": SupportModel(features=["dense_top", "coverage"], coef=[10.0, 6.0], intercept=-12.5, threshold=0.5),
    LEXICAL: SupportModel(features=["coverage", "bm25_norm"], coef=[8.0, 1.0], intercept=-5.0, threshold=0.5),
    TERMS: SupportModel(features=["coverage"], coef=[8.0], intercept=-4.0, threshold=0.5)})


def test_coverage_weighs_content_terms_by_length() -> None:
    assert coverage(["notice", "lease"], LEASE.text) == 1.0
    assert coverage(["notice", "amoxicillin"], LEASE.text) == pytest.approx(0.5)  # both weigh 4 (capped)
    assert coverage(["租金", "押金"], "每月租金在月初支付。") == pytest.approx(0.5)  # CJK terms match as text
    assert coverage([], "anything") == 1.0


def test_signals_read_raw_scores_coverage_and_agreement() -> None:
    question = "Which notice before the lease ends?"
    assert content_query(question) == "notice before lease ends"  # the BM25 probe: no stopwords
    s = support_signals(question, [LEASE, OFFICE], n_chunks=10, content_bm25=6.0)
    assert s.dense_top == pytest.approx(0.91) and s.coverage == 1.0 and s.sentence_coverage == 1.0
    assert s.agree == 1.0 and s.top_agree == 1.0
    # the probe's best BM25 score per question term over log(1 + chunks): 6.0 / (4 * log 11)
    assert s.bm25_norm == pytest.approx(6.0 / (4 * math.log(11)), abs=1e-6)
    # hybrid retrieval whose BM25 list came back empty: no lexical match at all, not "unknown"
    s = support_signals("What is the dose of amoxicillin for children?", [OFFICE], n_chunks=10, content_bm25=0.0)
    assert s.dense_top == pytest.approx(0.78) and s.coverage == 0.0
    assert s.bm25_norm == 0.0 and s.agree == 0.0 and s.top_agree == 0.0
    dense = support_signals("notice", [LEASE], n_chunks=10, mode="dense")
    assert dense.bm25_norm is None and dense.agree is None  # BM25 did not run: no lexical or agreement signal
    bm25_only = support_signals("notice", [Hit("notice", {"bm25": 1}, {"bm25": 3.0})], mode="bm25",
                                content_bm25=3.0)
    assert bm25_only.dense_top is None and bm25_only.bm25_norm is None  # the collection size is unknown


def test_sentence_coverage_wants_the_terms_close_together() -> None:
    far = Hit("The notice is given in writing. " + "Filler sentence here. " * 5 + "The lease ends in May.",
              {"dense": 1, "bm25": 1}, {"dense": 0.9, "bm25": 5.0})
    s = support_signals("notice lease", [far], n_chunks=10, content_bm25=5.0)
    assert s.coverage == 1.0 and s.sentence_coverage == pytest.approx(0.5)


def test_assess_answers_supported_questions_and_abstains_otherwise() -> None:
    yes = assess("Which notice before the lease ends?", [LEASE, OFFICE], "e5", 10, calibration=CAL)
    assert yes.answered and yes.model == "e5" and yes.probability > 0.5 and yes.reason == ""
    no = assess("What is the dose of amoxicillin for children?", [OFFICE, LEASE], "e5", 10, calibration=CAL)
    assert not no.answered and no.probability < 0.5 and "do not support" in no.reason
    assert not assess("anything", [], "e5", 10, calibration=CAL).answered


def test_the_first_model_whose_signals_are_there_decides() -> None:
    q = "Which notice before the lease ends?"
    assert assess(q, [LEASE], "e5", 10, calibration=CAL).model == "e5"
    dense_only = Hit(LEASE.text, {"dense": 1}, {"dense": 0.91})
    assert assess(q, [dense_only], "e5", 10, mode="dense", calibration=CAL).model == "e5:dense"
    assert assess(q, [LEASE], "other-model", 10, content_bm25=6.0, calibration=CAL).model == LEXICAL
    bm25_only = Hit(LEASE.text, {"bm25": 1}, {"bm25": 7.5})
    assert assess(q, [bm25_only], None, 10, mode="bm25", content_bm25=6.0, calibration=CAL).model == LEXICAL
    assert assess(q, [bm25_only], None, None, mode="bm25", calibration=CAL).model == TERMS
    with pytest.raises(ValueError, match="dense_top"):
        MODEL.probability(Signals(dense_top=None, coverage=1.0, sentence_coverage=1.0, bm25_norm=None, agree=1.0,
                                  top_agree=1.0))


def test_the_llm_abstains_when_it_cites_nothing_or_says_the_passages_do_not_answer() -> None:
    assert llm_abstained("The notice period is three months.", [])
    assert llm_abstained("The passages do not contain the dose [1].", [1])
    assert llm_abstained("文中没有提到儿童剂量 [1]。", [1])
    assert not llm_abstained("The notice period is three months [1].", [1])


def test_answer_or_abstain_gives_the_abstention_sentence_without_calling_the_llm(monkeypatch: pytest.MonkeyPatch) -> None:
    from solutions.rag import answer

    monkeypatch.setattr(answer, "assess", lambda q, hits, emb, n, mode, probe: assess(q, hits, emb, n, mode, probe,
                                                                                     calibration=CAL))

    class NoCall:
        def complete(self, messages: Any) -> str:
            raise AssertionError("the LLM was asked although the KB abstained")

    text, kind, support = answer_or_abstain("What is the dose of amoxicillin for children?", [OFFICE, LEASE],
                                            NoCall(), collection="legal", embedder="e5",  # type: ignore[arg-type]
                                            n_chunks=10)
    assert (text, kind, support.answered) == (abstention_text("legal"), ABSTAINED, False)
    assert text == "The documents in legal do not answer this."
    text, kind, support = answer_or_abstain("Which notice before the lease ends?", [LEASE, OFFICE], None,
                                            collection="legal", embedder="e5", n_chunks=10)
    assert kind == "extractive" and support.answered and "[1]" in text


def test_the_packaged_calibration_has_the_default_embedder_and_the_lexical_model() -> None:
    cal = packaged_calibration()
    assert {LEXICAL, TERMS, "multilingual-e5-small", "multilingual-e5-small:dense"} <= set(cal.models)
    assert "kb_abstain_bench" in cal.source
    for model in cal.models.values():
        assert 0.0 < model.threshold < 1.0 and len(model.coef) == len(model.features)
