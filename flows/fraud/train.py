"""``fraud-train``: sequence model vs window-feature baseline, registered through the champion rule."""

from __future__ import annotations

import time

from prefect import flow

from flows.fraud import reports as R
from flows.fraud.governance import compare_with_champion, fraud_card, fraud_lineage, recompare_with
from flows.fraud.monitoring import profile_step, training_transactions
from flows.fraud.results import FraudTrainResult
from flows.fraud.steps import (
    PRIMARY_METRIC,
    build_sequence_model,
    check_periods,
    choose_candidate,
    evaluate_on_test,
    fit_baseline_candidate,
    obtain_transactions,
    prepare_features,
    publish_report,
    score_val_test,
    sequence_train_spec,
    setup_sequences,
    winner_registration,
)
from infra.compute import resolve_training
from infra.home import home_layout
from solutions.fraud.config import FraudTrainConfig, TrainingSource
from tasks.approval import approval_gate_task
from tasks.cards import as_comparison
from tasks.evaluate import artifact_key, plot_comparison
from tasks.monitoring import PROFILE_FILE
from tasks.register import register_model_task
from tasks.train import train_model_task


@flow(name="fraud-train", log_prints=True)
def fraud_train(
    data: str | None = None,
    columns: dict[str, str] | None = None,
    accounts: str | None = None,
    config: FraudTrainConfig = FraudTrainConfig(),  # noqa: B008 - a typed default renders a UI form
    fresh: bool = False,
    strict: bool = False,
    source: TrainingSource | None = None,
) -> FraudTrainResult:
    """Train the fraud sequence model and the gradient-boosting baseline, choose on the
    validation period between them and their ensemble, register the winner (the test period
    only reports) and promote it if it beats the champion. Without ``data`` it trains on the
    seeded synthetic transactions.

    Args:
        data: transactions CSV or Parquet (default: seeded synthetic data).
        columns: column mapping canonical=SOURCE,... (e.g. account_id=CUSTOMER_ID,timestamp=TX_DATETIME).
        accounts: optional accounts table: account_id, age, occupation, account_age_days.
        config: data, split, sequence model, baseline and registry name.
        fresh: retrain from scratch even if this run's checkpoints exist.
        strict: fail (QualityGateError) if the new version does not beat the champion.
        source: accumulated (the latest window of the scored-and-labelled dataset), file
            (``data``) or synthetic; default: ``data`` when given, else synthetic.
    """
    started = time.perf_counter()
    hardware = resolve_training("fraud-train")
    # -- data
    ref = training_transactions(source, data, columns or {}, config.data, accounts, config.split, obtain_transactions)
    prepared = prepare_features(ref, config.split, config.baseline.delay_days)
    check_periods(ref, prepared)
    out_dir = home_layout().new_report("fraud-train")
    # -- baseline and sequence model
    baseline = (fit_baseline_candidate(ref, prepared, config.model.seed, hardware.num_threads)
                if config.baseline.enabled else None)
    setup = setup_sequences(ref, prepared, config.model)
    model = build_sequence_model(ref, prepared, setup, config.model)
    trained = train_model_task(model, setup.datamodule, sequence_train_spec(prepared, config.model, fresh=fresh, hardware=hardware))
    # -- the candidates compared on validation; the test period only reports
    sequence = score_val_test(model, setup, ref, prepared)
    choice = choose_candidate(sequence, baseline, config.candidates)
    seq_report = evaluate_on_test("sequence", sequence, config.fpr_target, out_dir)
    base_report = evaluate_on_test("baseline", baseline.scores, config.fpr_target, out_dir) if baseline else None
    winner_report = (evaluate_on_test(choice.winner, choice.scores[choice.winner], config.fpr_target, out_dir)
                     if choice.winner == "ensemble" else base_report if choice.winner == "baseline" else seq_report)
    images = plot_comparison(R.comparison_curves(sequence, baseline.scores if baseline else None), "test", out_dir,
                             stem="fraud")
    # -- register the winner with lineage + champion rule (champion re-scored on this test period, compare-and-swap)
    winning = winner_registration(choice, model, setup, baseline, config.model, config.split,
                                  config.baseline.delay_days, out_dir)
    winner_scores = choice.scores[choice.winner]
    champion = compare_with_champion(config.model_name, ref, prepared, winner_scores)
    lineage = fraud_lineage(ref, prepared, config, data, hardware, trained, source)
    registration = register_model_task(
        config.model_name,
        winning.module,
        kind=winning.kind,
        extra_files={**winning.extra_files, PROFILE_FILE: profile_step(ref, prepared, winner_scores.s_test, out_dir)},
        params=winning.params,
        metrics={**R.train_metrics(winner_report, base_report), **choice.metrics()},
        primary_metric=PRIMARY_METRIC,
        data_hash=ref.content_hash,
        comparison=as_comparison(champion),
        recompare=recompare_with(config.model_name, ref, prepared, winner_scores),
        lineage=lineage,
        strict=strict,
    )
    fraud_card(registration, ref, prepared, setup, choice, champion)
    registration = approval_gate_task(registration, strict=strict)  # a model that needs approval waits here
    publish_report(choice.render() + "\n" + R.render_train_report(seq_report, base_report, prepared.split, images,
                                                                  registration.decision),
                   out_dir, artifact_key("fraud-train-report"), "Sequence vs baseline on the test period")
    return FraudTrainResult(
        dataset=ref,
        split=prepared.split,
        rows=prepared.rows,
        train=trained,
        sequence=seq_report,
        baseline=base_report,
        winner=choice.winner,
        candidates_val_auprc=choice.val_pr_auc,
        model=registration.model,
        promotion=registration.decision,
        report_dir=str(out_dir),
        seconds=time.perf_counter() - started,
    )
