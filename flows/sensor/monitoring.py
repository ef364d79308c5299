"""The sensor vertical's monitoring steps: the reference profile at registration, drift per
batch run, the failure events, the realised RUL error and the accumulated training data
(thin tasks over :mod:`solutions.sensor.monitoring`, :mod:`tasks.monitoring` and
:mod:`tasks.accumulate`)."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from prefect import task
from prefect.cache_policies import NONE

from flows.sensor.accumulated import failures_root, readings_root
from flows.sensor.results import FailuresIngest, SensorAccumulated
from flows.sensor.steps import grid_table
from infra.deploy_config import MonitoringSpec
from infra.errors import DataValidationError
from infra.home import home_layout
from infra.registry import ModelRegistry, parse_model_spec
from solutions.sensor import data as D
from solutions.sensor import monitoring as M
from solutions.sensor import schema as S
from solutions.sensor.config import SensorConfig
from solutions.sensor.pipeline import SupervisedSetup
from tasks import accumulate as A
from tasks import monitoring as MON
from tasks.data import DatasetRef, load_table
from tasks.dispatch import Dispatched
from tasks.ledger import FileLedger, InboxRun, LedgerEntry, locate, quarantine, scan_inbox, scored_entries

log = logging.getLogger(__name__)

BATCH_JOB = "sensor-batch-score"
MONITOR_JOB = "sensor-monitor"
FAILURES_JOB = "sensor-failures"
ACCUMULATE_JOB = "sensor-accumulate"


@task(name="profile-training-data", cache_policy=NONE)
def profile_step(grid_ref: DatasetRef, setup: SupervisedSetup, predicted_rul: np.ndarray, out_dir: Path) -> Path:
    """The profile of the training assets' sensor values and operating settings and of the
    model's predicted RUL on the test units' last windows, written to ``<out_dir>/profile.json``."""
    rows = M.asset_rows(grid_ref.read(), list(setup.splits.get("train", [])))
    return MON.build_profile(M.monitored_features(rows), predicted_rul).save(out_dir / MON.PROFILE_FILE)


@task(name="check-drift", cache_policy=NONE)
def drift_step(run: InboxRun, columns: Mapping[str, str], config: SensorConfig) -> MON.DriftSummary | None:
    """Compare this run's aligned readings and predicted RUL with the champion's profile (PSI,
    KS); record the rows, and emit an event and tag the run when a threshold is crossed (the
    plot over the runs is the monitor's)."""
    inputs = []
    for entry in scored_entries(BATCH_JOB, run.outputs) if run.outputs else []:
        plan = D.readings_plan(locate(entry.path) or Path(entry.path), None, dict(columns), config.align, data_sha256=entry.sha256)
        grid_ref, _ = grid_table(plan)  # the grid of the scored file, stored under its content key
        inputs.append((M.monitored_features(grid_ref.read()),
                       pd.read_parquet(entry.output, columns=["predicted_rul"])["predicted_rul"].to_numpy()))
    return MON.check_batch_drift(BATCH_JOB, run.model, inputs)


@task(name="drift-history", cache_policy=NONE)
def drift_history_step(out_dir: Path) -> MON.DriftHistory:
    """The batch job's drift over its recent runs: PSI per column plotted (``drift_psi.png``
    in the monitor's report folder) and a markdown section for the monitor's artifact."""
    return MON.job_drift_history(BATCH_JOB, out_dir)


# ------------------------------------------------------------------------------------
# failure events


@task(name="ingest-failures", cache_policy=NONE)
def ingest_failures_step(location: str, settle_s: float) -> FailuresIngest:
    """Validate every new failures file (``asset_id,failed_at``) and append it to the monitor's
    failures table and to the accumulated failure events; a bad file is quarantined with its
    reason."""
    ledger = FileLedger(FAILURES_JOB)
    folder = home_layout().monitoring(MONITOR_JOB)
    files, rows, bad = 0, 0, {}
    for file in scan_inbox(location, ledger, settle_s=settle_s).pending:
        try:
            failures = load_table(Path(file.path), M.failures_schema()).read()
        except DataValidationError as exc:
            bad[file.shown] = quarantine(file, str(exc), ledger).reason or str(exc)
            continue
        events = M.first_failures(failures)
        MON.append_rows(folder, "failures", events.assign(source=file.sha256[:16]))
        A.upsert_rows(failures_root(), _earliest_known(events), time_column=M.FAILED_AT, key=S.ASSET)
        ledger.record(LedgerEntry(sha256=file.sha256, path=file.shown, size=file.size, mtime_ns=file.mtime_ns,
                                  status="scored", rows=len(failures)))
        files, rows = files + 1, rows + len(failures)
    return FailuresIngest(files=files, rows=rows, quarantined=bad)


def all_failures() -> pd.DataFrame:
    """Every failure event that arrived (one per asset: the earliest)."""
    return M.first_failures(MON.read_rows(home_layout().monitoring(MONITOR_JOB), "failures"))


def _earliest_known(events: pd.DataFrame) -> pd.DataFrame:
    """``events`` without the assets whose accumulated failure is earlier (the first failure
    of an asset is its run-to-failure label; a later report of it does not move it)."""
    known = all_failures()
    if known.empty:
        return events
    earlier = events[S.ASSET].map(known.set_index(S.ASSET)[M.FAILED_AT])
    return events.loc[earlier.isna() | (events[M.FAILED_AT] <= earlier)]


# ------------------------------------------------------------------------------------
# scored readings -> accumulated data and the scored times


@task(name="accumulate-scored-readings", cache_policy=NONE)
def accumulate_step(columns: Mapping[str, str], step_seconds: float, encoding: str | None) -> SensorAccumulated:
    """Add the readings of every newly scored file to the day partitions, and record when each
    of its scored windows ended (the scored times the realised RUL error is counted from)."""
    ledger = FileLedger(ACCUMULATE_JOB, root=home_layout().ledgers())
    done = ledger.entries()
    folder = home_layout().monitoring(MONITOR_JOB)
    added = 0
    for entry in scored_entries(BATCH_JOB):
        if entry.sha256 in done:
            continue
        source = locate(entry.path)  # the ledger holds the redacted path
        if source is None or not Path(entry.output).exists():
            log.warning("scored file %s (or its scores) is gone; it cannot accumulate", entry.path)
            continue
        try:
            readings = M.read_canonical(str(source), dict(columns), encoding)
            scored = M.scored_times(pd.read_parquet(entry.output), readings, step_seconds, source=entry.path)
        except DataValidationError as exc:  # set aside with its reason, never retried in a loop
            log.warning("scored file %s cannot be monitored: %s", entry.path, exc)
            ledger.record(LedgerEntry(sha256=entry.sha256, path=entry.path, size=entry.size, status="quarantined",
                                      reason=str(exc)))
            continue
        MON.append_rows(folder, "scored", scored[[S.ASSET, S.STEP, M.SCORED_T, "predicted_rul", "model",
                                                  "model_version"]].assign(source=entry.sha256[:16]))
        try:
            A.upsert_rows(readings_root(), M.reading_keys(readings, source=entry.path), time_column=S.TIMESTAMP,
                          key=M.READING_KEY)
        except DataValidationError as exc:  # judged, but without calendar days it cannot accumulate
            log.warning("readings of %s do not accumulate: %s", entry.path, exc)
        ledger.record(LedgerEntry(sha256=entry.sha256, path=entry.path, size=entry.size, status="scored",
                                  output=str(readings_root()), rows=len(readings)))
        added += 1
    have = A.days(readings_root())
    return SensorAccumulated(path=str(readings_root()), files_added=added, days=len(have),
                             first_day=str(have[0]) if have else None, last_day=str(have[-1]) if have else None,
                             failures=len(all_failures()))


# ------------------------------------------------------------------------------------
# realised RUL error


@task(name="realised-rul-error", cache_policy=NONE)
def rul_error_step(step_seconds: float, within: float, out_dir: Path) -> tuple[pd.DataFrame, int]:
    """Join every scored (asset, step) with its asset's failure: the realised RUL error per
    model version, appended as this run's rows to ``<home>/monitoring/sensor-monitor/rul_error/``
    and plotted over the runs. Returns (this run's table, predictions judged)."""
    folder = home_layout().monitoring(MONITOR_JOB)
    realised = M.realised_rul(MON.read_rows(folder, "scored"), all_failures(), step_seconds)
    table = M.rul_error_table(realised, within)
    if realised.empty:
        return table, 0
    realised.to_parquet(out_dir / "realised_rul.parquet", index=False)
    at = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    MON.append_rows(folder, "rul_error", table.assign(run_id=MON.current_run_id(), at=at, within=within))
    history = MON.read_rows(folder, "rul_error")
    MON.plot_over_time(history.assign(version="v" + history["model_version"].astype(str)), "at", "mae", "version",
                       out_dir / "realised_rul_mae.png", title="Realised RUL MAE (steps) per model version")
    return table, len(realised)


# ------------------------------------------------------------------------------------
# the retrain decision


#: Realised RUL errors the gate can judge (lower is better), columns of the rul_error table.
ERROR_METRICS = ("mae", "rmse")
#: The deployment a sensor retrain runs when the config names none.
DEFAULT_TRIGGER = "sensor-train/weekly-retrain"


@task(name="decide-retrain", cache_policy=NONE)
def decide_step(model: str, spec: MonitoringSpec) -> MON.RetrainDecision:
    """Retrain when the champion's realised RUL error (``spec.metric``: mae or rmse, in grid
    steps) was above the gate in each of its last ``consecutive_days`` monitor runs that judged
    at least ``min_labels`` of its predictions, or its batch runs drifted ``consecutive_runs``
    times in a row; once per champion version.

    The gate is ``(1 + max_drop)`` times the reference, capped by ``min_metric`` (for an error,
    a ceiling): the reference is the champion's realised error over its first
    ``reference_days`` judged monitor runs, or with ``reference_days: 0`` its registered
    ``test/<metric>``.
    """
    registry = ModelRegistry()
    name, _ = parse_model_spec(model)
    champion = registry.champion(name) if name in registry.models() else None
    if champion is None:
        return MON.RetrainDecision(trigger=False, reason=f"no champion of {name} yet")
    if spec.metric not in ERROR_METRICS:
        raise ValueError(f"monitoring.sensor-monitor.metric {spec.metric!r} is not a realised RUL error "
                         f"(use one of {list(ERROR_METRICS)})")
    history = MON.read_rows(home_layout().monitoring(MONITOR_JOB), "rul_error")
    values: list[float] = []
    if not history.empty:
        mine = history.loc[(history["model"] == name) & (history["model_version"] == champion.version)
                           & (history["judged"] >= spec.min_labels)].sort_values("at")
        values = [float(v) for v in mine[spec.metric]]
    reference = recent = None
    if spec.reference_days == 0:
        reference = champion.metrics.get(f"test/{spec.metric}")
    elif len(values) >= spec.reference_days:
        reference = float(np.mean(values[: spec.reference_days]))
    if len(values) >= spec.reference_days + spec.consecutive_days:
        recent = min(values[-spec.consecutive_days:])  # above the gate only when every one of them is
    flags = MON.drift_flags(home_layout().monitoring(BATCH_JOB), champion.spec)
    return MON.retrain_decision(champion.spec, reference, recent, flags, spec, higher_is_better=False,
                                window="judged monitor run(s)",
                                already=MON.triggered_before(home_layout().monitoring(MONITOR_JOB), champion.spec))


@task(name="trigger-retrain", cache_policy=NONE)
def trigger_step(decision: MON.RetrainDecision, spec: MonitoringSpec, overrides: dict[str, Any], fallback: Any,
                 ) -> Dispatched:
    """Run the configured deployment (``spec.trigger``, by default the weekly retrain on the
    accumulated data) or, when it is not registered, its flow in-process; record the trigger."""
    return MON.start_retrain(decision, spec.trigger or DEFAULT_TRIGGER, overrides, fallback,
                             home_layout().monitoring(MONITOR_JOB))


def render_monitor_report(table: pd.DataFrame, judged: int, failures: FailuresIngest, acc: SensorAccumulated,
                          within: float, image: Path, decision: MON.RetrainDecision | None = None,
                          dispatched: Dispatched | None = None, drift: MON.DriftHistory | None = None) -> str:
    """Markdown: failure events taken in, the accumulated data, realised RUL error per version."""
    lines = ["## sensor-monitor", "",
             (f"Failure events: {failures.files} new file(s), {failures.rows} row(s), "
              f"{len(failures.quarantined)} quarantined; {acc.failures} asset(s) failed so far."),
             (f"Accumulated readings: {acc.days} day(s) ({acc.first_day} to {acc.last_day}), "
              f"{acc.files_added} scored file(s) added."), "",
             f"Realised RUL error: {judged} prediction(s) of failed assets judged."]
    if not table.empty:
        lines += ["", f"| version | judged | assets | MAE | RMSE | bias | within ±{within:g} |", "|---|---|---|---|---|---|---|"]
        for r in table.itertuples(index=False):
            lines.append(f"| {r.model}:{r.model_version} | {r.judged} | {r.assets} | {r.mae:.2f} | {r.rmse:.2f} | "
                         f"{r.bias:+.2f} | {r.within_share:.0%} |")
    if image.exists():
        lines += ["", f"Realised RUL MAE over the runs: `{image}`"]
    if decision is not None:
        lines += ["", f"Decision: {'retrain' if decision.trigger else 'no retrain'}: {decision.reason}"]
    if dispatched is not None:
        lines.append(f"Started {dispatched.deployment} ({dispatched.how}"
                     + (f", flow run {dispatched.flow_run_id}" if dispatched.flow_run_id else "") + ").")
    if drift is not None:
        lines += ["", drift.markdown]
    return "\n".join(lines) + "\n"
