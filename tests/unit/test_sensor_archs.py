"""The encoder trunks (``arch``: cnn, tcn, transformer): each trains a few steps on CPU,
pre-trains, rebuilds from registry params, prunes, quantises and exports like the CNN."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tasks.compress as C
from infra.registry import ModelRegistry
from solutions.sensor.compress import prune_plan
from solutions.sensor.config import ModelConfig
from solutions.sensor.encoder import SensorEncoder
from solutions.sensor.inference import SensorOutputs, build_module, predict
from solutions.sensor.model import MaskedReconstruction, SensorRULEnsemble, SensorRULModel, random_mask
from solutions.sensor.pipeline import encoder_fits

ARCHS = ("cnn", "tcn", "transformer")
HP = {"n_channels": 3, "channels": 8, "embedding_dim": 16, "pooling": "mean", "norm": "none", "stats": True,
      "rul_cap": 50.0}


def _windows(n: int = 64, t: int = 20) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, t, generator=g)
    rul = (x[:, 0, -5:].mean(1).sigmoid() * 50.0).detach()  # learnable from the window's end
    return x, rul


@pytest.mark.parametrize("arch", ARCHS)
def test_each_arch_trains_a_few_steps_and_keeps_any_window_length(arch: str) -> None:
    torch.manual_seed(0)
    model = SensorRULModel(**HP, arch=arch)
    x, rul = _windows()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    losses = []
    for _ in range(15):
        pred, _ = model(x)
        loss = torch.nn.functional.mse_loss(pred, rul / 50.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    model.eval()
    for t in (7, 20, 61):  # padded short windows, a length that is no multiple of the patch
        assert model(torch.randn(2, 3, t))[0].shape == (2,)
    # per-step features keep the time axis, so masked reconstruction's decoder fits every trunk
    assert model.encoder.steps(x[:2]).shape == (2, model.encoder.step_dim, 20)


@pytest.mark.parametrize("arch", ARCHS)
def test_pretrained_encoder_of_each_arch_loads_into_its_predictor(arch: str) -> None:
    torch.manual_seed(0)
    pre = MaskedReconstruction(3, channels=8, embedding_dim=16, pooling="mean", norm="none", stats=True, arch=arch)
    x, _ = _windows()
    mask = random_mask(tuple(x.shape), 0.3, 0.15, torch.Generator().manual_seed(0))
    recon = pre(x, mask)
    assert recon.shape == x.shape and torch.isfinite(((recon - x) ** 2)[mask].mean())
    assert SensorRULModel(**HP, arch=arch).load_encoder(pre.state_dict()) > 0
    with pytest.raises(RuntimeError):  # another trunk's weights do not fit
        SensorRULModel(**HP, arch="cnn" if arch != "cnn" else "tcn").load_encoder(pre.state_dict())


def test_an_unknown_arch_is_refused_and_old_params_build_a_cnn() -> None:
    with pytest.raises(ValueError, match="unknown arch"):
        SensorEncoder(3, arch="lstm")
    old = {k: v for k, v in dict(SensorRULModel(**HP).hparams).items() if k != "arch"}  # registered before arch
    assert SensorRULModel(**old).encoder.arch == "cnn"
    assert ModelConfig().arch == "cnn"
    hp = {"hparams": dict(MaskedReconstruction(3, channels=8, embedding_dim=16, pooling="mean", norm="none",
                                               stats=True, arch="tcn").hparams)}
    assert encoder_fits(hp, ModelConfig(channels=8, embedding_dim=16, arch="tcn"))
    assert not encoder_fits(hp, ModelConfig(channels=8, embedding_dim=16))


@pytest.mark.parametrize("arch", ARCHS)
def test_each_arch_round_trips_the_registry_and_compresses(arch: str, tmp_path) -> None:
    import onnxruntime as ort

    from infra.onnx import export_onnx

    torch.manual_seed(0)
    model = SensorRULModel(**HP, arch=arch).eval()
    x, _ = _windows(8)
    reg = ModelRegistry(tmp_path)
    params = {"architecture": "SensorRULModel", "hparams": dict(model.hparams)}
    ref = reg.register("m", model.state_dict(), params=params, metrics={"test/rmse": 1.0},
                       primary_metric="test/rmse", higher_is_better=False)
    module = build_module(ref.params)  # the compress / serve rebuild
    module.load_state_dict(reg.load_state_dict(ref))
    module.eval()
    want = SensorOutputs(model).eval()(x).detach()
    torch.testing.assert_close(module(x).detach(), want)
    np.testing.assert_allclose(predict(model, x.numpy())[0], (want[:, 0].clamp(0, 1) * 50.0).numpy(), rtol=1e-5)
    path, _ = export_onnx(module, x, tmp_path / "m.onnx", input_names=["x"])
    got = ort.InferenceSession(str(path)).run(None, {"x": x.numpy()})[0]
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)
    pruned, _ = C.prune_channels(model, 0.5, prune_plan("mean", "none", 7 * 3, arch=arch))
    assert pruned.encoder.proj[1].out_features == 8 and pruned(x)[0].shape == (8,)
    quant = torch.ao.quantization.quantize_dynamic(SensorOutputs(model).eval(), {torch.nn.Linear}, dtype=torch.qint8)
    assert quant(x).shape == (8, 2)
    ensemble = SensorRULEnsemble.of([model, model])
    torch.testing.assert_close(ensemble(x)[0], model(x)[0])
