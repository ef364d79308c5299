"""The fraud flows end to end on tiny synthetic data, against a real (test) Prefect API."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

import flows.fraud as F
import flows.fraud.train as fraud_train_module
from flows.fraud.cli import main
from infra.errors import DataValidationError
from infra.registry import ModelRegistry
from solutions.fraud.config import FraudTrainConfig, SequenceModelConfig, SyntheticDataConfig
from solutions.fraud.synthetic import generate_transactions
from tasks.train import train_model
from tests.flows.run_states import latest_flow_run_id, task_states

TINY = ["--n-accounts", "300", "--n-terminals", "150", "--n-days", "40", "--max-epochs", "2", "--seq-len", "8"]


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_train_cli_json_registers_and_reuses_prepared_data(capsys: pytest.CaptureFixture) -> None:
    assert main(["train", *TINY, "--json", "--model", "fraud-cli"]) == 0
    result = _last_json(capsys.readouterr().out)
    assert result["model"]["name"] == "fraud-cli" and result["model"]["version"] == 1
    assert result["promotion"]["promoted"] is True
    for key in ("sequence", "baseline"):
        report = result[key]
        assert 0.0 <= report["pr_auc"] <= 1.0 and report["n"] == result["rows"]["test"]
    assert result["winner"] in {"sequence", "baseline", "ensemble"}
    assert Path(result["report_dir"], "report.md").exists()
    assert Path(result["sequence"]["roc_png"]).exists()
    # unchanged inputs: the validated table, the features and the training are reused
    assert main(["train", *TINY, "--json", "--model", "fraud-cli"]) == 0
    again = _last_json(capsys.readouterr().out)
    # Prefect's cache skips the deterministic loaders and the training of the same run key (the UI shows them Cached)
    loaders = ("generate-transactions", "load-table", "prepare-features", "train-model")
    states = task_states(latest_flow_run_id("fraud-train"), loaders)
    assert [states.get(name) for name in loaders] == ["Cached"] * len(loaders), states
    assert again["train"]["reused_completed"] is True
    assert again["dataset"]["content_hash"] == result["dataset"]["content_hash"]
    # the same weights do not beat themselves: the champion stays at v1
    assert again["model"]["version"] == 2 and again["promotion"]["promoted"] is False
    # each decision is its own artifact: both metrics and the reason
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["fraud-cli-promotion"])))
    texts = sorted(str(a.data) for a in arts)
    assert len(texts) == 2
    latest = next(t for t in texts if "v2: not promoted" in t)
    assert "| candidate | 2 |" in latest and "| champion before | 1 |" in latest and "Reason:" in latest


def test_interrupted_training_flow_resumes(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning.pytorch.callbacks import Callback

    class Crash(Callback):
        def on_train_epoch_start(self, trainer, pl_module) -> None:
            if trainer.current_epoch == 2:
                raise RuntimeError("simulated crash at epoch 2")

    config = FraudTrainConfig(
        data=SyntheticDataConfig(n_accounts=300, n_terminals=150, n_days=40, seed=5),
        model=SequenceModelConfig(seq_len=8, max_epochs=4, patience=10),
        model_name="fraud-resume",
    )
    real = fraud_train_module.train_model_task

    def crashing(module, datamodule, spec, callbacks=()):
        return train_model(module, datamodule, spec, callbacks=[*callbacks, Crash()])

    monkeypatch.setattr(fraud_train_module, "train_model_task", crashing)
    with pytest.raises(RuntimeError, match="simulated crash"):
        F.fraud_train(config=config)
    monkeypatch.setattr(fraud_train_module, "train_model_task", real)
    result = F.fraud_train(config=config)
    assert result.train.resumed_from_epoch == 2
    assert result.train.epochs_trained_now == [2, 3]
    assert result.train.epochs_completed == 4


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.drop(columns=["amount"]), "missing required column"),
        (lambda d: d.assign(amount=d["amount"].astype(object).where(d.index != 5, "12,50 EUR")), "non-numeric"),
        (lambda d: d.assign(timestamp=d["timestamp"].astype(str).where(d.index != 3, "31/02/2025 25:00")), "unparseable"),
        (lambda d: d.assign(label=0), "all one class"),
        (lambda d: d.iloc[0:0], "rows"),
    ],
)
def test_bad_input_fails_clearly_and_registers_nothing(tmp_path: Path, mutate, message) -> None:
    frame = generate_transactions(n_accounts=50, n_terminals=30, n_days=30, seed=3)
    path = tmp_path / "bad.csv"
    mutate(frame).to_csv(path, index=False)
    registry = ModelRegistry()
    before = len(registry.versions("fraud-bad"))
    with pytest.raises(DataValidationError, match=message) as info:
        F.fraud_train(data=str(path), config=FraudTrainConfig(model_name="fraud-bad"))
    assert str(path) in str(info.value)
    assert len(registry.versions("fraud-bad")) == before == 0


def test_column_mapping_of_a_real_format_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """ULB/Worldline handbook column names, mapped on the command line."""
    frame = generate_transactions(n_accounts=300, n_terminals=150, n_days=40, seed=7)
    real = frame.rename(
        columns={
            "transaction_id": "TRANSACTION_ID",
            "account_id": "CUSTOMER_ID",
            "terminal_id": "TERMINAL_ID",
            "timestamp": "TX_DATETIME",
            "amount": "TX_AMOUNT",
            "label": "TX_FRAUD",
        }
    )[["TRANSACTION_ID", "TX_DATETIME", "CUSTOMER_ID", "TERMINAL_ID", "TX_AMOUNT", "TX_FRAUD"]]
    path = tmp_path / "handbook.csv"
    real.to_csv(path, index=False)
    mapping = "transaction_id=TRANSACTION_ID,account_id=CUSTOMER_ID,terminal_id=TERMINAL_ID,timestamp=TX_DATETIME,amount=TX_AMOUNT,label=TX_FRAUD"
    code = main(["train", "--data", str(path), "--columns", mapping, "--max-epochs", "1", "--seq-len", "8", "--model", "fraud-handbook", "--json"])
    assert code == 0
    result = _last_json(capsys.readouterr().out)
    assert result["dataset"]["n_rows"] == len(real)
    assert result["sequence"]["n"] > 0


def test_adapt_then_score(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # adapt fine-tunes a sequence model: the parent is trained without the GBM candidate
    assert main(["train", *TINY, "--no-baseline", "--model", "fraud-ad", "--json"]) == 0
    trained = _last_json(capsys.readouterr().out)
    code = main(
        ["adapt", "--model", "fraud-ad", "--n-accounts", "300", "--n-terminals", "150", "--n-days", "40",
         "--max-epochs", "2", "--json"]
    )
    assert code == 0
    adapted = _last_json(capsys.readouterr().out)
    assert adapted["parent"] == "fraud-ad:1"
    assert adapted["freeze"]["trainable_fraction"] <= 0.10
    assert adapted["model"]["parent"] == "fraud-ad:1" and adapted["model"]["version"] == 2
    assert adapted["pattern_before"] is not None and adapted["old_before"]["n"] == trained["rows"]["test"]
    # batch scoring of an unlabelled file with the champion
    frame = generate_transactions(n_accounts=100, n_terminals=150, n_days=10, seed=11).drop(columns=["label", "scenario"])
    src = tmp_path / "new transactions.csv"
    frame.to_csv(src, index=False)
    out = tmp_path / "scores.parquet"
    assert main(["score", "--data", str(src), "--model", "fraud-ad", "--output", str(out), "--csv", "--json"]) == 0
    scored = _last_json(capsys.readouterr().out)
    table = pd.read_parquet(out)
    assert scored["rows_scored"] == len(frame) == len(table)
    assert set(table["model_version"]) == {int(scored["model"].split(":")[1])}
    assert table["score"].between(0, 1).all()
    assert Path(scored["csv_output"]).exists()
