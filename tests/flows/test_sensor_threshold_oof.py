"""Cross-fitted ``sensor-train``: the failure-alert threshold is calibrated on every validation
block's out-of-fold P(failure), like the RUL choice."""

from __future__ import annotations

from pathlib import Path

import pytest

from solutions.sensor.config import SensorConfig, WindowConfig


def test_cross_fitted_alert_threshold_is_calibrated_out_of_fold(tmp_path: Path) -> None:
    """Cross-fitted, every member and GBM trained on the other blocks' assets: the alert threshold
    is chosen on each block's P(failure) from the models that did not train on it, pooled, not on
    block 0's windows (which members 1 and 2 trained on)."""
    from flows.sensor import steps as st
    from solutions.sensor import evaluate as E
    from solutions.sensor import pipeline as P
    from solutions.sensor.config import SensorSource, SyntheticFleetConfig
    from solutions.sensor.data import build_grid, window_config
    from solutions.sensor.inference import predict
    from tasks.evaluate import choose_threshold

    config = SensorConfig(fleet=SyntheticFleetConfig(n_assets=24, min_life=45, max_life=70, seed=2),
                          window=WindowConfig(length=12, horizon=10))
    source = SensorSource()
    grid, report = build_grid(source, config)
    wcfg = window_config(source, config)
    blocks = [P.supervised_setup(grid, config, wcfg, report, block=b) for b in range(3)]
    members = [P.new_predictor(blocks[b], config, wcfg)[0] for b in range(3)]  # untrained: outputs differ per seed
    oof = st.OutOfFold.of(blocks, members)
    sizes = [len(b.data.val) for b in blocks]
    assert len(oof.fail) == len(oof.network_prob) == sum(sizes) and 0 < oof.fail.sum() < len(oof.fail)
    assert oof.network_prob[: sizes[0]] == pytest.approx(predict(members[0], blocks[0].data.val.x)[1])
    assert oof.network_prob[sizes[0] : sizes[0] + sizes[1]] == pytest.approx(predict(members[1], blocks[1].data.val.x)[1])

    baseline = st.baseline_candidate_step.fn(blocks[0].data, 0, blocks)
    assert baseline.oof_prob is not None and len(baseline.oof_prob) == sum(sizes)
    y, p = st.calibration_set("baseline", oof, baseline)
    assert y is oof.fail and p is baseline.oof_prob
    assert st.calibration_set("cnn", oof, baseline)[1] is oof.network_prob
    assert st.calibration_set("ensemble", oof, baseline)[1] == pytest.approx((oof.network_prob + baseline.oof_prob) / 2)
    assert st.calibration_set("baseline", None, baseline) is None  # one block: its own validation windows
    with pytest.raises(ValueError, match="out-of-fold P"):
        st.calibration_set("baseline", oof, st.BaselineCandidate(baseline.gbm, baseline.predictions))

    # the evaluation takes the pooled set's max-F1 threshold; the bag on block 0 (seen by two of
    # its three GBMs) calls for a different, optimistic one
    data = blocks[0].data
    pooled = st.evaluate_step.fn("gbm", data, baseline.predictions, None, wcfg.horizon, tmp_path,
                                 calibrate=(y, p))
    assert pooled.threshold == pytest.approx(choose_threshold(y, p, method="f1"))
    block0 = choose_threshold(E.fail_labels(data.val), baseline.predictions.prob_val, method="f1")
    assert pooled.threshold != pytest.approx(block0)
