"""RUL and failure-alert metrics of the sensor vertical."""

from __future__ import annotations

import numpy as np


def phm08_score(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """The PHM08 challenge's asymmetric score (lower is better).

    ``d = predicted - true``; late predictions (d > 0) cost ``exp(d/10) - 1``, early ones
    ``exp(-d/13) - 1``, summed over units.
    """
    return float(np.sum(phm08_costs(y_true, y_pred)))


def phm08_costs(y_true: np.ndarray, y_pred: np.ndarray) -> np.ndarray:
    """Each unit's PHM08 cost (:func:`phm08_score` is their sum)."""
    d = np.asarray(y_pred, dtype="float64") - np.asarray(y_true, dtype="float64")
    return np.where(d < 0, np.exp(-d / 13.0) - 1.0, np.exp(d / 10.0) - 1.0)


def weighted_phm08(y: np.ndarray, s: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The PHM08 score per row of a bootstrap count matrix ``w`` (resamples x units): the sum of
    the resampled units' costs (a row of ones gives :func:`phm08_score`)."""
    return w @ phm08_costs(y, s)


def engine_of(units: np.ndarray) -> np.ndarray:
    """The engine (asset) of each scored unit: a test asset cut several times is scored as units
    ``<asset>@<k>``, all of one engine (a bootstrap over engines resamples them together)."""
    return np.array([str(u).split("@", 1)[0] for u in np.asarray(units)])


def alert_lead_times(
    asset: np.ndarray, rul_raw: np.ndarray, prob: np.ndarray, threshold: float, horizon: int
) -> dict[str, float]:
    """Lead time of the first alert of each failed asset, from per-window scores.

    An asset's first alert is its earliest window with ``prob >= threshold``. Its lead
    time is the true RUL at that window. Alerts more than ``3 * horizon`` steps before
    failure count as early (false) alarms, not as lead time.

    Returns:
        ``mean_lead_time`` (steps, over assets alerted in time; NaN if none),
        ``alerted_share`` (share of failed assets alerted in time), ``early_alarm_share``.
    """
    leads, early, n = [], 0, 0
    for a in np.unique(asset):
        m = (asset == a) & ~np.isnan(rul_raw)
        if not m.any():
            continue
        n += 1
        r, p = rul_raw[m], prob[m]
        order = np.argsort(-r)  # earliest window first
        hit = np.flatnonzero(p[order] >= threshold)
        if not len(hit):
            continue
        lead = float(r[order][hit[0]])
        if lead > 3 * horizon:
            early += 1
        else:
            leads.append(lead)
    return {
        "mean_lead_time": float(np.mean(leads)) if leads else float("nan"),
        "alerted_share": len(leads) / n if n else float("nan"),
        "early_alarm_share": early / n if n else float("nan"),
    }
