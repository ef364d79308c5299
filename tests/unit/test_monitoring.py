"""Profiles, drift (PSI, KS), realised metrics, the retrain rule and the accumulated dataset,
as plain functions (no Prefect)."""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from infra.deploy_config import MonitoringSpec
from infra.errors import DataValidationError
from solutions.fraud import monitoring as FM
from solutions.fraud.synthetic import generate_transactions
from tasks import accumulate as A
from tasks import monitoring as MON

SPEC = MonitoringSpec()


@pytest.fixture(scope="module")
def transactions() -> pd.DataFrame:
    return generate_transactions(n_accounts=400, n_terminals=150, n_days=20, seed=3)


def _period(frame: pd.DataFrame, first: int, last: int) -> pd.DataFrame:
    day = (frame["timestamp"].dt.normalize() - pd.Timestamp("2025-01-01")).dt.days
    return frame.loc[(day >= first) & (day < last)]


def test_fraud_unchanged_inputs_stay_below_the_thresholds_and_a_shifted_feature_is_named(transactions) -> None:
    rng = np.random.default_rng(0)
    profile = MON.build_profile(FM.monitored_features(_period(transactions, 0, 14)), rng.beta(1, 20, 5000))
    assert set(profile.columns) >= {"amount", "hour", "channel", "category", "age", MON.SCORE}
    # no raw rows: the profile is a few bins and quantiles per column, whatever the table size
    assert len(profile.model_dump_json()) < 20_000 and profile.columns["amount"].shares
    later = _period(transactions, 14, 20)
    same = MON.compare(profile, FM.monitored_features(later), rng.beta(1, 20, len(later)), SPEC)
    assert not [r.feature for r in same if r.flagged], same
    assert max(r.psi for r in same) < SPEC.psi
    # the feed starts sending amounts in cents: amount drifts, and only amount
    cents = FM.monitored_features(later.assign(amount=later["amount"] * 100))
    rows = {r.feature: r for r in MON.compare(profile, cents, rng.beta(1, 20, len(later)), SPEC)}
    assert [name for name, r in rows.items() if r.flagged] == ["amount"]
    assert rows["amount"].psi > 1 and rows["amount"].ks > 0.9 and "PSI" in rows["amount"].reason
    # a new channel mix and a score shift are flagged too, by name
    online = FM.monitored_features(later.assign(channel="online"))
    flagged = {r.feature for r in MON.compare(profile, online, rng.beta(5, 5, len(later)), SPEC) if r.flagged}
    assert flagged == {"channel", MON.SCORE}


def test_psi_and_ks_basics(tmp_path: Path) -> None:
    assert MON.psi([0.5, 0.5], [0.5, 0.5]) == 0
    assert MON.psi([0.5, 0.5], [0.9, 0.1]) > 0.25
    q = np.quantile(np.arange(1000.0), np.linspace(0, 1, 21))
    assert MON.ks_distance(q, np.arange(1000.0)) < 0.03
    assert MON.ks_distance(q, np.arange(1000.0) + 2000) == 1.0
    profile = MON.build_profile(pd.DataFrame({"x": [1.0, 2.0, np.nan, 4.0], "c": ["a", "b", "a", None]}))
    assert profile.columns["x"].missing_share == 0.25 and profile.columns["c"].categories == {"a": 2 / 3, "b": 1 / 3}
    assert MON.Profile.load(profile.save(tmp_path / "p.json")) == profile
    # a column that vanished from the feed: missing share 1, flagged
    row = MON.compare(profile, pd.DataFrame({"c": ["a"] * 40}), None, SPEC)[0]
    assert row.feature == "x" and row.flagged and "missing" in row.reason
    # a handful of values is recorded, not judged
    few = MON.compare(profile, pd.DataFrame({"x": [100.0] * 5, "c": ["z"] * 5}), None, SPEC)
    assert not any(r.flagged for r in few) and "too few" in few[0].reason


def test_realised_metrics_per_day_and_version() -> None:
    rng = np.random.default_rng(1)
    n = 400
    y = (rng.random(n) < 0.1).astype(int)
    good = np.where(y == 1, rng.uniform(0.5, 1, n), rng.uniform(0, 0.6, n))
    scores = pd.DataFrame({
        "transaction_id": [str(i) for i in range(n)], "account_id": [str(i % 50) for i in range(n)],
        "timestamp": pd.Timestamp("2025-01-01") + pd.to_timedelta(np.arange(n) // 200, unit="D"),
        "score": np.where(np.arange(n) < 200, good, rng.random(n)), "model": "m",
        "model_version": np.where(np.arange(n) < 200, 1, 2),
    })
    labels = pd.DataFrame({"transaction_id": scores["transaction_id"].iloc[:350], "label": y[:350]})
    joined = FM.join_labels(scores, labels)
    table = FM.realised_performance(joined, fpr=0.05, k=10)
    assert list(table["model_version"]) == [1, 2] and list(table["labelled"]) == [200, 150]
    first, second = table.iloc[0], table.iloc[1]
    assert first["pr_auc"] > 0.6 and first["roc_auc"] > 0.9 and first["recall_at_fpr"] > 0.5
    assert second["roc_auc"] < 0.75 and 0 <= second["card_precision_at_k"] <= 1
    assert FM.pooled_metric(joined, 1, [pd.Timestamp("2025-01-01")]) == pytest.approx(first["pr_auc"])
    # a later label for the same transaction wins
    relabelled = pd.concat([labels, pd.DataFrame({"transaction_id": ["0"], "label": [1 - y[0]]})])
    assert FM.latest_labels(relabelled).set_index("transaction_id").loc["0", "label"] == 1 - y[0]


def test_retrain_rule() -> None:
    spec = MonitoringSpec(max_drop=0.3, consecutive_days=2, consecutive_runs=3)
    ok = MON.retrain_decision("m:1", 0.5, 0.45, [False, True], spec, already=False)
    assert not ok.trigger and ok.gate == pytest.approx(0.35)
    low = MON.retrain_decision("m:1", 0.5, 0.2, [], spec, already=False)
    assert low.trigger and "below the gate 0.3500" in low.reason
    drifted = MON.retrain_decision("m:1", None, None, [False, True, True, True], spec, already=False)
    assert drifted.trigger and "3 drifted batch run(s)" in drifted.reason and drifted.gate is None
    assert not MON.retrain_decision("m:1", 0.5, 0.2, [], spec, already=True).trigger
    floor = MonitoringSpec(min_metric=0.4, max_drop=None)
    assert MON.retrain_decision("m:1", None, 0.3, [], floor, already=False).trigger
    # errors (RUL RMSE): lower is better, the gate is above the reference
    assert MON.retrain_decision("m:1", 10.0, 16.0, [], spec, already=False, higher_is_better=False).trigger
    assert math.isclose(MON.metric_gate(10.0, spec, higher_is_better=False), 13.0)


def test_accumulated_partitions_upsert_and_window(tmp_path: Path, transactions: pd.DataFrame) -> None:
    root = tmp_path / "acc"
    with pytest.raises(DataValidationError, match="holds nothing yet"):
        A.read_window(root, 5)
    rows = _period(transactions, 0, 6).drop(columns=["label"]).assign(transaction_id=lambda d: d["transaction_id"].astype(str))
    written = A.upsert_rows(root, FM.apply_labels(rows, pd.DataFrame()), time_column="timestamp", key="transaction_id")
    assert len(written) == 6 and A.days(root)[0] == dt.date(2025, 1, 1)
    assert A.upsert_rows(root, rows.iloc[:10], time_column="timestamp", key="transaction_id") == [dt.date(2025, 1, 1)]
    assert len(A.read_window(root)) == len(rows)  # the same keys again: replaced, not duplicated
    with pytest.raises(DataValidationError, match="holds 6 day"):
        A.read_window(root, 10, min_days=10)
    labels = pd.DataFrame({"transaction_id": rows["transaction_id"].iloc[:5], "label": [1, 0, 0, 0, 0]})
    A.update_days(root, [dt.date(2025, 1, 1)], lambda part: FM.apply_labels(part, labels))
    acc = A.read_window(root, 3)
    assert acc["timestamp"].dt.date.min() == dt.date(2025, 1, 4)
    full = A.read_window(root)
    assert full["label"].notna().sum() == 5
    train = FM.training_rows(full)  # up to the last day with a label; no report = legit
    assert train["timestamp"].max() < pd.Timestamp("2025-01-02") and train["label"].sum() == 1


def test_labels_are_one_schema_for_label_files_and_online_feedback() -> None:
    """A label that became known after scoring is one concept: the monitor's files and the server's
    feedback share one definition; the feedback only adds where the transaction sat."""
    from solutions.fraud import schema as S

    files, feedback = S.labels_schema(), S.labels_schema(placed=True)
    assert files.name == feedback.name == "fraud-labels"
    by_name = {c.name: c for c in feedback.columns}
    assert all(by_name[c.name] == c for c in files.columns)  # the same columns, the same kinds
    assert {c.name for c in feedback.columns if c.required} - {c.name for c in files.columns} == {
        S.TERMINAL_ID, S.TIMESTAMP}
    root = Path(__file__).resolve().parents[2]
    defined = [p for p in (root / "solutions").rglob("*.py") if 'name="fraud-labels"' in p.read_text()]
    assert [p.relative_to(root).as_posix() for p in defined] == ["solutions/fraud/schema.py"]
