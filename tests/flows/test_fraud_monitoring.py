"""After deployment, on tiny synthetic data against the test Prefect API: drift per batch
run, the nightly retrain on the accumulated dataset, and the closed loop (new fraud pattern
-> realised PR-AUC drop -> adapt -> promotion -> recovery)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import yaml

import flows.fraud as F
from infra.deploy_config import DEFAULT_CONFIG
from infra.errors import DataValidationError
from infra.home import home_layout
from infra.registry import ModelRegistry
from solutions.fraud.config import (
    BaselineConfig,
    FraudTrainConfig,
    SequenceModelConfig,
    SplitConfig,
    SyntheticDataConfig,
)
from solutions.fraud.synthetic import generate_transactions
from tasks import monitoring as MON

START = pd.Timestamp("2025-01-01")
#: Reads the account's last transactions; no window features (their delayed terminal-risk
#: part needs labels, which a scoring feed does not carry).
MODEL = SequenceModelConfig(seq_len=8, use_window_features=False, hidden=16, mlp_hidden=32, max_epochs=4, patience=4,
                            batch_size=256, negative_rate=0.5)
#: Days of earlier transactions each daily file carries as the accounts' history.
HISTORY = 4
SPLIT = SplitConfig(train_days=8, val_days=2, delay_days=1, test_days=3)


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home of its own (registry, ledgers, inboxes) and a deployment config copy."""
    monkeypatch.setenv("INDUSFLOW_HOME", str(tmp_path / "home"))
    config = yaml.safe_load(DEFAULT_CONFIG.read_text())
    config["monitoring"]["fraud-monitor"].update(min_labels=50, consecutive_days=3, max_drop=0.3, reference_days=2,
                                                    consecutive_runs=99)
    path = tmp_path / "deployments.yaml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("INDUSFLOW_DEPLOY_CONFIG", str(path))
    return tmp_path


def _day(frame: pd.DataFrame, day: int, history: int = 0) -> pd.DataFrame:
    ts = frame["timestamp"]
    return frame.loc[(ts >= START + pd.Timedelta(days=day - history)) & (ts < START + pd.Timedelta(days=day + 1))]


def _drop_in(frame: pd.DataFrame, name: str) -> Path:
    """A day's transactions into the fraud inbox, as a real feed has them: no label."""
    path = home_layout().inbox("fraud") / f"{name}.parquet"
    frame.drop(columns=["label", "scenario"]).to_parquet(path, index=False)
    return path


def _labels_in(frame: pd.DataFrame, name: str) -> None:
    path = home_layout().inbox("labels") / f"{name}.csv"
    frame[["transaction_id", "label"]].to_csv(path, index=False)


def _train_initial(frame: pd.DataFrame, tmp: Path, name: str = "fraud-seq") -> F.FraudTrainResult:
    path = tmp / "history.parquet"
    frame.to_parquet(path, index=False)
    return F.fraud_train(data=str(path), config=FraudTrainConfig(split=SPLIT, model=MODEL, model_name=name,
                                                                 baseline=BaselineConfig(enabled=False)))


def test_closed_loop_new_pattern_drop_adapt_recovery(home: Path) -> None:
    n_days, pattern_day, first_scored = 23, 16, 14
    data = generate_transactions(n_accounts=400, n_terminals=150, n_days=n_days, seed=11, fraud_rate=0.03,
                                 new_pattern=True, new_pattern_rate=0.06, new_pattern_from=pattern_day / n_days)
    data["transaction_id"] = data["transaction_id"].astype(str)
    initial = _train_initial(data.loc[data["timestamp"] < START + pd.Timedelta(days=first_scored)], home)
    profile = Path(initial.model.path) / MON.PROFILE_FILE
    assert profile.exists() and "amount" in MON.Profile.load(profile).columns
    retrain = {"config": FraudTrainConfig(data=SyntheticDataConfig(), model=MODEL,
                                          split=SplitConfig(train_days=4, val_days=1, delay_days=0, test_days=1)),
               "max_epochs": 4, "fraction": 0.3}
    figures = []
    import time
    t0 = time.perf_counter()
    for day in range(first_scored, n_days):
        _drop_in(_day(data, day, HISTORY), f"day-{day:02d}")
        batch = F.fraud_batch_score(settle_seconds=0)
        if day > first_scored:  # labels arrive one day after scoring
            _labels_in(_day(data, day - 1), f"labels-{day - 1:02d}")
        monitor = F.fraud_monitor(settle_seconds=0, top_k=10, retrain_parameters=retrain)
        perf = {(str(r["day"])[:10], r["model_version"]): r for r in monitor.performance}
        labelled = START + pd.Timedelta(days=day - 1)
        row = next((r for (d, _), r in perf.items() if d == str(labelled.date())), None)
        figures.append({
            "day": day, "scored_with": batch.model, "psi_max": batch.drift.max_psi if batch.drift else math.nan,
            "labelled_day": day - 1, "pr_auc": row["pr_auc"] if row else math.nan,
            "roc_auc": row["roc_auc"] if row else math.nan, "version": row["model_version"] if row else None,
            "decision": monitor.decision.reason[:80], "retrain": monitor.dispatched.how if monitor.dispatched else "",
            "promoted": monitor.retrain_result.promotion.promoted if monitor.retrain_result else None,
            "flagged": sorted(batch.drift.flagged) if batch.drift else None, "t": round(time.perf_counter() - t0, 1),
        })
        print(figures[-1])
    table = pd.DataFrame(figures)
    print(table.to_string())
