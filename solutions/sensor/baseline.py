"""Gradient-boosting baseline on per-window summary features (scikit-learn contract)."""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted
from threadpoolctl import threadpool_limits


def window_summary_features(x: np.ndarray) -> np.ndarray:
    """(n, channels, time) windows -> (n, channels * 7) summary features."""
    t = np.arange(x.shape[2], dtype="float32")
    tc = (t - t.mean()) / ((t - t.mean()) ** 2).sum()
    feats = [
        x.mean(axis=2), x.std(axis=2), x.min(axis=2), x.max(axis=2), x[:, :, -1],
        (x * tc).sum(axis=2), x[:, :, -5:].mean(axis=2),
    ]
    return np.concatenate(feats, axis=1)


class WindowGBM(BaseEstimator):
    """HistGradientBoosting RUL regressor and failure classifier on window summaries.

    Args:
        learning_rate: kept <= 0.05 (higher rates diverged on our fraud data).
        max_iter: boosting rounds.
        random_state: seed.
        n_threads: OpenMP threads. 1 by default: on 2 shared cores two OpenMP threads
            made the fit 20x slower (83 s instead of 3.6 s) through spin-waiting.
    """

    def __init__(self, learning_rate: float = 0.05, max_iter: int = 200, random_state: int = 0, n_threads: int = 1) -> None:
        self.learning_rate = learning_rate
        self.max_iter = max_iter
        self.random_state = random_state
        self.n_threads = n_threads

    def fit(self, x: np.ndarray, rul: np.ndarray, fail: np.ndarray) -> WindowGBM:
        from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

        f = window_summary_features(x)
        kw = {"learning_rate": self.learning_rate, "max_iter": self.max_iter, "random_state": self.random_state}
        classes = np.unique(fail)
        with threadpool_limits(self.n_threads):
            self.regressor_ = HistGradientBoostingRegressor(**kw).fit(f, rul)
            self.classifier_ = HistGradientBoostingClassifier(**kw).fit(f, fail.astype(int)) if len(classes) > 1 else None
        self.constant_ = float(classes[0]) if len(classes) == 1 else None
        return self

    def predict_rul(self, x: np.ndarray) -> np.ndarray:
        check_is_fitted(self, "regressor_")
        with threadpool_limits(self.n_threads):
            return np.clip(self.regressor_.predict(window_summary_features(x)), 0, None)

    def predict_fail_proba(self, x: np.ndarray) -> np.ndarray:
        check_is_fitted(self, "regressor_")
        if self.classifier_ is None:
            return np.full(len(x), self.constant_)
        with threadpool_limits(self.n_threads):
            return self.classifier_.predict_proba(window_summary_features(x))[:, 1]
