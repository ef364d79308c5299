"""``sensor-batch-score``: score every new readings file of an inbox (ledger + quarantine)."""

from __future__ import annotations

from functools import partial

from prefect import flow

from flows.sensor import score_steps as ss
from flows.sensor.monitoring import drift_step
from flows.sensor.results import SensorBatchScoreResult
from infra.home import home_layout
from infra.runners import ConfiguredTaskRunner
from solutions.sensor.config import SensorConfig
from solutions.sensor.schema import ColumnMapping
from tasks.ledger import process_inbox


@flow(name="sensor-batch-score", log_prints=True, task_runner=ConfiguredTaskRunner())
def sensor_batch_score(
    inbox: str | None = None,
    model: str = "sensor-rul",
    columns: dict[str, str] | None = None,
    threshold: float | None = None,
    output_dir: str | None = None,
    csv: bool = False,
    settle_seconds: float = 30.0,
    config: SensorConfig = SensorConfig(),  # noqa: B008 - a frozen typed default renders a UI form
    encoding: str | None = None,
) -> SensorBatchScoreResult:
    """Score every new long-format readings file (CSV/Parquet) in ``inbox`` with the champion:
    each asset's latest window gets predicted RUL, failure probability and an alert flag.

    ``inbox`` is a folder or a glob (default ``<home>/inbox/sensor``). Files are fanned out
    on the configured task runner (threads or Dask). A file handled before is skipped
    (processed-files ledger); an unreadable file is quarantined with its reason. The bad
    readings counted in each file are written beside its score file. The run's readings and
    predicted RUL are compared with the champion's profile (drift; thresholds in the
    deployment config): a drifted run emits an event and is tagged ``drift``.

    Args:
        inbox: folder or glob of long-format CSV/Parquet files (default: <home>/inbox/sensor).
        model: NAME[:VERSION|@alias] of a registered RUL model; a bare NAME scores with its champion.
        columns: column mapping canonical=SOURCE, e.g. asset_id=machine,timestamp=ts.
        threshold: alert when P(failure) >= this (default: the model's).
        output_dir: where score files go (default: <home>/scores/sensor-batch).
        csv: also write a CSV beside each Parquet.
        settle_seconds: skip files modified in the last N seconds (still being copied).
        config: settings of the sensor vertical (alignment; windows come from the model).
        encoding: text encoding of CSV files (default: detected per file, e.g. utf-8, gb18030, cp1252).
    """
    mapping = ColumnMapping(dict(columns or {})).columns  # a bad mapping fails before any file is read
    location = inbox or str(home_layout().inbox("sensor"))
    out_dir = ss.batch_output_dir(output_dir)
    run = process_inbox(
        "sensor-batch-score", location, model, settle_s=settle_seconds,
        make_scorer=lambda ref: partial(ss.score_readings_file, model=ref, columns=dict(mapping), threshold=threshold,
                                        config=config, out_dir=str(out_dir), csv=csv, encoding=encoding),
    )
    drift = drift_step(run, mapping, config)
    return SensorBatchScoreResult(**run.model_dump(), bad_readings=ss.collect_bad_readings_step(run.outputs), drift=drift)
