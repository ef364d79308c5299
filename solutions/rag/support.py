"""Does the retrieved evidence answer the question? The knowledge base's abstention rule.

An answer is given only when the retrieved passages support one; otherwise the KB says that the
documents do not answer, and shows the closest passages as related, not as an answer. The
decision reads signals of one question's retrieval (:func:`support_signals`):

- ``dense_top``: the best cosine similarity of the question to a retrieved chunk. Its scale is
  the embedder's own (multilingual-e5 puts unrelated text near 0.75), so it is calibrated per
  embedder;
- ``coverage``: the share of the question's content terms (weighted by length: a 4-letter
  word counts more than a particle) found in the best of the top passages, and
  ``sentence_coverage``: the same in the best two consecutive sentences (an answer's terms sit
  together; a long passage that mentions them far apart is weaker evidence);
- ``bm25_norm``: the best BM25 score of the question's content terms alone (:func:`content_query`:
  no stopwords, whose idf is high in a small collection), per term, over ``log(1 + chunks in
  the collection)``: the idf of a term found in one chunk grows with that log, so the ratio
  reads "how many of the question's rare terms matched" on a 5-chunk and a 50,000-chunk
  collection alike;
- ``agree``: one chunk is within the top 3 of both the dense and the BM25 list, and
  ``top_agree``: the two lists' first chunk is the same.

:class:`Calibration` maps them to a probability that the question is answerable (a logistic
model, fitted by ``bench/kb_abstain_bench.py`` on questions whose passage was and was not
ingested, plus out-of-domain questions) and a threshold chosen there for few false
abstentions. The packaged calibration (``abstain_calibration.json``) records the data, command
and figures it came from. Models: one per embedder with every signal; ``<embedder>:dense`` for
dense-only retrieval; ``lexical`` (no dense signal: another embedder, or BM25 only); ``terms``
(coverage only: the last resort). :meth:`Calibration.model_for` takes the first whose signals
are all there. With an LLM, an answer that cites no retrieved passage (or says it cannot answer)
is also an abstention (:func:`llm_abstained`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from solutions.rag.text import query_terms, sentence_spans

CALIBRATION_FILE = Path(__file__).with_name("abstain_calibration.json")
#: How many of the top passages the coverage signal looks at.
COVERAGE_DEPTH = 3
#: A chunk within this rank in both lists counts as the retrievers agreeing.
AGREE_RANK = 3
LEXICAL = "lexical"
TERMS = "terms"
DENSE_SUFFIX = ":dense"
FEATURES = ("dense_top", "coverage", "sentence_coverage", "bm25_norm", "agree", "top_agree")


class Hit(Protocol):
    """A retrieved chunk as :mod:`tasks.retrieve` returns it."""

    @property
    def ranks(self) -> dict[str, int]: ...

    @property
    def scores(self) -> dict[str, float]: ...

    @property
    def fields(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Signals:
    """What one question's retrieval says about its support (see the module docstring); None:
    the retrieval gave no such signal (no dense list, no BM25 list)."""

    dense_top: float | None
    coverage: float
    sentence_coverage: float
    bm25_norm: float | None
    agree: float | None
    top_agree: float | None

    def as_dict(self) -> dict[str, float | None]:
        return {name: getattr(self, name) for name in FEATURES}


def term_weight(term: str) -> float:
    """A content term's weight in the coverage signal: its length, capped at 4 characters."""
    return float(min(len(term), 4))


def coverage(question_terms: Sequence[str], passage: str) -> float:
    """The weighted share of ``question_terms`` that occur in ``passage`` (1.0 when none)."""
    terms = set(question_terms)
    if not terms:
        return 1.0
    lowered = passage.lower()
    # jieba may cut a passage's CJK run differently from the question's: CJK terms match as text
    found = set(query_terms(passage)) | {t for t in terms if not t.isascii() and t in lowered}
    total = sum(term_weight(t) for t in terms)
    return sum(term_weight(t) for t in terms if t in found) / total


def sentence_coverage(question_terms: Sequence[str], passage: str) -> float:
    """The best :func:`coverage` of two consecutive sentences of ``passage``."""
    sentences = [passage[a:b] for a, b in sentence_spans(passage)] or [passage]
    return max(coverage(question_terms, " ".join(sentences[i:i + 2])) for i in range(len(sentences)))


def content_query(question: str) -> str:
    """The question's content terms, space-separated: the BM25 query of ``bm25_norm``."""
    return " ".join(dict.fromkeys(query_terms(question)))


def support_signals(question: str, hits: Sequence[Hit], n_chunks: int | None = None, mode: str = "hybrid",
                    content_bm25: float | None = None) -> Signals:
    """The signals of ``question`` retrieved as ``hits`` (best first) with retriever ``mode``
    (dense, bm25 or hybrid) from a collection of ``n_chunks`` chunks, where the best BM25 score
    of :func:`content_query` is ``content_bm25`` (either None: no ``bm25_norm``). A dense
    retriever that ran and matched nothing gives 0; signals of a retriever that did not run
    are None."""
    ran_dense, ran_bm25 = mode in ("dense", "hybrid"), mode in ("bm25", "hybrid")
    dense = [h.scores["dense"] for h in hits if "dense" in h.scores] or ([0.0] if ran_dense else [])
    terms = list(dict.fromkeys(query_terms(question)))
    top = hits[:COVERAGE_DEPTH]
    cov = max((coverage(terms, h.fields.get("text", "")) for h in top), default=0.0)
    sent = max((sentence_coverage(terms, h.fields.get("text", "")) for h in top), default=0.0)
    bm25_norm = None
    if ran_bm25 and n_chunks and content_bm25 is not None:
        bm25_norm = content_bm25 / (max(len(terms), 1) * math.log(1 + n_chunks))
    both = ran_dense and ran_bm25
    agree = any(h.ranks.get("dense", 10**6) <= AGREE_RANK and h.ranks.get("bm25", 10**6) <= AGREE_RANK for h in hits)
    top_agree = any(h.ranks.get("dense") == 1 and h.ranks.get("bm25") == 1 for h in hits)
    return Signals(dense_top=max(dense) if dense else None, coverage=round(cov, 6), sentence_coverage=round(sent, 6),
                   bm25_norm=None if bm25_norm is None else round(bm25_norm, 6),
                   agree=float(agree) if both else None, top_agree=float(top_agree) if both else None)


class SupportModel(BaseModel):
    """A logistic model of P(answerable | signals) and the threshold above which the KB answers."""

    model_config = ConfigDict(frozen=True)

    features: list[str]
    coef: list[float]
    intercept: float
    threshold: float = Field(ge=0.0, le=1.0)

    def probability(self, signals: Signals) -> float:
        values = signals.as_dict()
        z = self.intercept
        for name, c in zip(self.features, self.coef, strict=True):
            value = values[name]
            if value is None:
                raise ValueError(f"support model needs signal {name!r}, which this retrieval has not")
            z += c * value
        return 1.0 / (1.0 + math.exp(-max(min(z, 60.0), -60.0)))


class Calibration(BaseModel):
    """Support models per embedder name, plus ``lexical`` (no dense signal), with provenance."""

    model_config = ConfigDict(frozen=True)

    source: str = Field(description="The command and data the models were fitted with.")
    figures: dict[str, Any] = Field(default_factory=dict, description="What the bench measured with them.")
    models: dict[str, SupportModel]

    def model_for(self, embedder: str | None, signals: Signals) -> tuple[str, SupportModel]:
        """The first model whose signals are all there: the embedder's (every signal), the
        embedder's dense-only one, ``lexical`` (no dense signal), then ``terms``."""
        values = signals.as_dict()
        names = [embedder, f"{embedder}{DENSE_SUFFIX}"] if embedder else []
        for name in [*names, LEXICAL, TERMS]:
            model = self.models.get(name) if name else None
            if model is not None and all(values[f] is not None for f in model.features):
                return name, model  # type: ignore[return-value]
        raise ValueError(f"no support model fits the signals {sorted(k for k, v in values.items() if v is not None)}")


@cache
def packaged_calibration() -> Calibration:
    """The calibration shipped with the package (``abstain_calibration.json``)."""
    return Calibration.model_validate_json(CALIBRATION_FILE.read_text(encoding="utf-8"))


class Support(BaseModel):
    """The support decision for one question."""

    model_config = ConfigDict(frozen=True)

    answered: bool
    probability: float = Field(description="Calibrated P(the documents answer the question).")
    threshold: float
    model: str = Field(description="The support model used: an embedder's name or 'lexical'.")
    signals: dict[str, float | None]
    reason: str = Field(default="", description="Why the KB did not answer (empty when it did).")


def assess(question: str, hits: Sequence[Hit], embedder: str | None = None, n_chunks: int | None = None,
           mode: str = "hybrid", content_bm25: float | None = None, calibration: Calibration | None = None,
           ) -> Support:
    """Whether ``hits`` (retrieved with ``mode`` from a collection of ``n_chunks`` chunks, see
    :func:`support_signals`) support an answer to ``question``, before any answer is generated."""
    signals = support_signals(question, hits, n_chunks, mode, content_bm25)
    if not hits:
        return Support(answered=False, probability=0.0, threshold=1.0, model="none", signals=signals.as_dict(),
                       reason="no passage was retrieved")
    name, model = (calibration or packaged_calibration()).model_for(embedder, signals)
    p = model.probability(signals)
    answered = p >= model.threshold
    return Support(answered=answered, probability=round(p, 4), threshold=model.threshold, model=name,
                   signals=signals.as_dict(),
                   reason="" if answered else "the retrieved passages do not support an answer "
                   f"(support {p:.2f} < {model.threshold:.2f})")


_CANNOT = re.compile(
    r"\b(?:do(?:es)? not (?:contain|answer|say|mention|provide)|cannot (?:be )?answer|can't answer|"
    r"no (?:information|answer)|not (?:mentioned|stated|in the (?:context|passages)))\b"
    r"|(?:没有|未)(?:提到|提及|涉及|包含|说明)|无法(?:回答|确定)",
    re.IGNORECASE,
)


def llm_abstained(answer: str, cited: Sequence[int]) -> bool:
    """An LLM answer is no answer when it cites no retrieved passage, or says the passages do not
    hold the answer (the system prompt asks it to say so)."""
    return not cited or bool(_CANNOT.search(answer[:400]))


def abstention_text(collection: str) -> str:
    """What the KB says instead of an answer."""
    return f"The documents in {collection} do not answer this."


def write_calibration(calibration: Calibration, path: Path = CALIBRATION_FILE) -> None:
    """Write ``calibration`` as the packaged file (the bench's ``--write``)."""
    path.write_text(json.dumps(calibration.model_dump(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    packaged_calibration.cache_clear()
