"""Sensor drift per batch run, against the profile stored with the trained version."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.sensor import sensor_batch_score, sensor_train
from infra.deploy_config import MonitoringSpec
from infra.registry import ModelRegistry
from solutions.sensor.config import FinetuneConfig, SensorConfig, SyntheticFleetConfig, WindowConfig
from solutions.sensor.synthetic import generate_fleet
from tasks import monitoring as MON


def test_sensor_drift_unchanged_fleet_passes_and_a_sensor_in_other_units_is_flagged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INDUSFLOW_HOME", str(tmp_path / "home"))
    fleet = SyntheticFleetConfig(n_assets=16, min_life=45, max_life=70, seed=1)
    config = SensorConfig(fleet=fleet, model_name="rul-drift", baseline=False, window=WindowConfig(length=12, horizon=10),
                          finetune=FinetuneConfig(pretrained=False, max_epochs=1))
    trained = sensor_train(config=config)
    profile = MON.Profile.load(Path(trained.model.path) / MON.PROFILE_FILE)
    assert "temperature" in profile.columns and MON.SCORE in profile.columns
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    readings, _ = generate_fleet(SyntheticFleetConfig(n_assets=8, min_life=45, max_life=70, seed=5))
    readings.to_parquet(inbox / "site-a.parquet", index=False)
    same = sensor_batch_score(inbox=str(inbox), model="rul-drift", settle_seconds=0, config=config)
    assert same.drift is not None and same.drift.flagged == {}, same.drift
    assert same.drift.rows > 100 and same.drift.max_psi < 0.25  # the 8 predicted RULs: too few to judge
    # the site's temperature sensor is swapped for one reading Fahrenheit
    fahrenheit = readings.copy()
    hot = fahrenheit["sensor"] == "temperature"
    fahrenheit.loc[hot, "value"] = fahrenheit.loc[hot, "value"] * 1.8 + 32
    fahrenheit.to_parquet(inbox / "site-a-fahrenheit.parquet", index=False)
    shifted = sensor_batch_score(inbox=str(inbox), model="rul-drift", settle_seconds=0, config=config)
    assert shifted.drift is not None and "temperature" in shifted.drift.flagged, shifted.drift
    assert shifted.drift.event_emitted and shifted.drift.streak == 1
    history = MON.read_rows(Path(shifted.drift.table).parent, "drift")
    assert history["run_id"].nunique() == 2 and (history["model"] == "rul-drift:1").all()
    # the monitor (not every batch run) plots PSI over the runs and reports the flagged column
    report = MON.drift_history("sensor-batch-score", Path(shifted.drift.table).parent, MonitoringSpec(), tmp_path)
    assert report.runs == 2 and report.drifted_runs == 1 and Path(report.plot).exists()
    assert "`temperature`" in report.markdown
    assert ModelRegistry().champion("rul-drift").version == 1
