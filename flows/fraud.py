"""Fraud detection flows: ``train``, ``adapt``, ``score`` and ``batch`` (inbox scoring).

Run ``python -m flows.fraud <command> --help``. Each command accepts ``--json`` and then
prints the flow's typed result as one JSON object on the last line of stdout.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
from prefect import flow, task
from prefect.cache_policies import NONE
from pydantic import BaseModel, ConfigDict, Field

from flows._cli import add_common, parse_columns, run_command
from infra.compute import resolve_training
from infra.errors import DataValidationError
from infra.home import home_layout
from infra.registry import ModelRef, ModelRegistry, PromotionDecision
from infra.runners import ConfiguredTaskRunner
from infra.settings import get_train_settings
from infra.store import atomic_path, safe_stem, stable_hash
from solutions.fraud import pipeline as P
from solutions.fraud import schema as S
from solutions.fraud.config import FraudTrainConfig, SequenceModelConfig, SplitConfig, SyntheticDataConfig
from solutions.fraud.model import build_module
from solutions.fraud.schema import ColumnMapping
from solutions.fraud.synthetic import generate_transactions
from tasks.compress import load_variant
from tasks.data import (
    ColumnSpec,
    DatasetRef,
    TableSchema,
    assign_periods,
    load_table,
    load_table_task,
    time_split,
)
from tasks.evaluate import (
    EvalReport,
    artifact_key,
    choose_threshold,
    evaluate_binary,
    plot_comparison,
    publish_eval_report_task,
    render_eval_report,
)
from tasks.finetune import FreezeReport, finetune_model_task
from tasks.ledger import InboxFile, InboxRun, ScoredFile, inbox_summary, process_inbox
from tasks.prepare import materialize_table, materialize_table_task
from tasks.register import register_model_task, render_promotion
from tasks.train import TrainResult, TrainSpec, train_model_task

log = logging.getLogger("flows.fraud")  # not __main__ under python -m
PRIMARY_METRIC = "test/auprc"
#: Adapting happens once the new pattern has been labelled: no delay, a short recent
#: training window that holds the pattern, then the test week.
ADAPT_SPLIT = SplitConfig(train_days=10, val_days=3, delay_days=0, test_days=7)


# ------------------------------------------------------------------------------------
# results


class FraudTrainResult(BaseModel):
    """What ``fraud-train`` produced."""

    model_config = ConfigDict(frozen=True)

    dataset: DatasetRef
    split: str
    rows: dict[str, int] = Field(description="Rows per period.")
    train: TrainResult
    sequence: EvalReport
    baseline: EvalReport | None
    winner: str = Field(description="Which model had the higher test PR-AUC.")
    model: ModelRef
    promotion: PromotionDecision
    report_dir: str
    seconds: float


class FraudAdaptResult(BaseModel):
    """What ``fraud-adapt`` produced: metrics before/after on the new and the old data."""

    model_config = ConfigDict(frozen=True)

    parent: str
    freeze: FreezeReport
    train: TrainResult
    new_before: EvalReport
    new_after: EvalReport
    pattern_before: EvalReport | None
    pattern_after: EvalReport | None
    old_before: EvalReport
    old_after: EvalReport
    model: ModelRef
    promotion: PromotionDecision
    report_dir: str


class FraudScoreResult(BaseModel):
    """What ``fraud-score`` wrote."""

    model_config = ConfigDict(frozen=True)

    model: str
    input: str
    rows_scored: int
    flagged: int
    threshold: float
    output: str
    csv_output: str | None
    labelled: EvalReport | None = Field(default=None, description="Metrics when labels were given.")


# ------------------------------------------------------------------------------------
# data steps (domain functions wrapped as tasks)


def transaction_schema(for_scoring: bool = False) -> TableSchema:
    """The validation schema of a transactions table."""
    columns = P.scoring_columns() if for_scoring else P.TRANSACTION_COLUMNS
    return TableSchema(
        name="fraud-transactions-score" if for_scoring else "fraud-transactions",
        columns=tuple(
            ColumnSpec(name=n, kind=k, required=r, nullable=nl, min_value=0.0 if n == S.AMOUNT else None)
            for n, k, r, nl in columns
        ),
        time_column=S.TIMESTAMP,
        label_column=None if for_scoring else S.LABEL,
        min_rows=2,
    )


def _generate(cfg: SyntheticDataConfig) -> pd.DataFrame:
    return generate_transactions(
        n_accounts=cfg.n_accounts,
        n_terminals=cfg.n_terminals,
        n_days=cfg.n_days,
        fraud_rate=cfg.fraud_rate,
        seed=cfg.seed,
        new_pattern=cfg.new_pattern,
    )


def obtain_transactions(
    data: str | None,
    columns: dict[str, str],
    synthetic: SyntheticDataConfig,
    accounts: str | None = None,
    for_scoring: bool = False,
) -> DatasetRef:
    """Validated transactions: the given file (mapped) or the seeded synthetic default."""
    if columns:
        ColumnMapping(columns)  # names the unknown canonical column early
    if data is None:
        generated = materialize_table_task.with_options(name="generate-transactions")(
            "fraud-synthetic", {"data": synthetic.model_dump(), "v": "1"}, lambda: _generate(synthetic)
        )
        path = Path(generated.path)
    else:
        path = Path(data).expanduser()
    ref = load_table_task(path, transaction_schema(for_scoring), columns=columns)
    if accounts:
        ref = _attach_accounts(ref, Path(accounts).expanduser())
    return ref


def accounts_schema() -> TableSchema:
    """The validation schema of the optional accounts table (static attributes)."""
    return TableSchema(
        name="fraud-accounts",
        columns=(
            ColumnSpec(name=S.ACCOUNT_ID, kind="id"),
            ColumnSpec(name=S.AGE, kind="float", required=False, nullable=True),
            ColumnSpec(name=S.OCCUPATION, kind="category", required=False, nullable=True),
            ColumnSpec(name=S.ACCOUNT_AGE_DAYS, kind="float", required=False, nullable=True),
        ),
    )


def _attach_accounts(ref: DatasetRef, accounts_path: Path) -> DatasetRef:
    acc = load_table_task(accounts_path, accounts_schema())
    return materialize_table_task.with_options(name="merge-accounts")(
        "fraud-merged",
        {"tx": ref.content_hash, "accounts": acc.content_hash},
        lambda: P.merge_accounts(ref.read(), acc.read()),
    )


def prepare_features(ref: DatasetRef, split: SplitConfig, delay_days: float) -> tuple[DatasetRef, str]:
    """Window features and periods of every row, stored once per (data, split, code)."""
    timestamps = ref.read([S.TIMESTAMP])[S.TIMESTAMP]
    bounds = time_split(
        timestamps,
        train_days=split.train_days,
        delay_days=split.delay_days,
        test_days=split.test_days,
        val_days=split.val_days,
    )

    def build() -> pd.DataFrame:
        return P.build_features(ref.read(), assign_periods(timestamps, bounds), delay_days)

    key = {"data": ref.content_hash, "split": split.model_dump(), "delay": delay_days, "v": P.FEATURES_VERSION}
    feats = materialize_table_task.with_options(name="prepare-features")("fraud-features", key, build)
    return feats, bounds.describe()


@task(name="fit-baseline", cache_policy=NONE)
def fit_baseline_step(features_ref: DatasetRef, data_ref: DatasetRef, seed: int) -> dict[str, np.ndarray]:
    """Fit the window-feature baseline; return its val and test scores."""
    feats = features_ref.read()
    labels = pd.read_parquet(data_ref.path, columns=[S.LABEL])[S.LABEL].to_numpy(dtype="float64")
    model = P.fit_baseline(feats, labels, seed=seed, n_threads=get_train_settings().num_threads)
    return {p: P.baseline_scores(model, feats, p) for p in ("val", "test")}


def _period_labels(data: pd.DataFrame, feats: pd.DataFrame, period: str) -> np.ndarray:
    return data.loc[(feats[P.PERIOD] == period).to_numpy(), S.LABEL].to_numpy(dtype="int64")


def _report_dir(kind: str) -> Path:
    path = home_layout().new_report(kind)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _evaluate_pair(
    name: str,
    y_val: np.ndarray,
    s_val: np.ndarray,
    y_test: np.ndarray,
    s_test: np.ndarray,
    fpr_target: float,
    out_dir: Path,
) -> EvalReport:
    """Threshold chosen on validation (max F1), applied to test."""
    threshold = choose_threshold(y_val, s_val, method="f1") if 0 < y_val.sum() < len(y_val) else 0.5
    return evaluate_binary(
        y_test, s_test, name=name, split="test", threshold=threshold, fpr_target=fpr_target, out_dir=out_dir
    )


def _champion_on(model_name: str, data: pd.DataFrame, feats: pd.DataFrame, period: str) -> float | None:
    """The current champion's PR-AUC on this run's period (a fair comparison), if any."""
    from sklearn.metrics import average_precision_score

    registry = ModelRegistry()
    champion = registry.champion(model_name) if model_name in registry.models() else None
    if champion is None:
        return None
    try:
        model, pre, cfg = P.model_from_params(champion.params, registry.load_state_dict(champion))
        setup = P.sequence_setup(data, feats, cfg, preprocessor=pre, periods=(period,))
        scores = P.score_period(model, setup, period)
    except (KeyError, ValueError, RuntimeError) as exc:
        log.warning("could not re-score champion %s on this data (%s); using its stored metric", champion.spec, exc)
        return None
    y = _period_labels(data, feats, period)
    return float(average_precision_score(y, scores))


# ------------------------------------------------------------------------------------
# flows


@flow(name="fraud-train", log_prints=True)
def fraud_train(
    data: str | None = None,
    columns: dict[str, str] | None = None,
    accounts: str | None = None,
    config: FraudTrainConfig = FraudTrainConfig(),
    fresh: bool = False,
    strict: bool = False,
) -> FraudTrainResult:
    """Train the fraud sequence model and the gradient-boosting baseline, evaluate both on
    the same test period, register the sequence model and promote it if it beats the
    champion. Without ``data`` it trains on the seeded synthetic transactions."""
    started = dt.datetime.now()
    # -- data
    ref = obtain_transactions(data, dict(columns or {}), config.data, accounts)
    feats_ref, split_text = prepare_features(ref, config.split, config.baseline.delay_days)
    df = ref.read()
    feats = feats_ref.read()
    counts = {str(k): int(v) for k, v in feats[P.PERIOD].value_counts().items()}
    log.info("split %s; rows %s", split_text, counts)
    for period in ("train", "val", "test"):
        y = _period_labels(df, feats, period) if counts.get(period) else np.zeros(0)
        if len(y) == 0 or y.sum() == 0:
            raise DataValidationError(
                f"the {period} period ({split_text}) has {len(y)} rows and {int(y.sum())} frauds; "
                "both classes are needed: adjust --train-days/--val-days/--delay-days/--test-days",
                source=ref.source,
            )
    # -- baseline
    out_dir = _report_dir("fraud-train")
    baseline_scores = fit_baseline_step(feats_ref, ref, config.model.seed) if config.baseline.enabled else None
    # -- sequence model
    mcfg = config.model
    setup = P.sequence_setup(df, feats, mcfg)
    train_labels = _period_labels(df, feats, "train").astype("float64")
    model = P.build_model(setup.preprocessor, mcfg, P.pos_weight_for(train_labels, mcfg.negative_rate))
    run_key = "fraud-seq-" + stable_hash({"data": feats_ref.content_hash, "model": mcfg.model_dump()})
    spec = TrainSpec(
        run_key=run_key,
        max_epochs=mcfg.max_epochs,
        patience=mcfg.patience,
        monitor="val/auprc",
        mode="max",
        seed=mcfg.seed,
        fresh=fresh,
        hardware=resolve_training("fraud-train"),
    )
    trained = train_model_task(model, setup.datamodule, spec)
    # -- evaluate both on the same test period
    y_val, y_test = _period_labels(df, feats, "val"), _period_labels(df, feats, "test")
    seq_test = P.score_period(model, setup, "test")
    seq_report = _evaluate_pair(
        "sequence", y_val, P.score_period(model, setup, "val"), y_test, seq_test, config.fpr_target, out_dir
    )
    curves = [("sequence", y_test, seq_test)]
    base_report = None
    if baseline_scores is not None:
        base_report = _evaluate_pair(
            "baseline", y_val, baseline_scores["val"], y_test, baseline_scores["test"], config.fpr_target, out_dir
        )
        curves.append(("baseline (HistGB)", y_test, baseline_scores["test"]))
    images = plot_comparison(curves, "test", out_dir, stem="fraud")
    # -- register + champion rule (champion re-scored on this test period)
    champion_value = _champion_on(config.model_name, df, feats, "test")
    metrics = {**seq_report.metrics(), **{f"baseline/{k}": v for k, v in (base_report.metrics() if base_report else {}).items()}}
    registration = register_model_task(
        config.model_name,
        model,
        params=P.model_params(model, setup.preprocessor, mcfg, threshold=seq_report.threshold, split=config.split.model_dump()),
        metrics=metrics,
        primary_metric=PRIMARY_METRIC,
        data_hash=ref.content_hash,
        champion_value=champion_value,
        strict=strict,
    )
    winner = "sequence"
    if base_report is not None and base_report.pr_auc > seq_report.pr_auc:
        winner = "baseline"
    markdown = render_eval_report(
        [r for r in (seq_report, base_report) if r is not None],
        title=f"fraud-train: sequence model vs baseline, {split_text}",
        images=images,
    ) + "\n\n" + render_promotion(registration.decision)
    (out_dir / "report.md").write_text(markdown)
    publish_eval_report_task(markdown, key=artifact_key("fraud-train-report"), description="Sequence vs baseline on the test period")
    return FraudTrainResult(
        dataset=ref,
        split=split_text,
        rows=counts,
        train=trained,
        sequence=seq_report,
        baseline=base_report,
        winner=winner,
        model=registration.model,
        promotion=registration.decision,
        report_dir=str(out_dir),
        seconds=(dt.datetime.now() - started).total_seconds(),
    )


def _scores_for(model_ref: ModelRef, df: pd.DataFrame, feats: pd.DataFrame, period: str) -> np.ndarray:
    registry = ModelRegistry()
    model, pre, cfg = P.model_from_params(model_ref.params, registry.load_state_dict(model_ref))
    setup = P.sequence_setup(df, feats, cfg, preprocessor=pre, periods=(period,))
    return P.score_period(model, setup, period)


def _pattern_rows(df: pd.DataFrame, feats: pd.DataFrame, period: str, scenario: str) -> np.ndarray | None:
    """Rows of ``period`` that are legit or of ``scenario`` (None without a scenario column)."""
    if S.SCENARIO not in df:
        return None
    rows = df.loc[(feats[P.PERIOD] == period).to_numpy(), S.SCENARIO].fillna("")
    keep = rows.isin(["", scenario]).to_numpy()
    has_pattern = (rows == scenario).any()
    return keep if has_pattern else None


@flow(name="fraud-adapt", log_prints=True)
def fraud_adapt(
    data: str | None = None,
    columns: dict[str, str] | None = None,
    model: str = "fraud-seq",
    config: FraudTrainConfig = FraudTrainConfig(
        data=SyntheticDataConfig(seed=1, new_pattern=True), split=ADAPT_SPLIT
    ),
    old_data: SyntheticDataConfig | None = SyntheticDataConfig(),
    fraction: float = 0.10,
    max_epochs: int = 6,
    fresh: bool = False,
    strict: bool = False,
) -> FraudAdaptResult:
    """Fine-tune the champion on data holding a new fraud pattern, training only the top
    ``fraction`` of its parameters; report metrics on the new pattern before and after, and
    on the old test set (forgetting). The adapted version goes through the champion rule,
    judged on the new data's test period."""
    registry = ModelRegistry()
    name, version = model.partition(":")[0], model.partition(":")[2] or "champion"
    parent = registry.get(name, version)
    parent_model, pre, mcfg = P.model_from_params(parent.params, registry.load_state_dict(parent))
    split = config.split
    out_dir = _report_dir("fraud-adapt")
    # -- new data (with the new pattern) and the old test set
    ref = obtain_transactions(data, dict(columns or {}), config.data)
    feats_ref, split_text = prepare_features(ref, split, config.baseline.delay_days)
    df, feats = ref.read(), feats_ref.read()
    y_val, y_test = _period_labels(df, feats, "val"), _period_labels(df, feats, "test")
    old_df = old_feats = None
    if old_data is not None:
        old_ref = obtain_transactions(None, {}, old_data)
        old_feats_ref, _ = prepare_features(old_ref, split, config.baseline.delay_days)
        old_df, old_feats = old_ref.read(), old_feats_ref.read()
    else:
        old_df, old_feats = df, feats
    y_old_test = _period_labels(old_df, old_feats, "test")
    threshold = float(parent.params.get("threshold", 0.5))

    def report(name_: str, y: np.ndarray, s: np.ndarray, keep: np.ndarray | None = None) -> EvalReport:
        if keep is not None:
            y, s = y[keep], s[keep]
        return evaluate_binary(y, s, name=name_, split="test", threshold=threshold, fpr_target=config.fpr_target)

    pattern = _pattern_rows(df, feats, "test", "new_pattern")
    new_before_s = _scores_for(parent, df, feats, "test")
    old_before_s = _scores_for(parent, old_df, old_feats, "test")
    new_before = report("before (new data)", y_test, new_before_s)
    old_before = report("before (old test)", y_old_test, old_before_s)
    pattern_before = report("before (new pattern)", y_test, new_before_s, pattern) if pattern is not None else None
    # -- fine-tune the top parameters on the new data's train period
    setup = P.sequence_setup(df, feats, mcfg, preprocessor=pre)
    run_key = "fraud-adapt-" + stable_hash({"parent": parent.spec, "data": feats_ref.content_hash, "fraction": fraction, "epochs": max_epochs})
    spec = TrainSpec(run_key=run_key, max_epochs=max_epochs, patience=3, monitor="val/auprc", mode="max", seed=mcfg.seed, fresh=fresh, hardware=resolve_training("fraud-adapt"))
    parent_model.train()
    tuned = finetune_model_task(parent_model, setup.datamodule, spec, mode="top", fraction=fraction)
    adapted = parent_model
    new_after_s = P.score_period(adapted, setup, "test")
    old_setup = P.sequence_setup(old_df, old_feats, mcfg, preprocessor=pre, periods=("test",))
    old_after_s = P.score_period(adapted, old_setup, "test")
    new_after = report("after (new data)", y_test, new_after_s)
    old_after = report("after (old test)", y_old_test, old_after_s)
    pattern_after = report("after (new pattern)", y_test, new_after_s, pattern) if pattern is not None else None
    # -- register with lineage; champion judged on the new data's test period
    metrics = {
        **new_after.metrics(),
        "old_test/auprc": old_after.pr_auc,
        "old_test/auprc_before": old_before.pr_auc,
        "test/auprc_before": new_before.pr_auc,
    }
    if pattern_after is not None and pattern_before is not None:
        metrics.update({"pattern/auprc": pattern_after.pr_auc, "pattern/auprc_before": pattern_before.pr_auc})
    params = dict(parent.params)
    params["threshold"] = choose_threshold(y_val, P.score_period(adapted, setup, "val")) if 0 < y_val.sum() < len(y_val) else threshold
    params["finetune"] = {"fraction": fraction, "trainable_params": tuned.freeze.trainable_params, "total_params": tuned.freeze.total_params}
    # the current champion (which may not be the parent) re-scored on the same test period
    champion = registry.champion(name)
    champion_value = (
        new_before.pr_auc
        if champion is not None and champion.version == parent.version
        else _champion_on(name, df, feats, "test")
    )
    registration = register_model_task(
        name, adapted, params=params, metrics=metrics, primary_metric=PRIMARY_METRIC,
        data_hash=ref.content_hash, parent=parent.spec, champion_value=champion_value, strict=strict,
        tags={"kind": "adapted"},
    )
    reports = [r for r in (new_before, new_after, pattern_before, pattern_after, old_before, old_after) if r is not None]
    markdown = (
        render_eval_report(reports, title=f"fraud-adapt: {parent.spec} fine-tuned on new data ({split_text})")
        + f"\n\nTrainable parameters: {tuned.freeze.trainable_params} of {tuned.freeze.total_params} "
        f"({100 * tuned.freeze.trainable_fraction:.1f}%).\n\n"
        + render_promotion(registration.decision)
    )
    (out_dir / "report.md").write_text(markdown)
    publish_eval_report_task(markdown, key=artifact_key("fraud-adapt-report"), description="Before/after fine-tuning on a new fraud pattern")
    return FraudAdaptResult(
        parent=parent.spec, freeze=tuned.freeze, train=tuned.train,
        new_before=new_before, new_after=new_after, pattern_before=pattern_before, pattern_after=pattern_after,
        old_before=old_before, old_after=old_after, model=registration.model, promotion=registration.decision,
        report_dir=str(out_dir),
    )


def score_transactions(ref_model: ModelRef, registry: ModelRegistry, ref: DatasetRef,
                       since: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray]:
    """Score the validated transactions of ``ref`` with one model version.

    Rows before ``since`` serve only as history for sequences and window features.
    Returns (scores table with the model version, the input rows scored, their scores).
    """
    if "compression" in ref_model.params:  # an INT8 / pruned / distilled variant (flows.compress)
        net = load_variant(ref_model, registry, build_module)
        pre, mcfg = P.preprocessing_from_params(ref_model.params)
    else:
        net, pre, mcfg = P.model_from_params(ref_model.params, registry.load_state_dict(ref_model))
    threshold = float(ref_model.params.get("threshold", 0.5))
    df = ref.read()
    delay = float(ref_model.params.get("split", {}).get("delay_days", 7))
    periods = np.full(len(df), "score", dtype=object)
    if since:
        cutoff = pd.Timestamp(since)
        periods[(df[S.TIMESTAMP] < cutoff).to_numpy()] = "history"
    feats = P.build_features(df, periods, delay)
    missing = [c for c in pre.window_feature_names if c not in feats]
    if missing:
        raise DataValidationError(
            f"the model needs window features {missing}, which this file cannot give "
            "(is a column such as terminal_id missing?)",
            source=ref.source,
        )
    setup = P.sequence_setup(df, feats, mcfg, preprocessor=pre, periods=("score",))
    scores = P.score_period(net, setup, "score")
    rows = periods == "score"
    out = df.loc[rows, [S.TRANSACTION_ID, S.ACCOUNT_ID, S.TIMESTAMP]].reset_index(drop=True)
    out["score"] = scores
    out["flagged"] = scores >= threshold
    out["model"] = ref_model.name
    out["model_version"] = ref_model.version
    return out, df.loc[rows], scores


def _write_scores(out: pd.DataFrame, target: Path, csv: bool) -> Path | None:
    with atomic_path(target) as tmp:
        out.to_parquet(tmp, index=False)
    if not csv:
        return None
    csv_path = target.with_suffix(".csv")
    with atomic_path(csv_path) as tmp:
        out.to_csv(tmp, index=False)
    return csv_path


@flow(name="fraud-score", log_prints=True)
def fraud_score(
    data: str,
    columns: dict[str, str] | None = None,
    accounts: str | None = None,
    model: str = "fraud-seq",
    output: str | None = None,
    csv: bool = False,
    since: str | None = None,
) -> FraudScoreResult:
    """Batch-score a transactions file with the champion (or a named version); write
    scores (Parquet, CSV on request) with the model version used, and a summary artifact.
    Rows before ``since`` serve only as history for sequences and window features."""
    registry = ModelRegistry()
    ref_model = registry.resolve(model)
    threshold = float(ref_model.params.get("threshold", 0.5))
    ref = obtain_transactions(data, dict(columns or {}), SyntheticDataConfig(), accounts, for_scoring=True)
    out, scored_rows, scores = score_transactions(ref_model, registry, ref, since)
    target = Path(output).expanduser() if output else (
        home_layout().scores() / f"{safe_stem(data)}-{ref_model.name}-v{ref_model.version}.parquet"
    )
    csv_path = _write_scores(out, target, csv)
    labelled = None
    if S.LABEL in scored_rows:
        y = scored_rows[S.LABEL]
        known = y.notna().to_numpy()
        if known.any() and 0 < y[known].astype(int).sum() < known.sum():
            labelled = evaluate_binary(y[known].astype(int).to_numpy(), scores[known], name=ref_model.spec, split="scored", threshold=threshold)
    quantiles = np.quantile(scores, [0.5, 0.9, 0.99]) if len(scores) else [np.nan] * 3
    markdown = (
        f"## fraud-score with {ref_model.spec}\n\n| | |\n|---|---|\n"
        f"| input | `{data}` |\n| rows scored | {len(out)} |\n| flagged (score ≥ {threshold:.4g}) | {int(out['flagged'].sum())} |\n"
        f"| score p50 / p90 / p99 | {quantiles[0]:.4f} / {quantiles[1]:.4f} / {quantiles[2]:.4f} |\n| output | `{target}` |\n"
    )
    if labelled is not None:
        markdown += "\n" + render_eval_report([labelled], title="Labelled rows")
    publish_eval_report_task(markdown, key=artifact_key("fraud-score-summary"), description="Batch scoring summary")
    return FraudScoreResult(
        model=ref_model.spec, input=str(data), rows_scored=len(out), flagged=int(out["flagged"].sum()),
        threshold=threshold, output=str(target), csv_output=str(csv_path) if csv_path else None, labelled=labelled,
    )


class FraudBatchScoreResult(InboxRun):
    """What one ``fraud-batch-score`` run did with the inbox: ``rows`` transactions scored,
    ``flagged`` of them at or above the model's threshold."""


def score_inbox_file(file: InboxFile, *, model: str, columns: dict[str, str], accounts: str | None,
                     out_dir: str, csv: bool) -> ScoredFile:
    """Score one inbox file with an exact model version (runs on any task-runner worker)."""
    registry = ModelRegistry()
    ref_model = registry.resolve(model)
    ref = load_table(Path(file.path), transaction_schema(for_scoring=True), columns=columns)
    if accounts:
        acc = load_table(Path(accounts).expanduser(), accounts_schema())
        tx = ref
        ref = materialize_table("fraud-merged", {"tx": tx.content_hash, "accounts": acc.content_hash},
                                lambda: P.merge_accounts(tx.read(), acc.read()))
    out, _, _ = score_transactions(ref_model, registry, ref)
    target = Path(out_dir) / f"{safe_stem(file.path)}-{file.sha256[:12]}-{ref_model.name}-v{ref_model.version}.parquet"
    _write_scores(out, target, csv)
    return ScoredFile(output=str(target), rows=len(out), model=ref_model.spec, flagged=int(out["flagged"].sum()))


@flow(name="fraud-batch-score", log_prints=True, task_runner=ConfiguredTaskRunner())
def fraud_batch_score(
    inbox: str | None = None,
    model: str = "fraud-seq",
    columns: dict[str, str] | None = None,
    accounts: str | None = None,
    output_dir: str | None = None,
    csv: bool = False,
    settle_seconds: float = 30.0,
) -> FraudBatchScoreResult:
    """Score every new transactions file (CSV/Parquet) in ``inbox`` with the champion.

    ``inbox`` is a folder or a glob (default ``<home>/inbox/fraud``). A file whose content
    was handled before is skipped (processed-files ledger); a file that cannot be read or
    validated is quarantined with its reason and the others are scored. Files change in the
    last ``settle_seconds`` are left for the next run (still being copied in)."""
    location = inbox or str(home_layout().inbox("fraud"))
    if columns:
        ColumnMapping(dict(columns))
    out_dir = Path(output_dir).expanduser() if output_dir else home_layout().scores("fraud-batch")
    out_dir.mkdir(parents=True, exist_ok=True)
    run = process_inbox(
        "fraud-batch-score", location, model, settle_s=settle_seconds,
        make_scorer=lambda spec: partial(score_inbox_file, model=spec, columns=dict(columns or {}), accounts=accounts,
                                         out_dir=str(out_dir), csv=csv),
    )
    return FraudBatchScoreResult(**run.model_dump())


# ------------------------------------------------------------------------------------
# command line


def _split_args(p: argparse.ArgumentParser, d: SplitConfig | None = None) -> None:
    d = d or SplitConfig()
    g = p.add_argument_group("time split (days, counted back from the end of the data)")
    g.add_argument("--train-days", type=float, default=d.train_days, help="training period, validation included (default %(default)s)")
    g.add_argument("--val-days", type=float, default=d.val_days, help="last part of training used for early stopping (default %(default)s)")
    g.add_argument("--delay-days", type=float, default=d.delay_days, help="label delay before the test period, never trained on (default %(default)s)")
    g.add_argument("--test-days", type=float, default=d.test_days, help="test period (default %(default)s)")


def _data_args(p: argparse.ArgumentParser, synthetic: bool = True) -> None:
    g = p.add_argument_group("input data")
    g.add_argument("--data", metavar="FILE", help="transactions CSV or Parquet (default: seeded synthetic data)")
    g.add_argument(
        "--columns",
        metavar="MAP",
        help="column mapping canonical=SOURCE,..., e.g. account_id=CUSTOMER_ID,timestamp=TX_DATETIME,"
        "amount=TX_AMOUNT,label=TX_FRAUD,transaction_id=TRANSACTION_ID,terminal_id=TERMINAL_ID",
    )
    g.add_argument("--accounts", metavar="FILE", help="optional accounts table: account_id, age, occupation, account_age_days")
    if synthetic:
        d = SyntheticDataConfig()
        s = p.add_argument_group("synthetic data (used when --data is not given)")
        s.add_argument("--n-accounts", type=int, default=d.n_accounts, help="default %(default)s")
        s.add_argument("--n-terminals", type=int, default=d.n_terminals, help="default %(default)s")
        s.add_argument("--n-days", type=int, default=d.n_days, help="default %(default)s")
        s.add_argument("--fraud-rate", type=float, default=d.fraud_rate, help="default %(default)s")
        s.add_argument("--seed", type=int, default=d.seed, help="default %(default)s")


def _model_args(p: argparse.ArgumentParser) -> None:
    d = SequenceModelConfig()
    g = p.add_argument_group("sequence model")
    g.add_argument("--seq-len", type=int, default=d.seq_len, help="transactions per sequence (default %(default)s)")
    g.add_argument("--max-epochs", type=int, default=d.max_epochs, help="default %(default)s")
    g.add_argument("--batch-size", type=int, default=d.batch_size, help="default %(default)s")
    g.add_argument("--loss", choices=["bce", "focal"], default=d.loss, help="imbalance handling (default %(default)s)")
    g.add_argument("--negative-rate", type=float, default=d.negative_rate, help="share of legit training rows drawn afresh each epoch (default %(default)s)")
    g.add_argument("--no-window-features", action="store_true", help="sequence embedding + static attributes only")


def _config_from(args: argparse.Namespace, new_pattern: bool = False, seed_offset: int = 0) -> FraudTrainConfig:
    return FraudTrainConfig(
        data=SyntheticDataConfig(
            n_accounts=args.n_accounts,
            n_terminals=args.n_terminals,
            n_days=args.n_days,
            fraud_rate=args.fraud_rate,
            seed=args.seed + seed_offset,
            new_pattern=new_pattern,
        ),
        split=SplitConfig(
            train_days=args.train_days, val_days=args.val_days, delay_days=args.delay_days, test_days=args.test_days
        ),
        model=SequenceModelConfig(
            seq_len=args.seq_len,
            max_epochs=args.max_epochs,
            batch_size=args.batch_size,
            loss=args.loss,
            negative_rate=args.negative_rate,
            use_window_features=not args.no_window_features,
        ),
        model_name=args.model_name,
    )


def _train_summary(r: FraudTrainResult) -> str:
    lines = [
        f"fraud-train: {r.split}",
        f"  rows per period: {r.rows}",
        f"  sequence  test PR-AUC {r.sequence.pr_auc:.4f}  ROC-AUC {r.sequence.roc_auc:.4f}  "
        f"recall@{r.sequence.fpr_target:.0%}FPR {r.sequence.recall_at_fpr:.4f}",
    ]
    if r.baseline:
        lines.append(
            f"  baseline  test PR-AUC {r.baseline.pr_auc:.4f}  ROC-AUC {r.baseline.roc_auc:.4f}  "
            f"recall@{r.baseline.fpr_target:.0%}FPR {r.baseline.recall_at_fpr:.4f}"
        )
    lines += [
        f"  winner: {r.winner}",
        f"  registered {r.model.spec}: {r.promotion.reason}",
        f"  training: {len(r.train.epochs_trained_now)} epoch(s) now"
        + (f", resumed at epoch {r.train.resumed_from_epoch}" if r.train.resumed_from_epoch is not None else "")
        + (", reused a finished run" if r.train.reused_completed else ""),
        f"  report: {r.report_dir}/report.md  ({r.seconds:.0f} s)",
    ]
    return "\n".join(lines)


def _adapt_summary(r: FraudAdaptResult) -> str:
    lines = [
        f"fraud-adapt: {r.parent} -> {r.model.spec}, trained {r.freeze.trainable_params} of "
        f"{r.freeze.total_params} parameters ({100 * r.freeze.trainable_fraction:.1f}%)",
        f"  new data test PR-AUC  {r.new_before.pr_auc:.4f} -> {r.new_after.pr_auc:.4f}",
    ]
    if r.pattern_before and r.pattern_after:
        lines.append(f"  new pattern PR-AUC    {r.pattern_before.pr_auc:.4f} -> {r.pattern_after.pr_auc:.4f}")
    lines += [
        f"  old test PR-AUC       {r.old_before.pr_auc:.4f} -> {r.old_after.pr_auc:.4f} (forgetting)",
        f"  {r.promotion.reason}",
        f"  report: {r.report_dir}/report.md",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m flows.fraud {train,adapt,score,batch}``."""
    parser = argparse.ArgumentParser(prog="python -m flows.fraud", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train + evaluate + register (sequence model vs baseline)", description=fraud_train.description)
    _data_args(t)
    _split_args(t)
    _model_args(t)
    t.add_argument("--model-name", default="fraud-seq", help="registry name (default %(default)s)")
    t.add_argument("--no-baseline", action="store_true", help="skip the gradient-boosting baseline")
    t.add_argument("--fresh", action="store_true", help="retrain from scratch even if this run's checkpoints exist")
    t.add_argument("--strict", action="store_true", help="fail (QualityGateError) if the new version does not beat the champion")
    add_common(t)

    a = sub.add_parser("adapt", help="fine-tune the champion on data with a new fraud pattern", description=fraud_adapt.description)
    _data_args(a)
    _split_args(a, ADAPT_SPLIT)
    a.set_defaults(seed=1)
    a.add_argument("--model", default="fraud-seq", help="NAME[:VERSION] to adapt (default: the champion of %(default)s)")
    a.add_argument("--fraction", type=float, default=0.10, help="share of parameters to train (default %(default)s)")
    a.add_argument("--max-epochs", type=int, default=6, help="default %(default)s")
    a.add_argument("--fresh", action="store_true", help="re-run fine-tuning even if this run's checkpoints exist")
    a.add_argument("--strict", action="store_true", help="fail if the adapted version does not beat the champion")
    add_common(a)

    s = sub.add_parser("score", help="batch-score a transactions file with the champion", description=fraud_score.description)
    s.add_argument("data", metavar="FILE", help="transactions CSV or Parquet (label optional)")
    s.add_argument("--columns", metavar="MAP", help="column mapping canonical=SOURCE,...")
    s.add_argument("--accounts", metavar="FILE", help="optional accounts table")
    s.add_argument("--model", default="fraud-seq", help="NAME[:VERSION] (default: the champion of %(default)s)")
    s.add_argument("--output", metavar="FILE", help="Parquet output (default: <home>/scores/<input>-<model>-v<version>.parquet)")
    s.add_argument("--csv", action="store_true", help="also write a CSV beside the Parquet")
    s.add_argument("--since", metavar="TIMESTAMP", help="score only rows at or after this time; earlier rows are history")
    add_common(s)

    b = sub.add_parser("batch", help="score every new file of an inbox folder/glob (ledger + quarantine)",
                       description=fraud_batch_score.description)
    b.add_argument("--inbox", metavar="DIR|GLOB", help="folder or glob of CSV/Parquet files (default: <home>/inbox/fraud)")
    b.add_argument("--model", default="fraud-seq", help="NAME[:VERSION] (default: the champion of %(default)s)")
    b.add_argument("--columns", metavar="MAP", help="column mapping canonical=SOURCE,...")
    b.add_argument("--accounts", metavar="FILE", help="optional accounts table joined to every file")
    b.add_argument("--output-dir", metavar="DIR", help="where score files go (default: <home>/scores/fraud-batch)")
    b.add_argument("--csv", action="store_true", help="also write a CSV beside each Parquet")
    b.add_argument("--settle-seconds", type=float, default=30.0,
                   help="skip files modified in the last N seconds (still being copied; default %(default)s)")
    add_common(b)

    args = parser.parse_args(argv)
    if args.command == "batch":
        return run_command(
            lambda: fraud_batch_score(
                inbox=args.inbox, model=args.model, columns=parse_columns(args.columns), accounts=args.accounts,
                output_dir=args.output_dir, csv=args.csv, settle_seconds=args.settle_seconds,
            ),
            as_json=args.json,
            summary=lambda r: inbox_summary("fraud-batch-score", r, rows="rows"),
        )
    if args.command == "train":
        config = _config_from(args)
        if args.no_baseline:
            config = config.model_copy(update={"baseline": config.baseline.model_copy(update={"enabled": False})})
        return run_command(
            lambda: fraud_train(
                data=args.data,
                columns=parse_columns(args.columns),
                accounts=args.accounts,
                config=config,
                fresh=args.fresh,
                strict=args.strict,
            ),
            as_json=args.json,
            summary=_train_summary,
        )
    if args.command == "adapt":
        data_cfg = SyntheticDataConfig(
            n_accounts=args.n_accounts, n_terminals=args.n_terminals, n_days=args.n_days,
            fraud_rate=args.fraud_rate, seed=args.seed, new_pattern=True,
        )
        old_cfg = data_cfg.model_copy(update={"seed": 0, "new_pattern": False})
        split = SplitConfig(train_days=args.train_days, val_days=args.val_days, delay_days=args.delay_days, test_days=args.test_days)
        return run_command(
            lambda: fraud_adapt(
                data=args.data, columns=parse_columns(args.columns), model=args.model,
                config=FraudTrainConfig(data=data_cfg, split=split), old_data=old_cfg,
                fraction=args.fraction, max_epochs=args.max_epochs, fresh=args.fresh, strict=args.strict,
            ),
            as_json=args.json,
            summary=_adapt_summary,
        )
    if args.command == "score":
        return run_command(
            lambda: fraud_score(
                data=args.data, columns=parse_columns(args.columns), accounts=args.accounts,
                model=args.model, output=args.output, csv=args.csv, since=args.since,
            ),
            as_json=args.json,
            summary=lambda r: (
                f"fraud-score: {r.rows_scored} rows scored with {r.model}, {r.flagged} flagged "
                f"(threshold {r.threshold:.4g}) -> {r.output}" + (f" and {r.csv_output}" if r.csv_output else "")
            ),
        )
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
