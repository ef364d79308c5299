"""The realised RUL error of the sensor monitor, on a hand-made case."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from infra.errors import DataValidationError
from solutions.sensor import monitoring as M

H = 3600.0


def _readings() -> pd.DataFrame:
    first = {"A": "2026-01-01 00:20", "B": "2026-01-01 05:00", "C": "2026-01-01 00:00", "D": "2026-01-01 00:00"}
    return pd.DataFrame({"asset_id": list(first), "timestamp": pd.to_datetime(list(first.values())),
                         "sensor": "temperature", "value": 1.0})


def _scores() -> pd.DataFrame:
    return pd.DataFrame({
        "asset_id": ["A", "A", "B", "C", "D"], "step": [10, 20, 4, 0, 3],
        "predicted_rul": [30.0, 5.0, 50.0, 10.0, 7.0], "model": "rul", "model_version": [1, 2, 1, 1, 2],
    })


def test_realised_rul_error_per_version_on_a_hand_made_case() -> None:
    scored = M.scored_times(_scores(), _readings(), H)
    # A's grid starts at its first reading floored to the hour (00:00): its step 10 begins at 10:00
    assert scored.loc[0, M.SCORED_T] == pd.Timestamp("2026-01-01 10:00").value / 1e9
    failures = pd.DataFrame({"asset_id": ["A", "B", "C", "A"],
                             "failed_at": pd.to_datetime(["2026-01-02 08:30", "2026-01-01 07:00",
                                                          "2026-01-01 14:59", "2026-01-03 00:00"])})
    realised = M.realised_rul(scored, failures, H)
    # A (failed 32.5 h after its origin): 22 steps after step 10, 12 after step 20; B failed
    # before it was scored (not judged); C: 14 steps; D has not failed
    got = {(r.asset_id, r.step): (r.true_rul, r.error) for r in realised.itertuples()}
    assert got == {("A", 10): (22.0, 8.0), ("A", 20): (12.0, -7.0), ("C", 0): (14.0, -4.0)}
    table = M.rul_error_table(realised, within=5).set_index("model_version")
    v1, v2 = table.loc[1], table.loc[2]
    assert (v1.judged, v1.assets, v1.mae, v1.bias, v1.within_share) == (2, 2, 6.0, 2.0, 0.5)
    assert math.isclose(v1.rmse, math.sqrt(40))
    assert (v2.judged, v2.mae, v2.rmse, v2.bias, v2.within_share) == (1, 7.0, 7.0, -7.0, 0.0)


def test_a_scored_asset_without_readings_is_named() -> None:
    with pytest.raises(DataValidationError, match=r"\['E'\]"):
        M.scored_times(pd.DataFrame({"asset_id": ["E"], "step": [1]}), _readings(), H)


def test_run_to_failure_keeps_failed_assets_up_to_the_failure_and_needs_enough() -> None:
    ts = pd.date_range("2026-01-01", periods=6, freq="h")
    readings = M.reading_keys(pd.DataFrame({"asset_id": ["A"] * 6 + ["B"] * 6, "timestamp": list(ts) * 2,
                                            "sensor": "temperature", "value": range(12)}))
    assert readings[M.READING_KEY].is_unique
    failures = pd.DataFrame({"asset_id": ["A", "A"], "failed_at": [ts[3], ts[5]]})
    rows, events = M.run_to_failure(readings, failures, min_assets=1)
    assert rows["asset_id"].unique().tolist() == ["A"] and rows["timestamp"].max() == ts[3]  # the first failure
    assert events.to_dict(orient="records") == [{"asset_id": "A", "failure_time": ts[3], "failure_type": "unknown"}]
    with pytest.raises(DataValidationError, match="holds 1 run-to-failure asset"):
        M.run_to_failure(readings, failures, min_assets=2)



def test_the_training_origin_is_checked() -> None:
    from solutions.sensor.config import SensorSource

    with pytest.raises(ValueError, match="origin 'accumulated'"):
        SensorSource(origin="accumulated", data="readings.csv")
    with pytest.raises(ValueError, match="origin 'file' needs data"):
        SensorSource(origin="file")
    assert SensorSource(origin="accumulated").describe() == "accumulated run-to-failure data"
