"""Multi-rate alignment, bad-reading counts, normalisation and windows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from infra.errors import DataValidationError
from solutions.sensor import schema as S
from solutions.sensor.align import align_readings, apply_mapping, clean_events, clean_readings
from solutions.sensor.config import AlignConfig, SyntheticFleetConfig
from solutions.sensor.features import RegimeNormalizer, make_windows
from solutions.sensor.schema import BadReadingReport, ColumnMapping
from solutions.sensor.synthetic import generate_fleet

CFG = AlignConfig(step_seconds=60.0, ffill_limit=2)


def _readings(n_steps: int = 6, asset: str = "A") -> pd.DataFrame:
    rows = []
    for s in range(n_steps):
        for j in range(10):  # fast: 10 per step, a pure +-1 square wave -> RMS 1, peak 1, kurtosis 1
            rows.append((asset, s * 60.0 + j * 6.0, "vib", 1.0 if j % 2 else -1.0))
        if s % 2 == 0:  # slow: every second step
            rows.append((asset, s * 60.0 + 1.0, "temp", 20.0 + s))
    return pd.DataFrame(rows, columns=list(S.READING_COLUMNS))


def test_fast_signals_aggregate_and_slow_ones_forward_fill() -> None:
    clean, report = clean_readings(_readings(), CFG)
    grid, report = align_readings(clean, None, CFG, report)
    assert grid[S.STEP].tolist() == list(range(6))
    np.testing.assert_allclose(grid["vib_rms"], 1.0)
    np.testing.assert_allclose(grid["vib_peak"], 1.0)
    np.testing.assert_allclose(grid["vib_kurtosis"], 1.0)
    assert grid["temp"].tolist() == [20.0, 20.0, 22.0, 22.0, 24.0, 24.0]  # carried forward
    assert grid[S.GAP_PREFIX + "temp"].tolist() == [0, 1, 0, 1, 0, 1]  # gaps marked
    assert grid[S.RUL].isna().all() and not grid[S.FAILED].any()  # no event: censored


def test_forward_fill_stops_at_the_limit() -> None:
    df = _readings(8)
    df = df[~((df[S.SENSOR] == "temp") & (df[S.TIMESTAMP] > 60))]  # temp only at step 0
    grid, _ = align_readings(clean_readings(df, CFG)[0], None, CFG)
    assert grid["temp"].iloc[:3].tolist() == [20.0, 20.0, 20.0]
    assert grid["temp"].iloc[3:].isna().all()


def test_bad_readings_are_counted_not_dropped_silently() -> None:
    df = _readings()
    df[S.VALUE] = df[S.VALUE].astype(object)
    df.loc[0, S.VALUE] = np.nan
    df.loc[1, S.VALUE] = np.inf
    df.loc[2, S.VALUE] = 5e7  # outside the default range
    df.loc[3, S.VALUE] = "broken"
    df = pd.concat([df, df.iloc[[20]]], ignore_index=True)  # a duplicated timestamp
    df = df.iloc[::-1].reset_index(drop=True)  # out of time order
    _, report = clean_readings(df, CFG)
    assert (report.nan, report.inf, report.out_of_range, report.non_numeric, report.duplicate_timestamps) == (1, 1, 1, 1, 1)
    assert report.out_of_order > 0
    assert report.readings_used == len(df) - 5
    assert "non-numeric 1" in report.summary()


def test_mostly_non_numeric_values_are_a_structural_error() -> None:
    df = _readings()
    df[S.VALUE] = "n/a"
    with pytest.raises(DataValidationError, match="not numbers") as info:
        clean_readings(df, CFG)
    assert info.value.column == S.VALUE


def test_missing_sensor_column_is_a_clear_error() -> None:
    df = _readings().drop(columns=[S.SENSOR])
    with pytest.raises(DataValidationError, match="missing required column") as info:
        apply_mapping(df, ColumnMapping(), S.READING_COLUMNS, "readings.csv")
    assert info.value.column == S.SENSOR
    mapped = _readings().rename(columns={S.ASSET: "machine"})
    out = apply_mapping(mapped, ColumnMapping({S.ASSET: "machine"}), S.READING_COLUMNS, "readings.csv")
    assert S.ASSET in out


def test_unparseable_timestamps_name_the_rows() -> None:
    df = _readings()
    df[S.TIMESTAMP] = df[S.TIMESTAMP].astype(object)
    df.loc[4, S.TIMESTAMP] = "yesterday"
    df[S.TIMESTAMP] = df[S.TIMESTAMP].astype(str)
    with pytest.raises(DataValidationError, match="cannot be parsed") as info:
        clean_readings(df, CFG)
    assert 4 in info.value.rows


def test_events_give_rul_and_truncate_and_single_reading_assets_are_skipped() -> None:
    df = pd.concat([_readings(6, "A"), pd.DataFrame([("B", 0.0, "temp", 1.0)], columns=list(S.READING_COLUMNS))])
    events = clean_events(pd.DataFrame({S.ASSET: ["A", "Z"], S.FAILURE_TIME: [4 * 60.0 + 30, 99.0], S.FAILURE_TYPE: ["bearing", "x"]}))
    clean, report = clean_readings(df, CFG)
    grid, report = align_readings(clean, events, CFG, report)
    a = grid[grid[S.ASSET] == "A"]
    assert a[S.RUL].tolist() == [4, 3, 2, 1, 0] and a[S.FAILURE_TYPE].iloc[0] == "bearing"
    assert report.after_failure == 10  # step 5's readings come after the failure
    assert report.short_assets == ["B"] and report.events_for_unknown_assets == 1


def test_too_short_assets_are_skipped_and_counted_or_padded() -> None:
    grid = pd.DataFrame({S.ASSET: ["A"] * 10 + ["B"] * 3, S.STEP: list(range(10)) + list(range(3)),
                         "x": np.arange(13.0), S.RUL: np.arange(13.0)[::-1], S.FAILED: True, S.SET: "fleet", S.FAILURE_TYPE: ""})
    norm = RegimeNormalizer(1).fit(grid)
    report = BadReadingReport()
    ws = make_windows(grid, norm, length=5, stride=2, report=report)
    assert set(ws.asset) == {"A"} and report.assets_without_window == ["B"]
    assert ws.end_step.tolist() == [5, 7, 9] and ws.x.shape == (3, 1, 5)  # the last window ends at the last step
    padded = make_windows(grid, norm, length=5, last_only=True, pad=True, report=report)
    assert len(padded) == 2 and report.padded_assets == ["B"]


def test_padded_training_windows_start_at_pad_from_and_match_the_scored_ones() -> None:
    grid = pd.DataFrame({S.ASSET: ["A"] * 10 + ["B"] * 3 + ["C"] * 2, S.STEP: list(range(10)) + list(range(3)) + [0, 1],
                         "x": np.arange(15.0), S.RUL: np.r_[np.arange(10.0)[::-1], [2.0, 1.0, 0.0], [1.0, 0.0]],
                         S.FAILED: True, S.SET: "fleet", S.FAILURE_TYPE: ""})
    norm = RegimeNormalizer(1).fit(grid)
    report = BadReadingReport()
    ws = make_windows(grid, norm, length=5, stride=1, pad_from=3, report=report)
    # A: windows end at rows 2..9 (steps 2..9), B at rows 2 only; C (2 rows) has none
    assert ws.asset.tolist() == ["A"] * 8 + ["B"] and ws.end_step.tolist() == [*range(2, 10), 2]
    assert report.assets_without_window == ["C"] and report.padded_assets == ["B"]
    assert ws.rul.tolist() == [*np.arange(8.0)[::-1], 0.0]
    # each padded window is the one scoring gives the asset cut at that row
    for k in (3, 4):
        cut = grid.loc[(grid[S.ASSET] == "A") & (grid[S.STEP] < k)]
        scored = make_windows(cut, norm, length=5, last_only=True, pad=True)
        np.testing.assert_array_equal(ws.x[k - 3], scored.x[0])
    # unpadded windows are the ones made without pad_from
    plain = make_windows(grid, norm, length=5, stride=1)
    np.testing.assert_array_equal(ws.x[2:8], plain.x)
    # a stride keeps the last window at the last row
    strided = make_windows(grid.loc[grid[S.ASSET] == "A"], norm, length=5, stride=3, pad_from=2)
    assert strided.end_step.tolist() == [3, 6, 9]


def test_regime_normaliser_finds_regimes_and_round_trips() -> None:
    rng = np.random.default_rng(0)
    regime = rng.integers(0, 3, 900)
    grid = pd.DataFrame({
        S.ASSET: "A", S.STEP: np.arange(900), "op_load": regime * 10.0 + rng.normal(0, 0.1, 900),
        "temp": regime * 50.0 + rng.normal(0, 1, 900), "const": 1.0,
    })
    norm = RegimeNormalizer("auto").fit(grid)
    assert len(norm.centers_) == 3 and norm.channels_ == ["temp"]  # the constant one is dropped
    x = norm.transform(grid)
    assert abs(float(x.std()) - 1.0) < 0.1  # regime offsets removed
    again = RegimeNormalizer.from_dict(norm.to_dict())
    np.testing.assert_allclose(again.transform(grid), x)


def test_synthetic_fleet_is_seeded_and_has_censored_assets_and_bad_readings() -> None:
    cfg = SyntheticFleetConfig(n_assets=8, min_life=40, max_life=60, censored_fraction=0.3, fast_rate=4, seed=3)
    a, ea = generate_fleet(cfg)
    b, _ = generate_fleet(cfg)
    pd.testing.assert_frame_equal(a, b)
    assert 0 < len(ea) < 8  # some censored
    assert set(ea[S.FAILURE_TYPE]) <= {"thermal", "hydraulic", "bearing"}
    clean, report = clean_readings(a, AlignConfig())
    grid, _ = align_readings(clean, clean_events(ea), AlignConfig(), report)
    assert {"vib_radial_rms", "vib_radial_kurtosis", "temperature", "op_load"} <= set(grid.columns)
    assert grid[S.ASSET].nunique() == 8


def test_regimes_are_fitted_despite_missing_settings() -> None:
    rng = np.random.default_rng(1)
    regime = rng.integers(0, 2, 400)
    op = regime * 10.0 + rng.normal(0, 0.1, 400)
    op[::7] = np.nan  # settings missing beyond the forward-fill limit
    grid = pd.DataFrame({S.ASSET: "A", S.STEP: np.arange(400), "op_load": op, "temp": regime * 50.0 + rng.normal(0, 1, 400)})
    norm = RegimeNormalizer("auto").fit(grid)
    assert len(norm.centers_) == 2 and np.isfinite(norm.transform(grid)).all()


def test_every_reading_in_is_used_or_counted_once() -> None:
    # readings after a failure and the readings of a skipped (single-step) asset are not "used"
    rows = [(a, t * 3600, s, float(t)) for a in ("A", "B") for t in range(10) for s in ("temp", "pres")]
    rows += [("C", 0, "temp", 1.0), ("A", 3600, "temp", "x"), ("B", 7200, "pres", float("nan"))]
    df = pd.DataFrame(rows, columns=list(S.READING_COLUMNS))
    events = pd.DataFrame({S.ASSET: ["A"], S.FAILURE_TIME: [5 * 3600], S.FAILURE_TYPE: ["f"]})
    cfg = AlignConfig()
    clean, report = clean_readings(df, cfg)
    _, report = align_readings(clean, clean_events(events), cfg, report)
    assert (report.non_numeric, report.nan, report.after_failure, report.short_assets) == (1, 1, 8, ["C"])
    assert report.readings_in == 43
    assert report.readings_used == 43 - 1 - 1 - 8 - 1  # the one reading of C is not used either
    assert report.readings_in == report.readings_used + report.bad_total() + 1
