"""``fraud federate`` end to end: a tiny federation of bank processes over Flower on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows.fraud.cli import main
from flows.fraud.federate import fraud_federate
from infra.registry import ModelRegistry
from solutions.fraud.config import (
    DP_LOCAL_EPOCHS,
    DP_MAX_GRAD_NORM,
    SMALL_MODEL,
    ClientFault,
    FederateConfig,
    FederationConfig,
    SyntheticDataConfig,
)

TINY = ["--n-accounts", "240", "--n-terminals", "100", "--n-days", "30", "--fraud-rate", "0.03", "--seed", "1",
        "--train-days", "12", "--val-days", "3", "--delay-days", "3", "--test-days", "5",
        "--feature-delay-days", "3", "--hidden", "8", "--mlp-hidden", "16", "--seq-len", "4"]


def test_tiny_federation_end_to_end(capsys: pytest.CaptureFixture) -> None:
    code = main(["federate", *TINY, "--clients", "2", "--rounds", "2", "--model", "fraud-fed-e2e", "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    result = json.loads(out.strip().splitlines()[-1])
    train_rounds = [r for r in result["rounds"] if r.get("phase") == "train"]
    assert [r["round"] for r in train_rounds] == [1, 2] and not result["partial_rounds"]
    assert all(r["ok"] == 2 for r in train_rounds)
    assert set(result["rows_per_bank"]) == {"0", "1"}
    for name in ("federated (union)", "federated (bank 0)", "pooled (all rows)", "bank 1 alone", "GBM pooled",
                 "pooled (shared features)", "GBM pooled (shared features)"):
        assert 0 <= result["metrics"][name]["ap"] <= 1, name
    assert result["epsilon"] is None
    # two rounds and each bank's own terminal counts: the summary says what the measured recipe changes
    assert len(result["notes"]) == 2 and "--rounds 24" in result["notes"][0], result["notes"]
    registry = ModelRegistry()
    ref = registry.resolve("fraud-fed-e2e:1")
    fed = ref.params["federation"]
    assert fed["clients"] == 2 and fed["rounds"] == 2 and fed["privacy"] == {"dp": False}
    assert fed["terminal_stats"] == "each bank's own"
    # the registered weights are the best validation round's (early stopping), named in the lineage
    assert result["best_round"] in (1, 2) and fed["registered_round"] == result["best_round"]
    weighted = {r["round"]: sum(r["val_ap"][b] * r["val_rows"][b] for b in r["val_ap"]) / sum(r["val_rows"].values())
                for r in train_rounds}
    assert result["best_round"] == max(weighted, key=weighted.get), weighted
    assert sum(fed["rows_per_client"].values()) == sum(result["rows_per_bank"].values())
    card = (registry.version_dir(ref) if hasattr(registry, "version_dir") else __import__("pathlib").Path(ref.path))
    text = (card / "card.md").read_text()
    assert "WITHOUT differential privacy" in text and "what a data-sharing agreement would give" in text


def test_shared_terminal_statistics_come_before_the_moments_round(capsys: pytest.CaptureFixture) -> None:
    code = main(["federate", *TINY, "--clients", "2", "--rounds", "2", "--share-terminal-stats",
                 "--model", "fraud-fed-terminals", "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    result = json.loads(out.strip().splitlines()[-1])
    phases = [(r.get("phase"), r.get("round")) for r in result["rounds"]]
    assert phases == [("terminals", 0), ("moments", 0), ("train", 1), ("train", 2)], phases
    assert all(r["ok"] == 2 for r in result["rounds"] if r.get("phase") == "train")
    registry = ModelRegistry()
    ref = registry.resolve("fraud-fed-terminals:1")
    assert ref.params["federation"]["terminal_stats"] == "daily counts summed across banks"
    card = __import__("pathlib").Path(ref.path) / "card.md"
    assert "shared each terminal's daily counts" in card.read_text()
    # the orchestrator scored each bank's test days with the summed counts the banks trained on
    assert 0 <= result["metrics"]["federated (union)"]["ap"] <= 1


def test_a_crashed_bank_leaves_a_partial_round_and_the_federation_finishes() -> None:
    config = FederateConfig(
        federation=FederationConfig(clients=2, rounds=2, min_clients=1, dp_epsilon=8.0),
        data=SyntheticDataConfig(n_accounts=240, n_terminals=100, n_days=30, fraud_rate=0.03, seed=1),
        split={"train_days": 12, "val_days": 3, "delay_days": 3, "test_days": 5}, delay_days=3,
        model=SMALL_MODEL.model_copy(update={"hidden": 8, "mlp_hidden": 16, "seq_len": 4}),
        compare=False, model_name="fraud-fed-crash")
    result = fraud_federate(config=config, faults={1: ClientFault(crash_round=2)})
    assert result.partial_rounds == [2]
    second = next(r for r in result.rounds if r.get("round") == 2)
    assert second["ok"] == 1 and second["failures"] == 1 and list(second["banks"]) == ["0"]
    # the noise was set for every step the banks took (DP_LOCAL_EPOCHS per round): within budget
    assert result.epsilon is not None and 0 < result.epsilon["federation"] <= 8.05
    assert result.best_round is None  # under DP the last round is kept (no choice by unnoised scores)
    fed = ModelRegistry().resolve("fraud-fed-crash:1").params["federation"]
    assert fed["local_epochs"] == DP_LOCAL_EPOCHS and fed["privacy"]["max_grad_norm"] == DP_MAX_GRAD_NORM
    assert result.metrics["federated (union)"]["ap"] is not None


def test_the_federation_stops_when_every_bank_has_died(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flower's server waits for clients for up to a day: with every bank gone it must not hang."""
    from solutions.fraud import flower_apps

    monkeypatch.setattr(flower_apps, "BANKS_GONE_GRACE_S", 3.0)
    config = FederateConfig(
        federation=FederationConfig(clients=2, rounds=3, min_clients=1),
        data=SyntheticDataConfig(n_accounts=240, n_terminals=100, n_days=30, fraud_rate=0.03, seed=1),
        split={"train_days": 12, "val_days": 3, "delay_days": 3, "test_days": 5}, delay_days=3,
        model=SMALL_MODEL.model_copy(update={"hidden": 8, "mlp_hidden": 16, "seq_len": 4}),
        compare=False, model_name="fraud-fed-gone")
    with pytest.raises(RuntimeError, match="every bank process exited"):
        fraud_federate(config=config, faults={0: ClientFault(crash_round=2), 1: ClientFault(crash_round=2)})


def test_without_flower_federate_names_the_extra_to_install(tmp_path) -> None:
    """Fresh processes where ``flwr`` cannot be imported (a sitecustomize hides it from every
    process of the run, the server's too): one ``error:`` line, exit 2, no traceback."""
    hide = tmp_path / "no_flower"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['flwr'] = None\n")
    argv = ["federate", *TINY, "--clients", "2", "--rounds", "1"]
    code = f"import sys\nfrom flows.fraud.cli import main\nsys.exit(main({argv!r}))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hide), str(Path(__file__).resolve().parents[2])]),
           "INDUSFLOW_HOME": str(tmp_path / "home"), "PREFECT_HOME": str(tmp_path / "prefect")}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [proc.stderr.strip().splitlines()[-1]] and len(errors) == 1, proc.stderr
    assert "flwr" in errors[0] and 'pip install -e ".[federated]"' in errors[0]
