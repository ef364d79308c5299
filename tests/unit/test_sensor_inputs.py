"""Inputs of the sensor models: the optional age channel of the normaliser (steps since the
asset's first reading, z-scored with the training assets' statistics only, kept through the
registry's JSON, carried by the left-padded window of an asset shorter than the window), and
held-out assets cut as the data's protocol says whatever the window length."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from infra.errors import DataValidationError
from solutions.sensor import crossval as CV
from solutions.sensor import pipeline as P
from solutions.sensor import schema as S
from solutions.sensor.config import SensorConfig, WindowConfig
from solutions.sensor.features import AGE_CHANNEL, RegimeNormalizer, make_windows


def _asset(name: str, life: int, rng: np.random.Generator, s1_shift: float = 0.0) -> pd.DataFrame:
    step = np.arange(life)
    return pd.DataFrame({
        S.ASSET: name, S.STEP: step, "s1": 10 + step / life + rng.normal(0, 0.05, life) + s1_shift,
        "s2": 5 - step / life + rng.normal(0, 0.05, life), S.RUL: (life - 1 - step).astype(float),
        S.FAILED: True, S.FAILURE_TYPE: "wear", S.SET: "train",
    })


def test_age_channel_is_last_and_uses_the_fitted_assets_statistics() -> None:
    rng = np.random.default_rng(0)
    train = pd.concat([_asset("a", 40, rng), _asset("b", 60, rng)], ignore_index=True)
    other = _asset("long", 300, rng)  # a much longer asset the normaliser must not see
    norm = RegimeNormalizer(1, age=True).fit(train)
    assert norm.channels_ == ["s1", "s2", AGE_CHANNEL]
    steps = train[S.STEP].to_numpy(dtype="float64")
    assert norm.age_mean_ == pytest.approx(steps.mean()) and norm.age_std_ == pytest.approx(steps.std())
    x = norm.transform(other)
    expected = np.clip((other[S.STEP].to_numpy() - steps.mean()) / steps.std(), -10, 10)
    np.testing.assert_allclose(x[:, -1], expected, rtol=1e-5)
    # the sensor channels are the same with and without the age channel
    np.testing.assert_allclose(x[:, :2], RegimeNormalizer(1).fit(train).transform(other), rtol=1e-6)
    # the registry's JSON keeps it; a normaliser stored before the channel existed has none
    again = RegimeNormalizer.from_dict(norm.to_dict())
    np.testing.assert_array_equal(again.transform(other), x)
    old = {k: v for k, v in RegimeNormalizer(1).fit(train).to_dict().items() if not k.startswith("age")}
    assert RegimeNormalizer.from_dict(old).channels_ == ["s1", "s2"]
    with pytest.raises(DataValidationError, match="step"):
        norm.transform(other.drop(columns=[S.STEP]))


def test_fold_normaliser_age_ignores_held_out_assets_and_pads_short_ones() -> None:
    rng = np.random.default_rng(1)
    grid = pd.concat([_asset(f"e{i}", int(rng.integers(40, 60)), rng) for i in range(11)]
                     + [_asset("e11", 400, rng)], ignore_index=True)
    wcfg = WindowConfig(length=30, stride=1, n_regimes=1, test_cuts=2, age_channel=True)
    splits = {"train": [f"e{i}" for i in range(8)], "val": ["e8", "e9"], "test": ["e10", "e11"]}
    fd = CV.fold_data(grid, splits, SensorConfig(), wcfg)
    fitted = grid.loc[grid[S.ASSET].isin(splits["train"] + splits["val"]), S.STEP]
    assert fd.normalizer.age_mean_ == pytest.approx(fitted.mean())  # the 400-step test asset left out
    assert fd.data.train.x.shape[1] == 3
    # a test asset cut shorter than the window: left-padded with its first row, age included
    short = _asset("short", 12, rng)
    ws = make_windows(short, fd.normalizer, length=30, last_only=True, pad=True)
    age = ws.x[0, -1]
    first = (0 - fd.normalizer.age_mean_) / fd.normalizer.age_std_
    np.testing.assert_allclose(age[:19], first, rtol=1e-5)
    np.testing.assert_allclose(age[18:], (np.arange(12) - fd.normalizer.age_mean_) / fd.normalizer.age_std_, rtol=1e-5)


def test_test_cuts_do_not_depend_on_a_longer_window() -> None:
    rng = np.random.default_rng(2)
    grid = pd.concat([_asset(f"e{i}", int(rng.integers(45, 70)), rng) for i in range(12)], ignore_index=True)
    splits = {"train": [f"e{i}" for i in range(8)], "val": ["e8", "e9"], "test": ["e10", "e11"]}
    cuts = {}
    for length in (P.TEST_MIN_STEPS, 50):
        wcfg = WindowConfig(length=length, stride=1, n_regimes=1, test_cuts=6)
        data = CV.fold_data(grid, splits, SensorConfig(), wcfg, seed=3).data
        cuts[length] = sorted(data.test_cut_grid.groupby(S.ASSET).size().tolist())
        assert len(data.test_last) == 12 and data.test_last.x.shape[2] == length
    # the same cut units for both windows; the 50-step window left-pads the ones shorter than it
    assert cuts[50] == cuts[P.TEST_MIN_STEPS] and min(cuts[50]) >= P.TEST_MIN_STEPS and min(cuts[50]) < 50


def test_val_cuts_score_the_last_window_of_random_cuts_and_feed_early_stopping() -> None:
    rng = np.random.default_rng(4)
    grid = pd.concat([_asset(f"e{i}", int(rng.integers(80, 120)), rng) for i in range(12)], ignore_index=True)
    splits = {"train": [f"e{i}" for i in range(8)], "val": ["e8", "e9"], "test": ["e10", "e11"]}
    plain = CV.fold_data(grid, splits, SensorConfig(), WindowConfig(length=30, stride=1, n_regimes=1, val_cuts=0),
                         seed=3).data
    assert plain.val_cut is None and plain.rul_val is plain.val
    wcfg = WindowConfig(length=30, stride=1, n_regimes=1, val_cuts=5)
    data = CV.fold_data(grid, splits, SensorConfig(), wcfg, seed=3).data
    # 5 cuts of each of the 2 validation assets, one (last) window each; the truth is the RUL at the cut
    assert len(data.val_cut) == 10 and data.rul_val is data.val_cut
    assert sorted(set(data.val_cut.asset)) == [f"e{a}@{k}" for a in (8, 9) for k in range(1, 6)]
    assert data.val_cut.rul.min() >= 1 and len(set(data.val_cut.rul.tolist())) > 2
    # every validation window is still there for the failure-alert threshold; training and test are unchanged
    np.testing.assert_array_equal(data.val.x, plain.val.x)
    np.testing.assert_array_equal(data.test_last.x, plain.test_last.x)
    np.testing.assert_array_equal(data.train.x, plain.train.x)
    assert data.window_counts()["val_cut"] == 10
    # the supervised model's datamodule early-stops on the cut windows
    setup = P.SupervisedSetup(splits, splits["train"], CV.fold_data(grid, splits, SensorConfig(), wcfg).normalizer,
                              data, None)  # type: ignore[arg-type]
    _, dm = P.new_predictor(setup, SensorConfig(), wcfg)
    assert len(dm.val_dataloader().dataset) == 10
