"""The sensor production loop: batch scoring -> failure events -> realised RUL error per
model version -> accumulated run-to-failure data -> the scheduled retrain trains on it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from flows.sensor import sensor_batch_score, sensor_monitor, sensor_train
from flows.sensor.cli import main
from infra.deploy import declared_parameters
from infra.deploy_config import config_path
from infra.errors import DataValidationError
from solutions.sensor.config import (
    FinetuneConfig,
    SensorConfig,
    SensorSource,
    SyntheticFleetConfig,
    WindowConfig,
)
from solutions.sensor.synthetic import generate_fleet
from tasks import monitoring as MON
from tests.flows.run_states import forget_deployments

H = 3600.0
CUTS = (4, 8, 12, 16, 20)  # steps before its failure at which each asset's first file ends


def _config() -> SensorConfig:
    fleet = SyntheticFleetConfig(n_assets=12, min_life=45, max_life=60, seed=1, censored_fraction=0.0)
    return SensorConfig(fleet=fleet, model_name="rul-mon", baseline=False, window=WindowConfig(length=8, horizon=10),
                        finetune=FinetuneConfig(pretrained=False, max_epochs=1))


def _cut_before_failure(readings: pd.DataFrame, events: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, int]]:
    """Each asset's readings up to ``k`` grid steps before its failure step (k from CUTS)."""
    keep, truth = [], {}
    failed = events.set_index("asset_id")["failure_time"]
    for i, (asset, rows) in enumerate(readings.groupby("asset_id", sort=True)):
        t = rows["timestamp"].astype("int64").to_numpy() / 1e9
        t0 = np.floor(t.min() / H) * H
        fail_step = int(np.floor((failed[asset].value / 1e9 - t0) / H))
        k = CUTS[i % len(CUTS)]
        keep.append(rows.loc[t < t0 + (fail_step - k + 1) * H])
        truth[str(asset)] = k
    return pd.concat(keep, ignore_index=True), truth


def _config_with_gate(tmp_path: Path) -> Path:
    """The shipped deployment config with a sensor-monitor gate any 1-epoch model fails: realised
    MAE above 0.5 steps in the last 2 judged monitor runs."""
    raw = yaml.safe_load(config_path().read_text())
    raw["monitoring"]["sensor-monitor"] = {"metric": "mae", "max_drop": None, "min_metric": 0.5, "reference_days": 0,
                                           "consecutive_days": 2, "min_labels": 5, "consecutive_runs": 50,
                                           "trigger": "sensor-train/weekly-retrain"}
    path = tmp_path / "deployments.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_sensor_monitor_judges_rul_per_version_and_retrains_on_the_accumulated_data_when_the_error_stays_high(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("INDUSFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("INDUSFLOW_DEPLOY_CONFIG", str(_config_with_gate(tmp_path)))
    forget_deployments("sensor-train/weekly-retrain")  # no worker here: the monitor runs the flow in-process
    config = _config()
    retrain_with = {"config": config.model_dump(mode="json")}  # the test's small model, same name
    assert sensor_train(config=config).model.version == 1
    inbox, failures = tmp_path / "inbox", tmp_path / "failures"
    inbox.mkdir(), failures.mkdir()
    readings, events = generate_fleet(SyntheticFleetConfig(n_assets=10, min_life=45, max_life=60, seed=5,
                                                           censored_fraction=0.0, bad_reading_rate=0.0))
    # day 1: each asset scored k steps before it fails; nothing has failed yet
    cut, truth = _cut_before_failure(readings, events)
    cut.to_parquet(inbox / "day1.parquet", index=False)
    assert sensor_batch_score(inbox=str(inbox), model="rul-mon", settle_seconds=0, config=config).scored == 1
    quiet = sensor_monitor(failures=str(failures), settle_seconds=0, model="rul-mon", retrain_parameters=retrain_with)
    assert quiet.judged == 0 and quiet.rul_error == [] and quiet.accumulated.files_added == 1
    assert quiet.decision is not None and not quiet.decision.trigger and quiet.dispatched is None
    with pytest.raises(DataValidationError, match="0 run-to-failure asset"):  # readings, no failure yet
        sensor_train(source=SensorSource(origin="accumulated"), config=config)
    # the failure events arrive: every day-1 prediction is judged against its true RUL k
    events[["asset_id"]].assign(failed_at=events["failure_time"]).to_csv(failures / "week1.csv", index=False)
    judged = sensor_monitor(failures=str(failures), settle_seconds=0, model="rul-mon", retrain_parameters=retrain_with)
    # one judged run above the gate is not yet a streak of two
    assert judged.decision is not None and not judged.decision.trigger and judged.dispatched is None
    assert judged.failures_rows == 10 and judged.judged == 10 and judged.accumulated.failures == 10
    [row] = judged.rul_error
    realised = pd.read_parquet(Path(judged.report_dir) / "realised_rul.parquet")
    assert dict(zip(realised["asset_id"], realised["true_rul"].astype(int), strict=True)) == truth
    error = realised["predicted_rul"] - realised["asset_id"].map(truth)
    assert (row["model_version"], row["judged"]) == (1, 10)
    assert row["mae"] == pytest.approx(error.abs().mean()) and row["rmse"] == pytest.approx(np.sqrt((error ** 2).mean()))
    assert row["within_share"] == pytest.approx((error.abs() <= 10).mean())
    assert Path(judged.report_dir, "realised_rul_mae.png").exists()
    # day 2: the rest of the readings, up to the failures, are scored and accumulate
    readings.to_parquet(inbox / "day2.parquet", index=False)
    sensor_batch_score(inbox=str(inbox), model="rul-mon", settle_seconds=0, config=config)
    # the weekly retrain, with its deployment's parameters, trains on the accumulated data
    assert declared_parameters("sensor-train", "weekly-retrain") == {"source": {"origin": "accumulated"}}
    # the second judged run above the gate: the monitor starts the weekly retrain (its parameters)
    closing = sensor_monitor(failures=str(failures), settle_seconds=0, model="rul-mon", retrain_parameters=retrain_with)
    assert closing.decision is not None and closing.decision.trigger, closing.decision
    assert "above the gate 0.5000" in closing.decision.reason and closing.decision.champion == "rul-mon:1"
    assert closing.dispatched is not None and closing.dispatched.deployment == "sensor-train/weekly-retrain"
    assert closing.dispatched.how == "direct" and "Decision: retrain" in Path(closing.report_dir, "report.md").read_text()
    retrained = closing.retrain_result
    assert retrained is not None and retrained.model.version == 2 and sum(retrained.assets.values()) == 10
    assert sorted(retrained.dataset.read()["asset_id"].astype(str).unique()) == sorted(events["asset_id"].astype(str))
    # version 2 scores a new site; its assets fail; the monitor reports both versions
    site, site_events = generate_fleet(SyntheticFleetConfig(n_assets=6, min_life=45, max_life=60, seed=9,
                                                            censored_fraction=0.0, bad_reading_rate=0.0))
    site = site.assign(asset_id="S" + site["asset_id"].astype(str))
    site_events = site_events.assign(asset_id="S" + site_events["asset_id"].astype(str))
    _cut_before_failure(site, site_events)[0].to_parquet(inbox / "site.parquet", index=False)
    sensor_batch_score(inbox=str(inbox), model="rul-mon:2", settle_seconds=0, config=config)
    site_events[["asset_id"]].assign(failed_at=site_events["failure_time"]).to_csv(failures / "site.csv", index=False)
    assert main(["monitor", "--failures", str(failures), "--settle-seconds", "0", "--model", "rul-mon"]) == 0
    out = capsys.readouterr().out
    assert "rul-mon:1" in out and "rul-mon:2" in out, out
    history = MON.read_rows(tmp_path / "home" / "monitoring" / "sensor-monitor", "rul_error")
    last = history.loc[history["run_id"] == history["run_id"].iloc[-1]].set_index("model_version")
    assert last.loc[2, "judged"] == 6 and last.loc[1, "judged"] == 20  # day 1 and day 2 of the fleet
    print(history[["run_id", "model_version", "judged", "assets", "mae", "rmse", "bias", "within_share"]].to_string())
    # once per champion version: the run after the retrain starts nothing more
    triggers = MON.read_rows(tmp_path / "home" / "monitoring" / "sensor-monitor", "triggers")
    assert len(triggers) == 1 and triggers["champion"].iloc[0] == "rul-mon:1"




def test_monitor_command_names_a_missing_failures_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["monitor", "--failures", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --failures:"), err
