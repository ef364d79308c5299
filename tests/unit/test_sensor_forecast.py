"""Sensor forecasting's plain functions: which columns are series, the held-out split, MASE and
coverage by hand, the per-sensor choice, the registered params, and the limit alerts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from infra.errors import DataValidationError
from solutions.sensor import forecast as F
from solutions.sensor import forecast_data as FD
from solutions.sensor import forecast_evaluate as FE
from solutions.sensor import forecast_models as FM
from solutions.sensor import schema as S
from solutions.sensor.forecast_config import ForecastConfig


def _grid(assets: int = 6, steps: int = 60, seed: int = 0) -> pd.DataFrame:
    """``trend``: a slow drift plus small noise; ``noisy``: white noise around 50; a constant, an
    operating setting and a gap flag that are not forecast."""
    rng = np.random.default_rng(seed)
    parts = []
    for a in range(assets):
        t = np.arange(steps)
        parts.append(pd.DataFrame({
            S.ASSET: f"A{a}", S.STEP: t, "op_load": rng.uniform(size=steps), "trend": 10 + 0.5 * t + rng.normal(0, 0.2, steps),
            "noisy": 50 + rng.normal(0, 1, steps), "flat": 7.0, "gap__noisy": 0.0,
            S.RUL: np.nan, S.FAILED: False, S.FAILURE_TYPE: "", S.SET: "fleet",
        }))
    return pd.concat(parts, ignore_index=True)


def test_sensor_channels_leave_out_settings_flags_labels_and_constants() -> None:
    channels, skipped = FD.sensor_channels(_grid())
    assert channels == ["trend", "noisy"]
    assert skipped == {"op_load": "operating setting", "flat": "constant"}
    assert FD.sensor_channels(_grid(), wanted=["noisy"])[0] == ["noisy"]
    with pytest.raises(DataValidationError, match=r"no sensor column\(s\) \['pressure'\]"):
        FD.sensor_channels(_grid(), wanted=["pressure"])


def test_series_table_holds_out_the_last_steps_and_fills_gaps_within_the_asset() -> None:
    grid = _grid(assets=2, steps=20)
    grid.loc[(grid[S.ASSET] == "A0") & (grid[S.STEP] == 5), "noisy"] = np.nan
    table = FD.series_table(grid, ["noisy"], history=8, hold_out=3)
    a0 = table.history.loc[table.history["unique_id"] == FD.series_id("A0", "noisy")]
    assert a0["ds"].tolist() == list(range(9, 17))  # 8 steps before the 3 held out
    assert table.truth.loc[table.truth["unique_id"] == FD.series_id("A0", "noisy"), "ds"].tolist() == [17, 18, 19]
    full = FD.series_table(grid, ["noisy"], history=100)
    filled = full.history.set_index(["unique_id", "ds"]).loc[(FD.series_id("A0", "noisy"), 5), "y"]
    assert filled == grid.loc[(grid[S.ASSET] == "A0") & (grid[S.STEP] == 4), "noisy"].item()  # carried forward
    short = FD.series_table(grid, ["noisy"], history=100, hold_out=3, min_steps=18)
    assert short.history.empty and short.short == 2


def test_mase_and_coverage_by_hand() -> None:
    uid = FD.series_id("A", "s")
    history = pd.DataFrame({"unique_id": uid, "ds": [0, 1, 2, 3], "y": [1.0, 3.0, 2.0, 4.0]})  # |diffs| 2, 1, 2
    truth = pd.DataFrame({"unique_id": uid, "ds": [4, 5], "y": [5.0, 2.0]})
    fc = pd.DataFrame({"unique_id": uid, "ds": [4, 5], "m": [4.0, 4.0], "m-lo-80": [3.0, 3.0], "m-hi-80": [6.0, 6.0]})
    cfg = ForecastConfig(horizon=2, level=80)
    scores = FE.score_forecasts(FD.SeriesTable(history, truth), fc, ["m"], cfg)
    scale = 5 / 3
    assert scores["h"].tolist() == [1, 2]
    assert scores["mase"].tolist() == pytest.approx([1 / scale, 2 / scale])
    assert scores["coverage"].tolist() == [1.0, 0.0]  # 5 inside [3, 6], 2 below it
    assert FE.summary(scores).loc[0, "mase"] == pytest.approx(1.5 / scale)


def test_a_series_that_never_changed_has_no_scale_and_is_left_out() -> None:
    history = pd.DataFrame({"unique_id": "x", "ds": [0, 1, 2], "y": [1.0, 1.0, 1.0]})
    assert np.isnan(FE.mase_scale(history, 1).loc["x"])


def test_choose_methods_takes_the_lowest_mase_per_sensor_and_the_first_on_ties() -> None:
    scores = pd.DataFrame({
        "method": ["naive", "auto_ets", "naive", "auto_ets"], "sensor": ["a", "a", "b", "b"], "h": 1,
        "mase": [1.0, 0.7, 0.5, 0.5], "coverage": 0.8, "series": 10,
    })
    assert FE.choose_methods(scores, ["naive", "auto_ets"]) == {"a": "auto_ets", "b": "naive"}


def test_naive_forecasts_the_last_value_with_a_widening_interval() -> None:
    grid = _grid(assets=1, steps=30)
    table = FD.series_table(grid, ["noisy"], history=100)
    fc = FM.forecast_series(table.history, ["naive"], ForecastConfig(horizon=4))
    assert fc["naive"].tolist() == pytest.approx([grid["noisy"].iloc[-1]] * 4)
    width = (fc["naive-hi-80"] - fc["naive-lo-80"]).to_numpy()
    assert (np.diff(width) > 0).all()


def test_evaluation_chooses_a_model_that_beats_naive_on_held_out_assets() -> None:
    grid = _grid(assets=16, steps=60)
    cfg = ForecastConfig(horizon=5, candidates=("naive", "auto_ets"))
    ev = FE.evaluate_forecasters(grid, [f"A{i}" for i in range(14)], ["A14", "A15"], cfg)
    assert ev.forecaster.methods == {"trend": "auto_ets", "noisy": "auto_ets"}  # a drift, a level: not the last value
    m = ev.metrics()
    assert m["test/mase"] < m["test/mase_naive"]
    assert m["test/mase_seasonal_naive"] == pytest.approx(m["test/mase_naive"])  # season 1: the same forecast
    assert 0 <= m["test/coverage"] <= 1 and ev.series == (28, 4)
    assert list(ev.horizon_table()["h"]) == [1, 2, 3, 4, 5]
    # the champion rule re-scores a forecaster on the same held-out assets: the choice scores as measured
    assert FE.rescore(ev.forecaster, grid, ["A14", "A15"]) == pytest.approx(m["test/mase"])


def test_forecaster_params_round_trip_and_reject_other_models() -> None:
    f = F.Forecaster({"trend": "auto_ets"}, 5, 80, 1, "model", 100, {"trend": 40.0}, {}, "mean")
    assert F.Forecaster.from_params(f.to_params()) == f
    assert f.with_limits({"trend": 50.0}, None).upper_limits == {"trend": 50.0}
    assert f.with_limits(None, None).upper_limits == {"trend": 40.0}
    with pytest.raises(ValueError, match="not a registered forecaster"):
        F.Forecaster.from_params({"architecture": "SensorRULModel"})


def test_forecast_grid_names_a_sensor_the_grid_lacks() -> None:
    f = F.Forecaster({"pressure": "naive"}, 3, 80, 1, "model", 100)
    with pytest.raises(DataValidationError, match=r"lacks sensor\(s\) \['pressure'\]"):
        F.forecast_grid(f, _grid())


def test_forecast_grid_gives_h_steps_per_asset_and_sensor() -> None:
    f = F.Forecaster({"trend": "auto_ets", "noisy": "naive"}, 3, 80, 1, "model", 100)
    table = F.forecast_grid(f, _grid(assets=2, steps=30))
    assert len(table) == 2 * 2 * 3
    assert table.groupby([S.ASSET, "sensor"])["steps_ahead"].apply(list).map(lambda v: v == [1, 2, 3]).all()
    assert set(table.loc[table["sensor"] == "trend", "method"]) == {"auto_ets"}
    assert (table["lower"] <= table["forecast"]).all() and (table["forecast"] <= table["upper"]).all()
    assert table.loc[table["sensor"] == "trend", S.STEP].min() == 30


def _table() -> pd.DataFrame:
    rows = []
    for asset, base in (("A", 10.0), ("B", 0.0)):
        for h in (1, 2, 3):
            rows.append({S.ASSET: asset, "sensor": "temp", S.STEP: 20 + h, "steps_ahead": h,
                         "forecast": base + h, "lower": base + h - 2, "upper": base + h + 2})
    return pd.DataFrame(rows)


def test_alert_at_the_first_step_a_forecast_crosses_a_limit() -> None:
    alerts = F.limit_alerts(_table(), {"temp": 12.5}, {}, alert_on="mean")
    assert alerts[[S.ASSET, "steps_ahead", "value"]].values.tolist() == [["A", 3, 13.0]]
    early = F.limit_alerts(_table(), {"temp": 12.5}, {}, alert_on="bound")  # the upper bound crosses first
    assert early[[S.ASSET, "steps_ahead", "value"]].values.tolist() == [["A", 1, 13.0]]
    low = F.limit_alerts(_table(), {}, {"temp": 0.0}, alert_on="bound")
    assert low[[S.ASSET, "limit_kind", "steps_ahead", "value"]].values.tolist() == [["B", "lower", 1, -1.0]]
    typed = F.alert_models(low)
    assert typed[0].asset_id == "B" and typed[0].limit == 0.0 and typed[0].step == 21


def test_no_limit_crossed_is_an_empty_table_and_limits_must_be_ordered() -> None:
    none = F.limit_alerts(_table(), {"temp": 100.0}, {"other": -5.0})
    assert none.empty and list(none.columns) == [S.ASSET, "sensor", "limit_kind", "limit", S.STEP, "steps_ahead",
                                                 "value"]
    with pytest.raises(ValidationError, match="lower one"):
        ForecastConfig(upper_limits={"t": 1.0}, lower_limits={"t": 2.0})


def test_steps_a_grid_skips_are_filled_and_absurd_readings_are_a_clear_error() -> None:
    f = F.Forecaster({"temp": "naive"}, 2, 80, 1, "model", 100)
    sparse = pd.DataFrame({S.ASSET: "m", S.STEP: [0, 5, 10], "temp": [1.0, 2.0, 3.0]})
    table = FD.series_table(sparse, ["temp"], history=100)
    assert table.history["ds"].tolist() == list(range(11))
    assert table.history["y"].tolist() == [1.0] * 5 + [2.0] * 5 + [3.0]
    assert F.forecast_grid(f, sparse)[S.STEP].tolist() == [11, 12]
    huge = pd.DataFrame({S.ASSET: "m", S.STEP: range(10), "temp": [1.7e308, -1.7e308] * 5})
    with pytest.raises(DataValidationError, match="not finite numbers .e.g. asset m, sensor temp"):
        F.forecast_grid(f, huge)


def test_interval_widths_make_the_training_truths_fall_inside_at_the_level() -> None:
    uid = [FD.series_id(f"A{i}", "s") for i in range(10)]
    history = pd.DataFrame({"unique_id": uid, "ds": 0, "y": 0.0})
    # every forecast 0 with the interval [-1, 1]; the truths at 0.1, 0.2, ..., 1.0 (step 1) and twice that (step 2)
    truth = pd.DataFrame({"unique_id": uid * 2, "ds": [1] * 10 + [2] * 10,
                          "y": [0.1 * (i + 1) for i in range(10)] + [0.2 * (i + 1) for i in range(10)]})
    fc = truth[["unique_id", "ds"]].assign(m=0.0, **{"m-lo-80": -1.0, "m-hi-80": 1.0})
    widths = FM.interval_widths(FD.SeriesTable(history, truth), fc, "m", ForecastConfig(horizon=2, level=80))
    assert widths["s"] == pytest.approx([np.quantile(np.arange(1, 11) / 10, 0.8), np.quantile(np.arange(1, 11) / 5, 0.8)])
    lo, hi = FM.widen(np.array([-1.0, -1.0, 9.0]), np.array([1.0, 1.0, 11.0]), np.array(["s", "s", "other"]),
                     np.array([1, 2, 1]), {"s": [0.5, 3.0]})
    assert lo.tolist() == [-0.5, -3.0, 9.0] and hi.tolist() == [0.5, 3.0, 11.0]


def test_a_forecaster_applies_its_interval_widths() -> None:
    grid = _grid(assets=2, steps=30)
    plain = F.Forecaster({"noisy": "naive"}, 3, 80, 1, "model", 100)
    wide = F.Forecaster({"noisy": "naive"}, 3, 80, 1, "model", 100, widths={"noisy": [2.0, 2.0, 2.0]})
    a, b = F.forecast_grid(plain, grid), F.forecast_grid(wide, grid)
    assert ((b["upper"] - b["lower"]) / (a["upper"] - a["lower"])).to_numpy() == pytest.approx(2.0)
    assert (b["forecast"] == a["forecast"]).all()
    assert F.Forecaster.from_params(wide.to_params()) == wide
