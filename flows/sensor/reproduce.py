"""``sensor-reproduce``: re-train a registered sensor version from its lineage and compare."""

from __future__ import annotations

from prefect import flow

from flows.sensor import score_steps as ss
from flows.sensor import steps as st
from flows.sensor.train import sensor_train
from solutions.sensor.config import SensorConfig, SensorSource
from tasks.reproduce import (
    ReproduceResult,
    check_data_hash_task,
    compare_reproduction_task,
    plan_reproduction_task,
    reproduction_name,
)


@flow(name="sensor-reproduce", log_prints=True)
def sensor_reproduce(model: str = "sensor-rul", tolerance: float = 0.05) -> ReproduceResult:
    """Re-run the training of a registered sensor RUL version from its recorded lineage
    (same data, encoder, parameters and seeds) and compare the metrics. Refused (exit 2)
    when the data's content hash or a major package version differs from the recorded one.
    The re-run is registered as ``<name>-reproduce``, so the original's champion never moves.

    Args:
        model: the version to reproduce, NAME[:VERSION|@alias] (a bare NAME: its champion).
        tolerance: largest accepted change of the primary metric (test RUL RMSE, in grid steps).
    """
    original = ss.resolve_model_step(model)
    plan = plan_reproduction_task(original)
    params = plan.parameters
    source = SensorSource.model_validate(params.get("source") or {})
    config = SensorConfig.model_validate(params.get("config") or {})
    grid_ref, _ = st.obtain_grid(source, config)
    check_data_hash_task(plan, grid_ref.content_hash, source.describe())
    again = sensor_train(source=source, config=config.model_copy(update={"model_name": reproduction_name(original)}),
                         fresh=True)
    return compare_reproduction_task(original, again.model, tolerance, plan)
