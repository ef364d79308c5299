"""``fraud-score`` (one file) and ``fraud-batch-score`` (every new file of an inbox)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from prefect import flow

from flows.fraud import reports as R
from flows.fraud.monitoring import drift_step
from flows.fraud.results import FraudBatchScoreResult, FraudScoreResult
from flows.fraud.steps import (
    evaluate_labelled,
    load_scoring_model_task,
    obtain_transactions,
    resolve_model,
    score_file_name,
    score_file_task,
    score_inbox_file,
    write_scores,
)
from infra.home import home_layout
from infra.runners import ConfiguredTaskRunner
from solutions.fraud.config import SyntheticDataConfig
from solutions.fraud.schema import ColumnMapping
from solutions.fraud.scoring import render_score_summary
from tasks.evaluate import artifact_key, publish_eval_report_task
from tasks.ledger import process_inbox


@flow(name="fraud-score", log_prints=True)
def fraud_score(
    data: str,
    columns: dict[str, str] | None = None,
    accounts: str | None = None,
    model: str = "fraud-seq",
    output: str | None = None,
    csv: bool = False,
    since: str | None = None,
    encoding: str | None = None,
) -> FraudScoreResult:
    """Batch-score a transactions file with the champion (or a named version); write
    scores (Parquet, CSV on request) with the model version used, and a summary artifact.
    Rows before ``since`` serve only as history for sequences and window features.

    Args:
        data: transactions CSV or Parquet (label optional).
        columns: column mapping canonical=SOURCE,... (source columns to canonical names).
        accounts: optional accounts table joined to the transactions.
        model: NAME[:VERSION|@alias]; a bare NAME means its champion.
        output: Parquet output (default: <home>/scores/<input>-<model>-v<version>.parquet).
        csv: also write a CSV beside the Parquet.
        since: score only rows at or after this timestamp; earlier rows are history.
        encoding: text encoding of CSV input (default: detected, e.g. utf-8, gb18030, cp1252).
    """
    scorer = load_scoring_model_task(resolve_model(model))
    ref = obtain_transactions(data, columns or {}, SyntheticDataConfig(), accounts, for_scoring=True,
                              encoding=encoding)
    scored = score_file_task(scorer, ref, since)
    target = Path(output).expanduser() if output else home_layout().scores() / score_file_name(data, scorer.ref)
    csv_path = write_scores(scored, target, csv)
    labelled = evaluate_labelled(scored, scorer.ref.spec)
    publish_eval_report_task(
        R.render_score_report(render_score_summary(scored, scorer.ref.spec, data, target), labelled),
        key=artifact_key("fraud-score-summary"), description="Batch scoring summary",
    )
    return FraudScoreResult(
        model=scorer.ref.spec, input=str(data), rows_scored=len(scored.table), flagged=scored.flagged,
        threshold=scored.threshold, output=str(target), csv_output=str(csv_path) if csv_path else None,
        labelled=labelled,
    )


@flow(name="fraud-batch-score", log_prints=True, task_runner=ConfiguredTaskRunner())
def fraud_batch_score(
    inbox: str | None = None,
    model: str = "fraud-seq",
    columns: dict[str, str] | None = None,
    accounts: str | None = None,
    output_dir: str | None = None,
    csv: bool = False,
    settle_seconds: float = 30.0,
    encoding: str | None = None,
) -> FraudBatchScoreResult:
    """Score every new transactions file (CSV/Parquet) in ``inbox`` with the champion.

    ``inbox`` is a folder or a glob (default ``<home>/inbox/fraud``). A file whose content
    was handled before is skipped (processed-files ledger); a file that cannot be read or
    validated is quarantined with its reason and the others are scored. Files changed in the
    last ``settle_seconds`` are left for the next run (still being copied in). The run's inputs
    and scores are compared with the champion's profile (drift; thresholds in the deployment
    config): a drifted run emits an event and is tagged ``drift``.

    Args:
        inbox: folder or glob of CSV/Parquet files (default: <home>/inbox/fraud).
        model: NAME[:VERSION|@alias]; a bare NAME means its champion.
        columns: column mapping canonical=SOURCE,... (source columns to canonical names).
        accounts: optional accounts table joined to every file.
        output_dir: where score files go (default: <home>/scores/fraud-batch).
        csv: also write a CSV beside each Parquet.
        settle_seconds: skip files modified in the last N seconds (still being copied).
        encoding: text encoding of CSV files (default: detected per file, e.g. utf-8, gb18030, cp1252).
    """
    location = inbox or str(home_layout().inbox("fraud"))
    mapping = dict(ColumnMapping(dict(columns or {})).columns)
    out_dir = Path(output_dir).expanduser() if output_dir else home_layout().scores("fraud-batch")
    out_dir.mkdir(parents=True, exist_ok=True)
    run = process_inbox(
        "fraud-batch-score", location, model, settle_s=settle_seconds,
        make_scorer=lambda ref: partial(score_inbox_file, model=ref, columns=mapping, accounts=accounts,
                                        out_dir=str(out_dir), csv=csv, encoding=encoding),
    )
    drift = drift_step(run, mapping, accounts)
    return FraudBatchScoreResult(**run.model_dump(), drift=drift)
