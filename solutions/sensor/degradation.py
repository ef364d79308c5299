"""Degradation features of sensor windows for the gradient-boosting candidates (scikit-learn contract).

The windows come from :func:`solutions.sensor.features.make_windows`, already normalised per
operating regime by :class:`~solutions.sensor.features.RegimeNormalizer` (KMeans on the
operating settings, one z-score per regime: a no-op on C-MAPSS FD001, six regimes on FD002 and
FD004), so every feature here is regime-free. What each group adds, per channel unless said:

- ``last``: the window's last reading, and its mean over the last 5 steps.
- ``ewma``: exponentially weighted means over the window (spans :attr:`spans`), the smoothing
  the PHM literature applies to the noisy C-MAPSS sensors.
- ``slope``: least-squares slope over the last ``s`` steps for each scale in :attr:`scales`
  (the degradation trend, short to long).
- ``stats``: mean and standard deviation over each scale, min and max over the whole window.
- ``age``: the asset's grid step at the window's end (cycles since its first reading: the
  position in its life, which no fixed window shows once the asset is older than the window).
- ``health``: a linear health index fitted on the training windows (capped RUL / cap regressed
  on the smoothed channels, ridge), then its last value, EWMAs, slopes and means as above: one
  channel that concentrates the drift of all sensors, which trees cannot form from splits alone.

Pure numpy over the window array: a window's features depend only on it (and its step), so
training, batch scoring and online scoring compute them alike.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_is_fitted

#: every feature group, in output order
GROUPS: tuple[str, ...] = ("last", "ewma", "slope", "stats", "age", "health")


def ewma_weights(length: int, span: int) -> np.ndarray:
    """Weights (oldest first, summing to 1) of an exponentially weighted mean of span ``span``
    over the last ``length`` steps (``alpha = 2 / (span + 1)``, as pandas' ``ewm(span=...)``)."""
    alpha = 2.0 / (span + 1.0)
    w = alpha * (1.0 - alpha) ** np.arange(length)[::-1]
    return (w / w.sum()).astype("float32")


def slope_weights(length: int, scale: int) -> np.ndarray:
    """Weights over ``length`` steps whose dot product with a series is its least-squares slope
    (per step) over the last ``min(scale, length)`` steps."""
    s = min(scale, length)
    t = np.arange(s, dtype="float64")
    tc = t - t.mean()
    w = np.zeros(length)
    w[length - s:] = tc / (tc**2).sum() if s > 1 else 0.0
    return w.astype("float32")


def _series_features(x: np.ndarray, spans: Sequence[int], scales: Sequence[int], groups: Sequence[str]) -> list[np.ndarray]:
    """The ``last``/``ewma``/``slope``/``stats`` groups of (n, channels, length) series."""
    length = x.shape[2]
    out: list[np.ndarray] = []
    if "last" in groups:
        out += [x[:, :, -1], x[:, :, -min(5, length):].mean(axis=2)]
    if "ewma" in groups:
        out += [x @ ewma_weights(length, s) for s in spans]
    if "slope" in groups:
        out += [x @ slope_weights(length, s) for s in scales]
    if "stats" in groups:
        for s in scales:
            part = x[:, :, -min(s, length):]
            out += [part.mean(axis=2), part.std(axis=2)]
        out += [x.min(axis=2), x.max(axis=2)]
    return out


class DegradationFeatures(TransformerMixin, BaseEstimator):
    """Windows ``(n, channels, length)`` -> degradation features ``(n, features)``.

    Args:
        groups: the feature groups to compute (:data:`GROUPS`; ``age`` needs ``steps``).
        spans: EWMA spans.
        scales: window scales (steps) of the slopes and statistics.
        health_span: EWMA span of the smoothed channels the health index is fitted on.
        health_alpha: ridge penalty of the health index.
        rul_cap: the RUL cap the health index's target is scaled by (1 healthy, 0 failed).
    """

    def __init__(self, groups: Sequence[str] = GROUPS, spans: Sequence[int] = (5, 10, 20),
                 scales: Sequence[int] = (10, 20, 30, 60), health_span: int = 10, health_alpha: float = 1.0,
                 rul_cap: float = 125.0) -> None:
        self.groups = groups
        self.spans = spans
        self.scales = scales
        self.health_span = health_span
        self.health_alpha = health_alpha
        self.rul_cap = rul_cap

    def fit(self, x: np.ndarray, y: np.ndarray | None = None, steps: np.ndarray | None = None) -> DegradationFeatures:
        """Check the groups; with ``health``, fit the health index on the windows and their
        capped RUL ``y``."""
        unknown = sorted(set(self.groups) - set(GROUPS))
        if unknown:
            raise ValueError(f"unknown degradation feature group(s) {unknown}; choose from {list(GROUPS)}")
        x = np.asarray(x, dtype="float32")
        self.n_channels_ = x.shape[1]
        self.health_coef_, self.health_intercept_ = np.zeros(x.shape[1]), 0.0
        if "health" in self.groups:
            if y is None:
                raise ValueError("the health index is fitted on the training windows' RUL: pass y to fit()")
            from sklearn.linear_model import Ridge

            smooth = x @ ewma_weights(x.shape[2], self.health_span)
            target = np.clip(np.asarray(y, dtype="float64"), 0, self.rul_cap) / self.rul_cap
            ridge = Ridge(alpha=self.health_alpha).fit(smooth, target)
            self.health_coef_, self.health_intercept_ = ridge.coef_.astype("float64"), float(ridge.intercept_)
        return self

    def transform(self, x: np.ndarray, steps: np.ndarray | None = None) -> np.ndarray:
        """The features of windows ``x`` (``steps``: each window's end step, for ``age``)."""
        check_is_fitted(self, "n_channels_")
        x = np.asarray(x, dtype="float32")
        if x.ndim != 3 or x.shape[1] != self.n_channels_:
            raise ValueError(f"expected windows (n, {self.n_channels_}, length), got shape {x.shape}")
        parts = _series_features(x, self.spans, self.scales, self.groups)
        if "age" in self.groups:
            if steps is None:
                raise ValueError("the age feature needs each window's end step: pass steps (WindowSet.end_step)")
            parts.append(np.asarray(steps, dtype="float32").reshape(-1, 1))
        if "health" in self.groups:
            hi = (np.einsum("ncl,c->nl", x, self.health_coef_.astype("float32")) + self.health_intercept_)[:, None, :]
            parts += _series_features(hi, self.spans, self.scales, ["last", "ewma", "slope", "stats"])
        return np.concatenate([p.reshape(len(x), -1) for p in parts], axis=1).astype("float32")

    def to_dict(self) -> dict[str, object]:
        """JSON-ready state (stored beside the boosted trees in the registry)."""
        check_is_fitted(self, "n_channels_")
        return {"groups": list(self.groups), "spans": list(self.spans), "scales": list(self.scales),
                "health_span": self.health_span, "health_alpha": self.health_alpha, "rul_cap": self.rul_cap,
                "n_channels": self.n_channels_, "health_coef": self.health_coef_.tolist(),
                "health_intercept": self.health_intercept_}

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> DegradationFeatures:
        """The fitted transformer :meth:`to_dict` wrote."""
        self = cls(tuple(d["groups"]), tuple(d["spans"]), tuple(d["scales"]), int(d["health_span"]),
                   float(d["health_alpha"]), float(d["rul_cap"]))
        self.n_channels_ = int(d["n_channels"])
        self.health_coef_ = np.asarray(d["health_coef"], dtype="float64")
        self.health_intercept_ = float(d["health_intercept"])
        return self
