"""Pruning: sensitivity analysis, global magnitude, structured pruning that shrinks tensors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import tasks.compress as C
from tests.unit.test_compress_quant import TinySeq, seq_batch


@pytest.fixture
def model() -> TinySeq:
    torch.manual_seed(0)
    return TinySeq().eval()


def test_structured_pruning_shrinks_tensors_and_model_runs(model: TinySeq) -> None:
    assert C.mlp_blocks(model) == ["head"]
    pruned, report = C.structured_prune(model, 0.5)
    assert pruned.head[0].weight.shape == (32, 32)  # 64 -> 32 neurons
    assert pruned.head[3].weight.shape == (8, 32)  # in-dim fixed up, 16 -> 8 neurons
    assert pruned.head[5].weight.shape == (1, 8)
    assert report.params_after < report.params_before
    assert model.head[0].weight.shape == (64, 32)  # the original is untouched
    out = pruned(seq_batch(7))
    assert out.shape == (7,) and torch.isfinite(out).all()
    # a fresh full-size model takes the pruned state after resize_to_state
    rebuilt = C.resize_to_state(TinySeq(), pruned.state_dict(), types=(nn.Linear,))
    rebuilt.load_state_dict(pruned.state_dict())
    b = seq_batch(5)
    assert torch.equal(rebuilt.eval()(b), pruned(b))


def test_structured_pruning_refuses_blocks_it_cannot_fix(model: TinySeq) -> None:
    model.head = nn.Sequential(nn.Linear(32, 16), nn.BatchNorm1d(16), nn.Linear(16, 1))
    assert C.mlp_blocks(model) == []
    with pytest.raises(ValueError, match="no MLP block"):
        C.structured_prune(model, 0.5)
    with pytest.raises(ValueError, match="BatchNorm1d"):
        C.prune_mlp_neurons_(model, "head", 0.5)


def test_global_magnitude_pruning_and_sensitivity(model: TinySeq) -> None:
    keys = C.prunable_weights(model)
    assert "gru.weight_hh_l0" in keys and "emb.weight" not in keys
    pruned, report = C.global_magnitude_prune(model, 0.6, keys)
    assert report.zero_fraction == pytest.approx(0.6, abs=0.01)
    assert not any(hasattr(m, "weight_orig") for m in pruned.modules())  # masks made permanent
    b = seq_batch(32)
    ref = model(b).detach()

    def score(m: nn.Module) -> float:  # closeness to the original's outputs
        with torch.no_grad():
            return -float((m(b) - ref).abs().mean())

    rows = C.sensitivity_analysis(model, score, ratios=(0.2, 0.9), keys=keys)
    assert len(rows) == 2 * len(keys)
    for key in keys:
        low, high = (r for r in rows if r.layer == key)
        assert high.drop >= low.drop >= 0.0  # pruning more of one layer hurts more
    best = C.tolerant_ratios(rows, max_drop=1e9)
    assert set(best.values()) == {0.9}
