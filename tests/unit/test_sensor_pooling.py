"""The encoder's poolings: mean alone (the default for new models), and models registered
before it (mean + max) that still rebuild and prune."""

from __future__ import annotations

import pytest
import torch

import tasks.compress as C
from solutions.sensor.compress import prune_plan
from solutions.sensor.encoder import SensorEncoder
from solutions.sensor.model import SensorRULModel


@pytest.mark.parametrize(("pooling", "proj_in"), [("mean", 16), ("meanmax", 32), ("meanlast", 32)])
def test_each_pooling_builds_prunes_and_predicts(pooling: str, proj_in: int) -> None:
    torch.manual_seed(0)
    model = SensorRULModel(3, channels=8, embedding_dim=16, pooling=pooling).eval()
    assert model.encoder.proj[1].in_features == proj_in and model.encoder(torch.randn(2, 3, 12)).shape == (2, 16)
    pruned, _ = C.prune_channels(model, 0.5, prune_plan(pooling))
    assert pruned.encoder.proj[1].in_features == proj_in // 2
    rul, logit = pruned(torch.randn(4, 3, 12))
    assert rul.shape == logit.shape == (4,)


def test_models_registered_before_pooling_was_a_setting_keep_mean_and_max() -> None:
    old = {"n_channels": 3, "channels": 8, "embedding_dim": 16, "dropout": 0.1, "rul_cap": 125.0, "fail_weight": 0.5,
           "lr": 2e-3, "pos_weight": 1.0}  # the hparams of a version registered before this change
    model = SensorRULModel(**old)
    assert model.encoder.pooling == "meanmax" and model.hparams.get("input_noise") == 0.0
    with pytest.raises(ValueError, match="unknown pooling"):
        SensorEncoder(3, pooling="max")


def test_encoder_without_batchnorm_builds_prunes_and_keeps_the_state_keys() -> None:
    """``norm="none"`` (the config default): no BatchNorm, the same conv keys as with it,
    recalibration a no-op, and the prune plan without norms; older models keep BatchNorm."""
    from solutions.sensor.config import ModelConfig
    from solutions.sensor.model import recalibrate_batchnorm

    torch.manual_seed(0)
    plain = SensorRULModel(3, channels=8, embedding_dim=16, pooling="mean", norm="none").eval()
    assert ModelConfig().norm == "none"
    assert not any(isinstance(m, torch.nn.BatchNorm1d) for m in plain.modules())
    normed = SensorRULModel(3, channels=8, embedding_dim=16, pooling="mean")  # class default: BatchNorm
    assert any(isinstance(m, torch.nn.BatchNorm1d) for m in normed.modules())
    conv_keys = {k for k in normed.state_dict() if ".convs." in k and k.endswith(".0.weight")}
    assert conv_keys <= set(plain.state_dict())
    x = torch.randn(4, 3, 12)
    before = plain(x)[0]
    recalibrate_batchnorm(plain.encoder, x)
    assert torch.equal(before, plain(x)[0])
    pruned, _ = C.prune_channels(plain, 0.5, prune_plan("mean", "none"))
    assert pruned.encoder.convs[0][0].out_channels == 4 and pruned(x)[0].shape == (4,)
    with pytest.raises(ValueError, match="unknown norm"):
        SensorEncoder(3, norm="layer")


def test_window_stats_are_the_baseline_features() -> None:
    """The encoder's window statistics are the GBM's summary features (slope scaled by the window length)."""
    import numpy as np

    from solutions.sensor.baseline import window_summary_features
    from solutions.sensor.encoder import N_WINDOW_STATS, window_stats

    x = np.random.default_rng(0).normal(size=(5, 3, 12)).astype("float32")
    ours = window_stats(torch.from_numpy(x)).numpy()
    gbm = window_summary_features(x)
    assert ours.shape == gbm.shape == (5, 3 * N_WINDOW_STATS)
    scale = np.ones(3 * N_WINDOW_STATS, dtype="float32")
    scale[5 * 3 : 6 * 3] = 12  # the slope block: per step in the baseline, over the window here
    np.testing.assert_allclose(ours, gbm * scale, rtol=1e-4, atol=1e-5)


def test_encoder_with_window_stats_reads_them_prunes_and_exports(tmp_path) -> None:
    """``stats=True``: the projection reads 7 statistics per input channel after the conv features;
    they change the embedding, pruning keeps them, pre-trained weights load, ONNX gives the same output."""
    import copy

    import numpy as np
    import onnxruntime as ort

    from infra.onnx import export_onnx
    from solutions.sensor.inference import SensorOutputs
    from solutions.sensor.model import MaskedReconstruction

    torch.manual_seed(0)
    model = SensorRULModel(3, channels=8, embedding_dim=16, pooling="mean", norm="none", stats=True).eval()
    assert model.encoder.proj[1].in_features == 16 + 7 * 3
    x = torch.randn(4, 3, 12)
    shifted = x + torch.linspace(0, 1, 12)
    blind = copy.deepcopy(model)
    with torch.no_grad():
        blind.encoder.proj[1].weight[:, 16:] = 0  # the statistics' columns
    assert not torch.allclose(model.encoder(x), blind.encoder(x))
    with pytest.raises(ValueError, match="window's statistics"):
        model.encoder.pool(model.encoder.steps(x))
    pruned, _ = C.prune_channels(model, 0.5, prune_plan("mean", "none", 7 * 3))
    assert pruned.encoder.proj[1].in_features == 8 + 7 * 3 and pruned(x)[0].shape == (4,)
    pre = MaskedReconstruction(3, channels=8, embedding_dim=16, pooling="mean", norm="none", stats=True)
    assert model.load_encoder(pre.state_dict()) > 0
    path, _ = export_onnx(SensorOutputs(model).eval(), x, tmp_path / "m.onnx", input_names=["x"])
    got = ort.InferenceSession(str(path)).run(None, {"x": shifted.numpy()})[0]
    np.testing.assert_allclose(got, SensorOutputs(model).eval()(shifted).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_an_encoder_of_another_shape_is_not_reused(tmp_path) -> None:
    """After the window statistics became the default, an encoder pre-trained without them on the
    same data is passed over (loading it would fail on the projection's shape); one that fits is used."""
    from infra.registry import ModelRegistry
    from solutions.sensor.config import ModelConfig
    from solutions.sensor.model import MaskedReconstruction
    from solutions.sensor.pipeline import encoder_for

    reg = ModelRegistry(tmp_path)
    new, old = ModelConfig(channels=8, embedding_dim=16), ModelConfig(channels=8, embedding_dim=16, window_stats=False)

    def register(stats: bool, data: str) -> None:
        module = MaskedReconstruction(3, channels=8, embedding_dim=16, pooling="mean", norm="none", stats=stats)
        reg.register("enc", module.state_dict(), params={"architecture": "MaskedReconstruction",
                                                         "hparams": dict(module.hparams)},
                     metrics={"val/loss": 1.0}, primary_metric="val/loss", higher_is_better=False, data_hash=data)

    register(False, "h1")
    assert encoder_for(reg, "enc", "h1", new) is None  # the old shape: pre-train anew
    assert encoder_for(reg, "enc", "h1", old).version == 1
    assert encoder_for(reg, "enc", "h1").version == 1  # without a config: as before
    register(True, "h1")
    register(True, "h2")
    found = encoder_for(reg, "enc", "h1", new)
    assert found.version == 2 and SensorRULModel(3, channels=8, embedding_dim=16, pooling="mean", norm="none",
                                                 stats=True).load_encoder(reg.load_state_dict(found)) > 0
