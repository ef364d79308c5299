"""Hybrid fusion weights: how much to trust dense retrieval for a question or a whole QA set.

Dense retrieval is only as good as the embedder's vocabulary: a Chinese question under an
English-only model is ~50-60% unknown word pieces, and equal-weight fusion then drags BM25
down (see ``tasks.retrieve`` for the measurements). With ``dense="auto"`` the dense weight
falls with the share of unknown pieces in the question.
"""

from __future__ import annotations

from collections.abc import Sequence

from infra.embeddings import Embedder
from solutions.rag.config import HybridWeights


def dense_weight_for(unk_share: float) -> float:
    """Coverage-aware default weight of the dense retriever in hybrid fusion.

    1.0 when the embedder knows (almost) every word piece of the query; it falls linearly to
    0.1 at 20% unknown pieces, where dense only reorders hits BM25 scores alike.
    """
    if unk_share <= 0.02:
        return 1.0
    return round(max(0.1, 1.0 - (unk_share - 0.02) / 0.18 * 0.9), 3)


def query_weights(embedder: Embedder, question: str, weights: HybridWeights) -> dict[str, float]:
    """Fusion weights for one question (``auto`` dense weight from the embedder's coverage of it)."""
    if weights.dense != "auto":
        return {"dense": float(weights.dense), "bm25": weights.bm25}
    if not getattr(embedder, "exact_tokenizer", True):  # no evidence about a remote model's vocabulary
        return {"dense": 1.0, "bm25": weights.bm25}
    tok = embedder.tokenizer
    ids = tok(question, add_special_tokens=False, verbose=False)["input_ids"]
    unk = getattr(tok, "unk_token_id", None)
    share = (sum(1 for i in ids if i == unk) / len(ids)) if ids and unk is not None else 0.0
    return {"dense": dense_weight_for(share), "bm25": weights.bm25}


def corpus_weights(embedder: Embedder, questions: Sequence[str], weights: HybridWeights) -> dict[str, float]:
    """One set of fusion weights for a whole QA set: the median per-question auto weight."""
    if weights.dense != "auto":
        return {"dense": float(weights.dense), "bm25": weights.bm25}
    dense = sorted(query_weights(embedder, q, weights)["dense"] for q in questions[:200])
    return {"dense": dense[len(dense) // 2] if dense else 1.0, "bm25": weights.bm25}
