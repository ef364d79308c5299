"""Bootstrap intervals, paired tests, model cards, lineage and reproduction checks (no Prefect API)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, roc_auc_score

from infra.errors import ReproductionError
from infra.registry import ModelRegistry
from tasks import stats
from tasks.cards import CARD_JSON, CARD_MD, Comparison, Section, build_card, refresh_card, write_card
from tasks.lineage import (
    LINEAGE_FILE,
    Environment,
    collect_lineage,
    current_environment,
    environment_differences,
    read_lineage,
)
from tasks.register import lineage_files
from tasks.reproduce import check_data_hash, compare_reproduction, plan_reproduction


def _scores(n: int = 2000, seed: int = 0, strength: float = 1.5) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.05).astype(int)
    return y, rng.normal(size=n) + strength * y


def test_weighted_metrics_match_sklearn_with_ties() -> None:
    rng = np.random.default_rng(3)
    y = (rng.random(400) < 0.2).astype(float)
    s = np.round(rng.random(400) + 0.4 * y, 1)  # many ties
    w = rng.integers(0, 4, size=(3, 400)).astype(float)
    for i in range(3):
        assert stats.weighted_pr_auc(y, s, w)[i] == pytest.approx(average_precision_score(y, s, sample_weight=w[i]))
        assert stats.weighted_roc_auc(y, s, w)[i] == pytest.approx(roc_auc_score(y, s, sample_weight=w[i]))


@pytest.mark.parametrize("rate", [0.01, 0.5, 0.97])
def test_weighted_metrics_match_sklearn_where_only_a_few_groups_hold_positives(rate: float) -> None:
    """Few positives, most, or nearly all; the last row tied with the best; resamples that drop
    every positive (NaN) or every negative (ROC NaN)."""
    rng = np.random.default_rng(int(rate * 100))
    y = (rng.random(300) < rate).astype(float)
    y[:2] = [1.0, 0.0]
    s = np.round(rng.random(300) + 0.3 * y, 2)
    s[-1] = s.max()
    w = rng.integers(0, 3, size=(6, 300)).astype(float)
    w[:4, 0] = 1.0  # the first four hold a positive and a negative
    w[:4, 1] = 1.0
    w[4, y == 1] = 0.0
    w[5, y == 0] = 0.0
    pr, roc = stats.weighted_pr_auc(y, s, w), stats.weighted_roc_auc(y, s, w)
    for i in range(4):
        assert pr[i] == pytest.approx(average_precision_score(y, s, sample_weight=w[i]))
        assert roc[i] == pytest.approx(roc_auc_score(y, s, sample_weight=w[i]))
    assert np.isnan(pr[4]) and np.isnan(roc[4]) and np.isnan(roc[5]) and pr[5] == pytest.approx(1.0)


def test_intervals_contain_the_estimate_and_are_seeded() -> None:
    y, s = _scores()
    for metric in ("pr_auc", "roc_auc"):
        ci = stats.bootstrap_ci(metric, y, s, resamples=300, seed=1)
        assert ci.low <= ci.value <= ci.high and ci.high - ci.low < 0.3 and ci.resamples == 300
        assert ci == stats.bootstrap_ci(metric, y, s, resamples=300, seed=1)
    true, pred = np.arange(50.0), np.arange(50.0) + np.random.default_rng(0).normal(0, 3, 50)
    rmse = stats.bootstrap_ci("rmse", true, pred, resamples=300)
    assert rmse.low <= rmse.value <= rmse.high and rmse.value == pytest.approx(np.sqrt(np.mean((pred - true) ** 2)))
    with pytest.raises(ValueError, match="unknown metric"):
        stats.bootstrap_ci("accuracy", y, s)
    with pytest.raises(ValueError, match="rows"):
        stats.bootstrap_ci("pr_auc", y, s[:-1])


def test_paired_bootstrap_p_values() -> None:
    y, strong = _scores(strength=2.5)
    weak = strong + np.random.default_rng(9).normal(0, 3, len(y))  # the same signal, drowned in noise
    better = stats.paired_bootstrap("pr_auc", y, strong, weak, resamples=250)
    worse = stats.paired_bootstrap("pr_auc", y, weak, strong, resamples=250)
    assert better.p_value < 0.01 and worse.p_value > 0.99
    assert better.diff_low <= better.diff <= better.diff_high
    same = stats.paired_bootstrap("pr_auc", y, strong, strong.copy(), resamples=250)
    assert 0.0 <= same.p_value <= 1.0 and same.p_value == 1.0  # never better than itself
    # lower is better for errors
    true = np.linspace(0, 100, 200)
    good, bad = true + 1.0, true + np.random.default_rng(1).normal(0, 10, 200)
    assert stats.paired_bootstrap("rmse", true, good, bad, resamples=250).p_value < 0.01


def _register(reg: ModelRegistry, name: str = "m", value: float = 0.5, **kw):
    return reg.register(name, {"w": torch.ones(2)}, params={}, metrics={"test/auprc": value},
                        primary_metric="test/auprc", **kw)


def test_card_is_stored_rendered_and_lists_later_variants(tmp_path: Path) -> None:
    reg = ModelRegistry(tmp_path)
    ref = _register(reg)
    y, s = _scores()
    metrics = [stats.bootstrap_ci("pr_auc", y, s, resamples=200)]
    vs = Comparison(against="baseline", test=stats.paired_bootstrap("pr_auc", y, s, s * 0.5 + 1, resamples=200))
    card = build_card(ref, title="t", intended_use="ranking for review", features=["a", "b"], metrics=metrics,
                      comparisons=[vs], sections=[Section(title="Per test day", columns=["day", "n"],
                                                          rows=[["2025-01-01", 3]])],
                      limitations=["only synthetic"], registry=reg)
    markdown = write_card(reg, ref, card)
    folder = Path(ref.path)
    assert (folder / CARD_MD).read_text() == markdown
    stored = json.loads((folder / CARD_JSON).read_text())
    assert stored["metrics"][0]["low"] <= stored["metrics"][0]["value"] <= stored["metrics"][0]["high"]
    assert "## Intended use" in markdown and "| baseline | pr_auc |" in markdown and "none yet" in markdown
    # a compressed variant registered later appears once the card is refreshed
    _register(reg, "m-int8", 0.49, parent=ref.spec, tags={"kind": "int8"})
    refreshed = refresh_card(reg, ref)
    assert "m-int8:1" in refreshed and "none yet" not in refreshed
    with pytest.raises(ValueError, match="written once"):
        reg.write_version_file(ref, "meta.json", "{}")


def _env(**packages: str) -> Environment:
    env = current_environment()
    return env.model_copy(update={"packages": {**env.packages, **packages}})


def test_environment_differences_block_major_versions_only() -> None:
    now = current_environment()
    assert environment_differences(now, now) == ([], [])
    torch_version = now.packages["torch"]
    major = str(int(torch_version.split(".")[0]) + 1) + ".0.0"
    blocking, _ = environment_differences(_env(torch=major), now)
    assert blocking == [f"torch {major} -> {torch_version}"]
    minor_bump = torch_version.split(".")[0] + ".999"
    blocking, minor = environment_differences(_env(torch=minor_bump), now)
    assert blocking == [] and minor == [f"torch {minor_bump} -> {torch_version}"]


def test_lineage_is_stored_and_reproduction_is_checked(tmp_path: Path) -> None:
    reg = ModelRegistry(tmp_path)
    lineage = collect_lineage(data_hash="a" * 64, data_source="tx.csv", rows={"train": 10, "test": 5},
                              seeds={"model": 0}, parameters={"data": "tx.csv", "config": {"lr": 0.1}})
    assert lineage.environment.packages["torch"] and lineage.environment.python and lineage.environment.cpu
    files = lineage_files(lineage, tmp_path)
    original = _register(reg, extra_files=files)
    assert (Path(original.path) / LINEAGE_FILE).exists() and read_lineage(original) == lineage
    plan = plan_reproduction(original)
    assert plan.parameters == {"data": "tx.csv", "config": {"lr": 0.1}}
    check_data_hash(plan, "a" * 64, "tx.csv")
    with pytest.raises(ReproductionError, match="data of m:1 changed: tx.csv now has content hash bbbb"):
        check_data_hash(plan, "b" * 64, "tx.csv")
    # the same weights and metric: within tolerance, identical weights
    again = _register(reg, "m-reproduce", 0.503)
    result = compare_reproduction(original, again, tolerance=0.005, plan=plan)
    assert result.within_tolerance and result.weights_identical and result.diff == pytest.approx(0.003)
    assert not compare_reproduction(original, _register(reg, "m-reproduce", 0.6), tolerance=0.005).within_tolerance
    # a version trained under another major version of torch is refused, naming it
    old = lineage.model_copy(update={"environment": _env(torch="1.13.1")})
    stale = _register(reg, extra_files=lineage_files(old, tmp_path))
    with pytest.raises(ReproductionError, match=r"torch 1\.13\.1 -> "):
        plan_reproduction(stale)
    # another thread count is not blocking, but named with the setting that restores it
    threads = lineage.model_copy(update={"hardware": {"num_threads": 99}})
    minor = plan_reproduction(_register(reg, extra_files=lineage_files(threads, tmp_path))).minor_differences
    assert any(m.startswith("threads 99 -> ") and "INDUSFLOW_TRAIN_NUM_THREADS=99" in m for m in minor)
    with pytest.raises(ReproductionError, match="no lineage"):
        plan_reproduction(_register(reg))


def test_grouped_bootstrap_draws_whole_clusters() -> None:
    """Each row repeated 8 times is no more evidence than the row once: drawn by cluster, the
    repeated data give the interval of the original rows exactly (the same draws, seed for seed),
    where drawn row by row they give an interval about sqrt(8) times too narrow."""
    rng = np.random.default_rng(5)
    y = rng.normal(50, 20, 40)
    a, b = y + rng.normal(0, 8, 40), y + rng.normal(2, 12, 40)
    rep = np.repeat(np.arange(40), 8)
    for metric in ("rmse", "mae"):
        alone = stats.bootstrap_ci(metric, y, a, resamples=400, seed=3)
        grouped = stats.bootstrap_ci(metric, y[rep], a[rep], resamples=400, seed=3, groups=rep)
        by_row = stats.bootstrap_ci(metric, y[rep], a[rep], resamples=400, seed=3)
        assert (grouped.low, grouped.value, grouped.high) == pytest.approx((alone.low, alone.value, alone.high))
        assert (by_row.high - by_row.low) < 0.6 * (grouped.high - grouped.low)
        t_alone = stats.paired_bootstrap(metric, y, a, b, resamples=400, seed=3)
        t_grouped = stats.paired_bootstrap(metric, y[rep], a[rep], b[rep], resamples=400, seed=3, groups=[f"g{i:03d}" for i in rep])
        assert (t_grouped.diff_low, t_grouped.diff_high, t_grouped.p_value) == pytest.approx(
            (t_alone.diff_low, t_alone.diff_high, t_alone.p_value))
    # ranking metrics too: ties of a repeated row keep their summed weight
    labels = (rng.random(60) < 0.3).astype(float)
    scores = labels + rng.normal(0, 0.8, 60)
    rep = np.repeat(np.arange(60), 3)
    alone = stats.bootstrap_ci("pr_auc", labels, scores, resamples=300, seed=1)
    grouped = stats.bootstrap_ci("pr_auc", labels[rep], scores[rep], resamples=300, seed=1, groups=rep)
    assert (grouped.low, grouped.value, grouped.high) == pytest.approx((alone.low, alone.value, alone.high))
    with pytest.raises(ValueError, match="groups have 3 rows"):
        stats.bootstrap_ci("rmse", y, a, groups=[1, 2, 3])
