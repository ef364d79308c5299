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
