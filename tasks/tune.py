"""Bayesian hyper-parameter tuning with Optuna: search spaces, studies, pruning, reports.

Domain-agnostic: a flow hands over a search space (plain pydantic specs declared by a
solution, checked here before any trial runs) and an objective that trains one model.
A study lives in a storage under the home folder (one SQLite file per study) or in a
database URL from :class:`~infra.settings.TuneSettings`, so a killed tuning run
resumes: finished trials (complete or pruned) are kept, trials left running by the
killed process are marked failed and re-enqueued with the same parameters.
"""

from __future__ import annotations

import base64
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from prefect import task
from prefect.cache_policies import NONE
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infra.errors import IndusflowError
from infra.home import home_layout
from infra.settings import TuneSettings, get_runner_settings, get_tune_settings
from infra.store import check_name
from tasks.evaluate import new_figure, save_figure
from tasks.tune_config import (
    TuneConfig,  # defined in a light module (a flow parameter); importable from here too
)

log = logging.getLogger(__name__)

#: Trial states that count towards the requested number of trials.
FINISHED_STATES = ("COMPLETE", "PRUNED")


class SearchSpaceError(IndusflowError, ValueError):
    """A search space names an unknown parameter or declares an impossible range."""


class TuningError(IndusflowError):
    """The tuning run could not finish (e.g. too many trials failed)."""


# ------------------------------------------------------------------------------------
# search space


class Param(BaseModel):
    """One tunable parameter (the generic form of a solution's spec)."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["float", "int", "categorical"]
    name: str
    low: float | None = None
    high: float | None = None
    step: int | None = None
    log: bool = False
    choices: tuple[Any, ...] | None = None


def validate_space(
    space: Sequence[BaseModel | Mapping[str, Any]],
    fields: Sequence[str],
    make_config: Callable[[dict[str, Any]], Any] | None = None,
) -> tuple[Param, ...]:
    """Check a search space before any trial runs; return it in generic form.

    Args:
        space: the solution's parameter specs (pydantic models or dicts with ``kind``).
        fields: the names the space may tune (the fields of the solution's config).
        make_config: builds the config from ``{name: value}``; when given, every bound
            and choice is tried so a value the config would reject fails here.

    Raises:
        SearchSpaceError: naming the parameter and what to fix.
    """
    if not space:
        raise SearchSpaceError("the search space is empty: declare at least one parameter")
    params: list[Param] = []
    seen: set[str] = set()
    for raw in space:
        data = raw.model_dump() if isinstance(raw, BaseModel) else dict(raw)
        name = str(data.get("name", "?"))
        try:
            p = Param.model_validate(data)
        except ValidationError as exc:
            raise SearchSpaceError(f"search-space parameter {name!r} is malformed: {exc}") from exc
        if p.name not in fields:
            raise SearchSpaceError(
                f"search-space parameter {p.name!r} is not a field of the config; "
                f"known fields: {', '.join(sorted(fields))}"
            )
        if p.name in seen:
            raise SearchSpaceError(f"search-space parameter {p.name!r} is declared twice")
        seen.add(p.name)
        if p.kind == "categorical":
            if not p.choices:
                raise SearchSpaceError(f"search-space parameter {p.name!r} has no choices")
            values = list(p.choices)
        else:
            if p.low is None or p.high is None or not (math.isfinite(p.low) and math.isfinite(p.high)):
                raise SearchSpaceError(f"search-space parameter {p.name!r} needs finite low and high")
            if p.low >= p.high:
                raise SearchSpaceError(
                    f"search-space parameter {p.name!r} has low={p.low} >= high={p.high}: low must be smaller"
                )
            if p.log and p.low <= 0:
                raise SearchSpaceError(
                    f"search-space parameter {p.name!r} is on a log scale but low={p.low} <= 0: "
                    "use a positive low or log=False"
                )
            if p.kind == "int":
                if p.low != int(p.low) or p.high != int(p.high):
                    raise SearchSpaceError(f"search-space parameter {p.name!r} is an int with non-integer bounds")
                if p.step is not None and (p.step < 1 or (p.log and p.step != 1)):
                    raise SearchSpaceError(
                        f"search-space parameter {p.name!r} has step={p.step}: use step >= 1 (and 1 on a log scale)"
                    )
                values = [int(p.low), int(p.high)]
            else:
                values = [p.low, p.high]
        if make_config is not None:
            for value in values:
                try:
                    make_config({p.name: value})
                except (ValidationError, ValueError, TypeError) as exc:
                    raise SearchSpaceError(
                        f"search-space parameter {p.name!r}: the config rejects the value {value!r} ({exc})"
                    ) from exc
        params.append(p)
    return tuple(params)


def suggest(trial: Any, space: Sequence[Param]) -> dict[str, Any]:
    """Draw one value per parameter from an Optuna trial."""
    out: dict[str, Any] = {}
    for p in space:
        if p.kind == "float":
            out[p.name] = trial.suggest_float(p.name, p.low, p.high, log=p.log)
        elif p.kind == "int":
            out[p.name] = trial.suggest_int(p.name, int(p.low), int(p.high), step=p.step or 1, log=p.log)
        else:
            out[p.name] = trial.suggest_categorical(p.name, list(p.choices or ()))
    return out


# ------------------------------------------------------------------------------------
# study


class StudyRef(BaseModel):
    """Where a study lives (small and serialisable, for task runners on other machines)."""

    model_config = ConfigDict(frozen=True)

    name: str
    storage: str = Field(
        description="SQLite URL under the home, or a token for the configured database URL "
        "(credentials never travel as a task parameter)."
    )
    direction: Literal["maximize", "minimize"] = "maximize"


class TrialRef(BaseModel):
    """One asked trial: its storage id, number and parameters."""

    model_config = ConfigDict(frozen=True)

    study: StudyRef
    trial_id: int
    number: int
    origin: int = Field(description="Trial number whose checkpoints this trial uses (itself, or a retried one).")
    params: dict[str, Any]

    @property
    def run_key(self) -> str:
        """The training run key (checkpoint folder) of this trial."""
        return f"{self.study.name}-trial-{self.origin:04d}"


class TrialOutcome(BaseModel):
    """How one trial ended."""

    model_config = ConfigDict(frozen=True)

    number: int
    state: Literal["COMPLETE", "PRUNED", "FAIL"]
    value: float | None
    params: dict[str, Any]
    epochs: int
    seconds: float
    run_key: str
    error: str | None = None


#: Stands for the configured database URL, so that credentials never travel as task
#: parameters (which Prefect stores and shows); each worker reads it from its settings.
CONFIGURED_STORAGE = "settings:INDUSFLOW_TUNE_STORAGE_URL"


def storage_url(study_name: str, settings: TuneSettings | None = None) -> str:
    """``sqlite:///<home>/tuning/<study>.db``, or a token for the configured database URL."""
    settings = settings or get_tune_settings()
    if settings.storage_url:
        return CONFIGURED_STORAGE
    return f"sqlite:///{home_layout().tuning() / (check_name(study_name, 'study name') + '.db')}"


def _storage(url: str) -> Any:
    import optuna

    if url == CONFIGURED_STORAGE:
        configured = get_tune_settings().storage_url
        if not configured:
            raise ValueError("INDUSFLOW_TUNE_STORAGE_URL is not set on this worker")
        url = configured.get_secret_value()

    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": 60}}
    return optuna.storages.RDBStorage(url, **kwargs)


def _quiet_optuna() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _pruner(config: TuneConfig) -> Any:
    """The median pruner (Optuna keeps no pruner in the storage: every opener builds it)."""
    import optuna

    return optuna.pruners.MedianPruner(
        n_startup_trials=config.prune_after_trials, n_warmup_steps=config.warmup_epochs
    )


def open_study(ref: StudyRef, config: TuneConfig | None = None) -> Any:
    """Create the study, or load it when it exists, with a seeded TPE sampler and a median pruner.

    The sampler's seed is offset by the number of trials already stored, so a resumed
    run does not propose the parameters of the first run again.
    """
    import optuna

    _quiet_optuna()
    config = config or TuneConfig()
    storage = _storage(ref.storage)
    try:
        existing = optuna.load_study(study_name=ref.name, storage=storage)
        n_before = len(existing.trials)
    except KeyError:
        n_before = 0
    sampler = optuna.samplers.TPESampler(
        seed=config.seed + n_before, n_startup_trials=config.startup_trials, constant_liar=True
    )
    study = optuna.create_study(
        study_name=ref.name,
        storage=storage,
        sampler=sampler,
        pruner=_pruner(config),
        direction=ref.direction,
        load_if_exists=True,
    )
    if study.direction.name.lower() != ref.direction:
        raise TuningError(
            f"study {ref.name!r} exists with direction {study.direction.name.lower()}; use another study name"
        )
    return study


def count_finished(study: Any) -> int:
    """Trials that count towards the requested number: complete and pruned ones."""
    return sum(1 for t in study.get_trials(deepcopy=False) if t.state.name in FINISHED_STATES)


def recover_interrupted(study: Any) -> list[int]:
    """Mark trials left RUNNING by a killed run as failed and re-enqueue their parameters.

    Assumes one tuning run per study at a time (the flow owns its study). A re-enqueued
    trial keeps the original trial's run key, so its training resumes from the
    checkpoint the killed run left behind.
    """
    from optuna.trial import TrialState

    recovered = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        # Optuna has no public "fail this trial" call for another process's trial.
        study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
        origin = int(t.user_attrs.get("origin", t.number))
        study.enqueue_trial(t.params, user_attrs={"origin": origin, "retry_of": t.number})
        recovered.append(t.number)
    if recovered:
        log.warning("study %s: trials %s were left running by an interrupted run; re-enqueued", study.study_name, recovered)
    return recovered


def ask_trial(study: Any, ref: StudyRef, space: Sequence[Param]) -> TrialRef:
    """Start a trial (an enqueued one first) and draw its parameters."""
    trial = study.ask()
    params = suggest(trial, space)
    origin = int(trial.user_attrs.get("origin", trial.number))
    trial.set_user_attr("origin", origin)
    return TrialRef(study=ref, trial_id=trial._trial_id, number=trial.number, origin=origin, params=params)


# ------------------------------------------------------------------------------------
# pruning callback


def make_pruning_callback(trial: Any, monitor: str) -> Any:
    """A Lightning callback that reports ``monitor`` to ``trial`` after every validation
    and raises :class:`optuna.TrialPruned` when the pruner says so."""
    import optuna
    from lightning.pytorch.callbacks import Callback

    class OptunaPruning(Callback):
        """Reports the monitored metric each epoch; stops a trial the pruner rejects."""

        def __init__(self) -> None:
            self.reported: dict[int, float] = {}

        def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
            if trainer.sanity_checking:
                return
            value = trainer.callback_metrics.get(monitor)
            if value is None:
                return
            epoch = int(trainer.current_epoch)
            score = float(value)
            self.reported[epoch] = score
            trial.report(score, step=epoch)
            if trial.should_prune():
                raise optuna.TrialPruned(f"pruned at epoch {epoch} with {monitor}={score:.4f}")

    return OptunaPruning()


class StudyReport(BaseModel):
    """A tuning run's report and the figures it states."""

    model_config = ConfigDict(frozen=True)

    markdown: str
    images: list[str]
    default_value: float | None = Field(description="Objective of the default parameters (trial 0), if run.")
    full_training_mean_s: float | None = Field(description="Mean wall time of the complete (un-pruned) trials.")
    trial_seconds_total: float = Field(description="Wall time of all finished trials, summed.")


def report_study(ref: StudyRef, config: TuneConfig, summary: TuneSummary, metric: str, out_dir: Path) -> StudyReport:
    """Trial table, optimisation history and parameter importances of a study (plots under ``out_dir``)."""
    study = open_study(ref, config)
    rows = trial_rows(study)
    default_value = next((r.value for r in rows if r.note.startswith("defaults") and r.state == "COMPLETE"), None)
    images = [
        plot_history(rows, metric, out_dir / "optimisation-history.png"),
        plot_importance(param_importances(study), out_dir / "param-importance.png"),
    ]
    full = [r.seconds for r in rows if r.state == "COMPLETE" and r.seconds and (r.epochs or 0) > 0]
    return StudyReport(
        markdown=render_tuning_report(summary, rows, metric, images, default_value=default_value),
        images=[str(i) for i in images],
        default_value=default_value,
        full_training_mean_s=float(sum(full) / len(full)) if full else None,
        trial_seconds_total=float(sum(r.seconds or 0.0 for r in rows if r.state in ("COMPLETE", "PRUNED"))),
    )


# ------------------------------------------------------------------------------------
# one trial

#: ``objective(params, run_key, callbacks) -> value``: trains one model with the extra
#: Lightning ``callbacks`` under checkpoint key ``run_key``; returns the monitored metric.
Objective = Callable[[dict[str, Any], str, list[Any]], float | None]


def run_trial(ref: TrialRef, objective: Objective, monitor: str, config: TuneConfig) -> TrialOutcome:
    """Train one trial and tell the study how it ended (complete, pruned or failed)."""
    import optuna
    from optuna.trial import TrialState

    _quiet_optuna()
    study = optuna.load_study(
        study_name=ref.study.name, storage=_storage(ref.study.storage), pruner=_pruner(config)
    )
    trial = optuna.trial.Trial(study, ref.trial_id)
    pruning = make_pruning_callback(trial, monitor)
    started = time.perf_counter()
    state: Literal["COMPLETE", "PRUNED", "FAIL"]
    value: float | None = None
    error = None
    try:
        value = objective(dict(ref.params), ref.run_key, [pruning])
        if value is None or not math.isfinite(value):
            raise TuningError(f"the objective returned {value!r} (is {monitor} logged?)")
        state = "COMPLETE"
    except optuna.TrialPruned:
        state = "PRUNED"
        value = pruning.reported[max(pruning.reported)] if pruning.reported else None
    except Exception as exc:  # noqa: BLE001 - a trial's failure is recorded, the study goes on
        state, error = "FAIL", f"{type(exc).__name__}: {exc}"
        log.warning("trial %d failed: %s", ref.number, error)
    seconds = time.perf_counter() - started
    trial.set_user_attr("seconds", seconds)
    trial.set_user_attr("epochs", len(pruning.reported))
    trial.set_user_attr("run_key", ref.run_key)
    if state == "COMPLETE":
        study.tell(ref.number, value)
    else:
        study.tell(ref.number, state=TrialState[state])
    log.info("trial %d %s %s=%s after %d epoch(s), %.1f s", ref.number, state.lower(), monitor, value, len(pruning.reported), seconds)
    return TrialOutcome(
        number=ref.number, state=state, value=value, params=ref.params,
        epochs=len(pruning.reported), seconds=seconds, run_key=ref.run_key, error=error,
    )


run_trial_task = task(
    run_trial,
    name="run-trial",
    description="Train one tuning trial and record its result in the study.",
    cache_policy=NONE,
)


# ------------------------------------------------------------------------------------
# the search loop


class TuneSummary(BaseModel):
    """What one tuning run did, and the study's state afterwards."""

    model_config = ConfigDict(frozen=True)

    study: str
    requested: int
    finished_before: int = Field(description="Complete + pruned trials found in the storage at the start.")
    recovered: list[int] = Field(description="Trials left running by a killed run, re-enqueued.")
    ran_now: list[TrialOutcome]
    complete: int
    pruned: int
    failed: int
    best_number: int
    best_value: float
    best_params: dict[str, Any]
    best_run_key: str
    seconds: float


class _Done:
    """A finished 'future' for trials run inline (outside a flow)."""

    def __init__(self, outcome: TrialOutcome) -> None:
        self._outcome = outcome

    def result(self) -> TrialOutcome:
        return self._outcome


def _first_done(running: list[Any]) -> Any:
    for fut in running:
        if isinstance(fut, _Done):
            return fut
    from prefect.futures import as_completed

    return next(iter(as_completed(running)))


def optimize(
    ref: StudyRef,
    space: Sequence[Param],
    objective: Objective,
    config: TuneConfig,
    monitor: str,
    defaults: Mapping[str, Any] | None = None,
) -> TuneSummary:
    """Run trials until the study holds ``config.trials`` complete + pruned trials.

    Inside a flow, trials are submitted to the flow's task runner with at most
    ``config.max_in_flight`` running (default: the runner's workers, INDUSFLOW_RUNNER_WORKERS); outside one
    they run one after another.
    """
    from prefect.context import FlowRunContext

    started = time.perf_counter()
    study = open_study(ref, config)
    recovered = recover_interrupted(study)
    before = count_finished(study)
    if config.enqueue_defaults and defaults is not None and not study.trials:
        study.enqueue_trial({p.name: defaults[p.name] for p in space}, user_attrs={"defaults": True})
    in_flow = FlowRunContext.get() is not None
    max_in_flight = config.max_in_flight or get_runner_settings().workers
    log.info(
        "study %s: %d of %d trials finished; running the rest, %d at a time",
        ref.name, before, config.trials, max_in_flight if in_flow else 1,
    )
    running: list[Any] = []
    outcomes: list[TrialOutcome] = []
    failures = 0
    while True:
        while count_finished(study) + len(running) < config.trials and len(running) < (max_in_flight if in_flow else 1):
            trial_ref = ask_trial(study, ref, space)
            if in_flow:
                running.append(run_trial_task.submit(trial_ref, objective, monitor, config))
            else:
                running.append(_Done(run_trial(trial_ref, objective, monitor, config)))
        if not running:
            break
        done = _first_done(running)
        running.remove(done)
        outcome = done.result()
        outcomes.append(outcome)
        if outcome.state == "FAIL":
            failures += 1
            if failures > config.max_failures:
                for fut in running:
                    fut.result()
                raise TuningError(
                    f"{failures} trials failed in this run (more than max_failures={config.max_failures}); "
                    f"last error: {outcome.error}"
                )
    trials = study.get_trials(deepcopy=False)
    states = [t.state.name for t in trials]
    try:
        best = study.best_trial
    except ValueError as exc:
        raise TuningError(f"study {ref.name!r} has no complete trial") from exc
    return TuneSummary(
        study=ref.name,
        requested=config.trials,
        finished_before=before,
        recovered=recovered,
        ran_now=outcomes,
        complete=states.count("COMPLETE"),
        pruned=states.count("PRUNED"),
        failed=states.count("FAIL"),
        best_number=best.number,
        best_value=float(best.value),
        best_params=dict(best.params),
        best_run_key=str(best.user_attrs.get("run_key", "")),
        seconds=time.perf_counter() - started,
    )



# ------------------------------------------------------------------------------------
# reports


class TrialRow(BaseModel):
    """One row of the trial table."""

    model_config = ConfigDict(frozen=True)

    number: int
    state: str
    value: float | None
    epochs: int | None
    seconds: float | None
    params: dict[str, Any]
    note: str = ""


def trial_rows(study: Any) -> list[TrialRow]:
    """The study's trials as table rows."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        value = t.value if t.value is not None else (
            t.intermediate_values[max(t.intermediate_values)] if t.intermediate_values else None
        )
        note = []
        if t.user_attrs.get("defaults"):
            note.append("defaults")
        if "retry_of" in t.user_attrs:
            note.append(f"retry of #{t.user_attrs['retry_of']}")
        rows.append(TrialRow(
            number=t.number, state=t.state.name, value=value, epochs=t.user_attrs.get("epochs"),
            seconds=t.user_attrs.get("seconds"), params=dict(t.params), note=", ".join(note),
        ))
    return rows


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "—" if value is None else str(value)


def render_trial_table(rows: Sequence[TrialRow], metric: str, best_number: int | None = None) -> str:
    """Markdown table of trials: state, metric, epochs, seconds and parameters."""
    names = sorted({k for r in rows for k in r.params})
    head = ["#", "state", metric, "epochs", "s", *names, "note"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        mark = " ★" if r.number == best_number else ""
        cells = [f"{r.number}{mark}", r.state.lower(), _fmt(r.value), _fmt(r.epochs), _fmt(r.seconds)]
        cells += [_fmt(r.params.get(n)) for n in names] + [r.note]
        lines.append("| " + " | ".join(str(c).replace("|", r"\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def plot_history(rows: Sequence[TrialRow], metric: str, path: Path, maximize: bool = True) -> Path:
    """Optimisation history: each trial's value (pruned ones at their last report) and the best so far."""
    fig = new_figure((6, 4))
    ax = fig.add_subplot(1, 1, 1)
    for state, marker, color in (("COMPLETE", "o", "tab:blue"), ("PRUNED", "x", "tab:gray")):
        pts = [(r.number, r.value) for r in rows if r.state == state and r.value is not None]
        if pts:
            ax.scatter(*zip(*pts), marker=marker, color=color, label=state.lower())
    best, xs, ys = None, [], []
    for r in rows:
        if r.state == "COMPLETE" and r.value is not None:
            best = r.value if best is None else (max(best, r.value) if maximize else min(best, r.value))
        if best is not None:
            xs.append(r.number)
            ys.append(best)
    if xs:
        ax.step(xs, ys, where="post", color="tab:red", label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel(metric)
    ax.set_title("Optimisation history")
    ax.legend(loc="best")
    return save_figure(fig, path)


def param_importances(study: Any) -> dict[str, float]:
    """fANOVA importances of the parameters (empty when there are too few complete trials)."""
    import optuna

    try:
        return dict(optuna.importance.get_param_importances(study))
    except (RuntimeError, ValueError, ZeroDivisionError) as exc:
        log.info("no parameter importances yet: %s", exc)
        return {}


def plot_importance(importances: Mapping[str, float], path: Path) -> Path:
    """Horizontal bar chart of parameter importances."""
    fig = new_figure((6, 4))
    ax = fig.add_subplot(1, 1, 1)
    if importances:
        names = list(importances)[::-1]
        ax.barh(names, [importances[n] for n in names], color="tab:blue")
        ax.set_xlabel("importance (fANOVA)")
    else:
        ax.text(0.5, 0.5, "too few complete trials", ha="center", va="center")
        ax.set_axis_off()
    ax.set_title("Parameter importance")
    return save_figure(fig, path)


def render_tuning_report(
    summary: TuneSummary,
    rows: Sequence[TrialRow],
    metric: str,
    images: Sequence[Path] = (),
    default_value: float | None = None,
) -> str:
    """Markdown report of a tuning run: outcome, trial table and plots."""
    lines = [
        f"## Tuning study {summary.study}",
        "",
        (
            f"- trials: {summary.complete} complete, {summary.pruned} pruned, {summary.failed} failed "
            f"(requested {summary.requested}; {summary.finished_before} finished before this run)"
        ),
        f"- best: trial {summary.best_number}, {metric} = {summary.best_value:.4f}",
    ]
    if default_value is not None:
        lines.append(f"- default parameters: {metric} = {default_value:.4f}")
    lines.append(f"- best parameters: `{summary.best_params}`")
    if summary.recovered:
        lines.append(f"- re-enqueued after an interruption: trials {summary.recovered}")
    lines += ["", render_trial_table(rows, metric, summary.best_number)]
    for image in images:
        encoded = base64.b64encode(Path(image).read_bytes()).decode("ascii")
        lines += [f"![{Path(image).stem}](data:image/png;base64,{encoded})", "", f"`{image}`", ""]
    return "\n".join(lines)
