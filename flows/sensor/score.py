"""``sensor-score``: score the latest window of each asset with a registered model."""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from flows.sensor import score_steps as ss
from flows.sensor import steps as st
from flows.sensor.results import SensorScoreResult
from infra.home import home_layout
from solutions.sensor import scoring as SC
from solutions.sensor.config import SensorConfig, SensorSource
from tasks.evaluate import artifact_key, publish_eval_report_task


@flow(name="sensor-score", log_prints=True)
def sensor_score(
    source: SensorSource = SensorSource(),  # noqa: B008 - a frozen typed default renders a UI form
    model: str = "sensor-rul",
    output: str | None = None,
    csv: bool = False,
    threshold: float | None = None,
    config: SensorConfig = SensorConfig(),  # noqa: B008 - a frozen typed default renders a UI form
) -> SensorScoreResult:
    """Score the latest window of each asset with the champion (or a named version):
    predicted RUL, failure probability and an alert flag; written out with the model version.

    Args:
        source: the input data (default: the seeded synthetic fleet; the test units of a C-MAPSS folder).
        model: NAME[:VERSION|@alias] of a registered RUL model; a bare NAME scores with its champion.
        output: Parquet output (default: <home>/scores/<input>-<model>-v<version>.parquet).
        csv: also write a CSV beside the Parquet.
        threshold: alert when P(failure) >= this (default: the model's).
        config: settings of the sensor vertical (the grid; windows come from the model).
    """
    ref = ss.resolve_model_step(model)
    cut = SC.alert_threshold(ref, threshold)
    grid_ref, bad = st.obtain_grid(source, config)
    scores, bad = ss.score_step(ref, grid_ref, source, cut, bad)
    target = Path(output).expanduser() if output else SC.default_scores_path(home_layout().scores(), source, ref)
    csv_path = ss.write_scores_step(scores, target, csv)
    alerts = int(scores["alert"].sum())
    publish_eval_report_task(
        f"## sensor-score with {ref.spec}\n\n| | |\n|---|---|\n| input | {source.describe()} |\n"
        f"| assets scored | {len(scores)} |\n| alerts (P ≥ {cut:.3g}) | {alerts} |\n"
        f"| output | `{target}` |\n\nBad readings: {bad.summary()}\n",
        key=artifact_key("sensor-score-summary"), description="Latest-window scoring",
    )
    return SensorScoreResult(
        model=ref.spec, input=source.describe(), assets_scored=len(scores), alerts=alerts, threshold=cut,
        output=str(target), csv_output=str(csv_path) if csv_path else None, bad_readings=bad,
    )
