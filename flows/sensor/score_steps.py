"""The sensor vertical's scoring steps: thin Prefect tasks (and the batch scorer's plain functions)
over ``solutions.sensor.scoring``: resolve a registered version, score each asset's latest window of
a grid or of an inbox file, write the scores and gather the bad-reading counts."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
from prefect import task
from prefect.cache_policies import NONE

from infra.errors import DataValidationError
from infra.home import home_layout
from infra.registry import ModelRef, ModelRegistry
from infra.store import write_json_atomic
from infra.tables import write_table
from solutions.sensor import candidates as CA
from solutions.sensor import data as D
from solutions.sensor import scoring as SC
from solutions.sensor.config import SensorConfig, SensorSource
from solutions.sensor.inference import build_module
from solutions.sensor.schema import BadReadingReport
from tasks.compress import load_variant
from tasks.data import DatasetRef
from tasks.ledger import InboxFile, ScoredFile, reading_content
from tasks.worker_models import load_once

log = logging.getLogger(__name__)


@task(name="resolve-model", cache_policy=NONE)
def resolve_model_step(spec: str) -> ModelRef:
    """One exact registered version for ``NAME``, ``NAME:VERSION`` or ``NAME@alias``."""
    return ModelRegistry().resolve(spec)


@task(name="score-latest-windows", cache_policy=NONE)
def score_step(ref: ModelRef, grid_ref: DatasetRef, source: SensorSource, threshold: float,
               bad: BadReadingReport) -> tuple[pd.DataFrame, BadReadingReport]:
    """Predicted RUL, failure probability and alert flag of each asset's (or test unit's) latest window."""
    grid = SC.units_to_score(grid_ref.read(), source)
    scores, report = SC.scores_table(ref, grid, threshold, bad, **sensor_scoring_at(ref))
    return scores, report or bad


@task(name="write-scores", cache_policy=NONE)
def write_scores_step(scores: pd.DataFrame, target: Path, csv: bool) -> Path | None:
    """Write the scores (Parquet, and CSV if asked); the CSV's path."""
    return write_table(scores, target, csv)


def sensor_scoring_at(ref: ModelRef) -> dict[str, Any]:
    """What ``scores_table`` needs to score with a registered version, read from its own folder
    (whatever this worker's home is): its tensors or compressed variant, and its GBM (skops) for
    a GBM or ensemble version."""
    registry = ModelRegistry(Path(ref.path).parents[1])
    loaded: dict[str, Any] = {"baseline": CA.load_baseline(ref)}
    if ref.kind == CA.KINDS[CA.BASELINE]:
        return loaded
    if SC.is_variant(ref):
        return {**loaded, "variant": load_variant(ref, registry, build_module)}
    return {**loaded, "state_dict": registry.load_state_dict(ref)}


def score_readings_file(file: InboxFile, *, model: ModelRef, columns: Mapping[str, str], threshold: float | None,
                        config: SensorConfig, out_dir: str, csv: bool, encoding: str | None = None) -> ScoredFile:
    """Score the latest window of every asset in one long-format readings file of an inbox,
    with the exact version the flow resolved (loaded once per worker).

    The grid is built in memory (the file is scored once; nothing is stored under this
    worker's home). The bad-reading counts the reader measured are written beside the score
    file. Errors while reading the file are the file's (quarantined); the model's and the
    machine's are retried.
    """
    ref = model
    loaded = load_once(ref, sensor_scoring_at)
    path = Path(file.path)
    with reading_content(file.shown):
        grid, bad = D.readings_plan(path, None, columns, config.align, data_sha256=file.sha256,
                                    encoding=encoding).build()
        if grid.empty:
            raise DataValidationError("no readings left after cleaning", source=file.shown)
    scores, report = SC.scores_table(ref, grid, SC.alert_threshold(ref, threshold), bad, **loaded)
    if scores.empty:
        raise DataValidationError("no asset has a complete window of readings", source=file.shown)
    target = SC.batch_scores_path(Path(out_dir), path, file.sha256, ref)
    write_table(scores, target, csv)
    write_json_atomic(SC.bad_readings_beside(target), (report or bad).model_dump())
    log.info("%s", (report or bad).summary())
    return ScoredFile(output=str(target), rows=len(scores), model=ref.spec, flagged=int(scores["alert"].sum()))


@task(name="collect-bad-readings", cache_policy=NONE)
def collect_bad_readings_step(outputs: list[str]) -> dict[str, BadReadingReport]:
    """The bad-reading counts written beside each score file of a batch run."""
    found = {}
    for output in outputs:
        path = SC.bad_readings_beside(Path(output))
        if path.exists():
            found[output] = BadReadingReport.model_validate_json(path.read_text())
    return found


def batch_output_dir(output_dir: str | None) -> Path:
    """Where batch score files go: the given folder, else the home's ``sensor-batch`` scores."""
    return Path(output_dir).expanduser() if output_dir else home_layout().scores("sensor-batch")
