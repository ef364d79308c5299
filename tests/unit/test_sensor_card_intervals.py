"""The sensor card's PHM08 score with a bootstrap interval over engines (a cut engine's units
resampled together), beside RMSE."""

from __future__ import annotations

import numpy as np
import pytest

from solutions.sensor.metrics import engine_of, phm08_score, weighted_phm08
from tasks.cards import intervals


def test_weighted_phm08_of_ones_is_the_score_and_counts_weigh_units() -> None:
    y = np.array([10.0, 50.0, 80.0])
    s = np.array([15.0, 40.0, 80.0])
    assert weighted_phm08(y, s, np.ones((1, 3)))[0] == pytest.approx(phm08_score(y, s))
    twice_first = weighted_phm08(y, s, np.array([[2.0, 1.0, 0.0]]))[0]
    assert twice_first == pytest.approx(2 * phm08_score(y[:1], s[:1]) + phm08_score(y[1:2], s[1:2]))


def test_engine_of_strips_the_cut_index() -> None:
    assert engine_of(np.array(["7@1", "7@2", "12", "u@3"])).tolist() == ["7", "7", "12", "u"]


def test_intervals_bootstrap_phm08_over_engines() -> None:
    rng = np.random.default_rng(0)
    engines = np.repeat([f"e{i}" for i in range(20)], 4)
    units = np.array([f"{e}@{k % 4 + 1}" for k, e in enumerate(engines)])
    y = rng.uniform(5, 125, len(units))
    s = y + rng.normal(0, 12, len(units))
    rmse, phm, mae = intervals(y, s, ["rmse", "phm08", "mae"], resamples=300, seed=0, groups=engine_of(units),
                               custom={"phm08": weighted_phm08})
    assert phm.metric == "phm08" and phm.value == pytest.approx(phm08_score(y, s))
    assert phm.low < phm.value < phm.high and rmse.low < rmse.value < rmse.high and mae.n == len(units)
    with pytest.raises(ValueError, match="unknown metric"):
        intervals(y, s, ["phm08"], resamples=10, seed=0)
