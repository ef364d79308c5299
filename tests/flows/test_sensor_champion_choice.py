"""sensor-train chooses its candidate on the validation assets; a GBM winner is registered as
skops files (no pickle) and ``score`` and ``batch`` then load and use it."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from safetensors.torch import load_file

from flows.sensor.cli import main
from infra.registry import KIND_SKLEARN, ModelRegistry
from solutions.sensor.candidates import RUL_FILE, load_baseline

FLEET = ["--n-assets", "16", "--min-life", "45", "--max-life", "70", "--seed", "1"]
# a CNN that cannot learn in one epoch at this learning rate: the GBM wins on validation
TINY = [*FLEET, "--window", "12", "--horizon", "10", "--no-pretrain", "--max-epochs", "1", "--lr", "1e-7"]
MODEL = "rul-choice"


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_baseline_winning_on_validation_is_registered_and_scored(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from solutions.sensor.config import SyntheticFleetConfig
    from solutions.sensor.synthetic import generate_fleet

    assert main(["train", *TINY, "--model", MODEL, "--json"]) == 0
    out = capsys.readouterr().out
    result = _last_json(out)
    assert result["winner"] == "baseline"
    ref = ModelRegistry().resolve(MODEL)
    # the summary prints the registered GBM's own test figures
    m = ref.metrics
    assert any(line.startswith(f"  registered {ref.spec} (baseline)  test RMSE {m['test/rmse']:.2f}  "
                               f"MAE {m['test/mae']:.2f}  PHM08 {m['test/phm08']:.1f}") for line in out.splitlines()), out
    assert ref.kind == KIND_SKLEARN and ref.params["candidate"] == "baseline"
    val = {k.split("/")[1]: v for k, v in ref.metrics.items() if k.startswith("val/") and k.endswith("/rmse")}
    # cross-fitted: the stack competes too, scored nested over the blocks
    assert set(val) == {"cnn", "baseline", "ensemble", "stack"}
    assert val["baseline"] < min(val["cnn"], val["ensemble"], val["stack"])
    assert load_file(str(ref.weights_path)) == {} and ref.file(RUL_FILE).is_file()
    # cross-fitted (the default): 3 validation blocks of 2 of the 13 non-test assets, one GBM per
    # block, the registered GBM their mean (three skops regressors, reloaded as one bag)
    assert ref.metrics["val/assets"] == 6 and ref.params["baseline"]["members"] == 3
    assert ref.file("rul-1.skops").is_file() and ref.file("rul-2.skops").is_file()
    assert len(load_baseline(ref).bag_) == 2
    card = json.loads(ref.file("card.json").read_text())
    assert card["data"]["candidate chosen on"].startswith("6 validation assets in 3 disjoint blocks")
    assert not [p for p in Path(ref.path).iterdir() if p.suffix in {".pkl", ".pickle", ".joblib"}]

    # -- score: the GBM champion scores each asset's latest window
    out_file = tmp_path / "scores.parquet"
    assert main(["score", *FLEET, "--model", MODEL, "--output", str(out_file), "--json"]) == 0
    capsys.readouterr()
    frame = pd.read_parquet(out_file)
    assert (frame["model_version"] == ref.version).all() and (frame["predicted_rul"] >= 0).all()
    assert frame["failure_probability"].between(0, 1).all() and frame["predicted_rul"].nunique() > 1

    # -- batch: the inbox flow loads the same GBM champion
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    readings, _ = generate_fleet(SyntheticFleetConfig(n_assets=4, min_life=45, max_life=60, seed=3))
    readings.to_parquet(inbox / "site.parquet", index=False)
    assert main(["batch", "--inbox", str(inbox), "--model", MODEL, "--settle-seconds", "0", "--json"]) == 0
    batch = _last_json(capsys.readouterr().out)
    assert batch["scored"] == 1 and batch["rows"] == 4
    assert (pd.read_parquet(batch["outputs"][0])["model_version"] == ref.version).all()


def test_a_seed_ensemble_of_cnns_is_registered_as_one_model_and_scored(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    """``--members 2``: two CNNs from consecutive seeds, registered as one ensemble whose
    weights hold both; ``score`` rebuilds it from the registry params; compress has its adapter."""
    from flows.compress.adapters import adapter_for

    args = [*FLEET, "--window", "12", "--horizon", "10", "--no-pretrain", "--no-baseline", "--max-epochs", "2",
            "--members", "2", "--model", "rul-seeds", "--json"]
    assert main(["train", *args]) == 0
    result = _last_json(capsys.readouterr().out)
    ref = ModelRegistry().resolve("rul-seeds")
    assert result["winner"] == "cnn" and ref.params["architecture"] == "SensorRULEnsemble"
    assert ref.params["hparams"]["members"] == 2
    weights = load_file(str(ref.weights_path))
    first = {k[len("members.0."):]: v for k, v in weights.items() if k.startswith("members.0.")}
    second = {k[len("members.1."):]: v for k, v in weights.items() if k.startswith("members.1.")}
    assert first and first.keys() == second.keys()
    assert any(not (first[k] == second[k]).all() for k in first)  # trained from other seeds

    out_file = tmp_path / "scores.parquet"
    assert main(["score", *FLEET, "--model", "rul-seeds", "--output", str(out_file), "--json"]) == 0
    capsys.readouterr()
    frame = pd.read_parquet(out_file)
    assert len(frame) == 16 and frame["predicted_rul"].between(0, 125).all()
    assert adapter_for(ref).architecture == "SensorRULEnsemble"
