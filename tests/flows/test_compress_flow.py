"""The compress flow end to end on tiny fraud and sensor models, against a real (test) Prefect API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import tasks.compress as C
from flows.compress.adapters import adapter_for
from flows.compress.cli import main as compress_main
from flows.fraud.cli import main as fraud_main
from flows.sensor.cli import main as sensor_main
from infra.registry import ModelRegistry
from solutions.fraud.compress import FraudHeldOut
from solutions.sensor.compress import SensorHeldOut

pytest.importorskip("onnxruntime", reason="the compress flow checks ONNX parity with onnxruntime")

DATA = ["--n-accounts", "300", "--n-terminals", "150", "--n-days", "40"]


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_compress_flow_on_tiny_fraud_model(capsys: pytest.CaptureFixture) -> None:
    assert fraud_main(["train", *DATA, "--max-epochs", "1", "--seq-len", "8", "--no-baseline", "--model", "fraud-cmp", "--json"]) == 0
    source = _last_json(capsys.readouterr().out)["model"]
    assert compress_main(["--model", "fraud-cmp", *DATA, "--all", "--finetune-epochs", "1", "--distill-epochs", "1",
                    "--latency-batch", "64", "--json"]) == 0
    result = _last_json(capsys.readouterr().out)
    assert result["source"] == f"fraud-cmp:{source['version']}"
    rows = {c["name"]: c for c in result["candidates"]}
    assert list(rows) == ["fp32", "fp32-onnx", "int8-dynamic", "int8-weight-only", "pruned-structured", "pruned-global", "distilled"]
    # every candidate scored on the same test rows as the original; its metric matches the registry's
    assert rows["fp32"]["metric"] == pytest.approx(source["metrics"]["test/auprc"], abs=1e-6)
    assert all(c["cpu"]["batch_size"] == 64 and c["cpu"]["p50_ms"] > 0 for c in rows.values())
    assert result["int8_layers"]["fp32_bytes"] >= 3 * result["int8_layers"]["int8_bytes"]
    assert rows["int8-dynamic"]["size_bytes"] * 3 < rows["fp32"]["size_bytes"]
    assert rows["pruned-structured"]["params"] < rows["fp32"]["params"]
    assert rows["distilled"]["params"] < rows["fp32"]["params"]
    assert result["onnx"]["passed"] and result["onnx"]["max_abs_diff"] < 1e-4
    assert len(result["sensitivity"]) == 3 * 6  # 6 weight matrices x 3 ratios
    report = Path(result["report_dir"], "report.md").read_text()
    assert "| candidate | stage |" in report and "ONNX parity" in report and "Pruning sensitivity" in report
    # the chosen candidate is registered as a variant with lineage, and loads without pickle
    chosen = result["chosen"]
    assert chosen is not None and rows[chosen]["within_tolerance"]
    variant = result["variant"]
    assert variant["parent"] == result["source"] and variant["tags"]["compression"] == chosen
    registry = ModelRegistry()
    ref = registry.resolve(f"{variant['name']}:{variant['version']}")
    adapter = adapter_for(ref)
    module = C.load_variant(ref, registry, adapter.build)
    source_ref = registry.resolve(result["source"])
    options = FraudHeldOut.model_validate({"synthetic": {"n_accounts": 300, "n_terminals": 150, "n_days": 40}})
    target = adapter.prepare(source_ref, C.load_variant(source_ref, registry, adapter.build), options)
    assert C.score(target, module) == pytest.approx(rows[chosen]["metric"], abs=1e-6)
    assert isinstance(module, torch.nn.Module)
    # the variant scores a transactions file like the original does (same rows, close scores)
    from solutions.fraud.synthetic import generate_transactions

    new = Path(result["report_dir"]) / "new-transactions.csv"
    generate_transactions(n_accounts=60, n_terminals=30, n_days=5, seed=8).to_csv(new, index=False)
    capsys.readouterr()
    spec = f"{variant['name']}:{variant['version']}"
    assert fraud_main(["score", "--data", str(new), "--model", spec, "--json"]) == 0
    by_variant = _last_json(capsys.readouterr().out)
    assert fraud_main(["score", "--data", str(new), "--model", result["source"], "--json"]) == 0
    by_source = _last_json(capsys.readouterr().out)
    import pandas as pd

    a, b = pd.read_parquet(by_variant["output"]), pd.read_parquet(by_source["output"])
    assert by_variant["model"] == spec and len(a) == len(b) > 0
    assert (a["model"] == variant["name"]).all()
    assert a["score"].between(0, 1).all() and a["score"].nunique() > 1
    assert (a["transaction_id"] == b["transaction_id"]).all()
    assert (a["score"] != b["score"]).any()  # the variant's own weights were used, not the source's


SENSOR_FLEET = ["--n-assets", "16", "--min-life", "45", "--max-life", "70", "--seed", "1"]


def test_compress_flow_on_tiny_sensor_model(capsys: pytest.CaptureFixture) -> None:
    train = ["train", *SENSOR_FLEET, "--window", "12", "--horizon", "10", "--no-pretrain", "--no-baseline",
             "--max-epochs", "1", "--members", "1", "--model", "rul-cmp", "--json"]
    assert sensor_main(train) == 0
    trained = _last_json(capsys.readouterr().out)
    source = trained["model"]
    assert compress_main(["--model", "rul-cmp", *SENSOR_FLEET, "--all", "--finetune-epochs", "1", "--distill-epochs", "1",
                    "--latency-batch", "32", "--json"]) == 0
    result = _last_json(capsys.readouterr().out)
    rows = {c["name"]: c for c in result["candidates"]}
    assert list(rows) == ["fp32", "fp32-onnx", "int8-dynamic", "int8-weight-only", "pruned-structured", "pruned-global", "distilled"]
    # the registry's primary metric, scored on the same test cuts: test RMSE, lower is better
    assert result["primary_metric"] == "test/rmse" and result["higher_is_better"] is False
    assert rows["fp32"]["metric"] == pytest.approx(source["metrics"]["test/rmse"], rel=1e-9)
    base = rows["fp32"]["metric"]
    # the failure head is reported beside it (sensor-train's test PR-AUC), for every torch candidate
    assert rows["fp32"]["secondary"]["test/pr_auc"] == pytest.approx(source["metrics"]["test/pr_auc"], abs=1e-9)
    assert all("test/pr_auc" in r["secondary"] for r in rows.values() if r["kind"] != "onnx")
    for r in rows.values():  # a higher RMSE is a positive (worse) relative drop
        assert r["rel_drop"] == pytest.approx((r["metric"] - base) / base, abs=1e-12)
        assert r["within_tolerance"] == (r["rel_drop"] <= result["tolerance"])
    fits = [r for r in rows.values() if r["stage"] not in {"original", "export"} and r["within_tolerance"]]
    assert result["chosen"] == (min(fits, key=lambda r: r["size_bytes"])["name"] if fits else None)
    # the latency batch comes from the other test windows, not the few metric rows
    assert all(c["cpu"]["batch_size"] == 32 for c in rows.values())
    # INT8: the Linear layers only (convs stay fp32, and the table says so)
    assert set(result["int8_layers"]["layers"]) == {"encoder.proj.1", "heads.shared.0", "heads.rul", "heads.fail"}
    assert "Conv1d layers stay fp32" in rows["int8-dynamic"]["note"]
    assert rows["int8-weight-only"]["size_bytes"] * 3 < rows["fp32"]["size_bytes"]
    # ONNX: both heads checked, on the metric rows plus the latency batch
    onnx = result["onnx"]
    assert onnx["passed"] and len(onnx["max_abs_diff_per_output"]) == 2 and onnx["max_abs_diff"] < 1e-4
    assert onnx["n"] == trained["windows"]["test_last"] + 32
    # structured pruning shrank conv channels and neurons; the student is smaller
    shapes = result["prune"][0]["shapes"]
    assert result["prune"][0]["method"] == "structured-channels"
    # default widths 32/64/64 with mean pooling into the 256-d projection: half of each kept; the
    # projection's 7 window statistics per input channel are kept whole
    n_in = shapes["encoder.convs.0.0.weight"][1]
    assert shapes["encoder.convs.0.0.weight"][0] == 16 and shapes["encoder.proj.1.weight"] == [128, 32 + 7 * n_in]
    assert rows["pruned-structured"]["params"] < rows["fp32"]["params"] / 2
    assert rows["distilled"]["params"] < rows["fp32"]["params"] / 2
    assert len(result["sensitivity"]) == 3 * 7  # 3 convs + 4 Linear weights x 3 ratios
    report = Path(result["report_dir"], "report.md").read_text()
    assert "(lower is better)" in report and "rul/cap:" in report and "fail_logit:" in report
    # every stored sensor candidate rebuilds from plain tensors and scores as in the table
    registry = ModelRegistry()
    ref = registry.resolve(result["source"])
    adapter = adapter_for(ref)
    options = SensorHeldOut.model_validate({"fleet": {"n_assets": 16, "min_life": 45, "max_life": 70, "seed": 1}})
    target = adapter.prepare(ref, C.load_variant(ref, registry, adapter.build), options)
    out = Path(result["report_dir"])
    for name in ("fp32", "int8-weight-only", "pruned-structured", "pruned-global"):
        state = load_file(str(out / f"{name}.safetensors"))
        plain = C.dequantize_state(state)
        module = C.resize_to_state(adapter.build(ref.params), plain)
        module.load_state_dict(plain)
        module.eval()
        assert C.score(target, module) == pytest.approx(rows[name]["metric"], abs=1e-6), name
    state = load_file(str(out / "int8-dynamic.safetensors"))
    module = C.load_int8_state(C.resize_to_state(adapter.build(ref.params), C.dequantize_state(state)), state)
    assert C.score(target, module) == pytest.approx(rows["int8-dynamic"]["metric"], abs=1e-6)
    if result["variant"] is not None:  # the registered variant loads through the registry (safetensors)
        variant = registry.resolve(f"{result['variant']['name']}:{result['variant']['version']}")
        assert variant.metrics["test/pr_auc"] == rows[result["chosen"]]["secondary"]["test/pr_auc"]
        assert C.score(target, C.load_variant(variant, registry, adapter.build)) == pytest.approx(rows[result["chosen"]]["metric"], abs=1e-6)
        # and scores assets through the sensor score command like the original
        capsys.readouterr()
        assert sensor_main(["score", *SENSOR_FLEET, "--model", variant.spec, "--json"]) == 0
        by_variant = _last_json(capsys.readouterr().out)
        assert sensor_main(["score", *SENSOR_FLEET, "--model", ref.spec, "--json"]) == 0
        by_source = _last_json(capsys.readouterr().out)
        import pandas as pd

        a, b = pd.read_parquet(by_variant["output"]), pd.read_parquet(by_source["output"])
        assert by_variant["model"] == variant.spec and len(a) == len(b) == 16
        assert float((a["predicted_rul"] - b["predicted_rul"]).abs().median()) < 30


def test_compress_flow_on_a_seed_ensemble_of_sensor_cnns(capsys: pytest.CaptureFixture) -> None:
    """A seed ensemble compresses like one CNN: each member pruned alike, the student is one
    small CNN, and the chosen variant scores through ``sensor score``."""
    train = ["train", *SENSOR_FLEET, "--window", "12", "--horizon", "10", "--no-pretrain", "--no-baseline",
             "--max-epochs", "1", "--members", "2", "--model", "rul-cmp-seeds", "--json"]
    assert sensor_main(train) == 0
    source = _last_json(capsys.readouterr().out)["model"]
    assert compress_main(["--model", "rul-cmp-seeds", *SENSOR_FLEET, "--all", "--finetune-epochs", "1",
                          "--distill-epochs", "1", "--latency-batch", "32", "--tolerance", "0.99", "--json"]) == 0
    result = _last_json(capsys.readouterr().out)
    rows = {c["name"]: c for c in result["candidates"]}
    assert rows["fp32"]["metric"] == pytest.approx(source["metrics"]["test/rmse"], rel=1e-9)
    assert result["onnx"]["passed"]
    shapes = result["prune"][0]["shapes"]
    assert shapes["members.0.encoder.convs.0.0.weight"][0] == shapes["members.1.encoder.convs.0.0.weight"][0] == 16
    assert rows["distilled"]["params"] < rows["fp32"]["params"] / 4  # one small CNN for two full ones
    registry = ModelRegistry()
    variant = registry.resolve(f"{result['variant']['name']}:{result['variant']['version']}")
    capsys.readouterr()
    assert sensor_main(["score", *SENSOR_FLEET, "--model", variant.spec, "--json"]) == 0
    assert _last_json(capsys.readouterr().out)["assets_scored"] == 16


@pytest.fixture(scope="module")
def registered() -> dict[str, str]:
    """A fraud-architecture model and one of an architecture no adapter knows (weights never read)."""
    registry = ModelRegistry()
    for name, arch in (("cmp-check-fraud", "FraudSequenceModel"), ("cmp-check-other", "SomethingElse")):
        registry.register(name, {"w": torch.zeros(1)}, params={"architecture": arch},
                          metrics={"test/auprc": 0.5}, primary_metric="test/auprc")
    return {"fraud": "cmp-check-fraud:1", "other": "cmp-check-other:1"}


BAD_INVOCATIONS = [
    (["--model", "no-such-model"], "no-such-model"),
    (["--model", "{fraud}", "--tolerance", "2"], "--tolerance"),
    (["--model", "{fraud}", "--prune-ratio", "1.5"], "--prune-ratio"),
    (["--model", "{fraud}", "--data", "/nonexistent/transactions.csv"], "not found"),
    (["--model", "{fraud}", "--accounts", "/nonexistent/accounts.csv"], "not found"),
    (["--model", "{fraud}", "--columns", "nonsense=CUSTOMER_ID"], "nonsense"),
    (["--model", "{other}"], "SomethingElse"),
]


@pytest.mark.parametrize(("argv", "needle"), BAD_INVOCATIONS)
def test_bad_invocations_exit_2_with_one_error_line(
    argv: list[str], needle: str, registered: dict[str, str], capsys: pytest.CaptureFixture
) -> None:
    assert compress_main([a.format(**registered) for a in argv]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], err
    assert "Traceback" not in out + err


@pytest.mark.parametrize("arch", ["transformer", "tcn"])
def test_compress_flow_on_a_tiny_sensor_transformer_or_tcn(arch: str, capsys: pytest.CaptureFixture) -> None:
    """A sensor network with another encoder trunk goes through every compression stage: its
    trunk is kept whole by structured pruning, the Linear layers are quantised, ONNX matches, and
    every stored candidate rebuilds from plain tensors and scores as in the table."""
    name = f"rul-cmp-{arch}"
    train = ["train", *SENSOR_FLEET, "--window", "12", "--horizon", "10", "--no-pretrain", "--no-baseline",
             "--max-epochs", "1", "--members", "1", "--arch", arch, "--model", name, "--json"]
    assert sensor_main(train) == 0
    capsys.readouterr()
    assert compress_main(["--model", name, *SENSOR_FLEET, "--all", "--finetune-epochs", "1", "--distill-epochs", "1",
                          "--latency-batch", "32", "--json"]) == 0
    result = _last_json(capsys.readouterr().out)
    rows = {c["name"]: c for c in result["candidates"]}
    assert list(rows) == ["fp32", "fp32-onnx", "int8-dynamic", "int8-weight-only", "pruned-structured", "pruned-global",
                          "distilled"]
    assert result["onnx"]["passed"] and result["onnx"]["max_abs_diff"] < 1e-4
    assert f"the {arch} trunk" in rows["int8-dynamic"]["note"]
    shapes = result["prune"][0]["shapes"]
    assert shapes["encoder.proj.1.weight"][0] == 128  # the embedding halved, the trunk whole
    registry = ModelRegistry()
    ref = registry.resolve(result["source"])
    assert ref.params["hparams"]["arch"] == arch
    adapter = adapter_for(ref)
    options = SensorHeldOut.model_validate({"fleet": {"n_assets": 16, "min_life": 45, "max_life": 70, "seed": 1}})
    target = adapter.prepare(ref, C.load_variant(ref, registry, adapter.build), options)
    out = Path(result["report_dir"])
    for variant in ("fp32", "int8-weight-only", "pruned-structured", "pruned-global"):
        plain = C.dequantize_state(load_file(str(out / f"{variant}.safetensors")))
        module = C.resize_to_state(adapter.build(ref.params), plain)
        module.load_state_dict(plain)
        module.eval()
        assert C.score(target, module) == pytest.approx(rows[variant]["metric"], abs=1e-6), variant
