"""Grid plans of the sensor sources: content keys, stored bad-reading counts, pre-flight checks."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from infra.errors import DataValidationError
from solutions.sensor import data as D
from solutions.sensor import schema as S
from solutions.sensor.config import DEFAULT_STRIDE, SensorConfig, SensorSource, SyntheticFleetConfig
from tests.unit.test_sensor_cmapss import write_subset


def test_cmapss_plan_builds_the_grid_and_its_counts(tmp_path: Path) -> None:
    write_subset(tmp_path)
    plan = D.cmapss_plan(tmp_path, "fd001")
    assert plan.name == "sensor-cmapss-fd001" and plan.key["v"] == D.GRID_VERSION
    grid, report = plan.build()
    assert set(grid[S.SET]) == {"train", "test"} and report.readings_in == (75 + 52) * 24
    assert D.stored_bad_readings(plan) is None
    D.save_bad_readings(plan, report)
    assert D.stored_bad_readings(plan) == report
    assert D.cmapss_plan(tmp_path, "FD001").bad_readings_path() == plan.bad_readings_path()


def test_readings_key_follows_content_not_name(tmp_path: Path) -> None:
    frame = pd.DataFrame({S.ASSET: ["A"], S.TIMESTAMP: [0], S.SENSOR: ["t"], S.VALUE: [1.0]})
    frame.to_csv(tmp_path / "a.csv", index=False)
    frame.to_csv(tmp_path / "b.csv", index=False)
    align = SensorConfig().align
    assert D.readings_plan(tmp_path / "a.csv", None, {}, align).key == D.readings_plan(tmp_path / "b.csv", None, {}, align).key
    assert D.readings_plan(tmp_path / "a.csv", None, {"sensor": "s"}, align).key != D.readings_plan(
        tmp_path / "a.csv", None, {}, align).key


def test_build_grid_of_the_fleet_counts_its_readings() -> None:
    config = SensorConfig(fleet=SyntheticFleetConfig(n_assets=4, min_life=30, max_life=40, seed=2))
    grid, report = D.build_grid(SensorSource(), config)
    assert grid[S.ASSET].nunique() == 4 and report.readings_in >= report.readings_used > 0


def test_window_config_knows_cmapss_regimes(tmp_path: Path) -> None:
    for kind in ("train", "test", "RUL"):
        (tmp_path / f"{kind}_FD002.txt").write_text("")
    w = D.window_config(SensorSource(cmapss_dir=str(tmp_path), subset="FD002"), SensorConfig())
    assert (w.n_regimes, w.test_cuts, w.stride) == (6, 1, 1)  # test units cut already; every cycle a window
    (tmp_path / "RUL_FD002.txt").unlink()  # train file alone: held-out engines are cut as configured
    w = D.window_config(SensorSource(cmapss_dir=str(tmp_path), subset="FD002"), SensorConfig())
    assert (w.n_regimes, w.test_cuts, w.stride) == (6, SensorConfig().window.test_cuts, 1)
    fleet = D.window_config(SensorSource(), SensorConfig())
    assert fleet == SensorConfig().window.model_copy(update={"stride": DEFAULT_STRIDE}) and fleet.stride == 3


def test_check_source_files_names_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(DataValidationError, match="has no train_FD001.txt, test_FD001.txt, RUL_FD001.txt"):
        D.check_source_files(SensorSource(cmapss_dir=str(tmp_path)))
    readings = tmp_path / "r.parquet"
    pd.DataFrame({"machine": ["A"], S.TIMESTAMP: [0], S.SENSOR: ["t"], S.VALUE: [1.0]}).to_parquet(readings)
    with pytest.raises(DataValidationError, match=r"missing required column\(s\) \['asset_id'\]"):
        D.check_source_files(SensorSource(data=str(readings)))
    D.check_source_files(SensorSource(data=str(readings), columns={"asset_id": "machine"}))
