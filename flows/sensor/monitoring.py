"""The sensor vertical's monitoring steps: the reference profile at registration and drift
per batch run (thin tasks over :mod:`solutions.sensor.monitoring` and :mod:`tasks.monitoring`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
from prefect import task
from prefect.cache_policies import NONE

from flows.sensor.steps import grid_table
from infra.deploy_config import monitoring_spec
from infra.home import home_layout
from infra.registry import ModelRegistry
from solutions.sensor import data as D
from solutions.sensor import monitoring as M
from solutions.sensor.config import SensorConfig
from solutions.sensor.pipeline import SupervisedSetup
from tasks import monitoring as MON
from tasks.data import DatasetRef
from tasks.ledger import FileLedger, InboxRun

BATCH_JOB = "sensor-batch-score"


@task(name="profile-training-data", cache_policy=NONE)
def profile_step(grid_ref: DatasetRef, setup: SupervisedSetup, predicted_rul: np.ndarray, out_dir: Path) -> Path:
    """The profile of the training assets' sensor values and operating settings and of the
    model's predicted RUL on the test units' last windows, written to ``<out_dir>/profile.json``."""
    rows = M.asset_rows(grid_ref.read(), list(setup.splits.get("train", [])))
    return MON.build_profile(M.monitored_features(rows), predicted_rul).save(out_dir / MON.PROFILE_FILE)


@task(name="check-drift", cache_policy=NONE)
def drift_step(run: InboxRun, columns: Mapping[str, str], config: SensorConfig) -> MON.DriftSummary | None:
    """Compare this run's aligned readings and predicted RUL with the champion's profile (PSI,
    KS); record, plot, publish, and emit an event when a threshold is crossed."""
    if not run.outputs:
        return None
    model = ModelRegistry().resolve(run.model)
    keep = set(run.outputs)
    frames, scores = [], []
    for entry in FileLedger(BATCH_JOB).entries().values():
        if entry.status != "scored" or entry.output not in keep:
            continue
        plan = D.readings_plan(Path(entry.path), None, dict(columns), config.align, data_sha256=entry.sha256)
        grid_ref, _ = grid_table(plan)  # stored when the file was scored: read back, not rebuilt
        frames.append(M.monitored_features(grid_ref.read()))
        scores.append(pd.read_parquet(entry.output, columns=["predicted_rul"])["predicted_rul"].to_numpy())
    if not frames:
        return None
    folder = home_layout().monitoring(BATCH_JOB)
    return MON.check_drift(BATCH_JOB, model.spec, model.path, pd.concat(frames, ignore_index=True),
                           np.concatenate(scores), monitoring_spec(BATCH_JOB), folder, report_dir=folder)
