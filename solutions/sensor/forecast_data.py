"""The aligned grid as forecasting series: which sensor columns are forecast, and each asset's
channels as long-format series (``unique_id`` = asset and sensor, ``ds`` = grid step, ``y``),
with the held-out last steps kept apart as the truth."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from infra.errors import DataValidationError
from solutions.sensor import schema as S
from solutions.sensor.forecast_config import ForecastConfig

#: past windows statsforecast's conformal intervals are calibrated on (each H steps)
CONFORMAL_WINDOWS = 2
_SEP = "\x1f"
_NOT_SENSORS = {S.ASSET, S.STEP, *S.LABEL_COLUMNS}


def sensor_channels(grid: pd.DataFrame, op_prefix: str = "op_", wanted: Sequence[str] | None = None,
                    ) -> tuple[list[str], dict[str, str]]:
    """The grid columns to forecast and, for the columns left out, why.

    Default: every numeric column that is not a key, a label, a gap flag or an operating setting
    (``op_prefix``, and C-MAPSS's ``op_setting_*``), and that varies (a constant column has no
    scale to judge a forecast by). ``wanted`` names them instead.

    Raises:
        DataValidationError: a wanted column the grid does not have, or no column left.
    """
    numeric = [str(c) for c in grid.columns if c not in _NOT_SENSORS and not str(c).startswith(S.GAP_PREFIX)
               and pd.api.types.is_numeric_dtype(grid[c]) and not pd.api.types.is_bool_dtype(grid[c])]
    skipped: dict[str, str] = {}
    if wanted:
        absent = [c for c in wanted if c not in numeric]
        if absent:
            raise DataValidationError(f"no sensor column(s) {absent} to forecast; the grid has {numeric}",
                                      column=absent[0])
        pool = list(dict.fromkeys(wanted))
    else:
        pool = []
        for c in numeric:
            if c.startswith((op_prefix, "op_setting_")):
                skipped[c] = "operating setting"
            else:
                pool.append(c)
    channels = []
    for c in pool:
        spread = np.nanstd(grid[c].to_numpy(dtype="float64")) if grid[c].notna().any() else np.nan
        if not np.isfinite(spread) or spread == 0:
            skipped[c] = "no reading" if not np.isfinite(spread) else "constant"
        else:
            channels.append(c)
    if not channels:
        raise DataValidationError(f"no sensor column varies, nothing to forecast (left out: {skipped})")
    return channels, skipped


def min_history(cfg: ForecastConfig) -> int:
    """Fewest steps a series needs: a seasonal difference for the MASE scale, and with conformal
    intervals the past windows they are calibrated on (plus one step to fit on)."""
    need = max(3, cfg.season_length + 2)
    if cfg.intervals == "conformal":
        need = max(need, (CONFORMAL_WINDOWS + 1) * cfg.horizon + 1)
    return need


@dataclass(frozen=True)
class SeriesTable:
    """Long-format series: ``unique_id`` (asset and sensor), ``ds`` (grid step), ``y``.

    Attributes:
        history: what the models are fitted on (per series, the last ``history`` steps before the truth).
        truth: the held-out last steps of each series (empty when nothing is held out).
        short: series left out for having fewer steps than the models need.
    """

    history: pd.DataFrame
    truth: pd.DataFrame
    short: int = 0


def series_id(asset: str, sensor: str) -> str:
    return f"{asset}{_SEP}{sensor}"


def split_id(ids: pd.Series) -> tuple[pd.Series, pd.Series]:
    """(asset, sensor) of each ``unique_id``."""
    parts = ids.astype(str).str.split(_SEP, n=1)
    return parts.str[0], parts.str[1]



def describe_series(uid: str) -> str:
    """A series id for a message: ``<asset>, sensor <sensor>``."""
    return uid.replace(_SEP, ", sensor ")


def series_table(grid: pd.DataFrame, channels: Sequence[str], history: int, hold_out: int = 0,
                 min_steps: int = 3) -> SeriesTable:
    """Each asset's channels as series: gaps carried forward (then back) within the asset, the last
    ``hold_out`` steps kept apart as the truth, at most ``history`` steps before them fitted on."""
    grid = grid.sort_values([S.ASSET, S.STEP])
    frames, truths, short = [], [], 0
    for asset, g in grid.groupby(S.ASSET, sort=True, observed=True):
        # steps a grid sent as rows may skip are put back, carrying the last value forward
        steps = np.arange(int(g[S.STEP].min()), int(g[S.STEP].max()) + 1, dtype="int64")
        values = g.set_index(S.STEP)[list(channels)].reindex(steps).ffill().bfill()
        cut = len(steps) - hold_out
        for c in channels:
            y = values[c].to_numpy(dtype="float64")
            if cut < min_steps or np.isnan(y).any():
                short += 1
                continue
            start = max(0, cut - history)
            uid = series_id(str(asset), c)
            frames.append(pd.DataFrame({"unique_id": uid, "ds": steps[start:cut], "y": y[start:cut]}))
            if hold_out:
                truths.append(pd.DataFrame({"unique_id": uid, "ds": steps[cut:], "y": y[cut:]}))
    empty = pd.DataFrame({"unique_id": pd.Series(dtype=str), "ds": pd.Series(dtype="int64"),
                          "y": pd.Series(dtype="float64")})
    hist = pd.concat(frames, ignore_index=True) if frames else empty
    truth = pd.concat(truths, ignore_index=True) if truths else empty.copy()
    return SeriesTable(hist, truth, short)
