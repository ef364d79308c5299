"""Online prediction for the sensor vertical: a request's recent readings -> RUL, failure
probability and alert, exactly as the batch ``score`` path computes them for a file.

Two input formats:

* long format (one reading per row: ``asset_id``, ``timestamp``, ``sensor``, ``value``, or
  source names with a column mapping): read, cleaned and aligned by the same functions as a
  readings file (:func:`solutions.sensor.align.clean_readings`,
  :func:`~solutions.sensor.align.align_readings`) with the same alignment settings;
* the aligned grid (one row per asset and step, one column per feature), as the aligner
  produces it.

Either way the grid goes through :func:`solutions.sensor.scoring.scores_table` (the batch
path's windowing, regime normalisation and prediction) with the model kept loaded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from torch import nn

from infra.errors import DataValidationError
from infra.registry import ModelRef
from solutions.sensor import schema as S
from solutions.sensor.align import align_readings, apply_mapping, clean_readings
from solutions.sensor.config import AlignConfig
from solutions.sensor.model import RULModel
from solutions.sensor.schema import BadReadingReport, ColumnMapping
from solutions.sensor.scoring import alert_threshold, scores_table

__all__ = ["OnlineSensorModel", "grid_from_readings", "grid_from_rows", "predict_grid"]

SOURCE = "request"


@dataclass(frozen=True)
class OnlineSensorModel:
    """A registered sensor version kept loaded: the model (or a compressed variant) and its ref."""

    ref: ModelRef
    net: RULModel | None = None
    variant: nn.Module | None = None
    baseline: Any = None  # the GBM of a GBM or ensemble version (solutions.sensor.candidates)

    @property
    def threshold(self) -> float:
        """The alert threshold chosen at training."""
        return alert_threshold(self.ref, None)


def grid_from_readings(records: Sequence[Mapping[str, Any]], columns: Mapping[str, str] | None = None,
                       align: AlignConfig | None = None) -> tuple[pd.DataFrame, BadReadingReport]:
    """Long-format readings -> the grid, as a readings file is read by ``sensor score --data``.

    Raises:
        DataValidationError: a required column is missing, timestamps cannot be parsed or no
            usable reading is left (the message names the column).
    """
    if not records:
        raise DataValidationError("no readings in the request", source=SOURCE)
    frame = pd.DataFrame.from_records(list(records))
    frame = apply_mapping(frame, ColumnMapping(dict(columns or {})), S.READING_COLUMNS, SOURCE)
    cfg = align or AlignConfig()
    readings, report = clean_readings(frame, cfg, SOURCE)
    return align_readings(readings, None, cfg, report)


def grid_from_rows(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Aligned grid rows (``asset_id``, ``step``, feature and ``gap__*`` columns) -> a grid table.

    Label columns are not needed (an asset being scored has no known failure).

    Raises:
        DataValidationError: ``asset_id`` or ``step`` is missing or a step is not an integer.
    """
    if not records:
        raise DataValidationError("no grid rows in the request", source=SOURCE)
    grid = pd.DataFrame.from_records(list(records))
    missing = [c for c in (S.ASSET, S.STEP) if c not in grid.columns]
    if missing:
        raise DataValidationError(f"grid rows need column(s) {missing}", source=SOURCE, column=missing[0])
    grid[S.ASSET] = grid[S.ASSET].astype(str)
    steps = pd.to_numeric(grid[S.STEP], errors="coerce")
    bad = (steps.isna() | (steps != np.floor(steps))).to_numpy()
    if bad.any():
        raise DataValidationError("steps must be integers", source=SOURCE, column=S.STEP,
                                  rows=[int(i) for i in np.flatnonzero(bad)[:5]])
    grid[S.STEP] = steps.astype("int64")
    for col in grid.columns:
        if col in (S.ASSET, S.STEP, S.FAILURE_TYPE, S.SET, S.FAILED):
            continue
        values = pd.to_numeric(grid[col], errors="coerce")
        bad = (grid[col].notna() & values.isna()).to_numpy()
        if bad.any():
            raise DataValidationError("non-numeric value(s)", source=SOURCE, column=str(col),
                                      rows=[int(i) for i in np.flatnonzero(bad)[:5]])
        grid[col] = values.astype("float64")
    if grid.duplicated([S.ASSET, S.STEP]).any():
        raise DataValidationError("an (asset_id, step) pair occurs twice", source=SOURCE, column=S.STEP)
    defaults = {S.RUL: np.nan, S.FAILED: False, S.FAILURE_TYPE: "", S.SET: "fleet"}
    for col, value in defaults.items():
        if col not in grid.columns:
            grid[col] = value
    return grid


def predict_grid(model: OnlineSensorModel, grid: pd.DataFrame) -> pd.DataFrame:
    """The latest window of each asset of ``grid``: ``asset_id``, ``step``, ``predicted_rul``,
    ``failure_probability``, ``alert``, ``model``, ``model_version`` (the batch score table)."""
    table, _ = scores_table(model.ref, grid, model.threshold, net=model.net, variant=model.variant,
                            baseline=model.baseline)
    return table
