"""``verify`` proves what it can and says what it cannot: every version's stored files are hashed
into its registration entry and re-hashed; the trail's head is checked against an anchor outside
the registry folder, so truncating, re-chaining, stripping or deleting the trail is found; with
no anchor configured the answer is "unanchored", never "ok"."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from infra.registry import ALIAS_HISTORY_FILE, TRAIL_HEAD_FILE, ModelRegistry


@pytest.fixture
def anchored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModelRegistry:
    """A registry under ``tmp_path/home`` whose trail is anchored in a sink file outside it."""
    monkeypatch.setenv("INDUSFLOW_GOVERNANCE_TRAIL_ANCHORS", json.dumps([str(tmp_path / "sink" / "anchor.jsonl")]))
    registry = ModelRegistry(tmp_path / "home")
    for value in (0.1, 0.2, 0.3):
        ref = registry.register("m", {"w": torch.full((4,), value)}, params={}, metrics={"auc": value},
                                primary_metric="auc")
        registry.write_version_file(ref, "card.json", json.dumps({"card": value}))
        registry.promote(ref)
    assert registry.verify_trail("m").ok
    return registry


def _trail(registry: ModelRegistry) -> Path:
    return registry.root / "m" / ALIAS_HISTORY_FILE


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _problems(registry: ModelRegistry) -> str:
    report = registry.verify_trail("m")
    assert not report.ok
    return " | ".join(p.problem for p in report.problems)


def test_an_anchored_trail_verifies_ok(anchored: ModelRegistry) -> None:
    report = anchored.verify_trail("m")
    assert report.status == "ok" and report.anchored == report.entries and report.files_checked == 9


def test_truncating_the_trail_and_rewriting_its_head_is_found(anchored: ModelRegistry) -> None:
    lines = _trail(anchored).read_text().splitlines()[:-2]
    _trail(anchored).write_text("".join(f"{line}\n" for line in lines))
    (anchored.root / "m" / TRAIL_HEAD_FILE).write_text(json.dumps({"entries": len(lines),
                                                                   "last_sha256": _sha(lines[-1])}))
    champion = [json.loads(line)["version"] for line in lines if json.loads(line).get("alias") == "champion"][-1]
    (anchored.root / "m" / "aliases.json").write_text(json.dumps({"champion": champion}))  # consistent with it
    assert "entries were removed" in _problems(anchored)


def test_a_rechained_rewrite_is_found(anchored: ModelRegistry) -> None:
    entries = [json.loads(line) for line in _trail(anchored).read_text().splitlines()]
    entries[4]["reason"] = "approved by the board"  # then every later link and the head recomputed
    lines: list[str] = []
    for entry in entries:
        entry["prev"] = _sha(lines[-1]) if lines else None
        lines.append(json.dumps(entry, sort_keys=True))
    _trail(anchored).write_text("".join(f"{line}\n" for line in lines))
    (anchored.root / "m" / TRAIL_HEAD_FILE).write_text(json.dumps({"entries": len(lines),
                                                                   "last_sha256": _sha(lines[-1])}))
    assert "the trail was rewritten" in _problems(anchored)


def test_stripped_links_and_a_deleted_head_are_found(anchored: ModelRegistry) -> None:
    entries = [json.loads(line) for line in _trail(anchored).read_text().splitlines()]
    _trail(anchored).write_text("".join(json.dumps({k: v for k, v in e.items() if k not in ("prev", "seq")},
                                                   sort_keys=True) + "\n" for e in entries))
    (anchored.root / "m" / TRAIL_HEAD_FILE).unlink()
    assert "the trail was rewritten" in _problems(anchored)


def test_a_deleted_trail_and_head_are_found(anchored: ModelRegistry) -> None:
    _trail(anchored).unlink()
    (anchored.root / "m" / TRAIL_HEAD_FILE).unlink()
    assert "entries were removed" in _problems(anchored)


@pytest.mark.parametrize("file_name", ["meta.json", "card.json", "weights.safetensors"])
def test_an_edited_version_file_is_found(anchored: ModelRegistry, file_name: str) -> None:
    path = anchored.root / "m" / "3" / file_name
    data = bytearray(path.read_bytes())
    data[-2] ^= 1  # one bit
    path.write_bytes(bytes(data))
    assert f"v3: {file_name} differ from the trail's hashes" in _problems(anchored)


def test_swapped_version_folders_are_found(anchored: ModelRegistry) -> None:
    root = anchored.root / "m"
    (root / "1").rename(root / "x")
    (root / "2").rename(root / "1")
    (root / "x").rename(root / "2")
    problems = _problems(anchored)
    assert "v1: " in problems and "v2: " in problems


def test_a_version_folder_added_by_hand_is_found(anchored: ModelRegistry) -> None:
    shutil.copytree(anchored.root / "m" / "3", anchored.root / "m" / "4")
    assert "v4: the folder has no registration entry" in _problems(anchored)


def test_without_an_anchor_the_trail_is_only_unanchored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INDUSFLOW_GOVERNANCE_TRAIL_ANCHORS", raising=False)
    registry = ModelRegistry(tmp_path)
    registry.promote(registry.register("m", {"w": torch.zeros(2)}, params={}, metrics={"auc": 0.5},
                                       primary_metric="auc"))
    report = registry.verify_trail("m")
    assert report.ok and report.status == "unanchored" and report.anchored == 0
    assert "no anchor is configured" in report.unproven[0]
    _trail(registry).unlink()
    (registry.root / "m" / TRAIL_HEAD_FILE).unlink()
    (registry.root / "m" / "aliases.json").unlink()
    gone = registry.verify_trail("m")  # nothing left to compare: never "ok"
    assert gone.status == "unanchored" and any("before files were hashed" in u for u in gone.unproven)
