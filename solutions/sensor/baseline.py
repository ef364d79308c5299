"""Gradient-boosting RUL models on per-window features (scikit-learn contract): HistGradientBoosting
by default, LightGBM or XGBoost (the ``boost`` extra) as further candidates of a stack."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted
from threadpoolctl import threadpool_limits

from solutions.sensor.degradation import GROUPS, DegradationFeatures

#: the boosting libraries a :class:`WindowGBM` can fit with
LEARNERS: tuple[str, ...] = ("hgb", "lightgbm", "xgboost")
#: the feature groups of the default GBM (:mod:`solutions.sensor.degradation`): every group but the
#: multi-scale statistics, which cost 0.85 RMSE on C-MAPSS FD001 (engine-split CV, split 0: HGB on
#: every group 11.13, without ``stats`` 10.28; bench/results/sensor_cv_features/NOTES.md)
DEFAULT_FEATURES: tuple[str, ...] = tuple(g for g in GROUPS if g != "stats")


def window_summary_features(x: np.ndarray) -> np.ndarray:
    """(n, channels, time) windows -> (n, channels * 7) summary features."""
    t = np.arange(x.shape[2], dtype="float32")
    tc = (t - t.mean()) / ((t - t.mean()) ** 2).sum()
    feats = [
        x.mean(axis=2), x.std(axis=2), x.min(axis=2), x.max(axis=2), x[:, :, -1],
        (x * tc).sum(axis=2), x[:, :, -5:].mean(axis=2),
    ]
    return np.concatenate(feats, axis=1)


def make_regressor(learner: str, learning_rate: float, max_iter: int, random_state: int, n_threads: int) -> Any:
    """An unfitted boosted-trees regressor of ``learner`` (:data:`LEARNERS`), one thread by default.

    Raises:
        ValueError: an unknown learner.
        ImportError: LightGBM or XGBoost is not installed (``pip install 'indusflow[boost]'``).
    """
    if learner == "hgb":
        from sklearn.ensemble import HistGradientBoostingRegressor

        return HistGradientBoostingRegressor(learning_rate=learning_rate, max_iter=max_iter, random_state=random_state)
    common = {"n_estimators": max_iter, "learning_rate": learning_rate, "subsample": 0.8, "colsample_bytree": 0.5,
              "random_state": random_state, "n_jobs": n_threads}
    try:
        if learner == "lightgbm":
            from lightgbm import LGBMRegressor

            return LGBMRegressor(num_leaves=31, subsample_freq=1, verbose=-1, **common)
        if learner == "xgboost":
            from xgboost import XGBRegressor

            return XGBRegressor(max_depth=6, tree_method="hist", **common)
    except ImportError as exc:
        raise ImportError(f"the {learner} learner needs the boost extra: pip install 'indusflow[boost]' ({exc})") from exc
    raise ValueError(f"unknown learner {learner!r}; choose from {list(LEARNERS)}")


class WindowGBM(BaseEstimator):
    """A boosted-trees RUL regressor and an HGB failure classifier on per-window features.

    Args:
        learning_rate: kept <= 0.05 (higher rates diverged on our fraud data).
        max_iter: boosting rounds.
        random_state: seed.
        n_threads: OpenMP threads. 1 by default: on 2 shared cores two OpenMP threads
            made the fit 20x slower (83 s instead of 3.6 s) through spin-waiting.
        learner: the RUL regressor's library (:data:`LEARNERS`).
        features: the degradation feature groups (:class:`DegradationFeatures`, fitted on the
            training windows); None: the old seven window statistics per channel.
    """

    def __init__(self, learning_rate: float = 0.05, max_iter: int = 200, random_state: int = 0, n_threads: int = 1,
                 learner: str = "hgb", features: Sequence[str] | None = DEFAULT_FEATURES) -> None:
        self.learning_rate = learning_rate
        self.max_iter = max_iter
        self.random_state = random_state
        self.n_threads = n_threads
        self.learner = learner
        self.features = features

    def fit(self, x: np.ndarray, rul: np.ndarray, fail: np.ndarray, steps: np.ndarray | None = None,
            classify: bool = True) -> WindowGBM:
        """Fit on windows ``x``, their capped RUL and failure labels; ``steps``: each window's end
        step (the ``age`` feature); ``classify=False`` skips the failure classifier."""
        from sklearn.ensemble import HistGradientBoostingClassifier

        self.features_ = None if self.features is None else DegradationFeatures(tuple(self.features)).fit(x, rul, steps)
        f = self._features(self.features_, x, steps)
        classes = np.unique(fail)
        with threadpool_limits(self.n_threads):
            self.regressor_ = make_regressor(self.learner, self.learning_rate, self.max_iter, self.random_state,
                                             self.n_threads).fit(f, rul)
            self.classifier_ = HistGradientBoostingClassifier(
                learning_rate=self.learning_rate, max_iter=self.max_iter, random_state=self.random_state,
            ).fit(f, fail.astype(int)) if classify and len(classes) > 1 else None
        # one class seen (or no classifier asked for): P(failure) is the training share
        self.constant_ = None if self.classifier_ is not None else float(np.mean(fail))
        return self

    @staticmethod
    def _features(transformer: DegradationFeatures | None, x: np.ndarray, steps: np.ndarray | None) -> np.ndarray:
        return window_summary_features(x) if transformer is None else transformer.transform(x, steps)

    @classmethod
    def bag(cls, models: list[WindowGBM]) -> WindowGBM:
        """One GBM whose predictions are the mean of ``models``' (fitted, e.g. each on another
        block of assets): the first model with the others kept in ``bag_``."""
        if not models:
            raise ValueError("a bag needs at least one fitted GBM")
        first = models[0]
        out = cls(first.learning_rate, first.max_iter, first.random_state, first.n_threads, first.learner, first.features)
        out.regressor_, out.classifier_, out.constant_ = first.regressor_, first.classifier_, first.constant_
        out.features_ = first.features_
        out.bag_ = [(m.regressor_, m.classifier_, m.constant_, m.features_) for m in models[1:]]
        return out

    def members(self) -> list[tuple[Any, Any, float | None, DegradationFeatures | None]]:
        """(regressor, classifier or None, constant P(failure) or None, features) of each member (a bag: several)."""
        return [(self.regressor_, self.classifier_, self.constant_, self.features_), *getattr(self, "bag_", [])]

    def predict_rul(self, x: np.ndarray, steps: np.ndarray | None = None) -> np.ndarray:
        """Predicted RUL of windows ``x`` (``steps``: their end steps, when the features use the age)."""
        check_is_fitted(self, "regressor_")
        with threadpool_limits(self.n_threads):
            return np.mean([np.clip(reg.predict(self._features(feats, x, steps)), 0, None)
                            for reg, _, _, feats in self.members()], axis=0)

    def predict_fail_proba(self, x: np.ndarray, steps: np.ndarray | None = None) -> np.ndarray:
        """P(failure within the horizon) of windows ``x``."""
        check_is_fitted(self, "regressor_")
        with threadpool_limits(self.n_threads):
            return np.mean([np.full(len(x), const, dtype="float64") if clf is None
                            else clf.predict_proba(self._features(feats, x, steps))[:, 1]
                            for _, clf, const, feats in self.members()], axis=0)
