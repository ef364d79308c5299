"""Bayesian hyper-parameter tuning of a solution's model: ``python -m flows.tune``.

Optuna's TPE sampler searches the space the solution declares (``SEARCH_SPACE`` in
``solutions/<vertical>/config.py``); every trial is a real training through the train
task, scored by the validation split's primary metric, and bad trials are pruned
epoch by epoch. The best parameters' model is evaluated on the test period and goes
through the registry's champion rule. ``--json`` prints the typed result last.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import sys
from typing import Any

import numpy as np
from prefect import flow
from pydantic import BaseModel, ConfigDict, Field

import flows.fraud as F
from flows._cli import add_common, parse_columns, run_command
from infra.errors import DataValidationError
from infra.registry import ModelRef, PromotionDecision
from infra.runners import ConfiguredTaskRunner
from infra.store import check_name, stable_hash
from solutions.fraud import pipeline as P
from solutions.fraud.config import SEARCH_SPACE, FraudTrainConfig, SequenceModelConfig
from tasks.data import DatasetRef
from tasks.evaluate import (
    EvalReport,
    artifact_key,
    plot_comparison,
    publish_eval_report_task,
    render_eval_report,
)
from tasks.register import register_model_task, render_promotion
from tasks.train import TrainResult, TrainSpec, train_model, train_model_task
from tasks.tune import (
    Param,
    StudyRef,
    TuneConfig,
    TuneSummary,
    open_study,
    optimize,
    param_importances,
    plot_history,
    plot_importance,
    render_tuning_report,
    storage_url,
    trial_rows,
    validate_space,
)

log = logging.getLogger("flows.tune")  # not __main__ under python -m

OBJECTIVE = "val/auprc"
SOLUTIONS = ("fraud",)


class TuneResult(BaseModel):
    """What a tuning run produced."""

    model_config = ConfigDict(frozen=True)

    solution: str
    dataset: DatasetRef
    split: str
    summary: TuneSummary
    objective: str = OBJECTIVE
    default_value: float | None = Field(description="Objective of the default parameters (trial 0), if run.")
    full_training_mean_s: float | None = Field(description="Mean wall time of the complete (un-pruned) trials.")
    trial_seconds_total: float = Field(description="Wall time of all finished trials, summed.")
    final: TrainResult
    test: EvalReport
    model: ModelRef
    promotion: PromotionDecision
    report_dir: str
    seconds: float


def fraud_space(base: SequenceModelConfig) -> tuple[Param, ...]:
    """The fraud search space, checked against :class:`SequenceModelConfig`."""
    return validate_space(
        SEARCH_SPACE,
        fields=tuple(SequenceModelConfig.model_fields),
        make_config=lambda update: SequenceModelConfig(**{**base.model_dump(), **update}),
    )


def _check_both_classes(df, feats, split_text: str, source: str) -> None:
    for period in ("train", "val", "test"):
        y = F._period_labels(df, feats, period)
        if len(y) == 0 or y.sum() == 0:
            raise DataValidationError(
                f"the {period} period ({split_text}) has {len(y)} rows and {int(y.sum())} frauds; "
                "both classes are needed: adjust --train-days/--val-days/--delay-days/--test-days",
                source=source,
            )


@flow(name="fraud-tune", log_prints=True, task_runner=ConfiguredTaskRunner())
def fraud_tune(
    data: str | None = None,
    columns: dict[str, str] | None = None,
    accounts: str | None = None,
    config: FraudTrainConfig = FraudTrainConfig(),  # noqa: B008 - a typed default renders a UI form
    tune: TuneConfig = TuneConfig(),  # noqa: B008
    strict: bool = False,
) -> TuneResult:
    """Tune the fraud sequence model with Optuna (TPE + median pruning) on the validation
    PR-AUC, then evaluate the best parameters' model on the test period, register it and
    promote it if it beats the champion. The study persists, so a re-run resumes it."""
    started = dt.datetime.now()
    base = config.model
    space = fraud_space(base)  # fails here, before any data or trial, naming the parameter
    # -- data
    ref = F.obtain_transactions(data, dict(columns or {}), config.data, accounts)
    feats_ref, split_text = F.prepare_features(ref, config.split, config.baseline.delay_days)
    df, feats = ref.read(), feats_ref.read()
    _check_both_classes(df, feats, split_text, ref.source)
    pos_weight = P.pos_weight_for(F._period_labels(df, feats, "train").astype("float64"))
    # -- study
    tuned = {p.name for p in space}
    name = tune.study or "fraud-" + stable_hash({
        "data": feats_ref.content_hash,
        "fixed": {k: v for k, v in base.model_dump().items() if k not in tuned},
        "space": [p.model_dump() for p in space],
    })
    study_ref = StudyRef(name=check_name(name, "study name"), storage=storage_url(name), direction="maximize")

    def objective(params: dict[str, Any], run_key: str, callbacks: list[Any]) -> float | None:
        mcfg = SequenceModelConfig(**{**base.model_dump(), **params})
        setup = P.sequence_setup(df, feats, mcfg)
        model = P.build_model(setup.preprocessor, mcfg, pos_weight)
        spec = TrainSpec(
            run_key=run_key, max_epochs=mcfg.max_epochs, patience=mcfg.patience,
            monitor=OBJECTIVE, mode="max", seed=mcfg.seed,
        )
        return train_model(model, setup.datamodule, spec, callbacks=callbacks).best_score

    summary = optimize(study_ref, space, objective, tune, OBJECTIVE, defaults=base.model_dump())
    # -- final model: the best trial's run key, so its finished checkpoint is reused
    best_cfg = SequenceModelConfig(**{**base.model_dump(), **summary.best_params})
    setup = P.sequence_setup(df, feats, best_cfg)
    model = P.build_model(setup.preprocessor, best_cfg, pos_weight)
    final = train_model_task(
        model,
        setup.datamodule,
        TrainSpec(
            run_key=summary.best_run_key, max_epochs=best_cfg.max_epochs, patience=best_cfg.patience,
            monitor=OBJECTIVE, mode="max", seed=best_cfg.seed,
        ),
    )
    out_dir = F._report_dir("fraud-tune")
    y_val, y_test = F._period_labels(df, feats, "val"), F._period_labels(df, feats, "test")
    s_test = P.score_period(model, setup, "test")
    test_report = F._evaluate_pair(
        "tuned sequence", y_val, P.score_period(model, setup, "val"), y_test, s_test, config.fpr_target, out_dir
    )
    curves = plot_comparison([("tuned sequence", y_test, s_test)], "test", out_dir, stem="fraud-tuned")
    # -- register + champion rule (champion re-scored on this test period)
    registration = register_model_task(
        config.model_name,
        model,
        params=P.model_params(
            model, setup.preprocessor, best_cfg, threshold=test_report.threshold, split=config.split.model_dump(),
            tuning={"study": study_ref.name, "trial": summary.best_number, OBJECTIVE: summary.best_value},
        ),
        metrics={**test_report.metrics(), OBJECTIVE: summary.best_value},
        primary_metric=F.PRIMARY_METRIC,
        data_hash=ref.content_hash,
        champion_value=F._champion_on(config.model_name, df, feats, "test"),
        strict=strict,
    )
    # -- reports
    study = open_study(study_ref, tune)
    rows = trial_rows(study)
    default_value = next((r.value for r in rows if r.note.startswith("defaults") and r.state == "COMPLETE"), None)
    images = [
        plot_history(rows, OBJECTIVE, out_dir / "optimisation-history.png"),
        plot_importance(param_importances(study), out_dir / "param-importance.png"),
    ]
    tuning_md = render_tuning_report(summary, rows, OBJECTIVE, images, default_value=default_value)
    eval_md = render_eval_report([test_report], title=f"fraud-tune: best parameters on the test period, {split_text}", images=curves)
    (out_dir / "report.md").write_text(tuning_md + "\n\n" + eval_md + "\n\n" + render_promotion(registration.decision))
    publish_eval_report_task(tuning_md, key=artifact_key("fraud-tune-trials"), description="Tuning trials, history and importances")
    publish_eval_report_task(
        eval_md + "\n\n" + render_promotion(registration.decision),
        key=artifact_key("fraud-tune-report"),
        description="Best parameters on the test period and the champion rule",
    )
    full = [r.seconds for r in rows if r.state == "COMPLETE" and r.seconds and (r.epochs or 0) > 0]
    return TuneResult(
        solution="fraud",
        dataset=ref,
        split=split_text,
        summary=summary,
        default_value=default_value,
        full_training_mean_s=float(np.mean(full)) if full else None,
        trial_seconds_total=float(sum(r.seconds or 0.0 for r in rows if r.state in ("COMPLETE", "PRUNED"))),
        final=final,
        test=test_report,
        model=registration.model,
        promotion=registration.decision,
        report_dir=str(out_dir),
        seconds=(dt.datetime.now() - started).total_seconds(),
    )


def _summary_text(r: TuneResult) -> str:
    s = r.summary
    lines = [
        (
            f"tune {r.solution}: study {s.study}, {s.complete} complete + {s.pruned} pruned "
            f"(+{s.failed} failed) of {s.requested} requested; {len(s.ran_now)} trial(s) run now"
        ),
        f"  best {r.objective} {s.best_value:.4f} (trial {s.best_number})"
        + (f" vs defaults {r.default_value:.4f}" if r.default_value is not None else ""),
        f"  best parameters: {s.best_params}",
        f"  test PR-AUC {r.test.pr_auc:.4f}; registered {r.model.spec}: {r.promotion.reason}",
    ]
    if r.full_training_mean_s:
        lines.append(
            f"  trial time {r.trial_seconds_total:.0f} s vs ~{r.full_training_mean_s * s.requested:.0f} s for "
            f"{s.requested} un-pruned trainings (mean complete trial {r.full_training_mean_s:.1f} s)"
        )
    lines.append(f"  report: {r.report_dir}/report.md  ({r.seconds:.0f} s)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m flows.tune --solution fraud --trials 50``."""
    parser = argparse.ArgumentParser(prog="python -m flows.tune", description=__doc__.splitlines()[0])
    parser.add_argument("--solution", choices=SOLUTIONS, required=True, help="which vertical's model to tune")
    d = TuneConfig()
    g = parser.add_argument_group("search")
    g.add_argument("--trials", type=int, default=d.trials, help="complete + pruned trials wanted in the study (default %(default)s)")
    g.add_argument("--max-in-flight", type=int, default=None, help="trials trained at once (default: INDUSFLOW_TUNE_MAX_IN_FLIGHT or 2)")
    g.add_argument("--study", default=None, help="study name; the same name resumes it (default: derived from data, split and space)")
    g.add_argument("--tune-seed", type=int, default=d.seed, help="TPE sampler seed (default %(default)s)")
    g.add_argument("--startup-trials", type=int, default=d.startup_trials, help="random trials before TPE (default %(default)s)")
    g.add_argument("--no-defaults-trial", action="store_true", help="do not run the default parameters as trial 0")
    F._data_args(parser)
    F._split_args(parser)
    F._model_args(parser)
    parser.add_argument("--model-name", default="fraud-seq", help="registry name (default %(default)s)")
    parser.add_argument("--strict", action="store_true", help="fail (QualityGateError) if the tuned model does not beat the champion")
    add_common(parser)
    args = parser.parse_args(argv)

    tune = TuneConfig(
        trials=args.trials, max_in_flight=args.max_in_flight, study=args.study, seed=args.tune_seed,
        startup_trials=args.startup_trials, enqueue_defaults=not args.no_defaults_trial,
    )
    config = F._config_from(args)

    def run() -> TuneResult:
        return fraud_tune(
            data=args.data, columns=parse_columns(args.columns), accounts=args.accounts,
            config=config, tune=tune, strict=args.strict,
        )

    return run_command(run, as_json=args.json, summary=_summary_text)


if __name__ == "__main__":
    sys.exit(main())
