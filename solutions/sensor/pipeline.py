"""Sensor pipeline steps as plain functions: splits, labels, windows, evaluation, params.

No Prefect here: the flows wrap these steps in tasks and join them with the generic
train / fine-tune / evaluate / register tasks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from solutions.sensor import schema as S
from solutions.sensor.config import ModelConfig, PretrainConfig, SplitConfig, WindowConfig
from solutions.sensor.features import RegimeNormalizer, WindowSet, make_windows
from solutions.sensor.metrics import alert_lead_times, phm08_score
from solutions.sensor.model import MaskedReconstruction, SensorRULModel
from solutions.sensor.schema import BadReadingReport

log = logging.getLogger(__name__)

#: Bump when the grid/feature code changes, so stored tables are rebuilt.
GRID_VERSION = "1"


def split_assets(grid: pd.DataFrame, cfg: SplitConfig) -> dict[str, list[str]]:
    """Assets per split (train/val/test), never rows.

    C-MAPSS-style data whose ``set`` column marks test units keeps them as the test split
    and draws validation units from the rest; otherwise assets are drawn at random.
    """
    first = grid.drop_duplicates(S.ASSET)
    assets = first[S.ASSET].to_numpy().astype(str)
    rng = np.random.default_rng(cfg.seed)
    if (first[S.SET] == "test").any():
        test = assets[(first[S.SET] == "test").to_numpy()]
        rest = rng.permutation(assets[(first[S.SET] != "test").to_numpy()])
        n_val = max(1, round(cfg.val_fraction * len(rest)))
        val, train = rest[:n_val], rest[n_val:]
    else:
        perm = rng.permutation(assets)
        n_test = max(1, round(cfg.test_fraction * len(perm)))
        n_val = max(1, round(cfg.val_fraction * len(perm)))
        test, val, train = perm[:n_test], perm[n_test : n_test + n_val], perm[n_test + n_val :]
    if len(train) == 0:
        from infra.errors import DataValidationError

        raise DataValidationError(f"only {len(assets)} assets: too few to split into train, validation and test")
    return {"train": sorted(train), "val": sorted(val), "test": sorted(test)}


def labelled_assets(grid: pd.DataFrame, train: list[str], fraction: float, seed: int = 0) -> list[str]:
    """The labelled share of the training assets with an observed failure.

    Nested across fractions for one seed (the 5% set is inside the 20% set), at least one.
    """
    failed = grid.loc[grid[S.FAILED].to_numpy() & grid[S.ASSET].isin(train), S.ASSET].unique().astype(str)
    if len(failed) == 0:
        from infra.errors import DataValidationError

        raise DataValidationError(
            "no training asset has a failure event: supervised training needs failures (events table)"
        )
    order = np.random.default_rng(seed + 7919).permutation(np.sort(failed))
    k = max(1, int(np.ceil(fraction * len(order))))
    return sorted(order[:k].tolist())


def rows_of(grid: pd.DataFrame, assets: list[str]) -> pd.DataFrame:
    return grid.loc[grid[S.ASSET].isin(assets)]


def cut_test_assets(
    grid: pd.DataFrame, assets: list[str], length: int, seed: int = 0, cuts: int = 1, max_rul: int = 200
) -> pd.DataFrame:
    """Cut each failed test asset before its failure, as the C-MAPSS test files are.

    With ``cuts`` > 1 each asset is cut that many times at random points, as separate
    units ``<asset>@<k>``. Assets already cut (``set == test``, e.g. C-MAPSS) and censored
    ones are kept as they are.
    """
    rng = np.random.default_rng(seed + 104729)
    parts = []
    for a, g in rows_of(grid, assets).groupby(S.ASSET, sort=True):
        if g[S.SET].iloc[0] == "test" or not g[S.FAILED].iloc[0]:
            parts.append(g)
            continue
        hi = int(min(len(g) - length, max_rul))
        for k in range(cuts):
            cut = int(rng.integers(1, hi + 1)) if hi >= 1 else 0
            part = g.loc[g[S.RUL] >= cut].copy()
            if cuts > 1:
                part[S.ASSET] = f"{a}@{k + 1}"
            parts.append(part)
    return pd.concat(parts, ignore_index=True) if parts else grid.iloc[:0]


def fit_normalizer(grid: pd.DataFrame, assets: list[str], cfg: WindowConfig, op_prefix: str, seed: int = 0) -> RegimeNormalizer:
    return RegimeNormalizer(cfg.n_regimes, op_prefix, seed).fit(rows_of(grid, assets))


@dataclass
class SupervisedData:
    """Windows of each split for supervised training and evaluation."""

    train: WindowSet
    val: WindowSet
    test_last: WindowSet  # last window of each cut test asset (RUL protocol)
    test_all: WindowSet  # every window of each failed test asset (alerts, trajectories)
    test_cut_grid: pd.DataFrame  # the cut test assets (to re-score another model on them)


def supervised_windows(
    grid: pd.DataFrame,
    splits: dict[str, list[str]],
    labelled: list[str],
    normalizer: RegimeNormalizer,
    cfg: WindowConfig,
    report: BadReadingReport,
    seed: int = 0,
) -> SupervisedData:
    """Windows for training (labelled assets), validation and the test protocols."""
    kw = {"length": cfg.length, "rul_cap": cfg.rul_cap, "horizon": cfg.horizon}
    train = make_windows(rows_of(grid, labelled), normalizer, stride=cfg.stride, report=report, **kw).labelled()
    val = make_windows(rows_of(grid, splits["val"]), normalizer, stride=max(cfg.stride, 2), **kw).labelled()
    test_grid = rows_of(grid, splits["test"])
    cut = cut_test_assets(test_grid, splits["test"], cfg.length, seed, cuts=cfg.test_cuts)
    test_last = make_windows(cut, normalizer, last_only=True, pad=True, report=report, **kw).labelled()
    full = test_grid.loc[test_grid[S.SET] != "test"] if (test_grid[S.SET] != "test").any() else test_grid
    test_all = make_windows(full, normalizer, stride=1, **kw).labelled()
    if len(train) == 0 or len(val) == 0 or len(test_last) == 0:
        from infra.errors import DataValidationError

        raise DataValidationError(
            f"too few labelled windows (train {len(train)}, val {len(val)}, test {len(test_last)}) for windows "
            f"of {cfg.length} steps; use shorter windows or more assets"
        )
    return SupervisedData(train, val, test_last, test_all, cut)


def pretrain_windows(grid: pd.DataFrame, splits: dict[str, list[str]], normalizer: RegimeNormalizer, cfg: WindowConfig, stride: int) -> tuple[WindowSet, WindowSet]:
    """Unlabelled windows of every non-test asset (censored ones included) for pre-training."""
    train = make_windows(rows_of(grid, splits["train"]), normalizer, length=cfg.length, stride=stride)
    val = make_windows(rows_of(grid, splits["val"]), normalizer, length=cfg.length, stride=max(stride, 4))
    return train, val


def build_pretrainer(n_channels: int, mcfg: ModelConfig, pcfg: PretrainConfig) -> MaskedReconstruction:
    return MaskedReconstruction(
        n_channels, mcfg.channels, mcfg.embedding_dim, mcfg.dropout, pcfg.mask_time, pcfg.mask_sensor, pcfg.lr
    )


def build_predictor(n_channels: int, mcfg: ModelConfig, wcfg: WindowConfig, lr: float, fail: np.ndarray) -> SensorRULModel:
    pos = float(np.nansum(fail))
    neg = float(np.sum(~np.isnan(fail))) - pos
    return SensorRULModel(
        n_channels, mcfg.channels, mcfg.embedding_dim, mcfg.dropout, wcfg.rul_cap, mcfg.fail_weight, lr,
        pos_weight=float(np.sqrt(neg / pos)) if pos > 0 else 1.0,
    )


def rul_extra(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    return {"phm08": phm08_score(y_true, y_pred)}


def lead_metrics(ws: WindowSet, prob: np.ndarray, threshold: float, horizon: int) -> dict[str, float]:
    return alert_lead_times(ws.asset, ws.rul_raw, prob, threshold, horizon)


def model_params(model: SensorRULModel, normalizer: RegimeNormalizer, wcfg: WindowConfig, **extra: Any) -> dict[str, Any]:
    """JSON parameters that rebuild the model and its normalisation from the registry."""
    return {
        "architecture": type(model).__name__,
        "hparams": dict(model.hparams),
        "normalizer": normalizer.to_dict(),
        "window": wcfg.model_dump(),
        **extra,
    }


def preprocessing_from_params(params: dict[str, Any]) -> tuple[RegimeNormalizer, WindowConfig]:
    """The normaliser and window settings a registered model (or a variant of it) was trained with."""
    return RegimeNormalizer.from_dict(params["normalizer"]), WindowConfig(**params["window"])


def predictor_from_params(params: dict[str, Any], state_dict: dict[str, Any]) -> tuple[SensorRULModel, RegimeNormalizer, WindowConfig]:
    """Rebuild a registered RUL model (weights already read safely by the registry)."""
    if params.get("architecture") != "SensorRULModel":
        raise ValueError(f"not a sensor RUL model: {params.get('architecture')!r}")
    model = SensorRULModel(**params["hparams"])
    model.load_state_dict(state_dict)
    model.eval()
    return model, RegimeNormalizer.from_dict(params["normalizer"]), WindowConfig(**params["window"])
