"""The registry remembers every champion move; rollback walks back through it; a home written
before the history existed keeps working."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from infra.errors import QualityGateError, RegistryError
from infra.registry import ALIAS_HISTORY_FILE, ModelRegistry


def _version(registry: ModelRegistry, value: float) -> object:
    return registry.register("m", {"w": torch.full((1,), value)}, params={}, metrics={"auc": value},
                             primary_metric="auc")


def test_rollback_walks_back_through_promotions_and_moves_by_hand(tmp_path: Path) -> None:
    registry = ModelRegistry(tmp_path)
    v1, v2, v3 = (_version(registry, x) for x in (0.1, 0.2, 0.3))
    for ref in (v1, v2, v3):
        assert registry.promote(ref).promoted
    with pytest.raises(QualityGateError):
        registry.promote(v1, strict=True)  # the rule refuses a worse version...
    forced = registry.promote(v1, force=True)  # ...a move by hand does not ask it
    assert forced.promoted and forced.champion_version == 3 and "by hand" in forced.reason
    assert [registry.rollback("m").candidate_version for _ in range(3)] == [3, 2, 1]
    with pytest.raises(RegistryError, match="no earlier champion"):
        registry.rollback("m")
    assert registry.champion("m").version == 1
    # a move that changes nothing is not recorded; other aliases keep their own history
    registry.promote(v1, force=True)
    registry.set_alias("m", "staging", 2)
    assert len(registry.alias_history("m")) == 7
    assert [e["version"] for e in registry.alias_history("m", "staging")] == [2]
    assert len(registry.alias_history("m", None)) == 8


def test_a_home_without_history_stays_readable_and_learns_from_now_on(tmp_path: Path) -> None:
    registry = ModelRegistry(tmp_path)
    for value in (0.1, 0.2, 0.3):
        _version(registry, value)
    # an older release wrote aliases.json only
    (tmp_path / "m" / "aliases.json").write_text(json.dumps({"champion": 2}))
    assert registry.champion("m").version == 2 and registry.alias_history("m") == []
    with pytest.raises(RegistryError, match="no earlier champion"):
        registry.rollback("m")
    registry.promote(registry.get("m", 3))
    assert (tmp_path / "m" / ALIAS_HISTORY_FILE).exists()
    assert registry.rollback("m").candidate_version == 2  # the move from v2 was recorded
    assert registry.champion("m").version == 2
