"""The compress flow end to end on a tiny fraud model, against a real (test) Prefect API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import flows.compress as FC
import flows.fraud as F
from flows._compress_models import adapter_for
from infra.registry import ModelRegistry

pytest.importorskip("onnxruntime", reason="the compress flow checks ONNX parity with onnxruntime")

DATA = ["--n-accounts", "300", "--n-terminals", "150", "--n-days", "40"]


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_compress_flow_on_tiny_fraud_model(capsys: pytest.CaptureFixture) -> None:
    assert F.main(["train", *DATA, "--max-epochs", "1", "--seq-len", "8", "--model-name", "fraud-cmp", "--json"]) == 0
    source = _last_json(capsys.readouterr().out)["model"]
    assert FC.main(["--model", "fraud-cmp", *DATA, "--all", "--finetune-epochs", "1", "--distill-epochs", "1",
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
    module = FC.load_variant(ref, registry)
    target = adapter_for(ref).prepare(registry.resolve(result["source"]), {"synthetic": {"n_accounts": 300, "n_terminals": 150, "n_days": 40}})
    assert target.score(module) == pytest.approx(rows[chosen]["metric"], abs=1e-6)
    assert isinstance(module, torch.nn.Module)
