"""Inbox batch scoring: the processed-files ledger, quarantine, and the Dask fan-out."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

import flows.fraud as F
from flows.fraud.cli import main
from infra.home import home_layout
from infra.registry import ModelRegistry
from infra.runners import make_task_runner
from solutions.fraud.synthetic import generate_transactions
from tasks.ledger import FileLedger

TINY = ["--n-accounts", "300", "--n-terminals", "150", "--n-days", "40", "--max-epochs", "1", "--seq-len", "8",
        "--no-baseline"]
MODEL = "fraud-inbox"


@pytest.fixture(scope="module")
def champion() -> str:
    assert main(["train", *TINY, "--model", MODEL]) == 0
    return ModelRegistry().resolve(MODEL).spec


def _transactions(seed: int, days: int = 6) -> pd.DataFrame:
    df = generate_transactions(n_accounts=80, n_terminals=40, n_days=days, seed=seed)
    return df.drop(columns=["is_fraud", "scenario"], errors="ignore")


def test_same_file_twice_is_scored_once_and_bad_files_are_quarantined(tmp_path: Path, champion: str, capsys) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    good = _transactions(seed=11)
    good.to_csv(inbox / "day1.csv", index=False)
    shutil.copy(inbox / "day1.csv", inbox / "day1-copy.csv")  # the same content dropped twice
    good.head(500).to_parquet(inbox / "day2.parquet", index=False)
    (inbox / "broken.parquet").write_bytes(b"PAR1 this is not really parquet")
    good.drop(columns=["amount"]).to_csv(inbox / "no-amount.csv", index=False)
    (inbox / ".hidden.csv").write_text("ignored")
    (inbox / "notes.txt").write_text("not a table")

    assert main(["batch", "--inbox", str(inbox), "--model", MODEL, "--settle-seconds", "0", "--json"]) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert first["model"] == champion
    assert first["new_files"] == 4  # day1 (its copy is a duplicate), day2, broken, no-amount
    assert first["scored"] == 2 and first["quarantined"] == 2 and first["failed"] == 0
    assert first["rows"] == len(good) + 500
    reasons = {Path(k).name: v for k, v in first["quarantine"].items()}
    assert set(reasons) == {"broken.parquet", "no-amount.csv"}
    assert "amount" in reasons["no-amount.csv"]
    # outputs carry the model version used
    out = pd.read_parquet(first["outputs"][0])
    assert set(out["model_version"]) == {int(champion.split(":")[1])} and out["score"].between(0, 1).all()
    # quarantine keeps a copy and the reason
    qdir = home_layout().quarantine("fraud-batch-score")
    assert any(p.name.endswith("broken.parquet") for p in qdir.iterdir())
    assert any(p.name.endswith("no-amount.csv.reason.json") for p in qdir.iterdir())

    # the same files again (and one more copy under a new name): nothing is scored twice
    shutil.copy(inbox / "day2.parquet", inbox / "day2-again.parquet")
    assert main(["batch", "--inbox", str(inbox), "--model", MODEL, "--settle-seconds", "0", "--json"]) == 0
    second = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert second["new_files"] == 0 and second["scored"] == 0 and second["quarantined"] == 0
    assert second["seen_before"] == 6

    # a fixed file (new content) is scored; the ledger has one line per outcome
    good.head(300).to_csv(inbox / "no-amount.csv", index=False)
    assert main(["batch", "--inbox", str(inbox / "*.csv"), "--model", MODEL, "--settle-seconds", "0", "--json"]) == 0
    third = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert third["scored"] == 1 and third["rows"] == 300
    statuses = [e.status for e in FileLedger("fraud-batch-score").entries().values()]
    assert sorted(statuses) == ["quarantined", "quarantined", "scored", "scored", "scored"]


def test_file_still_being_written_waits_for_the_next_run(tmp_path: Path, champion: str) -> None:
    inbox = tmp_path / "fresh"
    inbox.mkdir()
    _transactions(seed=12, days=3).to_csv(inbox / "now.csv", index=False)
    result = F.fraud_batch_score(inbox=str(inbox), model=MODEL, settle_seconds=3600)
    assert result.new_files == 0 and result.scored == 0


def test_batch_scoring_fans_out_on_a_local_dask_cluster(tmp_path: Path, champion: str) -> None:
    pytest.importorskip("prefect_dask")
    inbox = tmp_path / "dask-inbox"
    inbox.mkdir()
    for seed in (21, 22, 23):
        _transactions(seed=seed, days=3).to_parquet(inbox / f"part-{seed}.parquet", index=False)
    (inbox / "bad.csv").write_text("account_id,timestamp\nA,not-a-time\n")
    runner = make_task_runner("dask", workers=2)
    result = F.fraud_batch_score.with_options(task_runner=runner)(inbox=str(inbox), model=MODEL, settle_seconds=0)
    assert result.scored == 3 and result.quarantined == 1 and result.failed == 0
    assert all(Path(p).exists() for p in result.outputs)
