"""The seed ensemble of sensor CNNs (``FinetuneConfig.members`` > 1): one model whose outputs
are the mean of its members', registered and rebuilt like a single CNN."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from solutions.sensor.config import SensorConfig, WindowConfig
from solutions.sensor.features import RegimeNormalizer
from solutions.sensor.inference import SensorEnsembleOutputs, build_module, predict
from solutions.sensor.model import SensorRULEnsemble, SensorRULModel
from solutions.sensor.pipeline import member_config, model_params, predictor_from_params

HP = {"n_channels": 3, "channels": 8, "embedding_dim": 16, "rul_cap": 100.0, "pooling": "mean", "norm": "none",
      "stats": True}


def _members(n: int) -> list[SensorRULModel]:
    out = []
    for seed in range(n):
        torch.manual_seed(seed)
        out.append(SensorRULModel(**HP).eval())
    return out


def test_the_ensemble_is_the_mean_of_its_members_and_rebuilds_from_its_params() -> None:
    members = _members(3)
    ensemble = SensorRULEnsemble.of(members)
    x = torch.randn(5, 3, 12)
    with torch.no_grad():
        rul, logit = ensemble(x)
        outs = [m(x) for m in members]
    torch.testing.assert_close(rul, torch.stack([o[0] for o in outs]).mean(0))
    torch.testing.assert_close(logit, torch.stack([o[1] for o in outs]).mean(0))
    assert not torch.allclose(outs[0][0], outs[1][0])  # the members differ

    readings = pd.DataFrame(np.random.default_rng(0).normal(size=(40, 3)), columns=["a", "b", "c"])
    params = model_params(ensemble, RegimeNormalizer(1).fit(readings), WindowConfig())
    assert params["architecture"] == "SensorRULEnsemble" and params["hparams"]["members"] == 3
    state = ensemble.state_dict()
    assert any(k.startswith("members.2.encoder.") for k in state)
    again, _, _ = predictor_from_params(params, state)
    np.testing.assert_allclose(predict(again, x.numpy())[0], predict(ensemble, x.numpy())[0], rtol=1e-6)
    assert predict(ensemble, x.numpy())[0].max() <= 100.0  # scaled by the members' RUL cap

    module = build_module(params)  # the plain one-output module (export, variants)
    assert isinstance(module, SensorEnsembleOutputs)
    module.load_state_dict(state)
    with torch.no_grad():
        torch.testing.assert_close(module.eval()(x), torch.stack([rul, logit], dim=-1))


def test_members_of_other_shapes_are_refused_and_member_seeds_follow_the_config() -> None:
    torch.manual_seed(0)
    other = SensorRULModel(**{**HP, "channels": 16})
    with pytest.raises(ValueError, match="member 1 has other hyper-parameters"):
        SensorRULEnsemble.of([_members(1)[0], other])
    config = SensorConfig()
    assert member_config(config, 0) is config
    assert [member_config(config, i).finetune.seed for i in (1, 2)] == [1, 2]
    assert member_config(config, 2).finetune.model_copy(update={"seed": 0}) == config.finetune


def test_an_ensemble_prunes_member_by_member_reloads_and_distils_into_one_cnn() -> None:
    import tasks.compress as C
    from solutions.sensor.compress import ENSEMBLE, prune_plan, student_of
    from solutions.sensor.encoder import N_WINDOW_STATS

    params = {"architecture": ENSEMBLE, "hparams": {"members": 2, "member": HP}}
    module = build_module(params)
    module.load_state_dict(SensorEnsembleOutputs(SensorRULEnsemble.of(_members(2))).state_dict())
    plan = prune_plan("mean", "none", N_WINDOW_STATS * 3, members=2)
    assert len(plan) == 10 and plan[5].producer == "members.1.encoder.convs.0.0"
    pruned, report = C.prune_channels(module.eval(), 0.5, plan)
    assert report.params_after < report.params_before / 2
    assert pruned.members[1].encoder.convs[0][0].out_channels == 4
    x = torch.randn(3, 3, 12)
    again = C.resize_to_state(build_module(params), pruned.state_dict())  # as load_variant rebuilds it
    again.load_state_dict(pruned.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(again.eval()(x), pruned(x))
    student, student_params = student_of(params)
    assert student_params["architecture"] == "SensorRULModel"
    assert student_params["hparams"] == {**HP, "channels": 8, "embedding_dim": 8}  # one CNN, at the minimum sizes
    assert student(x).shape == (3, 2)
