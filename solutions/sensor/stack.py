"""A stack of RUL candidates: non-negative ridge weights fitted on their out-of-fold predictions.

The candidates' predictions on the validation blocks, each block predicted by the members that
did not train on it (the cross-fitting of ``sensor-train``), are the meta-learner's training
set; the held-out or scored windows only ever see the fitted weights. Non-negative weights and
no intercept keep the stack a weighted mean-like blend of the candidates (a negative weight or a
shift fitted on ~36 engines overfits them: ``bench/results/sensor_cv_cross_fit`` measured a fitted
recalibration that gained nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Stack:
    """Fitted stack weights, one per candidate name."""

    weights: dict[str, float]

    def predict(self, predictions: Mapping[str, np.ndarray]) -> np.ndarray:
        """The weighted sum of the candidates' predictions (every weighted candidate is needed)."""
        missing = [n for n, w in self.weights.items() if w > 0 and n not in predictions]
        if missing:
            raise ValueError(f"the stack needs the predictions of {missing}")
        return np.sum([w * np.asarray(predictions[n], dtype="float64") for n, w in self.weights.items() if w > 0], axis=0)

    def rounded(self, digits: int = 3) -> dict[str, float]:
        """The weights rounded, for a report."""
        return {n: round(w, digits) for n, w in self.weights.items()}


def fit_stack(oof: Mapping[str, np.ndarray], truth: np.ndarray, alpha: float = 1.0) -> Stack:
    """Non-negative ridge weights (no intercept) of the candidates' out-of-fold predictions ``oof``
    against the capped RUL ``truth`` of the same windows.

    Raises:
        ValueError: no candidate, or predictions and truth of different lengths.
    """
    from sklearn.linear_model import Ridge

    names = list(oof)
    if not names:
        raise ValueError("a stack needs at least one candidate")
    x = np.column_stack([np.asarray(oof[n], dtype="float64") for n in names])
    y = np.asarray(truth, dtype="float64")
    if len(x) != len(y):
        raise ValueError(f"{len(x)} out-of-fold predictions against {len(y)} truths")
    coef = Ridge(alpha=alpha, positive=True, fit_intercept=False).fit(x, y).coef_
    return Stack({n: float(c) for n, c in zip(names, coef, strict=True)})


def nested_stack(oof: Mapping[str, np.ndarray], truth: np.ndarray, block: np.ndarray,
                 alpha: float = 1.0) -> tuple[Stack, np.ndarray]:
    """The stack fitted on every block's out-of-fold predictions, and its honest validation
    predictions: block ``b``'s by weights fitted on the other blocks only (the weights never see
    the rows they are scored on). Unknown truths (NaN) are left out of the fits."""
    block = np.asarray(block)
    known = ~np.isnan(np.asarray(truth, dtype="float64"))
    nested = np.zeros(len(block))
    for b in np.unique(block):
        train = known & (block != b)
        weights = fit_stack({n: np.asarray(p)[train] for n, p in oof.items()}, np.asarray(truth)[train], alpha)
        nested[block == b] = weights.predict({n: np.asarray(p)[block == b] for n, p in oof.items()})
    return fit_stack({n: np.asarray(p)[known] for n, p in oof.items()}, np.asarray(truth)[known], alpha), nested


def blend_weights(params: Mapping[str, object]) -> tuple[float, float]:
    """(network, GBM) weights of a registered network + GBM version's RUL: its stack's when it was
    registered as one (``params["stack"]``), else the plain mean (0.5, 0.5)."""
    stack = params.get("stack") or {}
    if not isinstance(stack, Mapping) or not stack:
        return 0.5, 0.5
    return float(stack.get("cnn", 0.0)), float(stack.get("baseline", 0.0))
