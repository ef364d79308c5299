"""A flow run that Prefect starts itself (a deployment's run on a worker) shows the project's log
lines in its Logs tab: the epochs, the split, the candidates and the test metrics."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from infra.deploy import RUN_ENV

_RUN = r'''
from flows.fraud import fraud_train
from solutions.fraud.config import FraudTrainConfig, SequenceModelConfig, SyntheticDataConfig

config = FraudTrainConfig(model_name="fraud-logs", data=SyntheticDataConfig(n_accounts=300, n_terminals=150, n_days=40),
                          model=SequenceModelConfig(max_epochs=2, seq_len=8))
state = fraud_train(config=config, return_state=True)
print("FLOW_RUN", state.state_details.flow_run_id)
'''


@pytest.mark.slow
def test_a_deployment_style_training_run_sends_epochs_split_candidates_and_metrics_to_its_logs(
        tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.settings import PREFECT_API_URL

    repo = Path(__file__).resolve().parents[2]
    # the environment a worker gives a deployment's flow run (infra/deploy.py), no command-line set-up
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("INDUSFLOW_LOG")}, **RUN_ENV,
           "PREFECT_API_URL": str(PREFECT_API_URL.value()), "PYTHONPATH": str(repo),
           "INDUSFLOW_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-c", _RUN], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_id = uuid.UUID(next(line for line in done.stdout.splitlines() if line.startswith("FLOW_RUN")).split()[1])
    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])), limit=200)
    messages = "\n".join(entry.message for entry in logs)
    assert "epoch 1/2" in messages and "epoch 2/2" in messages, messages
    assert "split " in messages and "candidates (val PR-AUC)" in messages, messages
    assert "sequence/test: n=" in messages, messages


_CLI_RUN = r'''
import logging
from infra.prefect_env import prefect_cli_settings

with prefect_cli_settings():  # what flows/cli.py does, then it imports the command's flow module
    from prefect import flow

    @flow(name="cli-logs-probe")
    def probe():
        logging.getLogger("tasks.probe").info("epoch 2/2: val/loss=0.1234")

    state = probe(return_state=True)
print("FLOW_RUN", state.state_details.flow_run_id)
'''


def test_a_command_line_run_sends_the_project_loggers_to_its_logs(tmp_path: Path) -> None:
    """``python -m flows.<vertical> <command>`` against a server: the project's lines reach the Logs tab
    (they did not when Prefect configured its logging after the project's loggers were routed)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.settings import PREFECT_API_URL

    repo = Path(__file__).resolve().parents[2]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("INDUSFLOW_LOG", "PREFECT_LOGGING"))},
           "PREFECT_API_URL": str(PREFECT_API_URL.value()), "PYTHONPATH": str(repo),
           "INDUSFLOW_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-c", _CLI_RUN], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_id = uuid.UUID(next(line for line in done.stdout.splitlines() if line.startswith("FLOW_RUN")).split()[1])
    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])), limit=50)
    assert any(e.name == "tasks.probe" and "epoch 2/2: val/loss=0.1234" in e.message for e in logs), \
        [(e.name, e.message) for e in logs]
