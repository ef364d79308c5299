"""``sensor-pretrain``: self-supervised pre-training of the 1D-CNN encoder."""

from __future__ import annotations

import time

from prefect import flow

from flows.sensor.results import SensorPretrainResult
from flows.sensor.steps import obtain_grid, pretrain_data_step, pretrain_spec
from solutions.sensor import pipeline as P
from solutions.sensor.config import SensorConfig, SensorSource
from solutions.sensor.data import window_config
from tasks.approval import approval_gate_task
from tasks.evaluate import artifact_key, publish_eval_report_task
from tasks.register import register_model_task, render_promotion
from tasks.train import train_model_task


@flow(name="sensor-pretrain", log_prints=True)
def sensor_pretrain(
    source: SensorSource = SensorSource(),  # noqa: B008 - a frozen typed default renders a UI form
    config: SensorConfig = SensorConfig(),  # noqa: B008 - a frozen typed default renders a UI form
    fresh: bool = False,
) -> SensorPretrainResult:
    """Pre-train the 1D-CNN encoder by masked reconstruction on the unlabelled windows of
    every non-test asset (censored ones included) and register it.

    Args:
        source: the input data (default: the seeded synthetic fleet).
        config: settings of the sensor vertical.
        fresh: retrain even if this run's checkpoints exist.
    """
    started = time.perf_counter()
    grid_ref, bad = obtain_grid(source, config)
    wcfg = window_config(source, config)
    data = pretrain_data_step(grid_ref, config, wcfg)
    module, dm = P.new_pretrainer(data, config)
    trained = train_model_task(module, dm, pretrain_spec(grid_ref, config, wcfg, fresh))
    registration = register_model_task(
        config.encoder_name, module, params=P.encoder_params(module, data, wcfg, config),
        metrics=P.encoder_metrics(trained.best_score), primary_metric=P.ENCODER_METRIC,
        higher_is_better=False, data_hash=grid_ref.content_hash, tags={"kind": "encoder"},
    )
    registration = approval_gate_task(registration)  # a model that needs approval waits here
    publish_eval_report_task(
        f"## sensor-pretrain\n\n{source.describe()}: {len(data.train)} train / {len(data.val)} val windows, "
        f"{len(data.normalizer.channels_)} channels, val masked MSE {trained.best_score}\n\n{bad.summary()}\n\n"
        + render_promotion(registration.decision),
        key=artifact_key("sensor-pretrain-report"), description="Encoder pre-training",
    )
    return SensorPretrainResult(
        dataset=grid_ref, bad_readings=bad, assets={k: len(v) for k, v in data.splits.items()},
        windows={"train": len(data.train), "val": len(data.val)}, channels=data.normalizer.channels_, train=trained,
        model=registration.model, promotion=registration.decision, seconds=time.perf_counter() - started,
    )
