"""After deployment, on tiny synthetic data against the test Prefect API: drift per batch
run, the nightly retrain on the accumulated dataset, and the closed loop (new fraud pattern
-> realised PR-AUC drop -> adapt -> promotion -> recovery)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import yaml
from prefect import flow

import flows.fraud as F
from infra.deploy import declared_parameters
from infra.deploy_config import DEFAULT_CONFIG
from infra.errors import DataValidationError
from infra.home import home_layout
from solutions.fraud.config import (
    BaselineConfig,
    FraudTrainConfig,
    SequenceModelConfig,
    SplitConfig,
)
from solutions.fraud.synthetic import generate_transactions
from tasks import monitoring as MON
from tasks.dispatch import dispatch
from tests.flows.run_states import forget_deployments

START = pd.Timestamp("2025-01-01")
#: Reads the account's last transactions; no window features (their delayed terminal-risk
#: part needs labels, which a scoring feed does not carry).
MODEL = SequenceModelConfig(seq_len=8, use_window_features=False, hidden=32, mlp_hidden=32, max_epochs=6, patience=6,
                            batch_size=256, negative_rate=0.5)
#: Days of earlier transactions each daily file carries as the accounts' history.
HISTORY = 4
SPLIT = SplitConfig(train_days=8, val_days=2, delay_days=1, test_days=3)


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home of its own (registry, ledgers, inboxes) and a deployment config copy."""
    monkeypatch.setenv("INDUSFLOW_HOME", str(tmp_path / "home"))
    config = yaml.safe_load(DEFAULT_CONFIG.read_text())
    # small daily samples: judge pooled windows (2 reference days, the last 4 days)
    # (score PSI hovers near its threshold on some days of this small feed: a drift streak is
    # not what this test is about)
    config["monitoring"]["fraud-monitor"].update(consecutive_days=4, reference_days=2, consecutive_runs=50)
    path = tmp_path / "deployments.yaml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("INDUSFLOW_DEPLOY_CONFIG", str(path))
    forget_deployments("fraud-adapt/on-drift-adapt")  # another test may have registered it (no worker here)
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


def test_closed_loop_new_pattern_drop_adapt_recovery_then_nightly_retrain_on_accumulated_data(home: Path) -> None:
    """Days 0-13 train v1. From day 14 each day's transactions are batch-scored (with four
    days of history in the file), yesterday's labels arrive and the monitor runs. A new
    fraud pattern starts on day 16; the monitor sees the champion's realised recall at 5% FPR
    fall below its gate, starts fraud-adapt on the accumulated data, the champion rule promotes
    the adapted version, and its realised PR-AUC on the following days is higher."""
    n_days, pattern_day, first_scored = 24, 16, 14
    data = generate_transactions(n_accounts=500, n_terminals=150, n_days=n_days, seed=11, fraud_rate=0.04,
                                 new_pattern=True, new_pattern_rate=0.06, new_pattern_from=pattern_day / n_days)
    data["transaction_id"] = data["transaction_id"].astype(str)
    nightly = declared_parameters("fraud-train", "nightly-retrain")
    assert nightly == {"source": "accumulated"}
    nightly_config = FraudTrainConfig(split=SplitConfig(train_days=5, val_days=1, delay_days=1, test_days=2),
                                      model=MODEL.model_copy(update={"max_epochs": 2}),
                                      baseline=BaselineConfig(enabled=False))
    with pytest.raises(DataValidationError, match="accumulated dataset holds nothing yet"):
        F.fraud_train(**nightly, config=nightly_config)  # before anything accumulated: a clear error

    initial = _train_initial(data.loc[data["timestamp"] < START + pd.Timedelta(days=first_scored)], home)
    profile = Path(initial.model.path) / MON.PROFILE_FILE
    assert profile.exists() and "amount" in MON.Profile.load(profile).columns
    retrain = {"config": FraudTrainConfig(model=MODEL, split=SplitConfig(train_days=4, val_days=1, delay_days=0,
                                                                         test_days=1)),
               "max_epochs": 10, "fraction": 1.0}  # the amounts reach the head only through the GRU
    figures = []
    for day in range(first_scored, n_days):
        _drop_in(_day(data, day, HISTORY), f"day-{day:02d}")
        batch = F.fraud_batch_score(settle_seconds=0)
        if day > first_scored:  # labels arrive one day after scoring
            _labels_in(_day(data, day - 1), f"labels-{day - 1:02d}")
        monitor = F.fraud_monitor(settle_seconds=0, top_k=10, fpr_target=0.05, retrain_parameters=retrain)
        labelled = str((START + pd.Timedelta(days=day - 1)).date())
        row = next((r for r in monitor.performance if str(r["day"])[:10] == labelled), {})
        figures.append({
            "day": day, "scored_with": batch.model, "drifted": sorted(batch.drift.flagged),
            "max_psi": round(batch.drift.max_psi, 3), "labels_of_day": day - 1, "version": row.get("model_version"),
            "pr_auc": row.get("pr_auc", math.nan), "roc_auc": row.get("roc_auc", math.nan),
            "recall@5%fpr": row.get("recall_at_fpr", math.nan), "cp@10": row.get("card_precision_at_k", math.nan),
            "retrain": monitor.dispatched.how if monitor.dispatched else "",
            "promoted": monitor.retrain_result.promotion.promoted if monitor.retrain_result else "",
        })
        if monitor.dispatched:
            adapt = monitor.retrain_result
            print(f"day {day}: {monitor.decision.reason}\n  fraud-adapt {adapt.parent} -> {adapt.model.spec}: "
                  f"{adapt.promotion.reason}")
    _labels_in(_day(data, n_days - 1), f"labels-{n_days - 1:02d}")  # the last day's labels arrive
    last = F.fraud_monitor(settle_seconds=0, top_k=10, fpr_target=0.05, retrain_parameters=retrain)
    row = next(r for r in last.performance if str(r["day"])[:10] == str((START + pd.Timedelta(days=n_days - 1)).date()))
    figures.append({"day": n_days, "scored_with": "", "drifted": [], "max_psi": math.nan, "labels_of_day": n_days - 1,
                    "version": row["model_version"], "pr_auc": row["pr_auc"], "roc_auc": row["roc_auc"],
                    "recall@5%fpr": row["recall_at_fpr"], "cp@10": row["card_precision_at_k"], "retrain": "",
                    "promoted": ""})
    table = pd.DataFrame(figures).set_index("day")
    with pd.option_context("display.width", 250, "display.precision", 3, "display.max_columns", 20):
        print(table.to_string())
    # no input feature drifts (the pattern hides in ordinary amounts; the scores may move)
    assert all(set(flagged) <= {MON.SCORE} for flagged in table["drifted"]), table
    triggered = table.index[table["retrain"] != ""].tolist()
    assert len(triggered) == 1 and triggered[0] > pattern_day + 1, table  # after the pattern, once
    assert table.loc[triggered[0], "promoted"] is True
    after = table.loc[table["scored_with"] == "fraud-seq:2"]
    assert len(after) >= 1 and (after.index > triggered[0]).all()
    v1_pattern_days = table.loc[(table["labels_of_day"] >= pattern_day) & (table["version"] == 1), "pr_auc"]
    v2_days = table.loc[table["version"] == 2, "pr_auc"]
    assert len(v2_days) >= 1 and v2_days.mean() > v1_pattern_days.mean() + 0.1, table  # recovery
    # the monitoring plot and report of the last run
    assert Path(last.report_dir, "realised_pr_auc.png").exists()
    assert "| v2 |" in Path(last.report_dir, "report.md").read_text()
    # ... with the batch runs' drift plotted over the runs (one batch run per scored day)
    assert last.drift is not None and last.drift.runs >= 3 and Path(last.drift.plot).exists()
    assert "drift: latest run" in Path(last.report_dir, "report.md").read_text()

    # a feed that switches to cents: flagged by name, an event, the run tagged (still Completed)
    cents = _day(data, n_days - 1, HISTORY)
    _drop_in(cents.assign(amount=cents["amount"] * 100), "cents")
    drifted = F.fraud_batch_score(settle_seconds=0)
    assert "amount" in drifted.drift.flagged and drifted.drift.event_emitted
    assert drifted.drift.streak == 1

    # the nightly retrain with its deployment's parameters trains on the accumulated data
    result = F.fraud_train(**nightly, config=nightly_config)
    assert "fraud-accumulated" in result.dataset.source
    accumulated = pd.read_parquet(result.dataset.path)
    assert accumulated["transaction_id"].isin(data["transaction_id"]).all()
    assert accumulated["timestamp"].min() >= START + pd.Timedelta(days=first_scored - HISTORY)
    assert result.model.version == 3 and (Path(result.model.path) / MON.PROFILE_FILE).exists()


@flow(name="dispatch-probe")
def dispatch_probe(x: int = 0) -> int:
    """A flow to dispatch."""
    return x + 1


def test_dispatch_runs_the_registered_deployment_else_the_flow_in_process() -> None:
    from prefect.client.orchestration import get_client

    with pytest.raises(LookupError, match="not registered"):
        dispatch("dispatch-probe/on-demand", {"x": 1})
    direct = dispatch("dispatch-probe/on-demand", {"x": 1}, fallback=dispatch_probe)
    assert direct.how == "direct" and direct.result == 2 and direct.flow_run_id is None
    dispatch_probe.to_deployment(name="on-demand").apply()
    started = dispatch("dispatch-probe/on-demand", {"x": 5}, fallback=dispatch_probe)
    assert started.how == "deployment" and started.result is None
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(started.flow_run_id)
    assert run.parameters == {"x": 5} and run.state is not None and run.state.is_scheduled()
