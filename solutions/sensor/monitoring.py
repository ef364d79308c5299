"""What the sensor vertical watches after deployment (plain functions, no Prefect).

* the aligned grid's sensor values and operating settings (:func:`monitored_features`),
  whose profile is stored beside each registered version and compared with every batch
  run's readings;
* the failure events that arrive later (``asset_id,failed_at``) and the realised RUL error
  of the predictions made before them (:func:`scored_times`, :func:`realised_rul`,
  :func:`rul_error_table`), in batch and, per served version, online (:func:`judge_served`);
* the accumulated training data: scored readings with the failure events of their assets
  (:func:`reading_keys`, :func:`run_to_failure`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from infra.errors import DataValidationError
from infra.serving.challenger import LABEL_ROLE
from infra.tables import ColumnSpec, TableSchema, read_table
from solutions.sensor import schema as S
from solutions.sensor.align import apply_mapping, to_seconds
from solutions.sensor.schema import ColumnMapping

#: The failure time column of a failures file.
FAILED_AT = "failed_at"
#: When a scored window ended (seconds, as :func:`solutions.sensor.align.to_seconds`).
SCORED_T = "scored_t"
#: The unique key of an accumulated reading.
READING_KEY = "reading_key"
#: Fewer run-to-failure assets than this cannot be split into train/validation/test.
MIN_FAILED_ASSETS = 8


def monitored_features(grid: pd.DataFrame) -> pd.DataFrame:
    """The sensor value and operating-setting columns of an aligned grid (gap flags, labels
    and ids left out)."""
    values, ops, _ = S.feature_columns(list(grid.columns))
    return grid[values + ops].reset_index(drop=True)


def asset_rows(grid: pd.DataFrame, assets: list[str]) -> pd.DataFrame:
    """The grid rows of ``assets``."""
    return grid.loc[grid[S.ASSET].astype(str).isin({str(a) for a in assets})]


# ------------------------------------------------------------------------------------
# failure events and the realised RUL error


def failures_schema() -> TableSchema:
    """A failures file: ``asset_id,failed_at`` (one row per failure event)."""
    return TableSchema(
        name="sensor-failures",
        columns=(ColumnSpec(name=S.ASSET, kind="id"), ColumnSpec(name=FAILED_AT, kind="datetime")),
        min_rows=1,
    )


def first_failures(failures: pd.DataFrame) -> pd.DataFrame:
    """One failure per asset (the earliest), ``asset_id`` as text."""
    if failures.empty:
        return pd.DataFrame(columns=[S.ASSET, FAILED_AT])
    out = failures[[S.ASSET, FAILED_AT]].assign(**{S.ASSET: failures[S.ASSET].astype(str),
                                                   FAILED_AT: pd.to_datetime(failures[FAILED_AT])})
    return out.sort_values(FAILED_AT, kind="stable").drop_duplicates(S.ASSET, keep="first").reset_index(drop=True)


def scored_times(scores: pd.DataFrame, readings: pd.DataFrame, step_seconds: float,
                 source: str = "readings") -> pd.DataFrame:
    """``scores`` (one row per asset: ``asset_id``, ``step`` = the scored window's last grid
    step) with ``scored_t``: the start of that step in seconds. Grid steps count from each
    asset's first reading in the scored file, floored to a whole step, as the aligner does.
    ``source`` names the scored file in errors.

    Raises:
        DataValidationError: a scored asset has no reading in ``readings``.
    """
    t = pd.Series(to_seconds(readings[S.TIMESTAMP], source, S.TIMESTAMP), index=readings.index)
    first = t.groupby(readings[S.ASSET].astype(str).to_numpy()).min()
    t0 = np.floor(first / step_seconds) * step_seconds
    origin = scores[S.ASSET].astype(str).map(t0)
    if origin.isna().any():
        missing = scores.loc[origin.isna(), S.ASSET].astype(str).unique()[:5].tolist()
        raise DataValidationError(f"scored asset(s) {missing} have no readings in the scored file", source=source,
                                  column=S.ASSET)
    return scores.assign(**{SCORED_T: origin.to_numpy() + scores[S.STEP].to_numpy(dtype="float64") * step_seconds})


def realised_rul(scored: pd.DataFrame, failures: pd.DataFrame, step_seconds: float) -> pd.DataFrame:
    """Every scored (asset, step) whose asset has failed since, with its true RUL in steps
    (``floor((failed_at - scored_t) / step)``, the grid's own RUL label) and the error
    ``predicted_rul - true_rul``. A failure before the scored time (an older life of the
    asset) does not count.
    """
    events = first_failures(failures)
    if scored.empty or events.empty:
        return pd.DataFrame(columns=[*scored.columns, FAILED_AT, "true_rul", "error"])
    joined = scored.assign(**{S.ASSET: scored[S.ASSET].astype(str)}).merge(events, on=S.ASSET, how="inner")
    failed_t = to_seconds(joined[FAILED_AT], "failures", FAILED_AT)
    joined["true_rul"] = np.floor((failed_t - joined[SCORED_T].to_numpy()) / step_seconds)
    joined = joined.loc[joined["true_rul"] >= 0].reset_index(drop=True)
    joined["error"] = joined["predicted_rul"].to_numpy(dtype="float64") - joined["true_rul"].to_numpy()
    return joined


def judge_served(rows: Sequence[Mapping[str, Any]], failures: pd.DataFrame, step_seconds: float,
                 rul_cap: float | None = None,
                 ) -> tuple[list[dict[str, Any]], dict[str, float], dict[str, str]]:
    """The serving API's score-log rows of a sensor model (``id`` = asset, ``score`` = predicted
    RUL, ``scored_t`` = when the window ended) judged by the failure events that came since: the
    rows whose asset failed at or after ``scored_t``, each keyed ``asset@scored_t`` (the champion's
    and the challenger's prediction of one window share the key), the true RUL of each key
    (:func:`realised_rul`'s, capped at ``rul_cap`` when given, as the models' targets are) and
    each key's asset (the evidence draws whole assets). Rows without a clock (aligned-grid
    requests) and label rows are left out.
    """
    served = [r for r in rows if r.get("role") != LABEL_ROLE and r.get(SCORED_T) is not None]
    if not served:
        return [], {}, {}
    frame = pd.DataFrame({S.ASSET: [str(r["id"]) for r in served],
                          SCORED_T: np.array([r[SCORED_T] for r in served], dtype="float64"),
                          "predicted_rul": np.array([r["score"] for r in served], dtype="float64"),
                          "row": np.arange(len(served))})
    frame = frame.loc[np.isfinite(frame[SCORED_T].to_numpy())]
    judged = realised_rul(frame, failures, step_seconds)
    if judged.empty:
        return [], {}, {}
    truth = judged["true_rul"].to_numpy(dtype="float64")
    if rul_cap is not None:
        truth = np.minimum(truth, rul_cap)
    keys = judged[S.ASSET].astype(str) + "@" + judged[SCORED_T].map(lambda t: f"{t:.0f}")
    out = [{**served[int(i)], "id": key} for i, key in zip(judged["row"], keys, strict=True)]
    return out, dict(zip(keys, truth.tolist(), strict=True)), dict(zip(keys, judged[S.ASSET].astype(str),
                                                                       strict=True))


def rul_error_table(realised: pd.DataFrame, within: float) -> pd.DataFrame:
    """Per model version: predictions judged, assets, MAE, RMSE, mean error (bias; positive =
    the model expected the failure later than it came) and the share within ±``within`` steps."""
    columns = ["model", "model_version", "judged", "assets", "mae", "rmse", "bias", "within_share"]
    if realised.empty:
        return pd.DataFrame(columns=columns)
    rows = []
    for (model, version), part in realised.groupby(["model", "model_version"], sort=True):
        err = part["error"].to_numpy(dtype="float64")
        rows.append({"model": model, "model_version": int(version), "judged": len(err),
                     "assets": int(part[S.ASSET].nunique()), "mae": float(np.mean(np.abs(err))),
                     "rmse": float(np.sqrt(np.mean(err ** 2))), "bias": float(np.mean(err)),
                     "within_share": float(np.mean(np.abs(err) <= within))})
    return pd.DataFrame(rows, columns=columns)


# ------------------------------------------------------------------------------------
# accumulated training data


def read_canonical(path: str, columns: dict[str, str], encoding: str | None = None) -> pd.DataFrame:
    """A long-format readings file as read for scoring: canonical column names, no cleaning."""
    return apply_mapping(read_table(Path(path), encoding), ColumnMapping(dict(columns)), S.READING_COLUMNS, str(path))


def reading_keys(readings: pd.DataFrame, source: str = "readings") -> pd.DataFrame:
    """Canonical readings with datetime timestamps and a ``reading_key`` (asset, time, sensor):
    the same reading sent again in a later file replaces, never doubles.

    Raises:
        DataValidationError: the timestamps are numbers (no calendar day to partition by).
    """
    ts = readings[S.TIMESTAMP]
    if pd.api.types.is_numeric_dtype(ts):
        raise DataValidationError("readings with numeric timestamps cannot accumulate by day; send datetimes",
                                  source=source, column=S.TIMESTAMP)
    ts = pd.to_datetime(ts, utc=True, format="mixed").dt.tz_localize(None)
    out = readings[list(S.READING_COLUMNS)].assign(**{S.ASSET: readings[S.ASSET].astype(str), S.TIMESTAMP: ts,
                                                      S.SENSOR: readings[S.SENSOR].astype(str)})
    out[READING_KEY] = out[S.ASSET] + "|" + ts.astype("int64").astype(str) + "|" + out[S.SENSOR]
    return out


def run_to_failure(readings: pd.DataFrame, failures: pd.DataFrame, min_assets: int = MIN_FAILED_ASSETS,
                   source: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The accumulated run-to-failure trajectories: the readings of the assets with a failure
    event, up to it, and the events as a sensor events table (``asset_id,failure_time,
    failure_type``) whose RUL labels the aligner derives. ``source`` names the data in errors.

    Raises:
        DataValidationError: fewer than ``min_assets`` assets have both readings and a failure.
    """
    events = first_failures(failures)
    have = set(readings[S.ASSET].astype(str)) if not readings.empty else set()
    events = events.loc[events[S.ASSET].isin(have)]
    if len(events) < min_assets:
        raise DataValidationError(
            f"the accumulated data holds {len(events)} run-to-failure asset(s) (readings and a failure event); "
            f"training needs at least {min_assets} (let batch scoring and the monitor run longer, or train on "
            "a file / synthetic data)", source=source)
    failed_at = readings[S.ASSET].astype(str).map(events.set_index(S.ASSET)[FAILED_AT])
    keep = failed_at.notna() & (readings[S.TIMESTAMP] <= failed_at)
    rows = readings.loc[keep, list(S.READING_COLUMNS)].sort_values([S.ASSET, S.TIMESTAMP], kind="stable")
    table = pd.DataFrame({S.ASSET: events[S.ASSET].to_numpy(), S.FAILURE_TIME: events[FAILED_AT].to_numpy(),
                          S.FAILURE_TYPE: "unknown"})
    return rows.reset_index(drop=True), table
