"""Online evidence: the score log round-trips (scores per version and role, labels), and the rule
recommends promote / keep / insufficient from the paired test on the transactions both versions
scored, with each version's realised metric and its interval."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from infra.serving.challenger import ScoreLog, ScoreRecord, read_score_log
from tasks.online_evidence import EvidenceRule, collect_evidence, read_labels


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
