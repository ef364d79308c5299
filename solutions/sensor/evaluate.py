"""Test-protocol predictions and the domain metrics of ``sensor-train`` (plain functions).

The generic metric reports (RMSE/MAE, PR-AUC) come from ``tasks``; this module computes
what only the sensor vertical knows: the predictions on its test protocol, the PHM08 score
and the uncapped RMSE, alert lead times, the registered metric names, the winner against
the baseline and a registered version's predictions on this run's test cuts.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from infra.registry import KIND_SKLEARN, ModelRef, ModelRegistry
from solutions.sensor.baseline import WindowGBM
from solutions.sensor.features import WindowSet, make_windows
from solutions.sensor.inference import predict
from solutions.sensor.model import RULModel
from solutions.sensor.pipeline import SupervisedData, lead_metrics, predictor_from_params, rul_extra
from solutions.sensor.stack import blend_weights

log = logging.getLogger(__name__)

BASELINE_NAME = "baseline (HistGB)"


@dataclass
class TestPredictions:
    """One model's predictions on the ``sensor-train`` test protocol.

    Attributes:
        rul_last: predicted RUL on the last window of each cut test unit.
        prob_val: P(failure within the horizon) on the validation windows.
        prob_all: P(failure) on every window of the failed test assets.
        rul_all: predicted RUL on those windows (trajectories), if computed.
    """

    rul_last: np.ndarray
    prob_val: np.ndarray
    prob_all: np.ndarray
    rul_all: np.ndarray | None = None


def rmse(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Root mean squared error."""
    return float(np.sqrt(np.mean((np.asarray(y_pred, "float64") - np.asarray(y_true, "float64")) ** 2)))


def predict_cnn(model: RULModel, data: SupervisedData) -> TestPredictions:
    """The CNN's predictions on the validation and test windows."""
    rul_last, _ = predict(model, data.test_last.x)
    _, prob_val = predict(model, data.val.x)
    rul_all, prob_all = predict(model, data.test_all.x)
    return TestPredictions(rul_last, prob_val, prob_all, rul_all)


def fit_baseline(train: WindowSet, seed: int) -> WindowGBM:
    """The gradient-boosting baseline on (at most ~4000) training windows' degradation features."""
    step = max(1, len(train) // 4000)
    return WindowGBM(random_state=seed).fit(train.x[::step], train.rul[::step], train.fail[::step],
                                            train.end_step[::step])


def predict_baseline(gbm: WindowGBM, data: SupervisedData) -> TestPredictions:
    """The baseline's predictions on the same windows as the CNN's."""
    return TestPredictions(gbm.predict_rul(data.test_last.x, data.test_last.end_step),
                           gbm.predict_fail_proba(data.val.x, data.val.end_step),
                           gbm.predict_fail_proba(data.test_all.x, data.test_all.end_step))


def rul_metrics(ws: WindowSet, pred: np.ndarray) -> dict[str, float]:
    """Domain RUL metrics beside RMSE/MAE: PHM08 score and RMSE against the uncapped truth."""
    return {**rul_extra(ws.rul, pred), "rmse_uncapped_truth": rmse(ws.rul_raw, pred)}


def fail_labels(ws: WindowSet) -> np.ndarray:
    """Failure-within-horizon labels as 0/1 integers."""
    return ws.fail.astype(int)


def has_both_classes(y: np.ndarray) -> bool:
    """True when ``y`` holds positives and negatives (a threshold or PR-AUC makes sense)."""
    return bool(0 < y.sum() < len(y))


def alerts(data: SupervisedData, pred: TestPredictions, threshold: float, horizon: int) -> dict[str, float]:
    """Lead time of the first alerts on the failed test assets."""
    return lead_metrics(data.test_all, pred.prob_all, threshold, horizon)


def trajectories(ws: WindowSet, pred: np.ndarray, n: int = 3) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(end steps, true RUL, predicted RUL) of the first ``n`` test assets, for a plot."""
    out = {}
    for unit in list(dict.fromkeys(ws.asset))[:n]:
        mask = ws.asset == unit
        out[str(unit)] = (ws.end_step[mask], ws.rul[mask], pred[mask])
    return out


def finite(metrics: Mapping[str, float | None]) -> dict[str, float]:
    """The metrics that are finite numbers (the registry stores no NaN or None)."""
    return {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(v)}


def registry_metrics(rul: Mapping[str, float], alert: Mapping[str, float], failure: Mapping[str, float] | None,
                     baseline_rul: Mapping[str, float] | None, baseline_failure: Mapping[str, float] | None,
                     ) -> dict[str, float]:
    """The metrics registered with a version: the CNN's, then the baseline's under ``baseline/``."""
    metrics = {**rul, **{f"test/{k}": v for k, v in alert.items()}, **(failure or {})}
    metrics.update({f"baseline/{k}": v for k, v in (baseline_rul or {}).items()})
    metrics.update({f"baseline/{k}": v for k, v in (baseline_failure or {}).items()})
    return finite(metrics)


def winner(cnn_rmse: float, baseline_rmse: float | None) -> str:
    """``baseline`` when its test RMSE is lower than the CNN's, else ``cnn``."""
    return "baseline" if baseline_rmse is not None and baseline_rmse < cnn_rmse else "cnn"


def rul_predictions(registry: ModelRegistry, version: ModelRef, data: SupervisedData) -> tuple[np.ndarray, np.ndarray]:
    """(true RUL, a registered version's predicted RUL) on the last window of this run's
    test cuts, each version with its own normaliser and window settings; a GBM or ensemble
    version (skops files) is scored by its GBM (alone or averaged with the CNN)."""
    from solutions.sensor.candidates import load_baseline  # (candidates imports this module)
    from solutions.sensor.pipeline import preprocessing_from_params

    gbm = load_baseline(version)
    if version.kind == KIND_SKLEARN:
        model, (norm, wcfg) = None, preprocessing_from_params(version.params)
    else:
        model, norm, wcfg = predictor_from_params(version.params, registry.load_state_dict(version))
    ws = make_windows(data.test_cut_grid, norm, length=wcfg.length, rul_cap=wcfg.rul_cap, horizon=wcfg.horizon,
                      last_only=True, pad=True).labelled()
    if model is not None and gbm is not None:  # the mean of both, or a stack's weights
        wc, wg = blend_weights(version.params)
        return ws.rul, wc * predict(model, ws.x)[0] + wg * gbm.predict_rul(ws.x, ws.end_step)
    return ws.rul, predict(model, ws.x)[0] if model is not None else gbm.predict_rul(ws.x, ws.end_step)
