"""Model monitoring, domain-agnostic: reference profiles, drift (PSI, KS), the monitoring
tables under the home, plots over time, Prefect events and run marks.

A **profile** summarises a table of monitored columns and a score column without keeping
any row: per numeric column its quantile bin edges (deciles of the reference), the share
of rows in each bin, the missing share and 21 quantiles (for a KS distance); per
categorical column the shares of its most frequent values (the rest pooled as
``__other__``). It is stored as JSON beside a registered model version
(:data:`PROFILE_FILE`).

A **drift check** bins a new table with the reference edges and reports, per column and
for the score, the population stability index (PSI) and, for numeric columns, the
Kolmogorov-Smirnov distance between the new values and the reference's quantile
function. Rows go to an append-only table (one Parquet part per run) under
``<home>/monitoring/<job>/``.

The vertical decides which columns are monitored (a frame in, a frame out); this module
never imports one.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from infra.deploy_config import MonitoringSpec
from infra.store import atomic_path, check_name

log = logging.getLogger(__name__)

#: The profile's file name in a registry version folder.
PROFILE_FILE = "profile.json"
#: The name the score column gets in profiles and drift rows.
SCORE = "__score__"
OTHER = "__other__"
MISSING = "__missing__"
#: Smallest share used in the PSI logarithm (empty bins would give infinities).
PSI_EPS = 1e-4
N_BINS = 10
N_QUANTILES = 21
TOP_CATEGORIES = 20


class ColumnProfile(BaseModel):
    """The reference distribution of one column."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["numeric", "categorical"]
    count: int = Field(description="Rows with a value.")
    missing_share: float
    edges: list[float] = Field(default_factory=list, description="Inner bin edges (numeric).")
    shares: list[float] = Field(default_factory=list, description="Share of valued rows per bin (numeric).")
    quantiles: list[float] = Field(default_factory=list, description="Quantiles at 0, 5%, ..., 100% (numeric).")
    categories: dict[str, float] = Field(default_factory=dict, description="Value -> share (categorical).")


class Profile(BaseModel):
    """The profile of a model's training inputs and scores (no raw rows)."""

    model_config = ConfigDict(frozen=True)

    rows: int
    columns: dict[str, ColumnProfile]
    created_at: str = Field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat())

    def save(self, path: Path) -> Path:
        """Write the profile as JSON (atomically); returns ``path``."""
        with atomic_path(path) as tmp:
            tmp.write_text(self.model_dump_json(indent=1))
        return path

    @classmethod
    def load(cls, path: Path) -> Profile:
        return cls.model_validate_json(Path(path).read_text())


def _is_numeric(series: pd.Series) -> bool:
    return (pd.api.types.is_numeric_dtype(series) or pd.api.types.is_bool_dtype(series)) and not isinstance(
        series.dtype, pd.CategoricalDtype)


def profile_column(series: pd.Series, bins: int = N_BINS) -> ColumnProfile:
    """The profile of one column (numeric: quantile bins; otherwise: value shares)."""
    total = len(series)
    valued = series.dropna()
    missing = 1.0 - len(valued) / total if total else 0.0
    if _is_numeric(series):
        values = valued.to_numpy(dtype="float64")
        values = values[np.isfinite(values)]
        if len(values) == 0:
            return ColumnProfile(kind="numeric", count=0, missing_share=1.0)
        edges = np.unique(np.quantile(values, np.linspace(0, 1, bins + 1)[1:-1]))
        counts = np.bincount(np.searchsorted(edges, values, side="right"), minlength=len(edges) + 1)
        return ColumnProfile(
            kind="numeric", count=len(values), missing_share=missing, edges=edges.tolist(),
            shares=(counts / counts.sum()).tolist(),
            quantiles=np.quantile(values, np.linspace(0, 1, N_QUANTILES)).tolist(),
        )
    shares = valued.astype(str).value_counts(normalize=True)
    top = shares.iloc[:TOP_CATEGORIES]
    categories = {str(k): float(v) for k, v in top.items()}
    if len(shares) > len(top):
        categories[OTHER] = float(shares.iloc[TOP_CATEGORIES:].sum())
    return ColumnProfile(kind="categorical", count=len(valued), missing_share=missing, categories=categories)


def build_profile(frame: pd.DataFrame, scores: Sequence[float] | np.ndarray | None = None) -> Profile:
    """The profile of every column of ``frame`` and of ``scores`` (as :data:`SCORE`)."""
    columns = {str(c): profile_column(frame[c]) for c in frame.columns}
    if scores is not None:
        columns[SCORE] = profile_column(pd.Series(np.asarray(scores, dtype="float64")))
    return Profile(rows=len(frame), columns=columns)


def psi(expected: Sequence[float], actual: Sequence[float], eps: float = PSI_EPS) -> float:
    """Population stability index of two share vectors over the same bins.

    ``sum((a - e) * ln(a / e))``, shares floored at ``eps``. Rules of thumb: below 0.1
    stable, 0.1-0.25 a moderate shift, above 0.25 a large one.
    """
    e = np.maximum(np.asarray(expected, dtype="float64"), eps)
    a = np.maximum(np.asarray(actual, dtype="float64"), eps)
    return float(np.sum((a - e) * np.log(a / e)))


def ks_distance(reference_quantiles: Sequence[float], values: np.ndarray) -> float:
    """Largest gap between the empirical CDF of ``values`` and the reference CDF, the
    latter interpolated from its quantiles (a KS statistic against the profile)."""
    return _ks_sorted(reference_quantiles, np.sort(values))


def _ks_sorted(reference_quantiles: Sequence[float], x: np.ndarray) -> float:
    """:func:`ks_distance` of values already sorted."""
    q = np.asarray(reference_quantiles, dtype="float64")
    if len(q) < 2 or len(x) == 0:
        return float("nan")
    probs = np.linspace(0, 1, len(q))
    ref_cdf = np.interp(x, q, probs, left=0.0, right=1.0)
    n = len(x)
    upper = np.arange(1, n + 1) / n
    lower = np.arange(0, n) / n
    return float(max(np.max(np.abs(upper - ref_cdf)), np.max(np.abs(lower - ref_cdf))))


class DriftRow(BaseModel):
    """One column's drift in one run."""

    model_config = ConfigDict(frozen=True)

    feature: str
    kind: str
    psi: float
    ks: float | None = None
    missing_ref: float
    missing_now: float
    rows: int
    flagged: bool = False
    reason: str = ""


def _shares(values: pd.Series) -> dict[Any, float]:
    """Share of each distinct value of a series without missing values. Arrow-backed strings
    (how text columns arrive from Parquet) are counted by Arrow's hash kernel, about 3x faster
    than pandas' on 100k rows, which matters once per categorical column per batch run."""
    if len(values) and getattr(values.dtype, "storage", None) in ("pyarrow", "pyarrow_numpy"):
        import pyarrow as pa
        import pyarrow.compute as pc

        counted = pc.value_counts(pa.array(values)).to_pylist()
        return {c["values"]: c["counts"] / len(values) for c in counted}
    return dict(values.value_counts(normalize=True).items())


def compare_column(name: str, ref: ColumnProfile, series: pd.Series) -> DriftRow:
    """PSI (and KS for numeric columns) of ``series`` against its reference profile."""
    total = len(series)
    valued = series.dropna()
    missing_now = 1.0 - len(valued) / total if total else 0.0
    if ref.kind == "numeric":
        values = pd.to_numeric(valued, errors="coerce").to_numpy(dtype="float64")
        values = values[np.isfinite(values)]
        if len(values) == 0 or not ref.shares:
            return DriftRow(feature=name, kind="numeric", psi=float("nan"), missing_ref=ref.missing_share,
                            missing_now=missing_now, rows=total)
        x = np.sort(values)  # sorted once: the bin counts are a few searches, and KS needs it anyway
        # a value falls in bin i when edges[i-1] <= value < edges[i] (as the profile binned it)
        below = np.searchsorted(x, np.asarray(ref.edges, dtype="float64"), side="left")
        counts = np.diff(np.concatenate(([0], below, [len(x)])))
        value = psi(ref.shares, counts / counts.sum())
        return DriftRow(feature=name, kind="numeric", psi=value, ks=_ks_sorted(ref.quantiles, x),
                        missing_ref=ref.missing_share, missing_now=missing_now, rows=total)
    now: dict[str, float] = {}
    for key, share in _shares(valued).items():  # count first, then name the (few) values
        now[str(key)] = now.get(str(key), 0.0) + float(share)  # values that print alike (1 and "1") are one
    known = [k for k in ref.categories if k != OTHER]
    expected = [ref.categories[k] for k in known] + [ref.categories.get(OTHER, 0.0)]
    actual = [now.get(k, 0.0) for k in known] + [sum(v for k, v in now.items() if k not in set(known))]
    return DriftRow(feature=name, kind="categorical", psi=psi(expected, actual), missing_ref=ref.missing_share,
                    missing_now=missing_now, rows=total)


def compare(profile: Profile, frame: pd.DataFrame, scores: Sequence[float] | np.ndarray | None,
            thresholds: MonitoringSpec) -> list[DriftRow]:
    """Drift rows of every profiled column present in ``frame`` and of the scores.

    A column the profile knows but ``frame`` lacks is reported with missing share 1.
    """
    rows: list[DriftRow] = []
    for name, ref in profile.columns.items():
        if name == SCORE:
            if scores is None:
                continue
            series = pd.Series(np.asarray(scores, dtype="float64"))
        else:
            series = frame[name] if name in frame else pd.Series([np.nan] * len(frame), dtype="float64")
        rows.append(flag(compare_column(name, ref, series), thresholds))
    return rows


def flag(row: DriftRow, t: MonitoringSpec) -> DriftRow:
    """The row with ``flagged`` and ``reason`` set from the thresholds."""
    if row.rows < t.min_rows:
        return row.model_copy(update={"flagged": False, "reason": f"{row.rows} value(s): too few to judge"})
    reasons = []
    limit = t.score_psi if row.feature == SCORE else t.psi
    if math.isfinite(row.psi) and row.psi > limit:
        reasons.append(f"PSI {row.psi:.3f} > {limit}")
    if t.ks is not None and row.ks is not None and math.isfinite(row.ks) and row.ks > t.ks:
        reasons.append(f"KS {row.ks:.3f} > {t.ks}")
    if row.missing_now - row.missing_ref > t.missing_delta:
        reasons.append(f"missing {row.missing_now:.1%} vs {row.missing_ref:.1%}")
    return row.model_copy(update={"flagged": bool(reasons), "reason": "; ".join(reasons)})


# ------------------------------------------------------------------------------------
# the monitoring table: one Parquet part per run under <home>/monitoring/<job>/<table>/


def append_rows(folder: Path, table: str, rows: pd.DataFrame) -> Path:
    """Append ``rows`` to ``<folder>/<table>/`` as one new Parquet part (atomic)."""
    target_dir = folder / check_name(table, "table name")
    target_dir.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%f")
    target = target_dir / f"part-{stamp}-{uuid.uuid4().hex[:8]}.parquet"
    with atomic_path(target) as tmp:
        rows.to_parquet(tmp, index=False)
    return target


def read_rows(folder: Path, table: str) -> pd.DataFrame:
    """Every row appended to ``<folder>/<table>/`` (empty frame when none)."""
    target_dir = folder / check_name(table, "table name")
    parts = sorted(target_dir.glob("part-*.parquet")) if target_dir.exists() else []
    if not parts:
        return pd.DataFrame()
    return pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)


def drift_frame(rows: Iterable[DriftRow], run: Mapping[str, Any]) -> pd.DataFrame:
    """Drift rows as a table, each with the run's identifying fields (``run_id``, ``at``, ...)."""
    records = [{**run, **r.model_dump()} for r in rows]
    return pd.DataFrame.from_records(records)


def consecutive_true(flags: Sequence[bool]) -> int:
    """How many of the last ``flags`` are True in a row (0 when the last is False)."""
    n = 0
    for value in reversed(list(flags)):
        if not value:
            break
        n += 1
    return n


def drift_streak(folder: Path, model_spec: str, table: str = "drift") -> int:
    """Drifted runs in a row of ``model_spec``, newest first, from ``<folder>/<table>/``.

    Reads the parts from the newest back (one part per run) and stops at the model's first
    run that did not drift, so a long history costs one or two small reads, not all of it.
    """
    target_dir = folder / check_name(table, "table name")
    parts = sorted(target_dir.glob("part-*.parquet"), reverse=True) if target_dir.exists() else []
    streak = 0
    for part in parts:
        rows = pd.read_parquet(part, columns=["model", "flagged"])
        mine = rows.loc[rows["model"] == model_spec, "flagged"]
        if mine.empty:
            continue
        if not mine.any():
            break
        streak += 1
    return streak


def plot_over_time(table: pd.DataFrame, x: str, y: str, series: str, path: Path, *, title: str,
                   threshold: float | None = None, top: int = 8) -> Path:
    """Lines of ``y`` over ``x``, one per value of ``series`` (the ``top`` highest at their
    maximum); a dashed line at ``threshold``. Written as a PNG."""
    from tasks.evaluate import new_figure

    fig = new_figure((8, 4.5))
    ax = fig.add_subplot(1, 1, 1)
    peaks = table.groupby(series)[y].max().sort_values(ascending=False)
    for name in peaks.index[:top]:
        part = table.loc[table[series] == name].sort_values(x)
        ax.plot(part[x], part[y], marker="o", markersize=3, label=str(name))
    if threshold is not None:
        ax.axhline(threshold, color="grey", linestyle="--", linewidth=1, label=f"threshold {threshold}")
    ax.set_title(title)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.legend(fontsize=7, loc="upper left")
    fig.autofmt_xdate()
    # fixed margins instead of tight_layout: the automatic layout measured ~0.6 s per batch
    # run, most of the drift check's fixed cost
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.2, top=0.92)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def render_drift_report(title: str, rows: Sequence[DriftRow], history: pd.DataFrame, image: Path | None,
                        thresholds: MonitoringSpec, streak: int) -> str:
    """Markdown: this run's drift per column (flagged first), the streak and the plot."""
    lines = [f"## {title}", ""]
    flagged = [r for r in rows if r.flagged]
    lines.append(
        f"{len(flagged)} of {len(rows)} column(s) over the thresholds (PSI > {thresholds.psi}, score PSI > "
        f"{thresholds.score_psi}, KS > {thresholds.ks}); drifted runs in a row: {streak}. "
        f"Runs recorded: {history['run_id'].nunique() if not history.empty else 0}."
    )
    lines += ["", "| column | kind | PSI | KS | missing (ref → now) | flag |", "|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (not r.flagged, -(r.psi if math.isfinite(r.psi) else 0))):
        ks = f"{r.ks:.3f}" if r.ks is not None and math.isfinite(r.ks) else "—"
        lines.append(f"| `{r.feature}` | {r.kind} | {r.psi:.4f} | {ks} | {r.missing_ref:.1%} → {r.missing_now:.1%} | "
                     f"{r.reason or 'ok'} |")
    if image is not None:
        lines += ["", f"PSI over time: `{image}`"]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------
# Prefect: events and run marks (no-ops outside a run)


def emit_alert(event: str, resource_id: str, payload: Mapping[str, Any], related: Mapping[str, str] | None = None,
               ) -> bool:
    """Emit a Prefect event (``event`` on resource ``resource_id``) for automations to react
    to; returns whether it was emitted."""
    from prefect.events import emit_event

    resource = {"prefect.resource.id": resource_id, **(related or {})}
    emitted = emit_event(event=event, resource=resource, payload=dict(payload))
    log.warning("event %s on %s: %s", event, resource_id, dict(payload))
    return emitted is not None


def mark_run(tag: str) -> bool:
    """Add ``tag`` to the current flow run (it stays Completed); False outside a flow run."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None:
        return False
    from prefect.client.orchestration import get_client

    tags = sorted({*(ctx.flow_run.tags or []), tag})
    with get_client(sync_client=True) as client:
        client.update_flow_run(ctx.flow_run.id, tags=tags)
    return True


def current_run_id() -> str:
    """The current flow run's id, or a fresh id outside a flow run."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    if ctx is not None and ctx.flow_run is not None:
        return str(ctx.flow_run.id)
    return uuid.uuid4().hex


# ------------------------------------------------------------------------------------
# one batch run's drift check, end to end


#: The event a drifted batch run emits (an automation can trigger on it).
DRIFT_EVENT = "indusflow.drift.detected"
#: The tag a drifted run gets (it stays Completed).
DRIFT_TAG = "drift"


class DriftSummary(BaseModel):
    """What a batch run's drift check found."""

    model_config = ConfigDict(frozen=True)

    model: str
    rows: int = Field(description="Input rows compared.")
    features: int = Field(description="Columns compared (the score included).")
    flagged: dict[str, str] = Field(description="Drifted column -> reason.")
    max_psi: float
    streak: int = Field(description="Drifted runs in a row for this model version (this one included).")
    table: str = Field(description="The job's drift table (Parquet parts).")
    event_emitted: bool = False

    @property
    def drifted(self) -> bool:
        return bool(self.flagged)


def profile_path(model_path: str | Path) -> Path:
    """Where a registered version's profile lives."""
    return Path(model_path) / PROFILE_FILE


def check_drift(job: str, model_spec: str, model_path: str | Path, frame: pd.DataFrame,
                scores: np.ndarray | None, spec: MonitoringSpec, folder: Path) -> DriftSummary | None:
    """Compare one batch run's inputs and scores with the version's profile, append the rows
    to ``<folder>/drift/`` and, when a column is over its threshold, emit :data:`DRIFT_EVENT`
    and tag the run :data:`DRIFT_TAG`.

    Only what a threshold needs happens per run; the plot of PSI over the runs and its
    artifact belong to the job's scheduled monitor (:func:`drift_history`), so every batch
    run does not redraw the whole history.

    Returns None (and logs why) when the version has no profile (registered before
    profiles existed).
    """
    path = profile_path(model_path)
    if not path.exists():
        log.warning("%s has no reference profile (%s); drift not measured", model_spec, path)
        return None
    rows = compare(Profile.load(path), frame, scores, spec)
    run = {"run_id": current_run_id(), "at": pd.Timestamp.now(tz="UTC").tz_localize(None), "job": job,
           "model": model_spec}
    append_rows(folder, "drift", drift_frame(rows, run))
    streak = drift_streak(folder, model_spec)
    flagged = {r.feature: r.reason for r in rows if r.flagged}
    emitted = False
    if flagged:
        emitted = emit_alert(DRIFT_EVENT, f"indusflow.model.{model_spec.partition(':')[0]}",
                             {"job": job, "model": model_spec, "flagged": flagged, "streak": streak},
                             related={"indusflow.job": job})
        mark_run(DRIFT_TAG)
    finite = [r.psi for r in rows if math.isfinite(r.psi) and r.rows >= spec.min_rows]
    return DriftSummary(model=model_spec, rows=len(frame), features=len(rows), flagged=flagged,
                        max_psi=max(finite) if finite else float("nan"), streak=streak,
                        table=str(folder / "drift"), event_emitted=emitted)


def check_batch_drift(job: str, model: str, inputs: Sequence[tuple[pd.DataFrame, np.ndarray]]) -> DriftSummary | None:
    """:func:`check_drift` of one batch run of ``job``: ``inputs`` holds, per scored file, its
    monitored input columns and its scores; they are compared with the profile of ``model``
    (resolved to its version) under the job's thresholds, in the job's monitoring folder."""
    if not inputs:
        return None
    from infra.deploy_config import monitoring_spec
    from infra.home import home_layout
    from infra.registry import ModelRegistry

    ref = ModelRegistry().resolve(model)
    frames, scores = zip(*inputs, strict=True)
    return check_drift(job, ref.spec, ref.path, pd.concat(frames, ignore_index=True), np.concatenate(scores),
                       monitoring_spec(job), home_layout().monitoring(job))


def job_drift_history(job: str, out_dir: Path) -> DriftHistory:
    """:func:`drift_history` of batch job ``job`` under its thresholds and monitoring folder."""
    from infra.deploy_config import monitoring_spec
    from infra.home import home_layout

    return drift_history(job, home_layout().monitoring(job), monitoring_spec(job), out_dir)


class DriftHistory(BaseModel):
    """The drift of a batch job's runs, as its monitor reports it."""

    model_config = ConfigDict(frozen=True)

    job: str
    runs: int = Field(description="Batch runs recorded.")
    drifted_runs: int = Field(description="Runs with at least one flagged column.")
    plot: str | None = Field(default=None, description="PSI per column over the runs (PNG).")
    markdown: str = ""


def drift_history(job: str, folder: Path, spec: MonitoringSpec, out_dir: Path, last_runs: int = 200) -> DriftHistory:
    """The batch job's drift over its last ``last_runs`` runs: PSI per column plotted over the
    runs (``<out_dir>/drift_psi.png``) and a markdown section with the latest run's rows
    (flagged first) and the drifted columns of the recent runs."""
    history = read_rows(folder, "drift")
    if history.empty:
        return DriftHistory(job=job, runs=0, drifted_runs=0, markdown=f"### {job} drift\n\nNo batch run recorded yet.\n")
    runs = history.groupby("run_id", sort=False).agg(at=("at", "first"), model=("model", "first"),
                                                     flagged=("flagged", "any")).sort_values("at")
    recent = runs.tail(last_runs)
    shown = history.loc[history["run_id"].isin(recent.index)]
    image = plot_over_time(shown, "at", "psi", "feature", out_dir / "drift_psi.png",
                           title=f"{job}: PSI per column over runs", threshold=spec.psi)
    latest = shown.loc[shown["run_id"] == recent.index[-1]]
    rows = [DriftRow(**{k: latest_row[k] for k in DriftRow.model_fields}) for latest_row in latest.to_dict("records")]
    lines = [render_drift_report(f"{job} drift: latest run, vs {recent['model'].iloc[-1]}", rows, history, image,
                                 spec, consecutive_true(runs.loc[runs["model"] == recent["model"].iloc[-1],
                                                                 "flagged"].tolist())).replace("## ", "### ", 1)]
    drifted = shown.loc[shown["flagged"]]
    if not drifted.empty:
        lines += ["", "| run at | model | drifted columns |", "|---|---|---|"]
        for run_id, part in drifted.groupby("run_id", sort=False):
            lines.append(f"| {pd.Timestamp(runs.loc[run_id, 'at']):%Y-%m-%d %H:%M} | {runs.loc[run_id, 'model']} | "
                         f"{', '.join(f'`{f}`' for f in part['feature'])} |")
    return DriftHistory(job=job, runs=len(runs), drifted_runs=int(runs["flagged"].sum()), plot=str(image),
                        markdown="\n".join(lines) + "\n")


# ------------------------------------------------------------------------------------
# closing the loop: when to retrain


class RetrainDecision(BaseModel):
    """Whether a monitor starts a retrain, and why."""

    model_config = ConfigDict(frozen=True)

    trigger: bool
    reason: str
    champion: str | None = None
    gate: float | None = Field(default=None, description="Realised metric on the wrong side of this fails the gate.")
    below_days: int = Field(default=0, description="Recent labelled days pooled that fail the gate (0: it passes).")
    drift_streak: int = Field(default=0, description="Drifted batch runs in a row of the champion.")


def metric_gate(reference: float | None, spec: MonitoringSpec, higher_is_better: bool = True) -> float | None:
    """The realised-metric gate (None: no gate yet): ``(1 - max_drop)`` times the reference
    (``1 + max_drop`` for errors, where lower is better), with ``min_metric`` as an absolute
    floor (a ceiling for errors)."""
    gates = []
    if spec.max_drop is not None and reference is not None and math.isfinite(reference):
        gates.append(reference * (1.0 - spec.max_drop if higher_is_better else 1.0 + spec.max_drop))
    if spec.min_metric is not None:
        gates.append(spec.min_metric)
    if not gates:
        return None
    return max(gates) if higher_is_better else min(gates)


def retrain_decision(champion: str, reference: float | None, recent: float | None, drift_flags: Sequence[bool],
                     spec: MonitoringSpec, *, already: bool, higher_is_better: bool = True,
                     window: str = "labelled day(s)") -> RetrainDecision:
    """Retrain when the champion's realised metric over its last ``consecutive_days``
    labelled days (``recent``, pooled) fails the gate set by ``reference`` (its first
    ``reference_days`` labelled days, pooled; or its registered test metric), or when its
    last ``consecutive_runs`` batch runs all drifted; never twice for one champion version
    (``already``)."""
    gate = metric_gate(reference, spec, higher_is_better)
    fails = gate is not None and recent is not None and math.isfinite(recent) and (
        recent < gate if higher_is_better else recent > gate)
    streak = consecutive_true(drift_flags)
    fields = {"champion": champion, "gate": gate, "below_days": spec.consecutive_days if fails else 0,
              "drift_streak": streak}
    reasons = []
    if fails:
        reasons.append(f"realised {spec.metric} {recent:.4f} over the last {spec.consecutive_days} {window} is "
                       f"{'below' if higher_is_better else 'above'} the gate {gate:.4f}"
                       + (f" (reference {reference:.4f})" if reference is not None else ""))
    if streak >= spec.consecutive_runs:
        reasons.append(f"{streak} drifted batch run(s) in a row")
    if not reasons:
        now = "no recent labelled days yet" if recent is None else f"recent {recent:.4f}"
        return RetrainDecision(trigger=False, reason=f"{champion} within limits ({now}, gate "
                               f"{'—' if gate is None else f'{gate:.4f}'}, drift streak {streak})", **fields)
    if already:
        return RetrainDecision(trigger=False, reason=f"{'; '.join(reasons)}, but a retrain was already started for "
                               f"{champion}; the champion rule keeps it until a better version is promoted", **fields)
    return RetrainDecision(trigger=True, reason="; ".join(reasons), **fields)


def triggered_before(folder: Path, champion: str) -> bool:
    """Whether a retrain was started while ``champion`` was the champion."""
    done = read_rows(folder, "triggers")
    return bool(not done.empty and (done["champion"] == champion).any())


def record_trigger(folder: Path, champion: str, reason: str, dispatched: Any) -> Path:
    """Append one row to ``<folder>/triggers/``: when, for which champion, why and how."""
    return append_rows(folder, "triggers", pd.DataFrame([{
        "at": pd.Timestamp.now(tz="UTC").tz_localize(None), "champion": champion, "reason": reason,
        "deployment": dispatched.deployment, "how": dispatched.how, "flow_run_id": dispatched.flow_run_id or "",
    }]))


def drift_flags(folder: Path, model_spec: str) -> list[bool]:
    """Whether each batch run of ``model_spec`` drifted, oldest first (``<folder>/drift/``)."""
    drift = read_rows(folder, "drift")
    if drift.empty:
        return []
    runs = drift.loc[drift["model"] == model_spec].groupby("run_id", sort=False).agg(
        at=("at", "first"), flagged=("flagged", "any")).sort_values("at")
    return [bool(v) for v in runs["flagged"]]


def start_retrain(decision: RetrainDecision, deployment: str, overrides: Mapping[str, Any], fallback: Any,
                  folder: Path) -> Any:
    """Run ``deployment`` (flow-name/deployment-name) with its parameters in prefect.yaml updated by
    ``overrides`` or, when the Prefect API does not have it, its flow ``fallback`` in-process
    with the same parameters; record the trigger in ``<folder>/triggers/``. Returns the
    :class:`~tasks.dispatch.Dispatched`."""
    from infra.deploy import declared_parameters
    from tasks.dispatch import dispatch

    flow_name, _, name = deployment.partition("/")
    parameters = {**(declared_parameters(flow_name, name) or {}), **overrides}
    done = dispatch(deployment, dict(overrides), fallback=lambda **_: fallback(**parameters))
    record_trigger(folder, decision.champion or "", decision.reason, done)
    return done
