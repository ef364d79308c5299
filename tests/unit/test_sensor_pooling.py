"""The encoder's poolings: mean alone (the default for new models), and models registered
before it (mean + max) that still rebuild and prune."""

from __future__ import annotations

import pytest
import torch

import tasks.compress as C
from solutions.sensor.compress import prune_plan
from solutions.sensor.model import SensorEncoder, SensorRULModel


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
