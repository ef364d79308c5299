"""Structured channel pruning (Conv1d + BatchNorm, Linear neurons) and caller-given losses."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import tasks.compress as C
from solutions.sensor.compress import PRUNE_PLAN as SENSOR_PRUNE_PLAN
from tests.unit.test_compress_quant import sensor_batch, tiny_sensor


def _silence_half(model: nn.Module) -> list[int]:
    """Make every odd channel / neuron of each plan producer output exactly zero (after its
    norm and activation), so removing exactly those leaves the outputs unchanged."""
    dead = []
    with torch.no_grad():
        for group in SENSOR_PRUNE_PLAN:
            producer = model.get_submodule(group.producer)
            idx = torch.arange(1, producer.weight.shape[0], 2)
            dead.append(len(idx))
            if group.norm:  # BN(x) = gamma * (...) + beta = 0 -> GELU(0) = 0
                bn = model.get_submodule(group.norm)
                bn.weight[idx], bn.bias[idx] = 0.0, 0.0
                bn.weight[~torch.isin(torch.arange(len(bn.weight)), idx)] += 1.0  # clear winners
            else:  # Linear row and bias zero -> 0 (and GELU(0) = 0 after the hidden layer)
                producer.weight[idx], producer.bias[idx] = 0.0, 0.0
    return dead


def test_channel_pruning_removes_the_right_slices_and_shrinks_tensors() -> None:
    torch.manual_seed(0)
    model = tiny_sensor()
    _silence_half(model)
    x = sensor_batch(17)
    before = model(x)
    pruned, report = C.prune_channels(model, 0.5, SENSOR_PRUNE_PLAN)
    # exactly the silent channels went: every output is unchanged (a wrong index would not be)
    torch.testing.assert_close(pruned(x), before, atol=1e-5, rtol=1e-5)
    assert pruned.encoder.convs[0][0].weight.shape == (4, 3, 5)  # 8 -> 4 output channels
    assert pruned.encoder.convs[0][1].running_mean.shape == (4,)  # its BatchNorm follows
    assert pruned.encoder.convs[1][0].weight.shape == (8, 4, 5)  # in 8 -> 4, out 16 -> 8
    assert pruned.encoder.convs[2][0].weight.shape == (8, 8, 3)
    assert pruned.encoder.proj[1].weight.shape == (8, 16)  # mean + max pooling: 2 x 8 inputs, 16 -> 8
    assert pruned.heads.shared[0].weight.shape == (32, 8)  # 64 -> 32 hidden neurons
    assert pruned.heads.rul.weight.shape == pruned.heads.fail.weight.shape == (1, 32)
    assert report.params_after < report.params_before / 2
    assert model.encoder.convs[0][0].weight.shape == (8, 3, 5)  # the original is untouched
    # a fresh full-size model takes the pruned state after resize_to_state
    rebuilt = C.resize_to_state(tiny_sensor(), pruned.state_dict())
    rebuilt.load_state_dict(pruned.state_dict())
    assert torch.equal(rebuilt.eval()(x), pruned(x))


def test_channel_pruning_refuses_a_wrong_plan() -> None:
    model = tiny_sensor()
    wrong = C.ChannelGroup(producer="encoder.convs.2.0", norm="encoder.convs.2.1", consumers=("encoder.proj.1",))
    with pytest.raises(ValueError, match="does not read 1 x 16"):  # proj reads mean + max: repeats=2
        C.prune_channels(model, 0.5, [wrong])
    with pytest.raises(TypeError, match="only Linear and Conv1d"):
        C.prune_channels(model, 0.5, [C.ChannelGroup(producer="encoder.convs.0.1", consumers=())])


def test_predict_wants_one_output_tensor() -> None:
    from solutions.sensor.model import SensorRULModel

    two_heads = SensorRULModel(n_channels=3, channels=8, embedding_dim=16)  # returns (rul, logit)
    with pytest.raises(TypeError, match="not one tensor"):
        C.predict(two_heads, [sensor_batch(4)])
    assert C.predict(tiny_sensor(), [sensor_batch(4)]).shape == (4, 2)


def _regression_batch(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = sensor_batch(n, seed=2)
    return x, x.mean(dim=(1, 2)) * 50 + 60, (x[:, 0, -1] > 0).float()


def _loss(out: torch.Tensor, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    _, rul, fail = batch
    return F.mse_loss(out[:, 0], rul / 125) + F.binary_cross_entropy_with_logits(out[:, 1], fail)


def _soft(s: torch.Tensor, t: torch.Tensor, T: float) -> torch.Tensor:
    return F.mse_loss(s[:, 0], t[:, 0]) + F.binary_cross_entropy_with_logits(s[:, 1] / T, torch.sigmoid(t[:, 1] / T)) * T * T


def test_trainable_and_distiller_use_the_callers_losses() -> None:
    torch.manual_seed(0)
    batch = _regression_batch(128)
    module = tiny_sensor().train()
    trainable = C.make_trainable(module, _loss, lr=1e-2)
    opt = trainable.configure_optimizers()
    first = float(_loss(module(batch[0]), batch))
    for _ in range(40):
        opt.zero_grad()
        trainable.training_step(batch, 0).backward()
        opt.step()
    assert float(_loss(module(batch[0]), batch)) < 0.5 * first  # the plain module itself was trained
    teacher = module.eval()
    student = tiny_sensor()
    with pytest.raises(ValueError, match="both hard_loss and soft_loss"):
        C.make_distiller(student, teacher, hard_loss=_loss)
    distiller = C.make_distiller(student, teacher, temperature=2.0, alpha=0.5, hard_loss=_loss, soft_loss=_soft, lr=1e-2)
    total, soft, hard = distiller.loss(batch)
    assert float(hard) == pytest.approx(float(_loss(student(batch[0]), batch)), rel=1e-5)
    assert float(total) == pytest.approx(0.5 * float(soft) + 0.5 * float(hard), rel=1e-5)
    opt = distiller.configure_optimizers()
    for _ in range(40):
        opt.zero_grad()
        distiller.loss(batch)[0].backward()
        opt.step()
    assert float(distiller.loss(batch)[1]) < float(soft)
