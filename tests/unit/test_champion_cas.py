"""Promotion is compare-and-swap: a comparison made against a champion that was replaced
meanwhile is never trusted (no Prefect)."""

from __future__ import annotations

import math
import multiprocessing as mp
from pathlib import Path

import pytest
import torch

from infra.errors import QualityGateError
from infra.registry import ChampionComparison, ModelRef, ModelRegistry, PromotionDecision

METRIC = "test/auprc"
#: True quality of each version, whatever data it is scored on (keeps the race readable).
QUALITY = {1: 0.50, 2: 0.80, 3: 0.60}


def _register(reg: ModelRegistry, value: float) -> ModelRef:
    return reg.register("m", {"w": torch.zeros(2)}, params={}, metrics={METRIC: value}, primary_metric=METRIC)


def _recompare(champion: ModelRef) -> ChampionComparison:
    """Re-score a champion version on the candidate's data (inside the lock)."""
    return ChampionComparison(champion_version=champion.version, champion_value=QUALITY[champion.version])


def test_stale_comparison_cannot_replace_a_better_champion(tmp_path: Path) -> None:
    reg = ModelRegistry(tmp_path)
    v1 = _register(reg, QUALITY[1])
    assert reg.promote(v1).promoted
    # two runs compare their candidates with champion v1 before either promotes
    v2, v3 = _register(reg, QUALITY[2]), _register(reg, QUALITY[3])
    seen_by_2 = ChampionComparison(champion_version=1, champion_value=QUALITY[1])
    seen_by_3 = ChampionComparison(champion_version=1, champion_value=QUALITY[1])
    first = reg.promote(v2, comparison=seen_by_2, recompare=_recompare)
    assert first.promoted and not first.rescored_in_lock
    # replayed in the bad order: v3 (0.60) still holds the stale 0.50 of v1
    second = reg.promote(v3, comparison=seen_by_3, recompare=_recompare)
    assert not second.promoted and second.rescored_in_lock
    assert second.champion_version == 2 and second.champion_value == pytest.approx(0.80)
    assert reg.champion("m").version == 2
    # without a way to re-score, the current champion's recorded metric is compared
    fallback = reg.promote(v3, comparison=seen_by_3)
    assert not fallback.promoted and fallback.champion_value == pytest.approx(0.80)
    with pytest.raises(QualityGateError, match="does not beat champion v2"):
        reg.promote(v3, comparison=seen_by_3, strict=True)


def test_significance_gate(tmp_path: Path) -> None:
    reg = ModelRegistry(tmp_path)
    v1 = _register(reg, 0.50)
    assert reg.promote(v1, alpha=0.05).promoted  # no champion yet: nothing to test against
    v2 = _register(reg, 0.52)
    noisy = ChampionComparison(champion_version=1, champion_value=0.50, p_value=0.30)
    decision = reg.promote(v2, comparison=noisy, alpha=0.05)
    assert not decision.promoted and "not significantly" in decision.reason and decision.p_value == 0.30
    assert not reg.promote(v2, comparison=noisy.model_copy(update={"p_value": None}), alpha=0.05).promoted
    assert reg.promote(v2, comparison=noisy).promoted  # gate off: the point estimate decides
    v3 = _register(reg, 0.70)
    sure = ChampionComparison(champion_version=2, champion_value=0.52, p_value=0.001)
    decision = reg.promote(v3, comparison=sure, alpha=0.05)
    assert decision.promoted and "significantly" in decision.reason


def _race(root: str, version: int, barrier, results) -> None:
    reg = ModelRegistry(Path(root))
    candidate = reg.get("m", version)
    # both processes compared with champion v1 (the one current when they started)
    seen = ChampionComparison(champion_version=1, champion_value=QUALITY[1])
    barrier.wait(timeout=60)
    results[version] = reg.promote(candidate, comparison=seen, recompare=_recompare).promoted


def test_two_processes_promote_at_once(tmp_path: Path) -> None:
    reg = ModelRegistry(tmp_path)
    assert reg.promote(_register(reg, QUALITY[1])).promoted
    _register(reg, QUALITY[2]), _register(reg, QUALITY[3])
    ctx = mp.get_context("fork")
    with ctx.Manager() as manager:
        barrier, results = manager.Barrier(2), manager.dict()
        procs = [ctx.Process(target=_race, args=(str(tmp_path), v, barrier, results)) for v in (3, 2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=120)
        assert all(p.exitcode == 0 for p in procs)
        outcome = dict(results)
    # whichever order the lock gave them, the better model ends as champion
    assert reg.champion("m").version == 2
    assert outcome[2] is True


@pytest.mark.parametrize("higher_is_better", [True, False])
def test_a_tie_keeps_the_champion_even_when_rounding_differs(tmp_path: Path, higher_is_better: bool) -> None:
    """The same quality scored along two paths differs in the last bits (0.1 + 0.2 != 0.3): not a win."""
    reg = ModelRegistry(tmp_path)

    def register(value: float) -> ModelRef:
        return reg.register("m", {"w": torch.zeros(2)}, params={}, metrics={METRIC: value},
                            primary_metric=METRIC, higher_is_better=higher_is_better)

    def against_v1(value: float) -> PromotionDecision:
        return reg.promote(register(value), comparison=ChampionComparison(champion_version=1, champion_value=0.3))

    assert reg.promote(register(0.3)).promoted
    one_ulp_better = math.nextafter(0.3, 1.0 if higher_is_better else 0.0)
    for tie in (0.3, one_ulp_better):
        decision = against_v1(tie)
        assert not decision.promoted and "a tie keeps the champion" in decision.reason
    assert against_v1(0.31 if higher_is_better else 0.29).promoted
