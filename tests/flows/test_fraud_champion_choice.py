"""fraud-train chooses its candidate on validation; a GBM winner is registered as a skops
file (no pickle) and ``score`` and ``batch`` then load and use it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from safetensors.torch import load_file

from flows.fraud.cli import main
from infra.registry import KIND_SKLEARN, SKLEARN_FILE, ModelRegistry
from solutions.fraud.candidates import load_baseline
from solutions.fraud.synthetic import generate_transactions

MODEL = "fraud-choice"
# a sequence model that cannot learn in one epoch at this learning rate, and enough fraud in a
# longer validation period that the GBM's lead there is not a coin toss: the GBM wins on validation
TINY = ["--n-accounts", "300", "--n-terminals", "150", "--n-days", "40", "--fraud-rate", "0.05", "--val-days", "6",
        "--max-epochs", "1", "--seq-len", "8", "--lr", "1e-7", "--hidden", "8", "--mlp-hidden", "8"]


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_baseline_winning_on_validation_is_registered_and_scored(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", *TINY, "--model", MODEL, "--json"]) == 0
    result = _last_json(capsys.readouterr().out)
    val = result["candidates_val_auprc"]
    assert set(val) == {"sequence", "baseline", "ensemble"}
    assert result["winner"] == "baseline" and val["baseline"] > max(val["sequence"], val["ensemble"])
    # the registered version is the GBM: a skops file, no tensors, no pickle
    ref = ModelRegistry().resolve(MODEL)
    assert ref.version == result["model"]["version"] and ref.kind == KIND_SKLEARN
    assert ref.params["candidate"] == "baseline" and ref.metrics["val/baseline/auprc"] == pytest.approx(val["baseline"])
    assert load_file(str(ref.weights_path)) == {}
    assert ref.file(SKLEARN_FILE).is_file()
    assert not [p for p in Path(ref.path).iterdir() if p.suffix in {".pkl", ".pickle", ".joblib"}]
    # the test period only reported: the registered metric is the GBM's own test PR-AUC
    assert ref.metrics["test/auprc"] == pytest.approx(result["baseline"]["pr_auc"])

    # -- score: the champion (the GBM) is loaded from its skops file and scores the file
    df = generate_transactions(n_accounts=80, n_terminals=40, n_days=6, seed=5).drop(
        columns=["is_fraud", "scenario"], errors="ignore")
    data = tmp_path / "day.csv"
    df.to_csv(data, index=False)
    out = tmp_path / "scores.parquet"
    assert main(["score", "--data", str(data), "--model", MODEL, "--output", str(out), "--json"]) == 0
    scored = _last_json(capsys.readouterr().out)
    assert scored["model"] == ref.spec and scored["rows_scored"] == len(df)
    table = pd.read_parquet(out)
    assert set(table["model_version"]) == {ref.version} and table["score"].between(0, 1).all()
    # the scores are the stored GBM's own probabilities on the file's window features
    gbm = load_baseline(ref)
    assert gbm is not None and gbm.feature_names == ref.params["baseline"]["features"]
    assert table["score"].nunique() > 10 and np.isfinite(table["score"]).all()

    # -- batch: the inbox flow loads the same GBM champion
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    df.head(400).to_csv(inbox / "day1.csv", index=False)
    assert main(["batch", "--inbox", str(inbox), "--model", MODEL, "--settle-seconds", "0", "--json"]) == 0
    batch = _last_json(capsys.readouterr().out)
    assert batch["model"] == ref.spec and batch["scored"] == 1 and batch["rows"] == 400
    assert pd.read_parquet(batch["outputs"][0])["score"].between(0, 1).all()


def test_candidates_flag_limits_the_choice_and_still_reports_all(capsys: pytest.CaptureFixture) -> None:
    """``--candidates ensemble``: the ensemble is registered although the GBM alone wins on
    validation here; every candidate's validation PR-AUC is still reported."""
    from infra.registry import KIND_TORCH_SKLEARN

    assert main(["train", *TINY, "--model", "fraud-forced", "--candidates", "ensemble", "--json"]) == 0
    out = capsys.readouterr().out
    result = _last_json(out)
    assert result["winner"] == "ensemble" and set(result["candidates_val_auprc"]) == {"sequence", "baseline",
                                                                                      "ensemble"}
    ref = ModelRegistry().resolve("fraud-forced")
    assert ref.kind == KIND_TORCH_SKLEARN and ref.params["candidate"] == "ensemble"
    assert load_baseline(ref) is not None and ref.file(SKLEARN_FILE).is_file()
    # the summary prints the registered ensemble's own test figures (neither model's line has them)
    m = ref.metrics
    assert (f"  registered {ref.spec} (ensemble)  test PR-AUC {m['test/auprc']:.4f}  ROC-AUC {m['test/roc_auc']:.4f}  "
            f"recall@1%FPR {m['test/recall_at_fpr']:.4f}") in out.splitlines()
    assert main(["train", *TINY, "--model", "fraud-forced", "--candidates", "gbm"]) == 2
    assert capsys.readouterr().err.startswith("error: --candidates: ")
