"""``fraud-adapt``: fine-tune the champion's top parameters on data with a new fraud pattern."""

from __future__ import annotations

from typing import Annotated

from prefect import flow
from pydantic import Field

from flows.fraud import reports as R
from flows.fraud.monitoring import profile_step, training_transactions
from flows.fraud.results import FraudAdaptResult
from flows.fraud.steps import (
    PRIMARY_METRIC,
    adapt_train_spec,
    adapted_params,
    evaluate_stage,
    load_for_finetuning,
    obtain_transactions,
    prepare_features,
    publish_report,
    rescore_champion,
    rescore_parent,
    resolve_model,
    score_adapted,
    setup_sequences,
)
from infra.compute import resolve_training
from infra.home import home_layout
from solutions.fraud.config import FraudTrainConfig, SplitConfig, SyntheticDataConfig, TrainingSource
from tasks.approval import approval_gate_task
from tasks.evaluate import artifact_key
from tasks.finetune import finetune_model_task
from tasks.monitoring import PROFILE_FILE
from tasks.register import register_model_task

#: Adapting happens once the new pattern has been labelled: no delay, a short recent
#: training window that holds the pattern, then the test week.
ADAPT_SPLIT = SplitConfig(train_days=10, val_days=3, delay_days=0, test_days=7)
#: The new data by default: another seed, with the new fraud pattern injected late on.
ADAPT_CONFIG = FraudTrainConfig(data=SyntheticDataConfig(seed=1, new_pattern=True), split=ADAPT_SPLIT)


@flow(name="fraud-adapt", log_prints=True)
def fraud_adapt(
    data: str | None = None,
    columns: dict[str, str] | None = None,
    model: str = "fraud-seq",
    config: FraudTrainConfig = ADAPT_CONFIG,
    old_data: SyntheticDataConfig | None = SyntheticDataConfig(),  # noqa: B008 - a typed default renders a UI form
    fraction: Annotated[float, Field(gt=0, le=1)] = 0.10,
    max_epochs: Annotated[int, Field(ge=1)] = 6,
    fresh: bool = False,
    strict: bool = False,
    source: TrainingSource | None = None,
) -> FraudAdaptResult:
    """Fine-tune the champion on data holding a new fraud pattern, training only the top
    ``fraction`` of its parameters; report metrics on the new pattern before and after, and
    on the old test set (forgetting). The adapted version goes through the champion rule,
    judged on the new data's test period.

    Args:
        data: transactions CSV or Parquet with the new pattern (default: seeded synthetic data).
        columns: column mapping canonical=SOURCE,... (source columns to canonical names).
        model: NAME[:VERSION|@alias] to adapt; a bare NAME means its champion.
        config: the new data, the split, the feature delay and the FPR of recall@FPR.
        old_data: synthetic data of the old regime, whose test period measures forgetting
            (None: the new data's test period).
        fraction: share of parameters to train.
        max_epochs: fine-tuning epochs at most.
        fresh: re-run fine-tuning even if this run's checkpoints exist.
        strict: fail if the adapted version does not beat the champion.
        source: accumulated (the latest window of the scored-and-labelled dataset), file
            (``data``) or synthetic; default: ``data`` when given, else synthetic.
    """
    parent = resolve_model(model)
    out_dir = home_layout().new_report("fraud-adapt")
    # -- new data (with the new pattern) and the old test set
    ref = training_transactions(source, data, columns or {}, config.data, None, config.split, obtain_transactions)
    new = prepare_features(ref, config.split, config.baseline.delay_days)
    old_ref = obtain_transactions(None, {}, old_data) if old_data is not None else ref
    old = prepare_features(old_ref, config.split, config.baseline.delay_days) if old_data is not None else new
    threshold = float(parent.params.get("threshold", 0.5))
    before = evaluate_stage("before", rescore_parent(parent, ref, new, old_ref, old), threshold, config.fpr_target)
    # -- fine-tune the top parameters on the new data's train period
    net, pre, mcfg = load_for_finetuning(parent)
    setup = setup_sequences(ref, new, mcfg, preprocessor=pre)
    spec = adapt_train_spec(parent, new, fraction, max_epochs, mcfg.seed, fresh=fresh, hardware=resolve_training("fraud-adapt"))
    tuned = finetune_model_task(net, setup.datamodule, spec, mode="top", fraction=fraction)
    adapted = score_adapted(net, setup, pre, mcfg, ref, new, old_ref, old)
    after = evaluate_stage("after", adapted, threshold, config.fpr_target)
    # -- register with lineage; the champion (maybe not the parent) judged on the same test period
    registration = register_model_task(
        parent.name, net, params=adapted_params(parent, net, setup, ref, new, fraction, tuned.freeze),
        metrics=R.adapt_metrics(before, after), primary_metric=PRIMARY_METRIC, data_hash=ref.content_hash,
        parent=parent.spec, strict=strict, tags={"kind": "adapted"},
        comparison=rescore_champion(parent.name, ref, new, known={parent.version: before.new.pr_auc}),
        extra_files={PROFILE_FILE: profile_step(ref, new, adapted.s_new, out_dir)},
    )
    registration = approval_gate_task(registration, strict=strict)  # a model that needs approval waits here
    publish_report(R.render_adapt_report(parent, before, after, tuned.freeze, new.split, registration.decision),
                   out_dir, artifact_key("fraud-adapt-report"), "Before/after fine-tuning on a new fraud pattern")
    return FraudAdaptResult(
        parent=parent.spec, freeze=tuned.freeze, train=tuned.train,
        new_before=before.new, new_after=after.new, pattern_before=before.pattern, pattern_after=after.pattern,
        old_before=before.old, old_after=after.old, model=registration.model, promotion=registration.decision,
        report_dir=str(out_dir),
    )
