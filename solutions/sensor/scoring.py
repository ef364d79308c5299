"""Scoring the latest window of each asset with a registered model (plain functions).

:func:`scores_table` turns a grid table into one row per asset: predicted RUL, failure
probability and an alert flag, with the model name and version. The model is either a
registered ``SensorRULModel`` (its weights) or a compressed variant of it, loaded by the
caller (the generic loader lives in ``tasks``) and passed in as a plain module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from torch import nn

from infra.registry import KIND_SKLEARN, ModelRef
from infra.store import safe_stem
from solutions.sensor import schema as S
from solutions.sensor.config import SensorSource
from solutions.sensor.features import make_windows
from solutions.sensor.inference import predict, predict_outputs
from solutions.sensor.model import RULModel
from solutions.sensor.pipeline import predictor_from_params, preprocessing_from_params
from solutions.sensor.schema import BadReadingReport
from solutions.sensor.stack import blend_weights

DEFAULT_THRESHOLD = 0.5
SCORE_COLUMNS = (S.ASSET, S.STEP, "predicted_rul", "failure_probability", "alert", "model", "model_version")


def is_variant(ref: ModelRef) -> bool:
    """True for an INT8 / pruned / distilled variant registered by the compress flow."""
    return "compression" in ref.params


def alert_threshold(ref: ModelRef, threshold: float | None) -> float:
    """The given threshold, else the one chosen at training (stored with the model)."""
    return float(threshold if threshold is not None else ref.params.get("threshold", DEFAULT_THRESHOLD))


def units_to_score(grid: pd.DataFrame, source: SensorSource) -> pd.DataFrame:
    """What to score: the test units of a C-MAPSS folder (every unit of a folder with the
    train file only), every asset otherwise."""
    test = grid[S.SET] == "test"
    return grid.loc[test] if source.cmapss_dir and test.any() else grid


def scores_table(ref: ModelRef, grid: pd.DataFrame, threshold: float, report: BadReadingReport | None = None, *,
                 state_dict: dict | None = None, variant: nn.Module | None = None,
                 net: RULModel | None = None, baseline: Any = None,
                 ) -> tuple[pd.DataFrame, BadReadingReport | None]:
    """Predicted RUL, failure probability and alert flag of each asset's latest window.

    Args:
        ref: the registered model (its params carry the normaliser and window settings).
        grid: the grid table to score.
        threshold: alert when P(failure) is at or above it.
        report: the grid's bad readings; a copy comes back with the assets padded to one window.
        state_dict: the weights of a registered ``SensorRULModel`` (or ``SensorRULEnsemble``).
        variant: a compressed variant as a plain module (instead of ``state_dict``).
        net: the registered model already loaded (the online path keeps it loaded).
        baseline: the version's GBM (``solutions.sensor.candidates.load_baseline``) for a version
            of kind ``sklearn-skops`` (alone) or ``torch+sklearn-skops`` (outputs averaged).
    """
    report = report.model_copy(deep=True) if report is not None else None
    gbm_only = ref.kind == KIND_SKLEARN
    if gbm_only and baseline is None:
        raise ValueError(f"{ref.spec} is a GBM: scores_table needs its baseline")
    if variant is not None or net is not None or gbm_only:
        norm, wcfg = preprocessing_from_params(ref.params)
    else:
        if state_dict is None:
            raise ValueError("scores_table needs the model's state_dict or a variant module")
        net, norm, wcfg = predictor_from_params(ref.params, state_dict)
    ws = make_windows(grid, norm, length=wcfg.length, rul_cap=wcfg.rul_cap, horizon=wcfg.horizon,
                      last_only=True, pad=True, report=report)
    if gbm_only:
        rul, prob = baseline.predict_rul(ws.x, ws.end_step), baseline.predict_fail_proba(ws.x, ws.end_step)
    elif variant is not None:
        rul, prob = predict_outputs(variant, ws.x, float(ref.params["hparams"].get("rul_cap", wcfg.rul_cap)))
    else:
        rul, prob = predict(net, ws.x)
    if baseline is not None and not gbm_only:  # an ensemble: the mean of both, or a stack's weights
        wc, wg = blend_weights(ref.params)
        rul = wc * np.asarray(rul) + wg * baseline.predict_rul(ws.x, ws.end_step)
        prob = (wc * np.asarray(prob) + wg * baseline.predict_fail_proba(ws.x, ws.end_step)) / max(wc + wg, 1e-12)
    frame = pd.DataFrame({
        S.ASSET: ws.asset.astype(str), S.STEP: ws.end_step, "predicted_rul": rul, "failure_probability": prob,
        "alert": np.asarray(prob) >= threshold, "model": ref.name, "model_version": ref.version,
    })
    return frame, report


def default_scores_path(folder: Path, source: SensorSource, ref: ModelRef) -> Path:
    """``<folder>/<input>-<model>-v<version>.parquet`` for a one-off scoring run."""
    named = source.data or (f"cmapss-{source.subset.lower()}" if source.cmapss_dir else "synthetic-fleet")
    return folder / f"{safe_stem(named)}-{ref.name}-v{ref.version}.parquet"


def batch_scores_path(folder: Path, data: Path, sha256: str, ref: ModelRef) -> Path:
    """``<folder>/<file stem>-<content hash>-<model>-v<version>.parquet`` for an inbox file."""
    return folder / f"{safe_stem(data)}-{sha256[:12]}-{ref.name}-v{ref.version}.parquet"


def bad_readings_beside(scores: Path) -> Path:
    """Where the bad-reading counts of a score file's input are written beside it."""
    return scores.with_suffix(".bad-readings.json")
