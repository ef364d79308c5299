"""The model registry and its champion rule (no Prefect)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from infra.errors import QualityGateError, RegistryError
from infra.registry import ModelRegistry


def _weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(3, 4, generator=g), "b": torch.zeros(4)}


def _register(reg: ModelRegistry, value: float, **kw):
    return reg.register(
        "m", _weights(), params={"hidden": 4}, metrics={"test/auprc": value}, primary_metric="test/auprc", **kw
    )


def test_register_load_and_lineage(tmp_path: Path) -> None:
    reg = ModelRegistry(tmp_path)
    ref = _register(reg, 0.5, data_hash="abc")
    assert ref.version == 1 and ref.data_hash == "abc" and ref.created_at
    loaded = reg.load_state_dict(ref)
    assert torch.equal(loaded["w"], _weights()["w"])
    child = _register(reg, 0.6, parent=ref.spec)
    assert child.version == 2 and child.parent == "m:1"
    assert [v.version for v in reg.versions("m")] == [1, 2]
    assert reg.resolve("m:latest").version == 2
    meta = json.loads((Path(child.path) / "meta.json").read_text())
    assert meta["params"] == {"hidden": 4}


def test_champion_moves_only_when_beaten(tmp_path: Path) -> None:
    reg = ModelRegistry(tmp_path)
    first = _register(reg, 0.5)
    assert reg.promote(first).promoted
    worse = _register(reg, 0.4)
    decision = reg.promote(worse)
    assert not decision.promoted and reg.champion("m").version == 1
    assert "does not beat" in decision.reason
    with pytest.raises(QualityGateError):
        reg.promote(worse, strict=True)
    better = _register(reg, 0.7)
    assert reg.promote(better).promoted and reg.champion("m").version == 3
    # a fair comparison: the champion re-scored on the candidate's data
    rival = _register(reg, 0.65)
    assert reg.promote(rival, champion_value=0.6).promoted


def test_failed_registration_leaves_nothing(tmp_path: Path) -> None:
    reg = ModelRegistry(tmp_path)
    with pytest.raises(TypeError):
        reg.register("m", _weights(), params={"bad": object()}, metrics={"a": 1.0}, primary_metric="a")
    with pytest.raises(ValueError, match="primary metric"):
        reg.register("m", _weights(), params={}, metrics={"a": 1.0}, primary_metric="b")
    assert reg.models() == []
    assert not any(p.name.isdigit() for p in (tmp_path / "m").iterdir()) if (tmp_path / "m").exists() else True


def test_unknown_model_version_alias_and_bad_names(tmp_path: Path) -> None:
    reg = ModelRegistry(tmp_path)
    with pytest.raises(RegistryError, match="no model named"):
        reg.get("nope")
    _register(reg, 0.1)
    with pytest.raises(RegistryError, match="no version 9"):
        reg.get("m", 9)
    with pytest.raises(RegistryError, match="no alias"):
        reg.get("m", "champion")
    with pytest.raises(ValueError, match="invalid model name"):
        reg.get("../escape")
