"""``sensor-monitor``: failure events -> realised RUL error per model version, and the
accumulated run-to-failure data the scheduled retrain trains on."""

from __future__ import annotations

from typing import Annotated, Any

from prefect import flow
from pydantic import Field

from flows.sensor import monitoring as MO
from flows.sensor.results import SensorMonitorResult
from flows.sensor.train import sensor_train
from infra.deploy_config import monitoring_spec
from infra.home import home_layout
from solutions.sensor.config import AlignConfig
from solutions.sensor.schema import ColumnMapping
from tasks.evaluate import artifact_key, publish_eval_report_task


@flow(name="sensor-monitor", log_prints=True)
def sensor_monitor(
    failures: str | None = None,
    columns: dict[str, str] | None = None,
    within: Annotated[float, Field(gt=0)] = 10.0,
    settle_seconds: Annotated[float, Field(ge=0)] = 30.0,
    align: AlignConfig = AlignConfig(),  # noqa: B008 - a frozen typed default renders a UI form
    encoding: str | None = None,
    model: str = "sensor-rul",
    retrain: bool = True,
    retrain_parameters: dict[str, Any] | None = None,
) -> SensorMonitorResult:
    """Take in the failure events (``asset_id,failed_at`` files), add the batch job's newly
    scored readings and the events to the accumulated data, and judge every RUL predicted
    for an asset that has failed since: true RUL = failure time - scored time, in grid
    steps; MAE, RMSE, bias and the share within ``within`` steps per model version, one row
    per version and run in the monitoring table, plotted over the runs. When the champion's
    realised error stays above the gate, or its batch runs keep drifting
    (``monitoring.sensor-monitor`` in the deployment config), start the retrain on the
    accumulated data (``trigger``, by default ``sensor-train/weekly-retrain``); the champion
    rule decides what follows.

    Args:
        failures: folder or glob of failures files (default: <home>/inbox/failures).
        columns: the batch job's column mapping canonical=SOURCE,... (to read its readings).
        within: a prediction within this many steps of the true RUL counts as on target.
        settle_seconds: skip failures files modified in the last N seconds (still being copied).
        align: the batch job's grid settings (its step is the RUL unit).
        encoding: text encoding of the batch job's CSV files (default: detected per file).
        model: the monitored model's name (its champion is judged).
        retrain: start the retrain when the rule says so (False: only report the decision).
        retrain_parameters: parameters that override the retrain deployment's own.
    """
    mapping = ColumnMapping(dict(columns or {})).columns
    out_dir = home_layout().new_report("sensor-monitor")
    arrived = MO.ingest_failures_step(failures or str(home_layout().inbox("failures")), settle_seconds)
    accumulated = MO.accumulate_step(dict(mapping), align.step_seconds, encoding)
    table, judged = MO.rul_error_step(align.step_seconds, within, out_dir)
    # -- close the loop: retrain when the rule says so; the champion rule decides after
    spec = monitoring_spec("sensor-monitor")
    decision = MO.decide_step(model, spec)
    dispatched = MO.trigger_step(decision, spec, dict(retrain_parameters or {}), sensor_train) \
        if decision.trigger and retrain else None
    drift = MO.drift_history_step(out_dir)  # the batch runs' drift, plotted over the runs
    image = out_dir / "realised_rul_mae.png"
    markdown = MO.render_monitor_report(table, judged, arrived, accumulated, within, image, decision, dispatched,
                                        drift)
    (out_dir / "report.md").write_text(markdown)
    publish_eval_report_task(markdown, key=artifact_key("sensor-monitor-report"),
                             description="Realised RUL error per model version, accumulated data")
    return SensorMonitorResult(
        failures_files=arrived.files, failures_rows=arrived.rows, quarantined=arrived.quarantined,
        accumulated=accumulated, rul_error=table.to_dict(orient="records"), judged=judged, decision=decision,
        dispatched=dispatched.model_copy(update={"result": None}) if dispatched else None,
        retrain_result=dispatched.result if dispatched else None, drift=drift, report_dir=str(out_dir),
    )
