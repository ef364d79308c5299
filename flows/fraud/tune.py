"""``fraud-tune``: Bayesian tuning of the fraud sequence model (Optuna TPE + median pruning).

The search space is ``SEARCH_SPACE`` in :mod:`solutions.fraud.config`; the engine (study,
trials, pruning, resume, reports) is the generic :mod:`tasks.tune`.
"""

from __future__ import annotations

import time

from prefect import flow

from flows.fraud import reports as R
from flows.fraud.results import FraudTuneResult
from flows.fraud.steps import (
    OBJECTIVE,
    PRIMARY_METRIC,
    SequenceObjective,
    build_best_model,
    check_periods,
    evaluate_on_test,
    fraud_space,
    obtain_transactions,
    prepare_features,
    rescore_champion,
    score_val_test,
    study_for,
    write_report,
)
from infra.compute import resolve_training
from infra.home import home_layout
from infra.runners import ConfiguredTaskRunner
from solutions.fraud import pipeline as P
from solutions.fraud.config import FraudTrainConfig
from tasks.approval import approval_gate_task
from tasks.evaluate import artifact_key, plot_comparison, publish_eval_report_task
from tasks.register import register_model_task
from tasks.train import train_model_task
from tasks.tune import optimize, report_study
from tasks.tune_config import TuneConfig


@flow(name="fraud-tune", log_prints=True, task_runner=ConfiguredTaskRunner())
def fraud_tune(
    data: str | None = None,
    columns: dict[str, str] | None = None,
    accounts: str | None = None,
    config: FraudTrainConfig = FraudTrainConfig(),  # noqa: B008 - a typed default renders a UI form
    tune: TuneConfig = TuneConfig(),  # noqa: B008
    strict: bool = False,
) -> FraudTuneResult:
    """Tune the fraud sequence model with Optuna (TPE + median pruning) on the validation
    PR-AUC, then evaluate the best parameters' model on the test period, register it and
    promote it if it beats the champion. The study persists, so a re-run resumes it.

    Args:
        data: transactions CSV or Parquet (default: seeded synthetic data).
        columns: column mapping canonical=SOURCE,... (source columns to canonical names).
        accounts: optional accounts table: account_id, age, occupation, account_age_days.
        config: data, split, the sequence model's fixed settings and registry name.
        tune: trials, parallelism, sampler and pruner.
        strict: fail (QualityGateError) if the tuned model does not beat the champion.
    """
    started = time.perf_counter()
    space = fraud_space(config.model)  # fails here, before any data or trial, naming the parameter
    # -- data
    ref = obtain_transactions(data, columns or {}, config.data, accounts)
    prepared = prepare_features(ref, config.split, config.baseline.delay_days)
    check_periods(ref, prepared)
    # -- study: trials fan out on the configured task runner
    study = study_for(tune, prepared, config.model, space)
    objective = SequenceObjective(ref, prepared, config.model, resolve_training("fraud-tune"))
    summary = optimize(study, space, objective, tune, OBJECTIVE, defaults=config.model.model_dump())
    # -- final model: the best trial's run key, so Prefect's cache skips it (Cached) with the trial's weights
    model, setup, spec = build_best_model(objective, summary.best_params, summary.best_run_key)
    final = train_model_task(model, setup.datamodule, spec)
    out_dir = home_layout().new_report("fraud-tune")
    scores = score_val_test(model, setup, ref, prepared)
    test_report = evaluate_on_test("tuned sequence", scores, config.fpr_target, out_dir)
    curves = plot_comparison([("tuned sequence", scores.y_test, scores.s_test)], "test", out_dir, stem="fraud-tuned")
    # -- register + champion rule (champion re-scored on this test period)
    registration = register_model_task(
        config.model_name,
        model,
        params=P.model_params(
            model, setup.preprocessor, objective.config(summary.best_params), threshold=test_report.threshold,
            split=config.split.model_dump(),
            tuning={"study": study.name, "trial": summary.best_number, OBJECTIVE: summary.best_value},
        ),
        metrics={**test_report.metrics(), OBJECTIVE: summary.best_value},
        primary_metric=PRIMARY_METRIC,
        data_hash=ref.content_hash,
        comparison=rescore_champion(config.model_name, ref, prepared),
        strict=strict,
    )
    registration = approval_gate_task(registration, strict=strict)  # a model that needs approval waits here
    # -- reports
    trials = report_study(study, tune, summary, OBJECTIVE, out_dir)
    evaluation = R.render_tune_eval(test_report, prepared.split, curves, registration.decision)
    write_report(R.render_tune_report(trials, evaluation), out_dir)
    publish_eval_report_task(trials.markdown, key=artifact_key("fraud-tune-trials"),
                             description="Tuning trials, history and importances")
    publish_eval_report_task(evaluation, key=artifact_key("fraud-tune-report"),
                             description="Best parameters on the test period and the champion rule")
    return FraudTuneResult(
        dataset=ref, split=prepared.split, summary=summary, objective=OBJECTIVE,
        default_value=trials.default_value, full_training_mean_s=trials.full_training_mean_s,
        trial_seconds_total=trials.trial_seconds_total, final=final, test=test_report,
        model=registration.model, promotion=registration.decision, report_dir=str(out_dir),
        seconds=time.perf_counter() - started,
    )
