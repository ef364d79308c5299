"""What the sensor vertical watches after deployment (plain functions, no Prefect): the
aligned grid's sensor values and operating settings, whose profile is stored beside each
registered version and compared with every batch run's readings."""

from __future__ import annotations

import pandas as pd

from solutions.sensor import schema as S


def monitored_features(grid: pd.DataFrame) -> pd.DataFrame:
    """The sensor value and operating-setting columns of an aligned grid (gap flags, labels
    and ids left out)."""
    values, ops, _ = S.feature_columns(list(grid.columns))
    return grid[values + ops].reset_index(drop=True)


def asset_rows(grid: pd.DataFrame, assets: list[str]) -> pd.DataFrame:
    """The grid rows of ``assets``."""
    return grid.loc[grid[S.ASSET].astype(str).isin({str(a) for a in assets})]
