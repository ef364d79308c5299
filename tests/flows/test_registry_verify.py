"""``python -m flows.registry verify``: the trail of every model checked; an edited line exits 1
naming the line; the promotion's trail head is the one verify reports."""

from __future__ import annotations

import json

import pytest
import torch

from flows.fraud.cli import main as fraud_main
from flows.registry.cli import main
from infra.registry import ALIAS_HISTORY_FILE, ModelRegistry


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_verify_passes_then_finds_an_edited_line(capsys: pytest.CaptureFixture) -> None:
    registry = ModelRegistry()
    for name in ("trail-a", "trail-b"):
        for value in (0.1, 0.2, 0.3):
            ref = registry.register(name, {"w": torch.full((2,), value)}, params={},
                                    metrics={"test/auprc": value}, primary_metric="test/auprc")
            registry.promote(ref)
    assert fraud_main(["rollback", "--model", "trail-a", "--json"]) == 0
    rolled = _last_json(capsys.readouterr().out)
    assert rolled["trail_sha256"] and len(rolled["trail_sha256"]) == 64

    assert main(["verify", "--json"]) == 0
    out = capsys.readouterr().out
    result = _last_json(out)
    reports = {r["name"]: r for r in result["reports"]}
    assert result["ok"] and {"trail-a", "trail-b"} <= set(reports)
    assert reports["trail-a"]["entries"] == 4 and reports["trail-a"]["head_sha256"] == rolled["trail_sha256"]
    assert "trail-a: ok (4 entries, head " in out

    path = registry.root / "trail-a" / ALIAS_HISTORY_FILE
    lines = path.read_text().splitlines()
    lines[0] = lines[0].replace('"no champion yet"', '"approved by the board"')
    path.write_text("\n".join(lines) + "\n")
    assert main(["verify", "--model", "trail-a", "--json"]) == 1
    out = capsys.readouterr().out
    result = _last_json(out)
    assert not result["ok"] and result["reports"][0]["problems"][0]["line"] == 2
    assert "trail-a: FAILED" in out and "line 2: the line before it was edited or removed" in out

    assert main(["verify", "--model", "no-such-model"]) == 2
    assert "no registered model 'no-such-model'" in capsys.readouterr().err
