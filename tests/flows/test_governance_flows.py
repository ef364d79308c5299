"""Lineage, model card and ``reproduce`` of a trained fraud version, end to end (test Prefect API)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.fraud.cli import main
from infra.registry import ModelRegistry
from solutions.fraud.synthetic import generate_transactions

TINY = ["--max-epochs", "2", "--seq-len", "8"]


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_lineage_card_and_reproduce(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = tmp_path / "tx.csv"
    df = generate_transactions(n_accounts=300, n_terminals=150, n_days=40, seed=11)
    df.to_csv(data, index=False)
    assert main(["train", "--data", str(data), *TINY, "--model", "fraud-gov", "--json"]) == 0
    trained = _last_json(capsys.readouterr().out)
    ref = ModelRegistry().get("fraud-gov", 1)
    folder = Path(ref.path)
    # lineage: data, parameters with defaults, seeds, software and hardware
    lineage = json.loads((folder / "lineage.json").read_text())
    assert lineage["data"]["content_hash"] == trained["dataset"]["content_hash"] == ref.data_hash
    assert lineage["data"]["rows"]["test"] == trained["rows"]["test"]
    assert lineage["parameters"]["data"] == str(data) and lineage["parameters"]["config"]["model"]["lr"] == 2e-3
    assert lineage["seeds"]["model"] == 0 and lineage["flow"] == "fraud-train" and lineage["flow_run_id"]
    assert lineage["deterministic"] is True and lineage["precision"] == "32-true"
    assert {"torch", "lightning", "prefect", "sklearn", "pandas", "numpy", "indusflow"} <= set(
        lineage["environment"]["packages"])
    # the card: intervals around the test figures, per-day table, comparison with the baseline
    card = json.loads((folder / "card.json").read_text())
    pr = next(m for m in card["metrics"] if m["metric"] == "pr_auc")
    # (the registered candidate is the validation winner: sequence model, GBM or their ensemble)
    assert pr["low"] <= pr["value"] <= pr["high"] and pr["value"] == pytest.approx(ref.metrics["test/auprc"])
    assert pr["value"] == pytest.approx(ref.metrics[f"test/{trained['winner']}/auprc"])
    others = {c["against"].split(" ")[0] for c in card["comparisons"]}
    assert len(others) == 2 and all(0 <= c["test"]["p_value"] <= 1 for c in card["comparisons"])
    assert card["sections"][0]["title"] == "Per test day" and "card_precision@100" in card["sections"][0]["columns"]
    assert "Known limitations" in (folder / "card.md").read_text()
    # reproduce: same data, same parameters -> the same figures (and weights)
    assert main(["reproduce", "--model", "fraud-gov:1", "--json"]) == 0
    again = _last_json(capsys.readouterr().out)
    assert again["within_tolerance"] and again["reproduction"] == "fraud-gov-reproduce:1"
    assert again["diff"] == pytest.approx(0.0, abs=0.005) and again["weights_identical"]
    assert ModelRegistry().champion("fraud-gov").version == 1
    # the data file changed: refused before any training, the difference named
    df.loc[0, "amount"] += 1.0
    df.to_csv(data, index=False)
    assert main(["reproduce", "--model", "fraud-gov:1"]) == 2
    err = capsys.readouterr().err
    assert "error: the data of fraud-gov:1 changed" in err and str(data) in err and "Traceback" not in err
