"""Model files encrypted at rest in the registry (infra.sealed): no plaintext on disk, tampering
detected, key rotation, wrong or missing keys named (no Prefect)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.ensemble import HistGradientBoostingClassifier

from infra.registry import SKLEARN_FILE, ModelRegistry
from infra.sealed import MAGIC, KeyWrapper, LocalKek, SealError, key_from_reference, read_artifact
from infra.sklearn_store import load_estimator, save_estimator


def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {"w": torch.randn(64, 32, generator=g), "b": torch.randn(32, generator=g)}


def _kek_file(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.write_text(os.urandom(32).hex())
    return path


@pytest.fixture
def keyed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A KEK file configured as INDUSFLOW_REGISTRY_KEY."""
    kek = _kek_file(tmp_path, "kek.hex")
    monkeypatch.setenv("INDUSFLOW_REGISTRY_KEY", f"file:{kek}")
    return kek


def _register(reg: ModelRegistry, extra: dict[str, Path] | None = None):
    return reg.register("m", _weights(), params={}, metrics={"auc": 0.5}, primary_metric="auc", extra_files=extra)


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def test_no_plaintext_weight_bytes_on_disk(tmp_path: Path, keyed: Path) -> None:
    reg = ModelRegistry(tmp_path / "registry")
    skops = save_estimator(HistGradientBoostingClassifier(max_iter=3).fit(np.eye(8), np.arange(8) % 2),
                           tmp_path / "staging" / SKLEARN_FILE)
    onnx = tmp_path / "staging" / "model.onnx"
    onnx.write_bytes(b"onnx-graph-bytes-" + _weights()["b"].numpy().tobytes())
    ref = _register(reg, {SKLEARN_FILE: skops, "model.onnx": onnx})
    needles = [_weights()["w"].numpy().tobytes()[:64], _weights()["b"].numpy().tobytes()[:64], b"onnx-graph-bytes",
               b"HistGradientBoostingClassifier"]
    for path in _files(reg.root):
        data = path.read_bytes()
        assert not any(n in data for n in needles), f"plaintext model bytes in {path}"
    for name in ("weights.safetensors", SKLEARN_FILE, "model.onnx"):
        assert (Path(ref.path) / name).read_bytes().startswith(MAGIC)
    assert json.loads((Path(ref.path) / "meta.json").read_text())["version"] == 1  # documents stay readable
    loaded = reg.load_state_dict(ref)
    assert torch.equal(loaded["w"], _weights()["w"]) and torch.equal(loaded["b"], _weights()["b"])
    assert load_estimator(ref.file(SKLEARN_FILE)).predict(np.eye(8)).shape == (8,)
    assert read_artifact(ref.file("model.onnx")) == onnx.read_bytes()


def test_off_by_default_writes_plain_safetensors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INDUSFLOW_REGISTRY_KEY", raising=False)
    reg = ModelRegistry(tmp_path)
    ref = _register(reg)
    assert not ref.weights_path.read_bytes().startswith(MAGIC)
    assert not (tmp_path / "m" / "keys.json").exists()
    assert torch.equal(reg.load_state_dict(ref)["w"], _weights()["w"])


def test_a_flipped_bit_is_detected(tmp_path: Path, keyed: Path) -> None:
    reg = ModelRegistry(tmp_path)
    ref = _register(reg)
    data = bytearray(ref.weights_path.read_bytes())
    data[len(data) // 2] ^= 0x01
    ref.weights_path.write_bytes(bytes(data))
    with pytest.raises(SealError, match=r"m:1: weights.safetensors fails authentication: it was altered"):
        reg.load_state_dict(ref)


def test_a_file_moved_between_versions_is_detected(tmp_path: Path, keyed: Path) -> None:
    reg = ModelRegistry(tmp_path)
    one, two = _register(reg), _register(reg)
    two.weights_path.write_bytes(one.weights_path.read_bytes())
    with pytest.raises(SealError, match="fails authentication"):
        reg.load_state_dict(two)


def test_a_sealed_version_refuses_a_plaintext_replacement(tmp_path: Path, keyed: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    reg = ModelRegistry(tmp_path)
    ref = _register(reg)
    monkeypatch.delenv("INDUSFLOW_REGISTRY_KEY")
    plain = ModelRegistry(tmp_path / "other")
    ref.weights_path.write_bytes(_register(plain).weights_path.read_bytes())
    monkeypatch.setenv("INDUSFLOW_REGISTRY_KEY", f"file:{keyed}")
    with pytest.raises(SealError, match="stored encrypted but weights.safetensors is plaintext"):
        reg.load_state_dict(ref)


def test_missing_key_names_the_model_and_the_setting(tmp_path: Path, keyed: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    reg = ModelRegistry(tmp_path)
    ref = _register(reg)
    monkeypatch.delenv("INDUSFLOW_REGISTRY_KEY")
    with pytest.raises(SealError, match=r"model m:1 is encrypted at rest .*set INDUSFLOW_REGISTRY_KEY"):
        reg.load_state_dict(ref)


def test_wrong_key_names_both_key_ids(tmp_path: Path, keyed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reg = ModelRegistry(tmp_path)
    ref = _register(reg)
    right, wrong = LocalKek(bytes.fromhex(keyed.read_text()), "x"), _kek_file(tmp_path, "other.hex")
    monkeypatch.setenv("INDUSFLOW_REGISTRY_KEY", f"file:{wrong}")
    with pytest.raises(SealError, match=rf"m:1 is sealed under key {right.key_id}, but INDUSFLOW_REGISTRY_KEY"):
        reg.load_state_dict(ref)


def test_an_altered_wrapped_key_is_refused(tmp_path: Path, keyed: Path) -> None:
    reg = ModelRegistry(tmp_path)
    ref = _register(reg)
    ring_path = tmp_path / "m" / "keys.json"
    ring = json.loads(ring_path.read_text())
    ring["1"]["wrapped"] = ring["1"]["wrapped"][:-6] + "AAAAA="  # same length, other bytes
    ring_path.write_text(json.dumps(ring))
    with pytest.raises(SealError, match="m:1: .*does not unwrap"):
        reg.load_state_dict(ref)


def test_rotation_rewraps_without_touching_files(tmp_path: Path, keyed: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    reg = ModelRegistry(tmp_path)
    refs = [_register(reg), _register(reg)]
    stored = {p: p.read_bytes() for p in _files(tmp_path) if p.parent.name.isdigit()}
    new = _kek_file(tmp_path, "new.hex")
    report = reg.rotate_key(key_from_reference(f"file:{keyed}"), key_from_reference(f"file:{new}"))
    assert (report.rewrapped, report.already_current, report.models) == (2, 0, ["m"])
    assert {p: p.read_bytes() for p in stored} == stored  # no version file re-encrypted
    monkeypatch.setenv("INDUSFLOW_REGISTRY_KEY", f"file:{new}")
    for ref in refs:
        assert torch.equal(reg.load_state_dict(ref)["w"], _weights()["w"])
    again = reg.rotate_key(key_from_reference(f"file:{keyed}"), key_from_reference(f"file:{new}"))
    assert (again.rewrapped, again.already_current) == (0, 2)
    monkeypatch.setenv("INDUSFLOW_REGISTRY_KEY", f"file:{keyed}")  # the old KEK no longer opens anything
    with pytest.raises(SealError, match="is sealed under key local:"):
        reg.load_state_dict(refs[0])
    stranger = key_from_reference(f"file:{_kek_file(tmp_path, 'stranger.hex')}")
    with pytest.raises(SealError, match="m:1 is sealed under key .*but --old-key names key"):
        reg.rotate_key(stranger, key_from_reference(f"file:{keyed}"))  # a wrong old key changes nothing
    monkeypatch.setenv("INDUSFLOW_REGISTRY_KEY", f"file:{new}")
    assert torch.equal(reg.load_state_dict(refs[1])["w"], _weights()["w"])


def test_env_and_kms_key_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = os.urandom(32)
    monkeypatch.setenv("MY_KEK", raw.hex())
    env = key_from_reference("env:MY_KEK")
    assert env.unwrap(env.wrap(b"k" * 32)) == b"k" * 32
    assert raw.hex() not in repr(env) and env.key_id.startswith("local:")
    kms = key_from_reference("kms:tests.unit.test_sealed:fake_kms")
    assert isinstance(kms, KeyWrapper)
    monkeypatch.setenv("INDUSFLOW_REGISTRY_KEY", "kms:tests.unit.test_sealed:fake_kms")
    reg = ModelRegistry(tmp_path)
    assert torch.equal(reg.load_state_dict(_register(reg))["w"], _weights()["w"])
    for bad, message in (("env:NOT_SET_ANYWHERE", "is not set"), ("file:/nonexistent/kek", "no such file"),
                         ("plain-text-key", "must be file:PATH"), ("kms:os:getcwd", "lacks key_id")):
        with pytest.raises(SealError, match=message):
            key_from_reference(bad)
    monkeypatch.setenv("SHORT_KEK", "abcd")
    with pytest.raises(SealError, match=r"from \$SHORT_KEK is 3 bytes; it must be 32 random bytes"):
        key_from_reference("env:SHORT_KEK")
    monkeypatch.setenv("SHORT_KEK", "not base64 !")
    with pytest.raises(SealError, match="neither 32 raw bytes"):
        key_from_reference("env:SHORT_KEK")


class _FakeKms:
    """A KMS client stand-in: wraps with a key the caller never sees."""

    key_id = "kms:test-key-1"

    def __init__(self) -> None:
        self._inner = LocalKek(b"\x11" * 32, "fake kms")

    def wrap(self, data_key: bytes) -> bytes:
        return self._inner.wrap(data_key)

    def unwrap(self, wrapped: bytes) -> bytes:
        return self._inner.unwrap(wrapped)


def fake_kms() -> _FakeKms:
    return _FakeKms()


def test_register_model_removes_staged_plaintext_model_files(tmp_path: Path, keyed: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from tasks.register import register_model

    monkeypatch.setenv("INDUSFLOW_HOME", str(tmp_path / "home"))
    staged = save_estimator(HistGradientBoostingClassifier(max_iter=3).fit(np.eye(8), np.arange(8) % 2),
                            tmp_path / "report" / SKLEARN_FILE)
    notes = tmp_path / "report" / "notes.json"
    notes.write_text("{}")
    result = register_model("gbm", None, params={}, metrics={"auc": 0.5}, primary_metric="auc",
                            kind="sklearn-skops", extra_files={SKLEARN_FILE: staged, "notes.json": notes})
    assert not staged.exists() and notes.exists()  # the model file is sealed in the registry; documents stay
    assert result.model.file(SKLEARN_FILE).read_bytes().startswith(MAGIC)
    assert load_estimator(result.model.file(SKLEARN_FILE)).predict(np.eye(8)).shape == (8,)
    monkeypatch.delenv("INDUSFLOW_REGISTRY_KEY")
    kept = save_estimator(HistGradientBoostingClassifier(max_iter=3).fit(np.eye(8), np.arange(8) % 2),
                          tmp_path / "plain" / SKLEARN_FILE)
    register_model("gbm", None, params={}, metrics={"auc": 0.5}, primary_metric="auc", kind="sklearn-skops",
                   extra_files={SKLEARN_FILE: kept})
    assert kept.exists()  # off: nothing of the caller's is deleted
