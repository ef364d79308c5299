"""``python -m flows.registry verify``: the trail of every model checked; an edited line exits 1
naming the line; the promotion's trail head is the one verify reports; without an anchor it says
"unanchored", with the Prefect anchor a re-chained trail is found."""

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
    assert reports["trail-a"]["entries"] == 7 and reports["trail-a"]["head_sha256"] == rolled["trail_sha256"]
    assert reports["trail-a"]["status"] == "unanchored"  # consistent, but no anchor: never "ok"
    assert "trail-a: unanchored (7 entries, 6 files re-hashed, head " in out
    assert "not proven: no anchor is configured" in out

    path = registry.root / "trail-a" / ALIAS_HISTORY_FILE
    lines = path.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if '"no champion yet"' in line)
    lines[at] = lines[at].replace('"no champion yet"', '"approved by the board"')
    path.write_text("\n".join(lines) + "\n")
    assert main(["verify", "--model", "trail-a", "--json"]) == 1
    out = capsys.readouterr().out
    result = _last_json(out)
    assert not result["ok"] and result["reports"][0]["problems"][0]["line"] == at + 2
    assert "trail-a: FAILED" in out and f"line {at + 2}: the line before it was edited or removed" in out

    assert main(["verify", "--model", "no-such-model"]) == 2
    assert "no registered model 'no-such-model'" in capsys.readouterr().err


def test_the_prefect_anchor_pins_the_head(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """Every trail entry's hash is an artifact on the Prefect server: a trail rewritten and
    re-chained in the registry folder no longer matches, and verify says so."""
    import hashlib

    monkeypatch.setenv("INDUSFLOW_GOVERNANCE_TRAIL_ANCHORS", json.dumps(["prefect"]))
    registry = ModelRegistry()
    for value in (0.1, 0.2):
        registry.promote(registry.register("trail-p", {"w": torch.full((2,), value)}, params={},
                                           metrics={"test/auprc": value}, primary_metric="test/auprc"))
    assert main(["verify", "--model", "trail-p", "--json"]) == 0
    out = capsys.readouterr().out
    report = _last_json(out)["reports"][0]
    assert report["status"] == "ok" and report["anchored"] == report["entries"] == 4 and report["anchors"] == ["prefect"]
    assert "trail-p: ok (4 entries, 4 files re-hashed, 4 pinned by prefect" in out

    path = registry.root / "trail-p" / ALIAS_HISTORY_FILE
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    entries[1]["reason"] = "approved by the board"
    lines: list[str] = []
    for entry in entries:  # re-chained, head rewritten: consistent with itself
        entry["prev"] = hashlib.sha256(lines[-1].encode()).hexdigest() if lines else None
        lines.append(json.dumps(entry, sort_keys=True))
    path.write_text("".join(f"{line}\n" for line in lines))
    (registry.root / "trail-p" / "alias_history.head.json").write_text(json.dumps(
        {"entries": 4, "last_sha256": hashlib.sha256(lines[-1].encode()).hexdigest()}))
    assert main(["verify", "--model", "trail-p"]) == 1
    assert "entry 2 is not the one anchor prefect saw: the trail was rewritten" in capsys.readouterr().out


def test_keygen_and_policy_commands_enrol_approvers(tmp_path, capsys: pytest.CaptureFixture) -> None:
    """``keygen`` writes a private key (0600) and prints the public key; ``policy`` signs the model's
    policy with it; a second ``policy`` signed by a key the policy does not enrol is refused."""
    registry = ModelRegistry()
    registry.register("policy-m", {"w": torch.zeros(2)}, params={}, metrics={"test/auprc": 0.1},
                      primary_metric="test/auprc")
    keys = {}
    for who in ("alice", "mallory"):
        assert main(["keygen", who, "--out", str(tmp_path / f"{who}.pem"), "--json"]) == 0
        keys[who] = _last_json(capsys.readouterr().out)["public_key"]
        assert (tmp_path / f"{who}.pem").stat().st_mode & 0o777 == 0o600
    assert main(["policy", "--model", "policy-m", "--approvers", f"alice:{keys['alice']}:alice",
                 "--key", str(tmp_path / "alice.pem"), "--json"]) == 0
    out = capsys.readouterr().out
    assert "policy-m: policy 1 signed by alice; alias moves need approval by one of alice" in out
    assert _last_json(out)["signed_by"] == "alice" and registry.policy("policy-m").approvers[0].accounts == ["alice"]
    assert main(["policy", "--model", "policy-m", "--approvers", f"mallory:{keys['mallory']}",
                 "--key", str(tmp_path / "mallory.pem"), "--no-approval-required"]) == 2
    assert "no approver of the current policy" in capsys.readouterr().err
    assert registry.policy("policy-m").approval_required
