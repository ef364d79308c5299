"""The tuning flow end to end on tiny synthetic data: trials, resume, final model, errors."""

from __future__ import annotations

import json
import time
from pathlib import Path
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

from flows.fraud import steps
from flows.fraud.cli import main
from infra.home import home_layout
from solutions.fraud.config import FloatParam, SequenceModelConfig
from tasks.tune import StudyRef, TuneConfig, ask_trial, open_study, storage_url
from tests.flows.run_states import FINAL, latest_flow_run_id

TINY = ["--n-accounts", "300", "--n-terminals", "150", "--n-days", "40", "--max-epochs", "2", "--seq-len", "8"]
STUDY = "flow-tune-resume"


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def _trainings(flow_run_id: UUID, expected: int, timeout_s: float = 90.0) -> list[str]:
    """The states of the flow run's ``train-model`` task runs (trials' and final), oldest first,
    once ``expected`` of them are recorded in a final state (the API records them from events)."""
    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            states = [r.state_name for r in sorted(runs, key=lambda r: r.created) if r.name.startswith("train-model-")]
            if (len(states) >= expected and all(s in FINAL for s in states)) or time.monotonic() > deadline:
                return states
            time.sleep(0.5)


def test_tune_cli_runs_trials_registers_and_resumes_after_a_kill(capsys: pytest.CaptureFixture) -> None:
    args = ["tune", *TINY, "--study", STUDY, "--model", "fraud-tuned", "--max-in-flight", "2", "--json"]
    assert main([*args, "--trials", "2"]) == 0
    first = _last_json(capsys.readouterr().out)
    s = first["summary"]
    assert s["complete"] + s["pruned"] == 2 and len(s["ran_now"]) == 2
    assert first["default_value"] is not None  # trial 0 ran the default parameters
    assert s["best_value"] >= first["default_value"]
    assert first["model"]["name"] == "fraud-tuned" and first["promotion"]["promoted"] is True
    # the final training is the best trial's run key: Prefect's cache skips it (Cached), with the trial's weights
    assert first["final"]["reused_completed"] is True and first["final"]["epochs_trained_now"] == []
    trainings = _trainings(latest_flow_run_id("fraud-tune"), expected=3)  # two trials, then the final one
    assert trainings[-1] == "Cached" and "Completed" in trainings[:-1], trainings
    report = Path(first["report_dir"], "report.md").read_text()
    assert "optimisation-history" in report and "param-importance" in report and "| 0 " in report
    assert Path(first["report_dir"], "param-importance.png").exists()

    # what a killed run leaves: a trial RUNNING with drawn parameters and no result
    ref = StudyRef(name=STUDY, storage=storage_url(STUDY))
    study = open_study(ref, TuneConfig())
    zombie = ask_trial(study, ref, steps.fraud_space(SequenceModelConfig(seq_len=8, max_epochs=2)))

    assert main([*args, "--trials", "3"]) == 0
    second = _last_json(capsys.readouterr().out)["summary"]
    assert second["finished_before"] == 2 and second["recovered"] == [zombie.number]
    assert second["complete"] + second["pruned"] == 3  # exactly the requested count
    ran = second["ran_now"]
    assert len(ran) == 1 and ran[0]["params"] == zombie.params  # finished trials were not re-run
    assert ran[0]["run_key"] == zombie.run_key


def test_invalid_search_space_fails_before_any_trial(monkeypatch, capsys) -> None:
    bad = (FloatParam(name="lr", low=0.0, high=1e-2, log=True),)
    monkeypatch.setattr(steps, "SEARCH_SPACE", bad)
    before = set(home_layout().tuning().iterdir())
    assert main(["tune", *TINY, "--trials", "3", "--study", "flow-bad-space"]) == 2
    assert "'lr' is on a log scale but low=0.0" in capsys.readouterr().err
    assert set(home_layout().tuning().iterdir()) == before  # no study was created

    monkeypatch.setattr(steps, "SEARCH_SPACE", (FloatParam(name="learning_rate", low=1e-4, high=1e-2),))
    assert main(["tune", *TINY, "--trials", "3", "--study", "flow-bad-space"]) == 2
    assert "'learning_rate' is not a field of the config" in capsys.readouterr().err


def test_trials_run_on_a_local_dask_cluster(monkeypatch, capsys) -> None:
    """The same flow with trials fanned out to a local 2-worker Dask cluster (prefect-dask)."""
    pytest.importorskip("prefect_dask")
    monkeypatch.setenv("INDUSFLOW_RUNNER_KIND", "dask")
    args = ["tune", *TINY, "--study", "flow-tune-dask", "--model", "fraud-dask", "--max-in-flight", "2", "--trials", "2", "--json"]
    assert main(args) == 0
    result = _last_json(capsys.readouterr().out)
    assert result["summary"]["complete"] + result["summary"]["pruned"] == 2
    assert len(result["summary"]["ran_now"]) == 2
