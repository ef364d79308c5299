"""Bootstrap confidence intervals and paired-bootstrap tests, seeded and vectorised.

A bootstrap resample is drawn as a vector of counts (how often each row is drawn), so
every metric here is a *weighted* metric evaluated for a whole block of resamples at once
with one sort of the scores: no Python loop over resamples, and the same seed gives the
same intervals. The paired test draws one set of rows and evaluates both models on it,
which is what makes it paired: the spread that comes from *which* rows were sampled
cancels, and only the difference between the models remains.

With ``groups`` (a cluster id per row) whole clusters are drawn instead of rows: the rows of
one asset, one account or one engine are not independent evidence, and drawing them one by
one makes an interval too narrow when a few clusters hold many rows each.

Metrics (``METRICS``): ``pr_auc`` (average precision, sklearn's step definition),
``roc_auc``, ``rmse``, ``mae``. Each takes labels / targets ``y``, scores / predictions
``s`` and a weight matrix ``w`` of shape (resamples, rows), and returns one value per
resample.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

MetricName = Literal["pr_auc", "roc_auc", "rmse", "mae"]
#: Rows x resamples handled per block (bounds the memory of the weight matrix).
_BLOCK_CELLS = 2_000_000


class Interval(BaseModel):
    """A point estimate with its bootstrap percentile interval."""

    model_config = ConfigDict(frozen=True)

    metric: str
    value: float = Field(description="The metric on the data as it is.")
    low: float = Field(description="Lower bound of the interval.")
    high: float = Field(description="Upper bound of the interval.")
    level: float = Field(default=0.95, description="Coverage of the interval.")
    resamples: int = Field(description="Bootstrap resamples that had a defined metric.")
    n: int = Field(description="Rows evaluated.")


class PairedTest(BaseModel):
    """Paired bootstrap of 'model A is better than model B' on the same rows."""

    model_config = ConfigDict(frozen=True)

    metric: str
    a: float = Field(description="Metric of A (the candidate).")
    b: float = Field(description="Metric of B (the champion / baseline).")
    diff: float = Field(description="A - B, sign as measured (not oriented).")
    diff_low: float = Field(description="Lower bound of the 95% interval of A - B.")
    diff_high: float = Field(description="Upper bound of the 95% interval of A - B.")
    p_value: float = Field(ge=0, le=1, description="One-sided p-value of 'A is better than B'.")
    higher_is_better: bool
    resamples: int
    n: int


# ------------------------------------------------------------------------------------
# weighted metrics over blocks of resamples


def _groups(s: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
    """Order of ``s`` descending (None when already in that order) and the index of the
    last row of each run of tied scores."""
    order = None if np.all(s[1:] <= s[:-1]) else np.argsort(-s, kind="stable")
    sorted_s = s if order is None else s[order]
    ends = np.flatnonzero(np.r_[sorted_s[1:] != sorted_s[:-1], True])
    return order, ends


def _positive_groups(y: np.ndarray, s: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per resample and per group of tied scores that holds a positive (best first): the weight of
    its positives ``p``, and the weight of all rows ranked above it (``before``) and up to its end
    (``through``).

    Only those groups move recall or the ROC curve, and positives are few: the weight matrix is
    summed once per stretch between their boundaries (``np.add.reduceat``), never cumulated column
    by column (a fraud card's bootstrap, 44k rows x 1000 resamples: 6.6 s before, 2.4 s, 2026-12-07).
    Weights are counts, so every sum is exact and the metrics are those of the full running sums.
    """
    order, ends = _groups(s)
    if order is not None:
        w, y = w[:, order], y[order]
    pos = np.flatnonzero(y)
    if pos.size == 0:
        empty = np.zeros((len(w), 0))
        return empty, empty, empty
    groups, first = np.unique(np.searchsorted(ends, pos), return_index=True)  # the tie groups of the positives
    starts = np.r_[0, ends[:-1] + 1][groups]  # first row of each group holding a positive
    stops = ends[groups] + 1  # one past its last row
    cuts = np.unique(np.r_[0, starts, stops])  # stretches between boundaries; the last cut may be n
    inner = cuts[cuts < w.shape[1]]
    running = np.zeros((len(w), cuts.size))  # weight of the rows before each cut
    running[:, 1:] = np.cumsum(np.add.reduceat(w, inner, axis=1), axis=1)[:, : cuts.size - 1]
    before, through = running[:, np.searchsorted(cuts, starts)], running[:, np.searchsorted(cuts, stops)]
    return np.add.reduceat(w[:, pos] * y[pos], first, axis=1), before, through


def weighted_pr_auc(y: np.ndarray, s: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Average precision per row of ``w`` (NaN where a resample holds no positive)."""
    p, _, through = _positive_groups(y, s, w)
    tp = np.cumsum(p, axis=1)
    total = p.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        precision = np.where(through > 0, tp / through, 1.0)
        return np.where(total > 0, np.sum(p * precision, axis=1) / total, np.nan)


def weighted_roc_auc(y: np.ndarray, s: np.ndarray, w: np.ndarray) -> np.ndarray:
    """ROC-AUC per row of ``w`` (ties count one half; NaN without both classes)."""
    p, before, through = _positive_groups(y, s, w)
    neg_before = before - (np.cumsum(p, axis=1) - p)
    neg_tied = through - before - p
    positives = p.sum(axis=1)
    negatives = w.sum(axis=1) - positives
    # each positive group scores above the negatives ranked below it, half the tied ones
    area = np.sum(p * (negatives[:, None] - neg_before - 0.5 * neg_tied), axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(positives * negatives > 0, area / (positives * negatives), np.nan)


def weighted_rmse(y: np.ndarray, s: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Root mean squared error per row of ``w``."""
    return np.sqrt((w @ (s - y) ** 2) / w.sum(axis=1))


def weighted_mae(y: np.ndarray, s: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Mean absolute error per row of ``w``."""
    return (w @ np.abs(s - y)) / w.sum(axis=1)


METRICS: dict[str, tuple[Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray], bool]] = {
    "pr_auc": (weighted_pr_auc, True),
    "roc_auc": (weighted_roc_auc, True),
    "rmse": (weighted_rmse, False),
    "mae": (weighted_mae, False),
}


def higher_is_better(metric: str) -> bool:
    """Whether a larger value of ``metric`` is better."""
    return _metric(metric)[1]


def _metric(metric: str) -> tuple[Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray], bool]:
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; known: {sorted(METRICS)}")
    return METRICS[metric]


def _arrays(y: np.ndarray, *scores: np.ndarray) -> tuple[np.ndarray, ...]:
    y = np.asarray(y, dtype="float64").ravel()
    out = [y]
    for s in scores:
        s = np.asarray(s, dtype="float64").ravel()
        if s.shape != y.shape:
            raise ValueError(f"scores have {s.size} rows but labels have {y.size}")
        out.append(s)
    if y.size == 0:
        raise ValueError("no rows to evaluate")
    keep = np.isfinite(y)
    for s in out[1:]:
        keep &= np.isfinite(s)
    return tuple(a[keep] for a in out)


def _count_blocks(n: int, resamples: int, seed: int, position: np.ndarray | None = None):
    """Blocks of bootstrap count matrices (resamples x n), reproducible from ``seed``.

    With ``position`` (where each row stands in the caller's ordering) the counts come laid
    out in that ordering: the same resamples, so the same figures, without reordering the
    matrix afterwards.
    """
    rng = np.random.default_rng(seed)
    per_block = max(1, min(resamples, _BLOCK_CELLS // max(n, 1)))
    done = 0
    while done < resamples:
        b = min(per_block, resamples - done)
        idx = rng.integers(0, n, size=(b, n))
        if position is not None:
            idx = position[idx]
        flat = (np.arange(b)[:, None] * n + idx).ravel()
        yield np.bincount(flat, minlength=b * n).reshape(b, n).astype("float64")
        done += b


def _weight_blocks(n: int, resamples: int, seed: int, position: np.ndarray, groups: np.ndarray | None):
    """Blocks of bootstrap weights (resamples x n) in the sorted row order: rows drawn one by one,
    or with ``groups`` (each sorted row's cluster code, 0..G-1) whole clusters drawn, each row
    weighted by how often its cluster was drawn."""
    if groups is None:
        yield from _count_blocks(n, resamples, seed, position)
        return
    for counts in _count_blocks(int(groups.max()) + 1, resamples, seed):
        yield counts[:, groups]


def _codes(groups: np.ndarray | None, n: int) -> np.ndarray | None:
    """Cluster ids -> codes 0..G-1 (as float, to travel with the metric arrays)."""
    if groups is None:
        return None
    groups = np.asarray(groups).ravel()
    if groups.size != n:
        raise ValueError(f"groups have {groups.size} rows but labels have {n}")
    return np.unique(groups, return_inverse=True)[1].astype("float64")


def _compact(codes: np.ndarray) -> np.ndarray:
    """Cluster codes renumbered 0..G-1 over the rows left after non-finite ones were dropped."""
    return np.unique(codes, return_inverse=True)[1]


def _by_score(s: np.ndarray, *arrays: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Rows ordered by ``s`` descending (what the ranking metrics sort by) and, for the
    count blocks, where each original row now stands."""
    order = np.argsort(-s, kind="stable")
    position = np.empty_like(order)
    position[order] = np.arange(order.size)
    return position, [a[order] for a in (s, *arrays)]


def metric_value(metric: str, y: np.ndarray, s: np.ndarray) -> float:
    """The metric on the rows as they are (weight 1 each)."""
    fn, _ = _metric(metric)
    y, s = _arrays(y, s)
    return float(fn(y, s, np.ones((1, y.size)))[0])


def bootstrap_ci(metric: str, y: np.ndarray, s: np.ndarray, *, resamples: int = 1000, level: float = 0.95,
                 seed: int = 0, groups: np.ndarray | None = None,
                 fn: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray] | None = None) -> Interval:
    """The metric with a percentile bootstrap interval (rows resampled with replacement).

    Args:
        metric: a name of :data:`METRICS` (or any name, with ``fn``).
        y: labels (0/1) or true values. s: scores or predictions, same length.
        resamples: bootstrap resamples. level: interval coverage. seed: resampling seed.
        groups: a cluster id per row: whole clusters are resampled (see the module docstring).
        fn: the metric as ``fn(y, s, w)`` -> one value per row of the count matrix ``w`` (as
            :func:`weighted_rmse`), for a metric of the caller's domain that is not in :data:`METRICS`.
    """
    if fn is None:
        fn, _ = _metric(metric)
    codes = _codes(groups, np.asarray(y).size)
    if codes is None:
        y, s = _arrays(y, s)
        g = None
    else:
        y, s, g = _arrays(y, s, codes)
    position, (s, y, *rest) = _by_score(s, y, *([] if g is None else [g]))
    sorted_codes = _compact(rest[0]) if rest else None
    values = np.concatenate([fn(y, s, w) for w in _weight_blocks(y.size, resamples, seed, position,
                                                                   sorted_codes)])
    values = values[np.isfinite(values)]
    point = float(fn(y, s, np.ones((1, y.size)))[0])
    tail = (1 - level) / 2
    low, high = (np.quantile(values, [tail, 1 - tail]) if values.size else (np.nan, np.nan))
    return Interval(metric=metric, value=point, low=float(low), high=float(high), level=level,
                    resamples=int(values.size), n=int(y.size))


def paired_bootstrap(metric: str, y: np.ndarray, s_a: np.ndarray, s_b: np.ndarray, *, resamples: int = 1000,
                     seed: int = 0, groups: np.ndarray | None = None) -> PairedTest:
    """Paired bootstrap test of 'A is better than B' on the same rows.

    The p-value is the share of resamples in which A is not better than B, with the
    usual +1 correction ((1 + #{A not better}) / (1 + resamples)), so it is never 0.

    Args:
        metric: a name of :data:`METRICS` (its direction decides what "better" means).
        y: labels or true values. s_a: candidate scores. s_b: champion / baseline scores.
        groups: a cluster id per row: whole clusters are resampled (see the module docstring).
    """
    fn, higher = _metric(metric)
    codes = _codes(groups, np.asarray(y).size)
    if codes is None:
        y, s_a, s_b = _arrays(y, s_a, s_b)
        extra: list[np.ndarray] = []
    else:
        y, s_a, s_b, g = _arrays(y, s_a, s_b, codes)
        extra = [g]
    position, (s_a, y, s_b, *rest) = _by_score(s_a, y, s_b, *extra)
    sorted_codes = _compact(rest[0]) if rest else None
    diffs = []
    for w in _weight_blocks(y.size, resamples, seed, position, sorted_codes):
        diffs.append(fn(y, s_a, w) - fn(y, s_b, w))
    d = np.concatenate(diffs)
    d = d[np.isfinite(d)]
    ones = np.ones((1, y.size))
    a, b = float(fn(y, s_a, ones)[0]), float(fn(y, s_b, ones)[0])
    oriented = d if higher else -d
    p = (1.0 + float(np.sum(oriented <= 0))) / (1.0 + d.size)
    low, high = (np.quantile(d, [0.025, 0.975]) if d.size else (np.nan, np.nan))
    return PairedTest(metric=metric, a=a, b=b, diff=a - b, diff_low=float(low), diff_high=float(high),
                      p_value=min(1.0, p), higher_is_better=higher, resamples=int(d.size), n=int(y.size))
