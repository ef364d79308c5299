"""The fraud vertical's monitoring steps: the reference profile at registration, drift per
batch run, the delayed labels, the accumulated training data and the retrain trigger.

Thin tasks over :mod:`solutions.fraud.monitoring` (what is watched, the realised metrics)
and the generic :mod:`tasks.monitoring`, :mod:`tasks.accumulate` and :mod:`tasks.dispatch`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from prefect import task
from prefect.cache_policies import NONE

from flows.fraud.results import Accumulated, LabelsIngest, PreparedFeatures
from infra.deploy_config import MonitoringSpec
from infra.errors import DataValidationError
from infra.home import home_layout
from infra.registry import ModelRegistry, parse_model_spec
from infra.store import stable_hash
from solutions.fraud import monitoring as M
from solutions.fraud import pipeline as P
from solutions.fraud import schema as S
from solutions.fraud.config import SplitConfig, SyntheticDataConfig, TrainingSource
from solutions.fraud.pipeline import accounts_schema, transaction_schema
from tasks import accumulate as A
from tasks import monitoring as MON
from tasks.data import DatasetRef, load_table
from tasks.dispatch import Dispatched
from tasks.ledger import FileLedger, InboxRun, LedgerEntry, quarantine, scan_inbox, scored_entries
from tasks.prepare import materialize_table

log = logging.getLogger(__name__)

BATCH_JOB = "fraud-batch-score"
MONITOR_JOB = "fraud-monitor"
LABELS_JOB = "fraud-labels"
ACCUMULATE_JOB = "fraud-accumulate"
#: Days of history before the training window that window features look back on.
HISTORY_DAYS = 30


# ------------------------------------------------------------------------------------
# reference profile (at registration)


@task(name="profile-training-data", cache_policy=NONE)
def profile_step(ref: DatasetRef, prepared: PreparedFeatures, scores: np.ndarray, out_dir: Path) -> Path:
    """The profile of the train period's monitored inputs and of the model's held-out
    (test) scores, written to ``<out_dir>/profile.json`` for the registry."""
    periods = prepared.features.read([P.PERIOD])[P.PERIOD].to_numpy()
    rows = ref.read().loc[periods == "train"]
    return MON.build_profile(M.monitored_features(rows), scores).save(out_dir / MON.PROFILE_FILE)


# ------------------------------------------------------------------------------------
# drift of one batch run


def _with_accounts(tx: pd.DataFrame, accounts: str | None) -> pd.DataFrame:
    if not accounts:
        return tx
    return P.merge_accounts(tx, load_table(Path(accounts).expanduser(), accounts_schema()).read())


@task(name="check-drift", cache_policy=NONE)
def drift_step(run: InboxRun, columns: dict[str, str], accounts: str | None) -> MON.DriftSummary | None:
    """Compare this run's inputs and scores with the champion's profile (PSI, KS); record
    the rows, and emit an event and tag the run when a threshold is crossed (the plot over the
    runs is the monitor's)."""
    inputs = []
    for entry in scored_entries(BATCH_JOB, run.outputs) if run.outputs else []:
        kept = M.features_beside(Path(entry.output))
        if kept.exists():  # written while the file was scored: no second read of the input
            frame = pd.read_parquet(kept)
        else:
            frame = M.monitored_features(_with_accounts(
                load_table(Path(entry.path), transaction_schema(for_scoring=True), columns=columns).read(), accounts))
        inputs.append((frame, pd.read_parquet(entry.output, columns=["score"])["score"].to_numpy()))
    return MON.check_batch_drift(BATCH_JOB, run.model, inputs)


@task(name="drift-history", cache_policy=NONE)
def drift_history_step(out_dir: Path) -> MON.DriftHistory:
    """The batch job's drift over its recent runs: PSI per column plotted (``drift_psi.png``
    in the monitor's report folder) and a markdown section for the monitor's artifact."""
    return MON.job_drift_history(BATCH_JOB, out_dir)


# ------------------------------------------------------------------------------------
# delayed labels


@task(name="ingest-labels", cache_policy=NONE)
def ingest_labels_step(location: str, settle_s: float) -> LabelsIngest:
    """Validate every new labels file and append it to the monitor's labels table; a bad
    file is quarantined with its reason."""
    ledger = FileLedger(LABELS_JOB)
    folder = home_layout().monitoring(MONITOR_JOB)
    files, rows, bad, ids = 0, 0, {}, []
    for file in scan_inbox(location, ledger, settle_s=settle_s).pending:
        try:
            labels = load_table(Path(file.path), S.labels_schema()).read()
        except DataValidationError as exc:
            bad[file.shown] = quarantine(file, str(exc), ledger).reason or str(exc)
            continue
        MON.append_rows(folder, "labels", labels.assign(source=file.sha256[:16]))
        ledger.record(LedgerEntry(sha256=file.sha256, path=file.shown, size=file.size, mtime_ns=file.mtime_ns,
                                  status="scored", rows=len(labels)))
        files, rows = files + 1, rows + len(labels)
        ids += labels[S.TRANSACTION_ID].astype(str).tolist()
    return LabelsIngest(files=files, rows=rows, quarantined=bad, new_ids=ids)


def all_labels() -> pd.DataFrame:
    """Every label that arrived (all files, in arrival order)."""
    return MON.read_rows(home_layout().monitoring(MONITOR_JOB), "labels")


def all_scores() -> pd.DataFrame:
    """Every transaction the batch job scored, with the score of its first scoring (the
    decision taken then: a file that re-sends earlier rows as history does not replace it)."""
    entries = scored_entries(BATCH_JOB)
    parts = [pd.read_parquet(e.output) for e in entries if Path(e.output).exists()]
    if not parts:
        return pd.DataFrame(columns=[S.TRANSACTION_ID, S.ACCOUNT_ID, S.TIMESTAMP, "score", "model", "model_version"])
    scores = pd.concat(parts, ignore_index=True)
    return scores.drop_duplicates(S.TRANSACTION_ID, keep="first").reset_index(drop=True)


# ------------------------------------------------------------------------------------
# accumulated training data


@task(name="accumulate-scored", cache_policy=NONE)
def accumulate_step(new_label_ids: list[str], columns: dict[str, str], accounts: str | None) -> Accumulated:
    """Add the batch job's newly scored inputs to the day partitions with their arrived
    labels, and write newly arrived labels into the partitions of their transactions."""
    root = home_layout().accumulated("fraud")
    ledger = FileLedger(ACCUMULATE_JOB, root=home_layout().ledgers())
    done = ledger.entries()
    labels = all_labels()
    written: set[Any] = set()
    added = 0
    for entry in scored_entries(BATCH_JOB):
        if entry.sha256 in done:
            continue
        if not Path(entry.path).exists():
            log.warning("scored input %s is gone; its rows cannot accumulate", entry.path)
            continue
        tx = _with_accounts(load_table(Path(entry.path), transaction_schema(for_scoring=True), columns=columns).read(),
                            accounts)
        written.update(A.upsert_rows(root, M.apply_labels(tx, labels), time_column=S.TIMESTAMP, key=S.TRANSACTION_ID))
        ledger.record(LedgerEntry(sha256=entry.sha256, path=entry.path, size=entry.size, status="scored",
                                  output=str(root), rows=len(tx)))
        added += 1
    if new_label_ids:
        scores = all_scores()
        hit = scores.loc[scores[S.TRANSACTION_ID].astype(str).isin(set(new_label_ids)), S.TIMESTAMP]
        stale = set(pd.to_datetime(hit).dt.date) - written
        A.update_days(root, stale, lambda rows: M.apply_labels(rows, labels))
        written |= stale
    have = A.days(root)
    return Accumulated(path=str(root), files_added=added, days_written=len(written), days=len(have),
                       first_day=str(have[0]) if have else None, last_day=str(have[-1]) if have else None)


def accumulated_transactions(split: SplitConfig) -> DatasetRef:
    """The accumulated dataset's latest window (history + train + delay + test, counted back
    from the last day with arrived labels) as a validated transactions table.

    Raises:
        DataValidationError: too few days have accumulated for the split.
    """
    root = home_layout().accumulated("fraud")
    need = split.train_days + split.delay_days + split.test_days
    window = M.training_rows(A.read_window(root, need + HISTORY_DAYS + 1, min_days=need))
    if window.empty:
        raise DataValidationError("the accumulated dataset has no arrived label yet", source=str(root))
    span = (window[S.TIMESTAMP].max() - window[S.TIMESTAMP].min()) / pd.Timedelta(days=1)
    if span < need:
        raise DataValidationError(f"the accumulated dataset holds {span:.1f} labelled day(s); the split needs {need:g} "
                                  "(train + delay + test)", source=str(root))
    key = {"days": {str(d): (A.partition_dir(root, d) / A.PARTITION_FILE).stat().st_mtime_ns for d in A.days(root)},
           "need": need}
    stored = materialize_table("fraud-accumulated", {"v": "1", "parts": stable_hash(key)}, lambda: window)
    return load_table(Path(stored.path), transaction_schema())


load_accumulated_task = task(accumulated_transactions, name="load-accumulated", cache_policy=NONE)


def training_transactions(source: TrainingSource | None, data: str | None, columns: dict[str, str],
                          synthetic: SyntheticDataConfig, accounts: str | None, split: SplitConfig,
                          obtain: Any) -> DatasetRef:
    """The training data ``source`` names: the accumulated dataset's latest window, the given
    file, or the seeded synthetic data (``None``: the file when one is given, else synthetic).

    ``obtain`` is the vertical's loader of a file or synthetic data (``obtain_transactions``).
    """
    if source == "accumulated":
        if data:
            raise ValueError("source 'accumulated' trains on the accumulated dataset; drop data (or use source 'file')")
        return load_accumulated_task(split)
    if source == "file" and not data:
        raise ValueError("source 'file' needs data (a transactions CSV or Parquet)")
    if source == "synthetic" and data:
        raise ValueError("source 'synthetic' ignores data; drop data (or use source 'file')")
    return obtain(data, columns, synthetic, accounts)


# ------------------------------------------------------------------------------------
# realised performance and the retrain decision


@task(name="realised-performance", cache_policy=NONE)
def performance_step(fpr: float, k: int, min_labels: int, out_dir: Path) -> pd.DataFrame:
    """Join every score with its arrived label; realised metrics per scored day and model
    version, written to ``<home>/monitoring/fraud-monitor/performance.parquet`` and plotted."""
    joined = M.join_labels(all_scores(), all_labels())
    table = M.realised_performance(joined, fpr=fpr, k=k, min_labels=min_labels)
    folder = home_layout().monitoring(MONITOR_JOB)
    table.to_parquet(folder / "performance.parquet", index=False)
    if not table.empty and table["pr_auc"].notna().any():
        plot = table.assign(version="v" + table["model_version"].astype(str))
        MON.plot_over_time(plot.dropna(subset=["pr_auc"]), M.DAY, "pr_auc", "version", out_dir / "realised_pr_auc.png",
                           title="Realised PR-AUC per scored day")
    return table


@task(name="decide-retrain", cache_policy=NONE)
def decide_step(model: str, performance: pd.DataFrame, spec: MonitoringSpec, fpr: float,
                k: int) -> MON.RetrainDecision:
    """The champion's realised ``spec.metric`` over its last ``consecutive_days`` labelled days
    below the gate set by its first ``reference_days``, or its batch runs drifted
    ``consecutive_runs`` times in a row: retrain (once per champion version: the champion
    rule decides what follows)."""
    registry = ModelRegistry()
    name, _ = parse_model_spec(model)
    champion = registry.champion(name) if name in registry.models() else None
    if champion is None:
        return MON.RetrainDecision(trigger=False, reason=f"no champion of {name} yet")
    if spec.metric not in performance.columns.drop([M.DAY, "model", "model_version"]):
        raise ValueError(f"monitoring.fraud-monitor.metric {spec.metric!r} is not a realised metric "
                         f"(use one of {[c for c in performance.columns if c not in (M.DAY, 'model', 'model_version')]})")
    mine = performance.loc[(performance["model"] == name) & (performance["model_version"] == champion.version)
                           & (performance["labelled"] >= spec.min_labels) & performance[spec.metric].notna()]
    days = sorted(mine[M.DAY].tolist())
    reference = recent = None
    if spec.reference_days == 0 and spec.metric == "pr_auc":
        reference = champion.primary_value()  # test/auprc: the same metric on the test period
    if len(days) >= spec.reference_days + spec.consecutive_days:
        joined = M.join_labels(all_scores(), all_labels())
        if spec.reference_days:
            reference = M.pooled_metric(joined, champion.version, days[: spec.reference_days], spec.metric, fpr=fpr, k=k)
        recent = M.pooled_metric(joined, champion.version, days[-spec.consecutive_days:], spec.metric, fpr=fpr, k=k)
    flags = MON.drift_flags(home_layout().monitoring(BATCH_JOB), champion.spec)
    return MON.retrain_decision(champion.spec, reference, recent, flags, spec,
                                already=MON.triggered_before(home_layout().monitoring(MONITOR_JOB), champion.spec))


@task(name="trigger-retrain", cache_policy=NONE)
def trigger_step(decision: MON.RetrainDecision, spec: MonitoringSpec, overrides: dict[str, Any], fallback: Any,
                 ) -> Dispatched:
    """Run the configured deployment (``spec.trigger``) or, when it is not registered, its flow
    in-process; record the trigger."""
    return MON.start_retrain(decision, spec.trigger or "fraud-adapt/on-drift-adapt", overrides, fallback,
                             home_layout().monitoring(MONITOR_JOB))


def render_monitor_report(performance: pd.DataFrame, labels: LabelsIngest, acc: Accumulated,
                          decision: MON.RetrainDecision, dispatched: Dispatched | None, image: Path | None,
                          drift: MON.DriftHistory | None = None) -> str:
    """Markdown: labels taken in, the accumulated dataset, realised metrics per day and version,
    the decision."""
    lines = ["## fraud-monitor", "",
             f"Labels: {labels.files} new file(s), {labels.rows} row(s), {len(labels.quarantined)} quarantined.",
             (f"Accumulated dataset: {acc.days} day(s) ({acc.first_day} to {acc.last_day}), "
              f"{acc.files_added} scored file(s) added, {acc.days_written} day(s) written."), "",
             f"Decision: {'retrain' if decision.trigger else 'no retrain'}: {decision.reason}"]
    if dispatched is not None:
        lines.append(f"Started {dispatched.deployment} ({dispatched.how}"
                     + (f", flow run {dispatched.flow_run_id}" if dispatched.flow_run_id else "") + ").")
    if not performance.empty:
        lines += ["", "| day | version | labelled | frauds | PR-AUC | ROC-AUC | recall@FPR | CP@k |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in performance.itertuples(index=False):
            lines.append(f"| {pd.Timestamp(r.day).date()} | v{r.model_version} | {r.labelled} | {r.frauds} | "
                         f"{r.pr_auc:.3f} | {r.roc_auc:.3f} | {r.recall_at_fpr:.3f} | {r.card_precision_at_k:.3f} |")
    if image is not None and image.exists():
        lines += ["", f"Realised PR-AUC per day: `{image}`"]
    if drift is not None:
        lines += ["", drift.markdown]
    return "\n".join(lines) + "\n"
