"""Online evidence: the score log round-trips (scores per version and role, labels), and the rule
recommends promote / keep / insufficient from the paired test on the transactions both versions
scored, with each version's realised metric and its interval."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from infra.serving.challenger import ScoreLog, ScoreRecord, read_score_log
from solutions.sensor.monitoring import judge_served
from tasks.online_evidence import EvidenceRule, collect_evidence, evidence_markdown, read_labels


def _log(folder: Path, n: int, strength: tuple[float, float], seed: int = 0, labelled: int | None = None) -> None:
    """Champion v1 and challenger v2 scores of n transactions (a label lifts each version's score by
    its strength), and the labels of the first ``labelled`` of them."""
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.15).astype(int)
    ids = [f"tx{i}" for i in range(n)]
    log = ScoreLog(folder, flush_s=0.01)
    for version, role, lift in ((1, "champion", strength[0]), (2, "challenger", strength[1])):
        scores = 1 / (1 + np.exp(-(lift * y + rng.normal(size=n))))
        for a in range(0, n, 97):  # several model calls
            log.record(ScoreRecord(model="m", version=version, role=role, ids=ids[a:a + 97],
                                   scores=scores[a:a + 97].tolist(), decided=[role == "champion"] * len(ids[a:a + 97])))
    k = n if labelled is None else labelled
    log.record_labels("m", ids[:k], y[:k].tolist())
    log.close()


def _evidence(folder: Path, rule: EvidenceRule | None = None, challenger: int | None = 2):
    rows = read_score_log(folder, "m")
    return collect_evidence("m", rows, read_labels(rows), rule or EvidenceRule(), 1, challenger)


def test_the_score_log_round_trips(tmp_path: Path) -> None:
    _log(tmp_path, 300, (0.5, 2.0))
    rows = read_score_log(tmp_path, "m")
    assert sum(r["role"] == "champion" for r in rows) == 300 == sum(r["role"] == "challenger" for r in rows)
    assert len(read_labels(rows)) == 300
    assert all(r["decided"] for r in rows if r["role"] == "champion")
    assert sorted(p.name[:7] for p in (tmp_path / "m").iterdir()) == ["scores-"]


def test_a_better_challenger_is_recommended_with_its_interval(tmp_path: Path) -> None:
    _log(tmp_path, 1500, (0.5, 2.5))
    ev = _evidence(tmp_path)
    assert ev.recommendation == "promote", ev.reason
    assert ev.paired is not None and ev.paired.diff > 0 and ev.paired.p_value < 0.05 and ev.paired.n == 1500
    champion, challenger = ev.versions
    assert (champion.version, champion.roles, challenger.roles) == (1, ["champion"], ["challenger"])
    assert champion.labelled == challenger.labelled == 1500 and champion.decided == 1500 and challenger.decided == 0
    assert challenger.metric.low > champion.metric.high  # far apart here
    assert challenger.metric.low <= challenger.metric.value <= challenger.metric.high


def test_an_equal_or_worse_challenger_is_kept_out(tmp_path: Path) -> None:
    _log(tmp_path, 1500, (2.0, 1.0), seed=1)
    ev = _evidence(tmp_path)
    assert ev.recommendation == "keep" and ev.paired is not None and ev.paired.diff < 0


def test_too_few_labels_is_insufficient_and_no_challenger_is_said(tmp_path: Path) -> None:
    _log(tmp_path, 1500, (0.5, 2.5), labelled=150)
    ev = _evidence(tmp_path)
    assert ev.recommendation == "insufficient" and "150 labelled" in ev.reason and ev.paired is None
    ev = _evidence(tmp_path, EvidenceRule(min_labels=100, min_positives=5))
    assert ev.recommendation in ("promote", "keep") and ev.paired.n == 150
    assert _evidence(tmp_path, challenger=None).recommendation == "no_challenger"


def _rul_log(folder: Path, errors: tuple[float, float], assets: int = 8, per_asset: int = 12,
             seed: int = 0) -> pd.DataFrame:
    """Champion v1 and challenger v2 RULs of ``per_asset`` windows (hourly) of each asset, as the
    sensor API records them (ids = assets, scored_t = window end), plus one grid request without a
    clock; returns the failure events (each asset fails 5 h after its last window)."""
    rng = np.random.default_rng(seed)
    log = ScoreLog(folder, flush_s=0.01)
    t0 = pd.Timestamp("2026-03-01").value / 1e9
    failures = []
    for a in range(assets):
        times = t0 + 3600.0 * np.arange(per_asset)
        true = (per_asset - 1 - np.arange(per_asset)) + 5.0
        failures.append({"asset_id": f"pump-{a}", "failed_at": pd.Timestamp(times[-1] + 5 * 3600, unit="s")})
        for version, role, err in ((1, "champion", errors[0]), (2, "challenger", errors[1])):
            bias = rng.normal(0, err)  # a model is off for one asset as a whole: its windows' errors go together
            for k, t in enumerate(times):
                log.record(ScoreRecord(model="m", version=version, role=role, ids=[f"pump-{a}"],
                                       scores=[float(true[k] + bias + rng.normal(0, 1.0))],
                                       decided=[role == "champion"],
                                       extra={"step": [k], "scored_t": [float(t)]}))
    log.record(ScoreRecord(model="m", version=1, role="champion", ids=["engine-1"], scores=[40.0], decided=[True],
                           extra={"step": [3], "scored_t": [None]}))
    log.close()
    return pd.DataFrame(failures)


def test_sensor_rul_evidence_is_judged_by_failures_and_resamples_whole_assets(tmp_path: Path) -> None:
    failures = _rul_log(tmp_path, (9.0, 2.0))
    rows, truth, subjects = judge_served(read_score_log(tmp_path, "m"), failures, 3600.0)
    assert len(truth) == 8 * 12 and set(subjects.values()) == {f"pump-{a}" for a in range(8)}
    assert truth["pump-0@" + f"{pd.Timestamp('2026-03-01').value / 1e9:.0f}"] == 16.0  # 11 windows + 5 h
    assert not [r for r in rows if r["id"].startswith("engine-")]  # a grid request has no clock
    capped = judge_served(read_score_log(tmp_path, "m"), failures, 3600.0, rul_cap=10.0)[1]
    assert max(capped.values()) == 10.0
    rule = EvidenceRule(metric="rmse", min_labels=30, min_subjects=5)
    ev = collect_evidence("m", rows, truth, rule, 1, 2, groups=subjects, noun="predictions")
    assert ev.recommendation == "promote", ev.reason  # lower error is better
    assert ev.paired.diff < 0 and ev.paired.p_value < 0.05 and ev.paired.n == 96
    v1, v2 = ev.versions
    assert v1.subjects == v2.subjects == 8 and v2.metric.high < v1.metric.low
    # by whole assets the interval is wider than row by row (12 windows of an asset are not 12 cases)
    by_row = collect_evidence("m", rows, truth, rule, 1, 2, noun="predictions")
    assert (by_row.paired.diff_high - by_row.paired.diff_low) < (ev.paired.diff_high - ev.paired.diff_low)
    # a worse challenger is kept out; too few failed assets is insufficient
    assert collect_evidence("m", rows, truth, rule, 2, 1, groups=subjects).recommendation == "keep"
    few = EvidenceRule(metric="rmse", min_labels=30, min_subjects=9)
    short = collect_evidence("m", rows, truth, few, 1, 2, groups=subjects, noun="predictions", subject="assets")
    assert short.recommendation == "insufficient" and "96 labelled predictions" in short.reason
    assert "8 assets; the rule needs 30 and 9 assets" in short.reason
    assert "| subjects |" in evidence_markdown(ev)


# ------------------------------------------------------------------------------------
# evidence you can defend: who sent the labels, and when


def _served_pair(folder: Path, n: int = 3000, seed: int = 1) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Champion v1 (good) and challenger v2 (no skill) scores of n transactions; returns the ids and
    both versions' scores."""
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.1).astype(int)
    ids = [f"tx{i}" for i in range(n)]
    champion = 1 / (1 + np.exp(-(3.0 * y + rng.normal(size=n))))
    challenger = rng.random(n)
    log = ScoreLog(folder, flush_s=0.01)
    for version, role, scores in ((1, "champion", champion), (2, "challenger", challenger)):
        log.record(ScoreRecord(model="m", version=version, role=role, ids=ids, scores=scores.tolist(),
                               decided=[role == "champion"] * n))
    log.close()
    return ids, champion, challenger


def _registry(tmp_path: Path):
    import torch

    from infra.registry import ModelRegistry

    registry = ModelRegistry(tmp_path / "registry")
    for value in (0.5, 0.4):
        ref = registry.register("m", {"w": torch.zeros(1)}, params={}, metrics={"auc": value}, primary_metric="auc")
        if value == 0.5:
            registry.promote(ref)
    registry.set_alias("m", "challenger", 2)
    return registry


def test_labels_steered_by_one_key_do_not_recommend_the_worse_challenger(tmp_path: Path) -> None:
    """The review's attack: a fraud:label key labels the champion's 20 lowest scores as fraud (and
    280 others as genuine); the challenger then looks better. The labels all come from one key:
    no recommendation."""
    from tasks.online_evidence import online_evidence

    scores = tmp_path / "scores"
    ids, champion, challenger = _served_pair(scores)
    steer = np.argsort(champion - challenger)  # lowest champion and highest challenger scores first
    fraud, genuine = steer[:20], steer[-280:]
    log = ScoreLog(scores, flush_s=0.01)
    log.record_labels("m", [ids[i] for i in [*fraud, *genuine]], [1] * 20 + [0] * 280, source="k-attacker")
    log.close()
    rule = EvidenceRule(min_labels=200, min_positives=10)
    ev = online_evidence("m", rule, registry=_registry(tmp_path), scores_dir=scores)
    assert ev.recommendation == "insufficient", ev.reason
    assert "one label source (k-attacker) sent 300 of the 300 judged labels" in ev.reason
    assert ev.label_sources == {"k-attacker": 300}
    assert "| k-attacker | 300 | 100% |" in evidence_markdown(ev)
    blind = online_evidence("m", rule.model_copy(update={"max_source_share": 1.0}), registry=_registry(tmp_path / "b"),
                            scores_dir=scores)
    assert blind.recommendation == "promote", blind.reason  # what the steering achieved before sources counted
    # the same labels from the monitor's label file and a second key: the comparison is made, and shows through
    honest = ScoreLog(scores, flush_s=0.01)
    honest.record_labels("m", [ids[i] for i in steer[20:320]], [0] * 300, source="k-chargebacks")
    honest.close()
    both = online_evidence("m", rule, registry=_registry(tmp_path / "again"), scores_dir=scores)
    assert both.label_sources == {"k-attacker": 300, "k-chargebacks": 300}


def test_labels_arriving_far_faster_than_scores_do_not_recommend(tmp_path: Path) -> None:
    """Scores spread over an hour, labels from two keys all within a second: a burst."""
    from tasks.online_evidence import collect_evidence, label_provenance

    rng = np.random.default_rng(3)
    n = 1200
    y = (rng.random(n) < 0.15).astype(int)
    start = pd.Timestamp("2026-12-01T10:00:00+00:00")
    rows = []
    for i in range(n):
        at = (start + pd.Timedelta(seconds=3 * i)).isoformat()
        rows.append({"at": at, "version": 1, "role": "champion", "id": f"t{i}", "score": float(rng.random()),
                     "decided": True})
        rows.append({"at": at, "version": 2, "role": "challenger", "id": f"t{i}",
                     "score": float(y[i] + rng.normal(scale=0.3)), "decided": False})
    burst = (start + pd.Timedelta(hours=1, minutes=1)).isoformat()
    rows += [{"at": burst, "version": 0, "role": "label", "id": f"t{i}", "score": float(y[i]), "decided": False,
              "source": "k-a" if i % 2 else "k-b"} for i in range(n)]
    ev = collect_evidence("m", rows, read_labels(rows), EvidenceRule(), 1, 2, provenance=label_provenance(rows))
    assert ev.recommendation == "insufficient" and "times faster than the transactions were scored" in ev.reason
    relaxed = collect_evidence("m", rows, read_labels(rows), EvidenceRule(max_label_rate_ratio=1000), 1, 2,
                               provenance=label_provenance(rows))
    assert relaxed.recommendation == "promote", relaxed.reason


def test_scoring_an_id_again_does_not_rewrite_its_evidence(tmp_path: Path) -> None:
    """A fraud:score key sends a known transaction id again (under another account): the first
    served score of that id stays the one judged."""
    _log(tmp_path, 1500, (0.5, 2.5))
    before = _evidence(tmp_path)
    rows = read_score_log(tmp_path, "m")
    labels = read_labels(rows)
    frauds = [i for i, v in labels.items() if v == 1]
    log = ScoreLog(tmp_path, flush_s=0.01)  # the champion re-scores every fraud at 0.99: it would look perfect
    log.record(ScoreRecord(model="m", version=1, role="champion", ids=frauds, scores=[0.99] * len(frauds),
                           decided=[True] * len(frauds)))
    log.close()
    after = _evidence(tmp_path)
    assert after.versions[0].metric == before.versions[0].metric and after.recommendation == "promote"
