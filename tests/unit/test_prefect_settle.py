"""A command-line run on the ephemeral API ends with every task run recorded, and quietly.

``infra.prefect_env.settle_prefect`` polls the server's ``/task_runs/count`` until its task-run
recorder has caught up. Without that wait this test failed with Prefect 3.9.1 (2026-12-06, load
~7 on 2 cores): the server's shutdown cancelled the recorder's last flush (``Error flushing 100
events``). Run it before dropping the wait on a later Prefect.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
N_TASKS = 200

RUN = textwrap.dedent(f"""
    from prefect import flow, task
    from infra.prefect_env import prefect_cli_settings

    @task
    def step(i: int) -> int:
        return i * 2

    @flow
    def fan_out() -> int:
        return sum(f.result() for f in step.map(range({N_TASKS})))

    with prefect_cli_settings():
        fan_out()
""")


@pytest.mark.slow
def test_a_fan_out_run_leaves_every_task_run_recorded_completed(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "PREFECT_HOME"))}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PYTHONPATH=str(ROOT), INDUSFLOW_HOME=str(tmp_path / "home"))
    run = subprocess.run([sys.executable, "-c", RUN], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-3000:]
    for noise in ("Error flushing", "Still processing items", "Traceback"):
        assert noise not in output, output[-3000:]
    with sqlite3.connect(tmp_path / "prefect" / "prefect.db") as db:
        states = dict(db.execute("SELECT state_type, COUNT(*) FROM task_run GROUP BY state_type").fetchall())
    assert states == {"COMPLETED": N_TASKS}
