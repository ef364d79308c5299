"""``fraud-monitor``: delayed labels -> realised performance, accumulated training data, and
the retrain trigger that closes the loop."""

from __future__ import annotations

from typing import Annotated, Any

from prefect import flow
from pydantic import Field

from flows.fraud import monitoring as MO
from flows.fraud.adapt import fraud_adapt
from flows.fraud.results import FraudMonitorResult
from flows.fraud.steps import publish_report
from infra.deploy_config import monitoring_spec
from infra.home import home_layout
from tasks.evaluate import artifact_key


@flow(name="fraud-monitor", log_prints=True)
def fraud_monitor(
    labels: str | None = None,
    model: str = "fraud-seq",
    columns: dict[str, str] | None = None,
    accounts: str | None = None,
    fpr_target: Annotated[float, Field(gt=0, lt=1)] = 0.01,
    top_k: Annotated[int, Field(ge=1)] = 100,
    settle_seconds: float = 30.0,
    retrain: bool = True,
    retrain_parameters: dict[str, Any] | None = None,
) -> FraudMonitorResult:
    """Take in the delayed labels (``transaction_id,label[,labelled_at]`` files), join them to
    the batch job's past scores, compute realised PR-AUC, ROC-AUC, recall at ``fpr_target``
    and card precision@``top_k`` per scored day and model version, add the scored rows and
    their labels to the accumulated training dataset, and start the configured retrain
    (``monitoring.fraud-monitor.trigger`` in the deployment config) when the champion's
    realised PR-AUC stays below the gate or its batch runs keep drifting.

    Args:
        labels: folder or glob of label files (default: <home>/inbox/labels).
        model: the monitored model's name (its champion is judged).
        columns: the batch job's column mapping canonical=SOURCE,... (to read its inputs).
        accounts: the batch job's accounts table, if it joins one.
        fpr_target: false-positive rate of the realised recall.
        top_k: accounts per day of the card precision@k.
        settle_seconds: skip label files modified in the last N seconds (still being copied).
        retrain: start the retrain when the rule says so (False: only report the decision).
        retrain_parameters: parameters that override the retrain deployment's own.
    """
    spec = monitoring_spec("fraud-monitor")
    out_dir = home_layout().new_report("fraud-monitor")
    # -- labels in, accumulated dataset up to date
    arrived = MO.ingest_labels_step(labels or str(home_layout().inbox("labels")), settle_seconds)
    accumulated = MO.accumulate_step(arrived.new_ids, dict(columns or {}), accounts)
    # -- realised performance per scored day and version
    performance = MO.performance_step(fpr_target, top_k, spec.min_labels, out_dir)
    # -- close the loop: retrain when the rule says so; the champion rule decides after
    decision = MO.decide_step(model, performance, spec, fpr_target, top_k)
    dispatched = MO.trigger_step(decision, spec, dict(retrain_parameters or {}), fraud_adapt) \
        if decision.trigger and retrain else None
    drift = MO.drift_history_step(out_dir)  # the batch runs' drift, plotted over the runs
    image = out_dir / "realised_pr_auc.png"
    publish_report(MO.render_monitor_report(performance, arrived, accumulated, decision, dispatched, image, drift),
                   out_dir, artifact_key("fraud-monitor-report"), "Realised performance, accumulated data, retrain decision")
    return FraudMonitorResult(
        labels_files=arrived.files, labels_rows=arrived.rows, quarantined=arrived.quarantined,
        accumulated=accumulated, performance=performance.to_dict(orient="records"), decision=decision,
        dispatched=dispatched.model_copy(update={"result": None}) if dispatched else None,
        retrain_result=dispatched.result if dispatched else None, drift=drift, report_dir=str(out_dir),
    )
