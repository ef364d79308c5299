"""Pruning callback, and study resume semantics with a cheap objective (no Prefect flow)."""

from __future__ import annotations

from types import SimpleNamespace

import optuna
import pytest

from tasks.tune import (
    StudyRef,
    TuneConfig,
    make_pruning_callback,
    open_study,
    optimize,
    plot_history,
    plot_importance,
    render_tuning_report,
    storage_url,
    trial_rows,
    validate_space,
)

SPACE = validate_space(
    ({"kind": "float", "name": "x", "low": -3.0, "high": 3.0}, {"kind": "categorical", "name": "c", "choices": (0, 1)}),
    fields=("x", "c"),
)


class _FakeTrial:
    def __init__(self, prune_at: int) -> None:
        self.prune_at = prune_at
        self.reports: list[tuple[float, int]] = []

    def report(self, value: float, step: int) -> None:
        self.reports.append((value, step))

    def should_prune(self) -> bool:
        return len(self.reports) > self.prune_at


def _trainer(epoch: int, value: float | None) -> SimpleNamespace:
    metrics = {} if value is None else {"val/auprc": value}
    return SimpleNamespace(sanity_checking=False, current_epoch=epoch, callback_metrics=metrics)


def test_callback_reports_each_epoch_and_prunes() -> None:
    trial = _FakeTrial(prune_at=2)
    cb = make_pruning_callback(trial, "val/auprc")
    cb.on_validation_end(_trainer(0, 0.1), None)
    cb.on_validation_end(_trainer(1, None), None)  # metric missing: nothing reported
    cb.on_validation_end(_trainer(1, 0.2), None)
    with pytest.raises(optuna.TrialPruned, match="epoch 2"):
        cb.on_validation_end(_trainer(2, 0.15), None)
    assert trial.reports == [(0.1, 0), (0.2, 1), (0.15, 2)]


def test_callback_prunes_with_a_real_median_pruner(tmp_path) -> None:
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0))
    good = study.ask()
    for epoch in range(3):
        good.report(0.9, epoch)
    study.tell(good, 0.9)
    bad = study.ask()
    cb = make_pruning_callback(bad, "val/auprc")
    with pytest.raises(optuna.TrialPruned):
        cb.on_validation_end(_trainer(0, 0.1), None)


class Killed(BaseException):
    """Stands for the process being killed mid-trial (not caught as a trial failure)."""


def test_killed_study_resumes_to_exactly_the_requested_count(tmp_path) -> None:
    ref = StudyRef(name="unit-resume", storage=storage_url("unit-resume"))
    calls: list[str] = []

    def objective(params, run_key, callbacks, kill_at=None):
        calls.append(run_key)
        if kill_at is not None and len(calls) == kill_at:
            raise Killed()
        for epoch in range(2):  # report like a training would
            callbacks[0].on_validation_end(_trainer(epoch, 1 - abs(params["x"]) / 10), None)
        return 1 - abs(params["x"]) / 10 + params["c"] * 0.01

    config = TuneConfig(trials=6, startup_trials=2, prune_after_trials=1)
    with pytest.raises(Killed):
        optimize(ref, SPACE, lambda p, k, cb: objective(p, k, cb, kill_at=4), config, "val/auprc", defaults={"x": 0.0, "c": 0})
    study = open_study(ref, config)
    states = [t.state.name for t in study.trials]
    assert len(states) == 4 and all(s in ("COMPLETE", "PRUNED") for s in states[:3])
    assert states[3] == "RUNNING"  # the zombie the kill left behind
    killed_params = study.trials[3].params
    first_keys = list(calls[:3])

    calls.clear()
    summary = optimize(ref, SPACE, objective, config, "val/auprc")
    assert summary.recovered == [3]
    assert summary.finished_before == 3
    assert summary.complete + summary.pruned == 6  # exactly the requested count
    assert len(summary.ran_now) == 3 and not set(calls) & set(first_keys)  # finished trials not re-run
    retried = study.trials[4]
    assert retried.params == killed_params and retried.user_attrs["retry_of"] == 3
    assert calls[0] == "unit-resume-trial-0003"  # the retry resumes the killed trial's checkpoints
    assert study.trials[0].user_attrs.get("defaults") is True and study.trials[0].params == {"x": 0.0, "c": 0}
    # a third run has nothing left to do
    again = optimize(ref, SPACE, objective, config, "val/auprc")
    assert again.ran_now == [] and again.complete + again.pruned == 6

    rows = trial_rows(study)
    md = render_tuning_report(
        summary, rows, "val/auprc",
        [plot_history(rows, "val/auprc", tmp_path / "h.png"), plot_importance({"x": 0.8, "c": 0.2}, tmp_path / "i.png")],
    )
    assert "retry of #3" in md and "defaults" in md and md.count("data:image/png;base64") == 2


def test_workers_prune_with_the_configured_warmup() -> None:
    """The pruner is rebuilt from the config where a trial runs: no trial stops in its warm-up."""
    ref = StudyRef(name="unit-warmup", storage=storage_url("unit-warmup"))

    def objective(params, run_key, callbacks):
        for epoch in range(3):
            callbacks[0].on_validation_end(_trainer(epoch, 1 - abs(params["x"]) / 3), None)
        return 1 - abs(params["x"]) / 3

    config = TuneConfig(trials=8, startup_trials=8, prune_after_trials=1, warmup_epochs=1, enqueue_defaults=False)
    summary = optimize(ref, SPACE, objective, config, "val/auprc")
    pruned = [o for o in summary.ran_now if o.state == "PRUNED"]
    assert pruned and all(o.epochs >= 2 for o in pruned)
