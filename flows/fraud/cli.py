"""``python -m flows.fraud {train,adapt,score,batch,monitor,tune,promote,rollback,reproduce}``: the fraud commands.

Flags, defaults and help come from the flows' parameters (:mod:`flows.cli`); this module
names the flags where a field name alone would be unclear, checks files, column mappings,
timestamps and model names before a flow run starts, and renders each result for people.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from flows.cli import Command, approval_commands, champion_commands, evidence_command, given, make_main
from infra.registry import ModelRegistry, parse_model_spec

if TYPE_CHECKING:
    from flows.fraud.federate import FraudFederateResult
    from flows.fraud.results import (
        FraudAdaptResult,
        FraudBatchScoreResult,
        FraudMonitorResult,
        FraudScoreResult,
        FraudTrainResult,
        FraudTuneResult,
    )
    from tasks.reproduce import ReproduceResult

#: The flows, by entrypoint: imported only when a command runs (flows/cli.py reads their
#: parameters from the source), so --help and pre-flight errors import no torch or Prefect engine.
TRAIN = "flows.fraud.train:fraud_train"
ADAPT = "flows.fraud.adapt:fraud_adapt"
SCORE = "flows.fraud.score:fraud_score"
BATCH = "flows.fraud.score:fraud_batch_score"
MONITOR = "flows.fraud.monitor:fraud_monitor"
TUNE = "flows.fraud.tune:fraud_tune"
REPRODUCE = "flows.fraud.reproduce:fraud_reproduce"
FEDERATE = "flows.fraud.federate:fraud_federate"

#: Flag names shared by the commands that train (fields whose names would collide or mislead).
TRAINING_FLAGS = {
    "config.model_name": "model",
    "config.model.seed": "model-seed",
    "config.model.use_window_features": "no-window-features",
    "config.baseline.delay_days": "feature-delay-days",
}
#: The input files, shown in the short --help of the commands that train.
_DATA = ("data", "columns", "accounts")


# ------------------------------------------------------------------------------------
# pre-flight checks (before any flow run starts)


def _check_files(kwargs: dict[str, Any], *names: str) -> None:
    for name in names:
        value = kwargs.get(name)
        if value is not None and not Path(value).expanduser().is_file():
            raise ValueError(f"--{name.replace('_', '-')}: no such file: {value}")


def check_federate(kwargs: dict[str, Any]) -> None:
    """The data file exists and the federated extra is installed (one ``error:`` line, not a
    traceback from the server process)."""
    from solutions.fraud.flower_apps import require_federated_packages

    _check_files(kwargs, "data")
    config = kwargs.get("config")
    require_federated_packages(dp=bool(config and config.federation.dp_epsilon))


def _check_columns(kwargs: dict[str, Any], file: str | None = "data", *, for_scoring: bool = False) -> None:
    """The mapping names canonical columns, and the ``file`` parameter's header and first
    rows (read without the rest) have every required column, of its kind."""
    if kwargs.get("columns"):
        from solutions.fraud.schema import ColumnMapping

        try:
            ColumnMapping(dict(kwargs["columns"]))
        except ValueError as exc:
            raise ValueError(f"--columns: {exc}") from None
    if file and kwargs.get(file) is not None:
        from infra.tables import check_sample
        from solutions.fraud.schema import preflight_schema

        check_sample(Path(kwargs[file]).expanduser(), preflight_schema(for_scoring), kwargs.get("columns"),
                     kwargs.get("encoding"))


def _check_since(kwargs: dict[str, Any]) -> None:
    since = kwargs.get("since")
    if since is not None:
        import pandas as pd

        try:
            pd.Timestamp(since)
        except (ValueError, TypeError):
            raise ValueError(f"--since: {since!r} is not a timestamp (e.g. 2025-01-31 or 2025-01-31T12:00)") from None


def _check_encoding(kwargs: dict[str, Any]) -> None:
    if kwargs.get("encoding"):
        from infra.tables import check_encoding

        try:
            check_encoding(kwargs["encoding"])
        except ValueError as exc:
            raise ValueError(f"--encoding: {exc}") from None


def _check_model(kwargs: dict[str, Any], flow: Any, *, registered: bool) -> None:
    spec = given(kwargs, flow, "model")
    try:
        parse_model_spec(spec)
    except ValueError as exc:
        raise ValueError(f"--model: {exc}") from None
    if registered:
        ModelRegistry().resolve(spec)  # RegistryError names the registered models


def check_train(kwargs: dict[str, Any], *, for_scoring: bool = False) -> None:
    """Input files exist, the column mapping names canonical columns and the data file's
    first rows have the required columns, of their kinds (the label only when training)."""
    _check_files(kwargs, "data", "accounts")
    _check_columns(kwargs, for_scoring=for_scoring)


def check_tune(kwargs: dict[str, Any]) -> None:
    """As :func:`check_train`, and the search space fits the sequence model's config."""
    check_train(kwargs)
    from flows.fraud.steps import fraud_space

    fraud_space(given(kwargs, TUNE, "config").model)


def check_adapt(kwargs: dict[str, Any]) -> None:
    """As :func:`check_train`, the fine-tuning budget is valid and the model is registered."""
    check_train(kwargs)
    if not 0 < kwargs.get("fraction", 0.1) <= 1:
        raise ValueError(f"--fraction: {kwargs['fraction']} is not in (0, 1]")
    if kwargs.get("max_epochs", 1) < 1:
        raise ValueError(f"--max-epochs: {kwargs['max_epochs']} is below 1")
    _check_model(kwargs, ADAPT, registered=True)


def check_score(kwargs: dict[str, Any]) -> None:
    """Files exist, mapping and ``--since`` are valid, the model is registered."""
    _check_encoding(kwargs)
    check_train(kwargs, for_scoring=True)
    _check_since(kwargs)
    _check_model(kwargs, SCORE, registered=True)


def check_batch(kwargs: dict[str, Any]) -> None:
    """Accounts file and mapping valid, model name well formed (it is resolved only when a
    file waits: a schedule may fire before the first training)."""
    _check_files(kwargs, "accounts")
    _check_columns(kwargs, file=None)
    _check_encoding(kwargs)
    _check_model(kwargs, BATCH, registered=False)


def check_reproduce(kwargs: dict[str, Any]) -> None:
    """The model is registered and the tolerance is not negative."""
    if kwargs.get("tolerance", 0.0) < 0:
        raise ValueError(f"--tolerance: {kwargs['tolerance']} is negative")
    _check_model(kwargs, REPRODUCE, registered=True)


def check_monitor(kwargs: dict[str, Any]) -> None:
    """Accounts file and mapping valid, model name well formed."""
    _check_files(kwargs, "accounts")
    _check_columns(kwargs, file=None)
    _check_model(kwargs, MONITOR, registered=False)


def adapt_old_data(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The old regime's data for the forgetting check: the new data's size, seed 0, no new pattern."""
    config = given(kwargs, ADAPT, "config")
    return {**kwargs, "old_data": config.data.model_copy(update={"seed": 0, "new_pattern": False})}


# ------------------------------------------------------------------------------------
# summaries


def train_summary(r: FraudTrainResult) -> str:
    """The human summary of a training run."""
    lines = [
        f"fraud-train: {r.split}",
        f"  rows per period: {r.rows}",
        (
            f"  sequence  test PR-AUC {r.sequence.pr_auc:.4f}  ROC-AUC {r.sequence.roc_auc:.4f}  "
            f"recall@{r.sequence.fpr_target:.0%}FPR {r.sequence.recall_at_fpr:.4f}"
        ),
    ]
    if r.baseline:
        lines.append(
            f"  baseline  test PR-AUC {r.baseline.pr_auc:.4f}  ROC-AUC {r.baseline.roc_auc:.4f}  "
            f"recall@{r.baseline.fpr_target:.0%}FPR {r.baseline.recall_at_fpr:.4f}"
        )
    m, nan = r.model.metrics, float("nan")  # the registered winner's own test figures (an ensemble's too)
    lines += [
        (f"  registered {r.model.spec} ({r.winner})  test PR-AUC {m.get('test/auprc', nan):.4f}  "
         f"ROC-AUC {m.get('test/roc_auc', nan):.4f}  "
         f"recall@{r.sequence.fpr_target:.0%}FPR {m.get('test/recall_at_fpr', nan):.4f}"),
        f"  promotion: {r.promotion.reason}",
        f"  training: {len(r.train.epochs_trained_now)} epoch(s) now"
        + (f", resumed at epoch {r.train.resumed_from_epoch}" if r.train.resumed_from_epoch is not None else "")
        + (", reused a finished run" if r.train.reused_completed else ""),
        f"  report: {r.report_dir}/report.md  ({r.seconds:.0f} s)",
    ]
    return "\n".join(lines)


def adapt_summary(r: FraudAdaptResult) -> str:
    """The human summary of an adaptation."""
    lines = [
        (
            f"fraud-adapt: {r.parent} -> {r.model.spec}, trained {r.freeze.trainable_params} of "
            f"{r.freeze.total_params} parameters ({100 * r.freeze.trainable_fraction:.1f}%)"
        ),
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


def score_summary(r: FraudScoreResult) -> str:
    """The human summary of a scoring run."""
    return (
        f"fraud-score: {r.rows_scored} rows scored with {r.model}, {r.flagged} flagged "
        f"(threshold {r.threshold:.4g}) -> {r.output}" + (f" and {r.csv_output}" if r.csv_output else "")
    )


def monitor_summary(r: FraudMonitorResult) -> str:
    """The human summary of a monitor run: labels in, accumulated data, latest realised
    metrics per version, the decision."""
    a = r.accumulated
    lines = [
        f"fraud-monitor: {r.labels_files} label file(s), {r.labels_rows} label(s), {len(r.quarantined)} quarantined",
        f"  accumulated: {a.days} day(s) ({a.first_day} to {a.last_day}), {a.files_added} scored file(s) added",
    ]
    latest: dict[int, dict[str, Any]] = {}
    for row in r.performance:
        if row.get("pr_auc") == row.get("pr_auc") and row.get("pr_auc") is not None:  # not NaN
            latest[int(row["model_version"])] = row
    for version, row in sorted(latest.items()):
        lines.append(f"  v{version} on {str(row['day'])[:10]}: PR-AUC {row['pr_auc']:.4f}  ROC-AUC {row['roc_auc']:.4f}  "
                     f"recall@FPR {row['recall_at_fpr']:.4f}  CP@k {row['card_precision_at_k']:.4f}")
    lines.append(f"  {'retrain started' if r.dispatched else 'no retrain'}: {r.decision.reason}")
    lines.append(f"  report: {r.report_dir}/report.md")
    return "\n".join(lines)


def tune_summary(r: FraudTuneResult) -> str:
    """The human summary of a tuning run."""
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


def batch_summary(r: FraudBatchScoreResult) -> str:
    """The human summary of an inbox run."""
    from tasks.ledger import inbox_summary

    return inbox_summary("fraud-batch-score", r, rows="rows")


def reproduce_summary(r: ReproduceResult) -> str:
    """The human summary of a reproduction."""
    from tasks.reproduce import reproduce_summary as render

    return render(r)


def reproduce_exit_code(r: ReproduceResult) -> int:
    """0 when the reproduction is within its tolerance."""
    from tasks.reproduce import reproduce_exit_code as code

    return code(r)


# ------------------------------------------------------------------------------------
# commands


def federate_summary(result: FraudFederateResult) -> str:
    """Per-model test AP / ROC-AUC, partial rounds, ε and the registered version."""
    lines = [f"{name:28s} AP {m['ap'] if m['ap'] is not None else float('nan'):.4f}  "
             f"ROC-AUC {m['roc_auc'] if m['roc_auc'] is not None else float('nan'):.4f}"
             for name, m in result.metrics.items()]
    lines.append(f"rows per bank: {result.rows_per_bank}; partial rounds: {result.partial_rounds or 'none'}")
    if result.refused:
        lines.append(f"refused banks: {sorted(result.refused)}")
    lines.append(f"privacy: epsilon {result.epsilon}" if result.epsilon else "privacy: no differential privacy")
    lines.append(f"registered {result.model} ({'champion' if result.promoted else 'not promoted'}); "
                 f"report {result.report_dir}")
    lines += [f"note: {note}" for note in result.notes]
    return "\n".join(lines)


COMMANDS = (
    Command(
        "train", TRAIN, train_summary,
        help="train + evaluate + register (sequence model vs baseline)",
        flags={**TRAINING_FLAGS, "config.baseline.enabled": "no-baseline"},
        common=(*_DATA, "source", "config.model.max_epochs", "config.baseline.enabled", "fresh", "strict"),
        check=check_train,
    ),
    Command(
        "adapt", ADAPT, adapt_summary,
        help="fine-tune the champion on data with a new fraud pattern",
        flags={"config.baseline.delay_days": "feature-delay-days"},
        hidden={"config.model", "config.model_name", "config.baseline.enabled", "config.candidates", "old_data"},
        check=check_adapt, prepare=adapt_old_data,
    ),
    Command(
        "score", SCORE, score_summary,
        help="score a transactions file with the champion (or a named version)",
        check=check_score,
    ),
    Command(
        "batch", BATCH, batch_summary,
        help="score every new file of an inbox folder/glob (ledger + quarantine)",
        check=check_batch,
    ),
    Command(
        "monitor", MONITOR, monitor_summary,
        help="delayed labels -> realised metrics per day, accumulated data, retrain trigger",
        check=check_monitor,
    ),
    Command(
        "tune", TUNE, tune_summary,
        help="tune the sequence model (Optuna), register the best through the champion rule",
        flags={**TRAINING_FLAGS, "tune.seed": "tune-seed", "tune.enqueue_defaults": "no-defaults-trial"},
        hidden={"config.baseline.enabled", "config.candidates"},
        common=(*_DATA, "tune.trials", "tune.study", "tune.max_in_flight", "config.model.max_epochs", "strict"),
        check=check_tune,
    ),
    Command(
        "federate", FEDERATE, federate_summary,
        help="federated training across K banks (Flower; --dp-epsilon for DP-SGD), registered via the champion rule",
        flags={"config.model_name": "model", "config.model.seed": "model-seed",
               "config.model.use_window_features": "no-window-features", "config.delay_days": "feature-delay-days",
               "config.compare": "no-compare"},
        hidden={"faults", "config.federation.port", "config.model.max_epochs", "config.model.patience"},
        common=("data", "columns", "config.federation.clients", "config.federation.partition_by",
                "config.federation.rounds", "config.federation.dp_epsilon", "config.compare"),
        check=check_federate,
    ),
    evidence_command("flows.fraud.evidence:fraud_evidence",
                     "served scores per version (champion, challenger) joined to later labels; recommend (--promote)"),
    *champion_commands("flows.fraud.promote:fraud_promote", "flows.fraud.promote:fraud_rollback"),
    *approval_commands(),
    Command(
        "reproduce", REPRODUCE, reproduce_summary,
        help="re-train a registered version from its lineage; exit 0 when its metrics hold",
        check=check_reproduce, exit_code=reproduce_exit_code,
    ),
)

main = make_main(
    "python -m flows.fraud",
    "Fraud detection: train, adapt, score, batch-score an inbox, monitor, tune, promote, roll back, approve (four eyes), "
    "reproduce. "
    "Each command accepts --json and then prints the flow's typed result as one JSON object "
    "on the last line of stdout.",
    COMMANDS,
)
