"""Hybrid fusion: it never does worse than the better of its two retrievers when one of them is
poor, whichever one it is; the old default (max-normalised BM25 + raw cosine) did."""

from __future__ import annotations

import numpy as np
import pytest

from solutions.rag.config import HybridWeights
from tasks.retrieve import Retrieved, fuse

DEPTH = 20


def lists(good: str, seed: int = 0, n_queries: int = 200, pool: int = 100) -> list[tuple[str, dict]]:
    """Per query: the gold id and a dense and a BM25 list of ``DEPTH`` hits.

    The good retriever ranks the gold first for ~60% of queries (else 2nd-6th) and its top
    score stands out; the poor one ranks it geometrically far down (often not at all) with
    scores of its usual shape: BM25 gamma-distributed term scores, dense cosines in a narrow
    band around 0.8.
    """
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_queries):
        gold = f"d{rng.integers(pool)}"
        perm = [f"d{i}" for i in rng.permutation(pool) if f"d{i}" != gold]
        per = {}
        for name in ("dense", "bm25"):
            others = perm if name == "dense" else perm[10:] + perm[:10]
            if name == good:
                r = int(rng.choice([0, 0, 0, 0, 0, 0, 0, 1, 1, 2, 3, 5]))
            else:
                r = int(min(rng.geometric(0.12) - 1, DEPTH + 5))
            ids = (others[:r] + [gold] + others[r:])[:DEPTH]
            if name == "bm25":
                scores = np.sort(rng.gamma(2.0, 1.5, DEPTH))[::-1] + 4
                scores[0] += 4 if name == good else 0
            else:
                scores = np.sort(rng.normal(0.80, 0.02, DEPTH))[::-1]
                scores[0] += 0.03 if name == good else 0
            per[name] = [Retrieved(i, float(s), {"id": i}) for i, s in zip(ids, scores, strict=True)]
        out.append((gold, per))
    return out


def recall5_mrr10(ranked: list[list[Retrieved]], golds: list[str]) -> tuple[float, float]:
    ranks = [next((i for i, h in enumerate(hits[:10], 1) if h.id == g), None) for hits, g in zip(ranked, golds,
                                                                                                     strict=True)]
    n = len(ranks)
    return sum(1 for r in ranks if r and r <= 5) / n, sum(1 / r for r in ranks if r) / n


def max_normalised(per: dict[str, list[Retrieved]], weights: dict[str, float], top_k: int) -> list[Retrieved]:
    """The old default fusion, as the reference that drags: ``w_bm25 * bm25 / max(bm25) + w_dense * cosine``."""
    total: dict[str, float] = {}
    for name, hits in per.items():
        scale = max(h.score for h in hits) if name == "bm25" else 1.0
        for h in hits:
            total[h.id] = total.get(h.id, 0.0) + weights[name] * h.score / scale
    return [Retrieved(i, s, {"id": i}) for i, s in sorted(total.items(), key=lambda kv: -kv[1])[:top_k]]


def scores(data: list[tuple[str, dict]], weights: dict[str, float], fusion=fuse) -> dict[str, tuple[float, float]]:
    golds = [g for g, _ in data]
    return {"dense": recall5_mrr10([p["dense"] for _, p in data], golds),
            "bm25": recall5_mrr10([p["bm25"] for _, p in data], golds),
            "hybrid": recall5_mrr10([fusion(p, weights, DEPTH) for _, p in data], golds)}


@pytest.mark.parametrize("good", ["bm25", "dense"])
def test_fusion_is_never_below_its_better_retriever(good: str) -> None:
    default = HybridWeights()
    weights = {"dense": 1.0 if default.dense == "auto" else float(default.dense), "bm25": default.bm25}
    s = scores(lists(good), weights)
    poor = "dense" if good == "bm25" else "bm25"
    assert s[poor][0] < 0.6 * s[good][0]  # the fixture really has a poor retriever
    for metric in (0, 1):  # recall@5, MRR@10
        assert s["hybrid"][metric] >= max(s["dense"][metric], s["bm25"][metric]), (good, s)


def test_the_fixture_catches_a_fusion_dragged_down_by_its_poor_retriever() -> None:
    # the old default: max-normalised BM25 + raw cosine at equal weight
    s = scores(lists("dense"), {"dense": 1.0, "bm25": 1.0}, max_normalised)
    assert s["hybrid"][0] < s["dense"][0] and s["hybrid"][1] < s["dense"][1]
