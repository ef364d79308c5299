"""Degradation features of sensor windows, the GBM learners and the out-of-fold stack."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from solutions.sensor.degradation import GROUPS, DegradationFeatures, ewma_weights, slope_weights
from solutions.sensor.stack import fit_stack


def _windows(n: int = 400, channels: int = 3, length: int = 30, seed: int = 0) -> tuple[np.ndarray, ...]:
    """Windows whose channels drift down as RUL falls, with noise; their RUL and end steps."""
    rng = np.random.default_rng(seed)
    rul = rng.uniform(0, 160, size=n)
    t = np.arange(length)[::-1]
    drift = -np.minimum(rul[:, None] + t[None, :], 125) / 125  # (n, length): healthier further back
    x = drift[:, None, :] * rng.uniform(0.5, 1.5, size=(1, channels, 1)) + 0.3 * rng.normal(size=(n, channels, length))
    steps = rng.integers(0, 300, size=n)
    return x.astype("float32"), np.minimum(rul, 125), steps


def test_ewma_and_slope_weights_match_pandas_and_polyfit() -> None:
    series = np.random.default_rng(1).normal(size=40)
    for span in (5, 10, 20):
        expected = pd.Series(series).ewm(span=span).mean().iloc[-1]
        assert float(series @ ewma_weights(40, span)) == pytest.approx(expected, rel=1e-5)
    for scale in (10, 30, 60):  # 60 > the series: the whole series
        s = min(scale, 40)
        assert float(series @ slope_weights(40, scale)) == pytest.approx(np.polyfit(np.arange(s), series[-s:], 1)[0], rel=1e-4)


def test_each_group_adds_its_columns_and_age_needs_steps() -> None:
    x, rul, steps = _windows()
    full = DegradationFeatures().fit(x, rul, steps)
    n_all = full.transform(x, steps).shape[1]
    # per channel: last 2, ewma 3, slope 4, stats 2x4 + 2; age 1; health: 2 + 3 + 4 + 10 of its own series
    assert n_all == 3 * (2 + 3 + 4 + 10) + 1 + 19
    for group in GROUPS:
        without = DegradationFeatures(tuple(g for g in GROUPS if g != group)).fit(x, rul, steps)
        assert without.transform(x, steps).shape[1] < n_all
    assert np.array_equal(full.transform(x, steps)[:, 3 * 19], steps.astype("float32"))  # the age column
    with pytest.raises(ValueError, match="end step"):
        full.transform(x)
    with pytest.raises(ValueError, match="unknown degradation feature group"):
        DegradationFeatures(("last", "wavelets")).fit(x, rul)
    with pytest.raises(ValueError, match="pass y"):
        DegradationFeatures(("health",)).fit(x)
    with pytest.raises(ValueError, match=r"expected windows \(n, 3, length\)"):
        full.transform(x[:, :2], steps)


def test_the_health_index_tracks_rul_and_survives_json() -> None:
    x, rul, _ = _windows()
    feats = DegradationFeatures(("health",)).fit(x, rul)
    hi_last = feats.transform(x)[:, 0]
    assert np.corrcoef(hi_last, rul)[0, 1] > 0.8  # fitted on these windows: 1 healthy, 0 failed
    x2, _, _ = _windows(seed=5)
    again = DegradationFeatures.from_dict(feats.to_dict())
    assert np.array_equal(again.transform(x2), feats.transform(x2))


def test_a_gbm_on_degradation_features_beats_window_summaries_on_drifting_windows() -> None:
    from solutions.sensor.baseline import WindowGBM

    x, rul, steps = _windows(n=900)
    fail = (rul <= 30).astype(float)
    xt, rult, stepst = _windows(n=400, seed=9)
    errors = {}
    for name, groups in (("summary", None), ("degradation", GROUPS)):
        gbm = WindowGBM(max_iter=60, features=groups).fit(x, rul, fail, steps)
        errors[name] = float(np.sqrt(np.mean((gbm.predict_rul(xt, stepst) - rult) ** 2)))
        assert gbm.predict_fail_proba(xt, stepst).shape == (400,)
    assert errors["degradation"] < errors["summary"]


@pytest.mark.parametrize("learner", ["lightgbm", "xgboost"])
def test_other_learners_fit_and_are_not_registered(learner: str, tmp_path) -> None:
    pytest.importorskip(learner)
    from solutions.sensor import candidates as CA
    from solutions.sensor.baseline import WindowGBM

    x, rul, steps = _windows(n=300)
    gbm = WindowGBM(max_iter=20, learner=learner).fit(x, rul, (rul <= 30).astype(float), steps)
    assert gbm.predict_rul(x, steps).shape == (300,) and (gbm.predict_rul(x, steps) >= 0).all()
    with pytest.raises(ValueError, match="only HistGradientBoosting"):
        CA.baseline_files(gbm, tmp_path)


def test_unknown_learner_is_named() -> None:
    from solutions.sensor.baseline import WindowGBM

    x, rul, steps = _windows(n=50)
    with pytest.raises(ValueError, match="unknown learner 'catboost'"):
        WindowGBM(learner="catboost").fit(x, rul, (rul <= 30).astype(float), steps)


def test_the_stack_weighs_candidates_out_of_fold_and_drops_a_useless_one() -> None:
    rng = np.random.default_rng(3)
    truth = rng.uniform(0, 125, size=500)
    good, fair = truth + rng.normal(0, 5, 500), truth + rng.normal(0, 12, 500)
    useless = 125 - truth  # anti-correlated: a non-negative weight of 0
    stack = fit_stack({"good": good, "fair": fair, "useless": useless}, truth)
    assert stack.weights["good"] > stack.weights["fair"] > 0 and stack.weights["useless"] == 0
    blended = stack.predict({"good": good, "fair": fair})  # a zero-weight candidate is not needed
    assert np.sqrt(np.mean((blended - truth) ** 2)) < np.sqrt(np.mean((good - truth) ** 2))
    with pytest.raises(ValueError, match="needs the predictions of"):
        stack.predict({"good": good})
    with pytest.raises(ValueError, match="500 out-of-fold predictions against 3"):
        fit_stack({"good": good}, truth[:3])


def test_the_stack_competes_with_a_nested_score_and_a_registered_stack_keeps_its_weights() -> None:
    from solutions.sensor import candidates as CA
    from solutions.sensor.stack import blend_weights, nested_stack

    rng = np.random.default_rng(4)
    truth = rng.uniform(0, 125, size=600)
    block = np.repeat([0, 1, 2], 200)
    cnn, gbm = truth + rng.normal(0, 14, 600), truth + rng.normal(0, 7, 600)  # the GBM is the better one
    fitted, nested = nested_stack({"cnn": cnn, "baseline": gbm}, truth, block)
    assert fitted.weights["baseline"] > 2 * fitted.weights["cnn"] > 0
    # block 0's nested predictions come from weights fitted on blocks 1 and 2 only
    other = fit_stack({"cnn": cnn[200:], "baseline": gbm[200:]}, truth[200:])
    assert nested[:200] == pytest.approx(other.predict({"cnn": cnn[:200], "baseline": gbm[:200]}))
    choice = CA.choose_on_validation(truth, cnn, gbm, block=block)
    assert choice.winner == CA.STACK and choice.kind == CA.KINDS[CA.ENSEMBLE]
    assert choice.val_rmse[CA.STACK] < min(choice.val_rmse[CA.BASELINE], choice.val_rmse[CA.ENSEMBLE])
    assert set(choice.stack) == {"cnn", "baseline"}
    # one block: no stack (nothing to score it on honestly)
    assert CA.STACK not in CA.choose_on_validation(truth, cnn, gbm).val_rmse
    assert blend_weights({"stack": choice.stack}) == (choice.stack["cnn"], choice.stack["baseline"])
    assert blend_weights({}) == (0.5, 0.5)  # an ensemble registered before stacks: the mean
