"""The flows on an encrypted registry (INDUSFLOW_REGISTRY_KEY): fraud train registers a sealed sequence
model and its card, reproduce finds the same weights (compared decrypted: two sealings differ on disk),
compress loads the sealed source and registers a sealed variant, batch ``score`` uses it, and no
plaintext weight, skops or ONNX file is left in the registry or the runs' report folders."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from flows.compress.cli import main as compress_main
from flows.fraud.cli import main as fraud_main
from infra.home import home_layout
from infra.registry import ModelRegistry
from infra.sealed import ARTIFACT_SUFFIXES, MAGIC
from solutions.fraud.synthetic import generate_transactions

pytest.importorskip("onnxruntime", reason="the compress flow checks ONNX parity with onnxruntime")

DATA = ["--n-accounts", "300", "--n-terminals", "150", "--n-days", "40"]


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def _artifacts(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and p.name.endswith(ARTIFACT_SUFFIXES)]


def test_train_reproduce_compress_and_score_on_an_encrypted_registry(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    kek = tmp_path / "registry.kek"
    kek.write_text(os.urandom(32).hex())
    monkeypatch.setenv("INDUSFLOW_REGISTRY_KEY", f"file:{kek}")
    data = tmp_path / "tx.csv"
    generate_transactions(n_accounts=300, n_terminals=150, n_days=40, seed=11).to_csv(data, index=False)
    assert fraud_main(["train", "--data", str(data), "--max-epochs", "1", "--seq-len", "8", "--model", "fraud-enc",
                       "--no-baseline", "--json"]) == 0
    capsys.readouterr()
    registry = ModelRegistry()
    ref = registry.get("fraud-enc", 1)
    stored = _artifacts(Path(ref.path))
    assert stored and all(p.read_bytes().startswith(MAGIC) for p in stored)
    assert (Path(ref.path) / "card.md").is_file()  # the card is written from the sealed model's scores
    assert fraud_main(["reproduce", "--model", "fraud-enc:1", "--json"]) == 0
    again = _last_json(capsys.readouterr().out)
    assert again["within_tolerance"] and again["weights_identical"]

    assert compress_main(["--model", "fraud-enc", *DATA, "--latency-batch", "64", "--json"]) == 0
    result = _last_json(capsys.readouterr().out)
    assert not _artifacts(Path(result["report_dir"])), "plaintext candidates left in the compress report folder"
    variant = result["variant"]
    if variant is not None:
        spec = f"{variant['name']}:{variant['version']}"
        assert all(p.read_bytes().startswith(MAGIC) for p in _artifacts(Path(registry.resolve(spec).path)))
        new = tmp_path / "new.csv"
        generate_transactions(n_accounts=60, n_terminals=30, n_days=5, seed=8).to_csv(new, index=False)
        assert fraud_main(["score", "--data", str(new), "--model", spec, "--json"]) == 0
        assert _last_json(capsys.readouterr().out)["model"] == spec
    plain = [p for p in _artifacts(home_layout().registry()) if "fraud-enc" in str(p)
             and not p.read_bytes().startswith(MAGIC)]
    assert not plain, plain


def test_rotate_key_command(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """``python -m flows.registry rotate-key --old-key file:OLD`` with the new key set: every version
    loads with the new key, the old one is refused, and a second run rewraps nothing."""
    import torch

    from flows.registry.cli import main as registry_main
    from infra.sealed import SealError

    old, new = tmp_path / "old.kek", tmp_path / "new.kek"
    old.write_text(os.urandom(32).hex())
    new.write_text(os.urandom(32).hex())
    monkeypatch.setenv("INDUSFLOW_HOME", str(tmp_path / "home"))  # only this test's models
    monkeypatch.setenv("INDUSFLOW_REGISTRY_KEY", f"file:{old}")
    registry = ModelRegistry()
    refs = [registry.register("rotate-me", {"w": torch.full((4,), float(i))}, params={}, metrics={"x": 0.0},
                              primary_metric="x") for i in range(2)]
    monkeypatch.setenv("INDUSFLOW_REGISTRY_KEY", f"file:{new}")
    assert registry_main(["rotate-key", "--old-key", f"file:{old}", "--json"]) == 0
    out = capsys.readouterr().out
    assert _last_json(out)["rewrapped"] == 2 and "rewrapped 2 data keys" in out
    assert [registry.load_state_dict(r)["w"][0].item() for r in refs] == [0.0, 1.0]
    assert registry_main(["rotate-key", "--old-key", f"file:{old}", "--json"]) == 0
    assert _last_json(capsys.readouterr().out)["rewrapped"] == 0
    monkeypatch.setenv("INDUSFLOW_REGISTRY_KEY", f"file:{old}")
    with pytest.raises(SealError, match="rotate-me:1 is sealed under key"):
        registry.load_state_dict(refs[0])
