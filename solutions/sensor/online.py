"""Online prediction for the sensor vertical: a request's recent readings -> RUL, failure
probability and alert, exactly as the batch ``score`` path computes them for a file.

Two input formats:

* long format (one reading per row: ``asset_id``, ``timestamp``, ``sensor``, ``value``, or
  source names with a column mapping): read, cleaned and aligned by the same functions as a
  readings file (:func:`solutions.sensor.align.clean_readings`,
  :func:`~solutions.sensor.align.align_readings`) with the same alignment settings;
* the aligned grid (one row per asset and step, one column per feature), as the aligner
  produces it.

C-MAPSS-style data (one row per engine and cycle, settings and sensors as columns) is already a
grid: it is sent as ``grid`` rows with ``step`` = cycle - 1, as :mod:`solutions.sensor.cmapss`
reads a file. A request is checked against the model before it joins a shared model call
(:func:`check_grid`): a feature the model needs and the request lacks is a
:class:`~infra.errors.DataValidationError` naming it, never a failed model call.

Either way the grid goes through :func:`solutions.sensor.scoring.scores_table` (the batch
path's windowing, regime normalisation and prediction) with the model kept loaded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd
from torch import nn

from infra.errors import DataValidationError
from infra.registry import ModelRef
from solutions.sensor import schema as S
from solutions.sensor.align import align_readings, apply_mapping, clean_readings
from solutions.sensor.config import AlignConfig, WindowConfig
from solutions.sensor.features import RegimeNormalizer
from solutions.sensor.model import RULModel
from solutions.sensor.pipeline import preprocessing_from_params
from solutions.sensor.schema import BadReadingReport, ColumnMapping
from solutions.sensor.scoring import alert_threshold, scores_table

__all__ = ["OnlineSensorModel", "check_grid", "grid_from_readings", "grid_from_rows", "predict_grid",
           "window_end_seconds"]

SOURCE = "request"
#: aggregates :func:`~solutions.sensor.align.align_readings` makes of a fast sensor
FAST_SUFFIXES = ("_rms", "_peak", "_kurtosis")


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

    @cached_property
    def preprocessing(self) -> tuple[RegimeNormalizer, WindowConfig]:
        """The normaliser and window settings the version was trained with."""
        return preprocessing_from_params(self.ref.params)

    @property
    def features(self) -> list[str]:
        """The grid columns the model reads (operating settings, then sensor features)."""
        norm, _ = self.preprocessing
        return [*norm.ops_, *norm.values_]


def _reject_nested(frame: pd.DataFrame, columns: Sequence[str]) -> None:
    """A list or an object where a cell belongs is an error naming the column and rows."""
    for col in columns:
        if col not in frame.columns or frame[col].dtype != object:
            continue
        bad = frame[col].map(lambda v: isinstance(v, (list, dict, tuple, set))).to_numpy(dtype=bool)
        if bad.any():
            raise DataValidationError("holds a list or an object where a single value belongs", source=SOURCE,
                                      column=str(col), rows=[int(i) for i in np.flatnonzero(bad)[:5]])


def _check_span(readings: pd.DataFrame, cfg: AlignConfig, window: int | None) -> None:
    """At least one asset's readings cover 2 grid steps (the aligner's minimum), else a message
    that says how much history to send."""
    if readings.empty:
        return
    codes = readings[S.ASSET].cat.codes.to_numpy()
    t = readings["t"].to_numpy()
    first = np.full(int(codes.max()) + 1, np.inf)
    last = np.full(len(first), -np.inf)
    np.minimum.at(first, codes, t)
    np.maximum.at(last, codes, t)
    anchored = np.floor(first / cfg.step_seconds) * cfg.step_seconds  # the aligner's grid origin
    if ((last - anchored) < cfg.step_seconds).all():
        want = f"; the model's window is {window} steps (a shorter history is left-padded with its first step)" \
            if window else ""
        raise DataValidationError(
            f"every asset's readings fall within one grid step of {cfg.step_seconds:g} s: send each asset's "
            f"readings over at least 2 steps{want}", source=SOURCE, column=S.TIMESTAMP)


def grid_from_readings(records: Sequence[Mapping[str, Any]], columns: Mapping[str, str] | None = None,
                       align: AlignConfig | None = None, *, window: int | None = None,
                       ) -> tuple[pd.DataFrame, BadReadingReport, dict[str, float]]:
    """Long-format readings -> the grid, as a readings file is read by ``sensor score --data``,
    and each asset's grid origin (seconds: the start of its step 0, as the aligner anchors it),
    so that a scored step can be put back on the clock (:func:`window_end_seconds`).

    ``window`` (the model's window length) only words the error of a history under 2 grid steps.

    Raises:
        DataValidationError: a required column is missing, a cell holds a list or an object,
            timestamps cannot be parsed, every asset's readings fall in one grid step or no
            usable reading is left (the message names the column).
    """
    if not records:
        raise DataValidationError("no readings in the request", source=SOURCE)
    frame = pd.DataFrame.from_records(list(records))
    frame = apply_mapping(frame, ColumnMapping(dict(columns or {})), S.READING_COLUMNS, SOURCE)
    _reject_nested(frame, S.READING_COLUMNS)
    cfg = align or AlignConfig()
    readings, report = clean_readings(frame, cfg, SOURCE)
    _check_span(readings, cfg, window)
    grid, report = align_readings(readings, None, cfg, report)
    first = readings.groupby(readings[S.ASSET].astype(str), observed=True)["t"].min()
    origins = {str(a): float(np.floor(t / cfg.step_seconds) * cfg.step_seconds) for a, t in first.items()}
    return grid, report, origins


def window_end_seconds(table: pd.DataFrame, origins: Mapping[str, float] | None,
                       step_seconds: float) -> np.ndarray:
    """When each scored window of ``table`` (``asset_id``, ``step``) ended: the start of its last
    step in seconds (as :func:`solutions.sensor.monitoring.scored_times` computes it for a
    scored file); NaN where the request had no clock (aligned grid rows)."""
    if not origins:
        return np.full(len(table), np.nan)
    origin = table[S.ASSET].astype(str).map(origins).to_numpy(dtype="float64")
    return origin + table[S.STEP].to_numpy(dtype="float64") * step_seconds


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
    _reject_nested(grid, [str(c) for c in grid.columns])
    if grid[S.ASSET].isna().any():
        raise DataValidationError("grid rows need an asset id", source=SOURCE, column=S.ASSET,
                                  rows=[int(i) for i in np.flatnonzero(grid[S.ASSET].isna().to_numpy())[:5]])
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


def check_grid(model: OnlineSensorModel, grid: pd.DataFrame) -> None:
    """The grid has every feature ``model`` reads.

    Raises:
        DataValidationError: naming the missing features (and a fast sensor sent too sparsely
            to be aggregated as one, at fewer than 2 readings per grid step).
    """
    missing = [c for c in model.features if c not in grid.columns]
    if not missing:
        return
    have = sorted(c for c in grid.columns if c not in S.LABEL_COLUMNS and not str(c).startswith(S.GAP_PREFIX))
    sparse = sorted({c[: -len(x)] for c in missing for x in FAST_SUFFIXES if c.endswith(x) and c[: -len(x)] in have})
    hint = (f"; {sparse} came as slow sensor(s): a fast sensor needs at least 2 readings per grid step"
            if sparse else "")
    raise DataValidationError(
        f"the request lacks feature(s) {missing} that {model.ref.spec} was trained on (it reads {model.features}; "
        f"the request has {have}){hint}", source=SOURCE, column=missing[0])


def predict_grid(model: OnlineSensorModel, grid: pd.DataFrame) -> pd.DataFrame:
    """The latest window of each asset of ``grid``: ``asset_id``, ``step``, ``predicted_rul``,
    ``failure_probability``, ``alert``, ``model``, ``model_version`` (the batch score table)."""
    table, _ = scores_table(model.ref, grid, model.threshold, net=model.net, variant=model.variant,
                            baseline=model.baseline)
    return table
