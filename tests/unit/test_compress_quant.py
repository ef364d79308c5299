"""INT8: dynamic quantization shrinks the quantized layers, variants load without pickle."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import tasks.compress as C


class TinySeq(nn.Module):
    """Embedding + Linear + GRU + MLP head over a dict batch (the fraud model's shape)."""

    def __init__(self, hidden: int = 32, mlp: int = 64) -> None:
        super().__init__()
        self.emb = nn.Embedding(6, 4)
        self.proj = nn.Sequential(nn.Linear(9, hidden), nn.ReLU())
        self.gru = nn.GRU(hidden, hidden, batch_first=True)
        self.head = nn.Sequential(nn.Linear(hidden, mlp), nn.ReLU(), nn.Dropout(0.1), nn.Linear(mlp, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        x = torch.cat([batch["x"], self.emb(batch["c"])], dim=-1)
        _, h = self.gru(self.proj(x))
        return self.head(h[-1]).squeeze(-1)


def seq_batch(n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(n, 5, 5, generator=g), "c": torch.randint(0, 6, (n, 5), generator=g)}


@pytest.fixture
def model() -> TinySeq:
    torch.manual_seed(0)
    return TinySeq().eval()


def test_dynamic_int8_shrinks_quantized_layers_at_least_3x(model: TinySeq, tmp_path: Path) -> None:
    qmodel = C.quantize_dynamic_int8(model)
    state = C.int8_state_dict(qmodel)
    size = C.quantized_layer_size(model, state)
    assert set(size.layers) == {"proj.0", "gru", "head.0", "head.3", "head.5"}
    assert size.ratio >= 3.0
    assert state["head.0.weight.__q.int8"].dtype == torch.int8
    fp32 = C.save_state(model.state_dict(), tmp_path / "fp32.safetensors")
    int8 = C.save_state(state, tmp_path / "int8.safetensors")
    assert fp32 / int8 > 2.5  # whole file, embeddings and scales included
    b = seq_batch(64)
    assert torch.allclose(C.call_model(qmodel, b), model(b), atol=0.05)
    with pytest.raises(ValueError, match="cannot quantize"):
        C.quantize_dynamic_int8(model, ["Conv1d"])


def tiny_sensor() -> nn.Module:
    """The sensor 1D-CNN (convs + BatchNorm + Linear heads) seen as one (batch, 2) output."""
    from solutions.sensor.inference import SensorOutputs
    from solutions.sensor.model import SensorRULModel

    return SensorOutputs(SensorRULModel(n_channels=3, channels=8, embedding_dim=16)).eval()


def sensor_batch(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 3, 12, generator=torch.Generator().manual_seed(seed))


def _trained_stats(model: nn.Module) -> nn.Module:
    """Non-default BatchNorm statistics, so a loader that skips them is caught."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm1d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
    return model


VARIANTS = {
    "seq": (TinySeq, seq_batch),
    "sensor": (tiny_sensor, sensor_batch),
}


@pytest.mark.parametrize("arch", list(VARIANTS))
def test_int8_variant_loads_with_weights_only_and_safetensors(arch: str, tmp_path: Path) -> None:
    make, batch = VARIANTS[arch]
    torch.manual_seed(0)
    model = _trained_stats(make().eval())
    qmodel = C.quantize_dynamic_int8(model)
    state = C.int8_state_dict(qmodel)
    torch.save(state, tmp_path / "int8.pt")
    loaded = torch.load(tmp_path / "int8.pt", weights_only=True)  # plain tensors: no pickled code
    C.save_state(state, tmp_path / "int8.safetensors")
    b = batch(33, seed=1)
    expected = C.call_model(qmodel, b)
    assert isinstance(expected, torch.Tensor)  # one output tensor (the sensor heads stacked)
    for st in (loaded, load_file(str(tmp_path / "int8.safetensors"))):
        rebuilt = C.load_int8_state(make(), st)  # fresh random skeleton: every weight comes from st
        assert torch.equal(C.call_model(rebuilt, b), expected)
    # weight-only INT8 (conv kernels included) reloads the same way, without pickle
    wo = C.weight_only_int8_state(model)
    torch.save(wo, tmp_path / "wo.pt")
    for st in (torch.load(tmp_path / "wo.pt", weights_only=True), wo):
        rebuilt = C.load_weight_only_int8(make(), st).eval()
        assert (C.call_model(rebuilt, b) - C.call_model(model, b)).abs().max() < 0.05


def test_sensor_int8_quantizes_linears_only(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = tiny_sensor()
    state = C.int8_state_dict(C.quantize_dynamic_int8(model))
    size = C.quantized_layer_size(model, state)
    assert set(size.layers) == {"encoder.proj.1", "heads.shared.0", "heads.rul", "heads.fail"}
    assert state["encoder.convs.0.0.weight"].dtype == torch.float32  # convs stay fp32 under dynamic INT8
    wo = C.weight_only_int8_state(model)
    assert wo["encoder.convs.0.0.weight.__q.int8"].dtype == torch.int8  # weight-only covers the convs


def test_packed_quantized_state_dict_would_not_load_safely(model: TinySeq, tmp_path: Path) -> None:
    """Why int8_state_dict exists: torch's own quantized state dict needs unpickling."""
    torch.save(C.quantize_dynamic_int8(model).state_dict(), tmp_path / "packed.pt")
    with pytest.raises(Exception, match="(?i)weights only load failed"):
        torch.load(tmp_path / "packed.pt", weights_only=True)


def test_weight_only_int8_round_trip(model: TinySeq, tmp_path: Path) -> None:
    state = C.weight_only_int8_state(model)
    assert state["gru.weight_hh_l0.__q.int8"].dtype == torch.int8 and "emb.weight" in state
    C.save_state(state, tmp_path / "wo.safetensors")
    rebuilt = C.load_weight_only_int8(TinySeq(), load_file(str(tmp_path / "wo.safetensors")))
    b = seq_batch(16)
    assert (rebuilt(b) - model(b)).abs().max() < 0.02
