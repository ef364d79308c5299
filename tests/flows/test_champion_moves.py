"""``python -m flows.fraud promote/rollback`` and ``python -m flows.sensor promote/rollback``: the
champion moves by hand through the registry (its history remembers who was champion before);
a wrong model or version exits 2 with one ``error:`` line."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch

from flows.fraud.cli import main as fraud_main
from flows.sensor.cli import main as sensor_main
from infra.registry import ModelRegistry


def _register(name: str, values: list[float]) -> ModelRegistry:
    """Versions 1..n of ``name``, each promoted by the champion rule (the last is champion)."""
    registry = ModelRegistry()
    for value in values:
        ref = registry.register(name, {"w": torch.full((2,), value)}, params={}, metrics={"test/auprc": value},
                                primary_metric="test/auprc")
        registry.promote(ref)
    return registry


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize(("main", "name"), [(fraud_main, "fraud-moves"), (sensor_main, "sensor-moves")])
def test_promote_by_hand_then_roll_back_step_by_step(main: Callable[[list[str]], int], name: str,
                                                     capsys: pytest.CaptureFixture) -> None:
    registry = _register(name, [0.1, 0.2, 0.3])
    assert registry.aliases(name)["champion"] == 3
    # promote a worse version by hand: the champion rule is not asked
    assert main(["promote", "--model", f"{name}:1", "--json"]) == 0
    out = capsys.readouterr().out
    decision = _last_json(out)
    assert decision["promoted"] and decision["candidate_version"] == 1 and decision["champion_version"] == 3
    assert f"{name}: champion v3 -> v1" in out
    assert registry.champion(name).version == 1
    # each rollback returns to the champion before: v3 (promoted by hand over), then v2, then v1
    for expected, before in [(3, 1), (2, 3), (1, 2)]:
        assert main(["rollback", "--model", name, "--json"]) == 0
        decision = _last_json(capsys.readouterr().out)
        assert (decision["candidate_version"], decision["champion_version"]) == (expected, before)
        assert registry.champion(name).version == expected
    assert main(["rollback", "--model", name]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "no earlier champion" in err and len(err.strip().splitlines()) == 1
    assert registry.champion(name).version == 1
    history = registry.alias_history(name)
    assert [e["action"] for e in history] == ["promote", "promote", "promote", "force", "rollback", "rollback",
                                             "rollback"]


@pytest.mark.parametrize("main", [fraud_main, sensor_main])
@pytest.mark.parametrize(("argv", "says"), [
    (["promote", "--model", "{name}:9"], "has no version 9"),
    (["promote", "--model", "{name}"], "names no version"),
    (["promote", "--model", "no-such-model:1"], "no model named 'no-such-model'"),
    (["rollback", "--model", "no-such-model"], "no model named 'no-such-model'"),
    (["rollback", "--model", "{name}:1"], "rollback takes a model NAME"),
])
def test_a_wrong_model_or_version_exits_2_with_one_error_line(main: Callable[[list[str]], int], argv: list[str],
                                                              says: str, capsys: pytest.CaptureFixture) -> None:
    name = "moves-errors"
    if name not in ModelRegistry().models():
        _register(name, [0.5])
    assert main([a.format(name=name) for a in argv]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and says in captured.err, captured.err
    assert len(captured.err.strip().splitlines()) == 1 and "Traceback" not in captured.err
    assert ModelRegistry().champion(name).version == 1
