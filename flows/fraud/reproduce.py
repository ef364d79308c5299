"""``fraud-reproduce``: re-train a registered fraud version from its lineage and compare."""

from __future__ import annotations

from prefect import flow

from flows.fraud.steps import obtain_transactions, resolve_model
from flows.fraud.train import fraud_train
from solutions.fraud.config import FraudTrainConfig
from tasks.reproduce import (
    ReproduceResult,
    check_data_hash_task,
    compare_reproduction_task,
    plan_reproduction_task,
    reproduction_name,
)


@flow(name="fraud-reproduce", log_prints=True)
def fraud_reproduce(model: str = "fraud-seq", tolerance: float = 0.005) -> ReproduceResult:
    """Re-run the training of a registered fraud version from its recorded lineage (same
    data, parameters and seeds) and compare the metrics. Refused (exit 2) when the data's
    content hash or a major package version differs from the recorded one. The re-run is
    registered as ``<name>-reproduce``, so the original's champion never moves.

    Args:
        model: the version to reproduce, NAME[:VERSION|@alias] (a bare NAME: its champion).
        tolerance: largest accepted change of the primary metric (test PR-AUC).
    """
    original = resolve_model(model)
    plan = plan_reproduction_task(original)
    params = plan.parameters
    config = FraudTrainConfig.model_validate(params.get("config") or {})
    ref = obtain_transactions(params.get("data"), params.get("columns") or {}, config.data, params.get("accounts"))
    check_data_hash_task(plan, ref.content_hash, params.get("data"))
    again = fraud_train(data=params.get("data"), columns=params.get("columns"), accounts=params.get("accounts"),
                        config=config.model_copy(update={"model_name": reproduction_name(original)}), fresh=True)
    return compare_reproduction_task(original, again.model, tolerance, plan)
