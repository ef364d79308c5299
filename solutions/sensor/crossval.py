"""Engine-split cross-validation of the sensor RUL models (plain functions).

Folds hold out whole assets (C-MAPSS engines), never windows: each asset is tested once,
its windows never reach training. Each fold's held-out assets are cut before failure as a
C-MAPSS test file is (several random cuts per asset, scored on the last window of each
cut), validation assets are drawn from the fold's training assets, and the normaliser is
fitted on the fold's training assets only. Training itself is the caller's (the benches
pass the generic train task in), so this module stays below ``tasks``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from infra.errors import DataValidationError
from solutions.sensor import schema as S
from solutions.sensor.config import SensorConfig, WindowConfig
from solutions.sensor.features import RegimeNormalizer
from solutions.sensor.metrics import phm08_score
from solutions.sensor.pipeline import SupervisedData, fit_normalizer, supervised_windows

#: model names of a cross-validation table, in display order
MODELS = ("cnn_pretrained", "cnn_scratch", "gbm", "ensemble")


def engine_folds(assets: Iterable[str], k: int, seed: int = 0) -> list[list[str]]:
    """``k`` disjoint groups of held-out assets that together hold every asset once.

    Raises:
        DataValidationError: fewer than ``3 * k`` assets (each fold needs training and
            validation assets besides its held-out ones).
    """
    names = np.sort(np.unique(np.asarray(list(assets), dtype=str)))
    if k < 2:
        raise ValueError(f"cross-validation needs at least 2 folds, got {k}")
    if len(names) < 3 * k:
        raise DataValidationError(f"only {len(names)} assets: too few for {k} folds (at least {3 * k} needed)")
    perm = np.random.default_rng(seed).permutation(names)
    return [sorted(part.tolist()) for part in np.array_split(perm, k)]


def fold_splits(assets: Iterable[str], held_out: Sequence[str], val_fraction: float, seed: int = 0,
                block: int = 0) -> dict[str, list[str]]:
    """Train / validation / test assets of one fold: the held-out assets are the test split,
    validation assets are drawn (by ``seed``) from the others; ``block``: which block of
    ``val_fraction`` of the drawn assets validates (the others train)."""
    test = set(held_out)
    rest = np.random.default_rng(seed + 15485863).permutation(sorted(set(map(str, assets)) - test))
    n_val = max(1, round(val_fraction * len(rest)))
    val = rest[block * n_val : (block + 1) * n_val]
    if len(rest) - n_val < 1:
        raise DataValidationError(f"only {len(rest)} assets outside the held-out fold: none left to train on")
    if len(val) < n_val:
        raise ValueError(f"validation block {block} of {n_val} assets is past the {len(rest)} assets left")
    return {"train": sorted(rest[~np.isin(rest, val)].tolist()), "val": sorted(val.tolist()), "test": sorted(test)}


def cross_fit_splits(assets: Iterable[str], held_out: Sequence[str], val_fraction: float, k: int,
                     seed: int = 0) -> list[dict[str, list[str]]]:
    """``k`` train / validation / test splits of one fold whose validation assets are disjoint:
    split ``i`` validates on the ``i``-th block of ``val_fraction`` of the non-held-out assets and
    trains on the others (:func:`fold_splits`' ``block``), so ``k`` models validated each on its own
    block score ``k`` times as many assets out of fold as one does. Split 0 is :func:`fold_splits`' split."""
    rest = len(set(map(str, assets)) - set(held_out))
    n_val = max(1, round(val_fraction * rest))
    if k < 1 or rest - k * n_val < 1:
        raise DataValidationError(f"{rest} assets outside the held-out fold cannot give {k} disjoint "
                                  f"validation blocks of {n_val} and still leave assets to train on")
    return [fold_splits(assets, held_out, val_fraction, seed, block=i) for i in range(k)]


@dataclass
class FoldData:
    """One fold: its splits, the normaliser fitted on its training assets and its windows."""

    splits: dict[str, list[str]]
    normalizer: RegimeNormalizer
    data: SupervisedData


def fold_data(grid: pd.DataFrame, splits: dict[str, list[str]], config: SensorConfig, wcfg: WindowConfig,
              labelled: Sequence[str] | None = None, seed: int = 0) -> FoldData:
    """The normaliser (fitted on the fold's train and validation assets, never its held-out
    ones) and the windows of one fold; ``labelled`` (default: every training asset) are the
    assets whose windows train the supervised models."""
    from solutions.sensor.schema import BadReadingReport

    norm = fit_normalizer(grid, splits["train"] + splits["val"], wcfg, config.align.op_prefix, seed)
    labelled = list(labelled) if labelled is not None else splits["train"]
    data = supervised_windows(grid, splits, labelled, norm, wcfg, BadReadingReport(), seed)
    return FoldData(splits, norm, data)


def training_assets(grid: pd.DataFrame) -> list[str]:
    """The run-to-failure assets of a grid (C-MAPSS: the ``train`` units, never test units)."""
    first = grid.drop_duplicates(S.ASSET)
    keep = first[S.FAILED].to_numpy(dtype=bool) & (first[S.SET] != "test").to_numpy()
    return sorted(first.loc[keep, S.ASSET].astype(str).tolist())


def rul_scores(data: SupervisedData, pred_last: np.ndarray, pred_all: np.ndarray | None = None) -> dict[str, float]:
    """RMSE and PHM08 score on the last window of each cut held-out asset (the C-MAPSS test
    protocol), the PHM08 score per cut unit, and the RMSE over every window of the held-out
    assets' full trajectories when ``pred_all`` is given."""
    truth = data.test_last.rul
    out = {
        "rmse": float(np.sqrt(np.mean((pred_last - truth) ** 2))),
        "phm08": phm08_score(truth, pred_last),
        "phm08_per_unit": phm08_score(truth, pred_last) / max(1, len(truth)),
        "units": float(len(truth)),
    }
    if pred_all is not None:
        out["rmse_all_windows"] = float(np.sqrt(np.mean((pred_all - data.test_all.rul) ** 2)))
    return out


def ensemble(*predictions: np.ndarray) -> np.ndarray:
    """The mean of several models' RUL predictions (the CNN + GBM ensemble)."""
    return np.mean(np.stack([np.asarray(p, dtype="float64") for p in predictions]), axis=0)


def finite(value: float, digits: int = 3) -> float | None:
    """``value`` rounded, or None when it is not finite (a spread over one run): valid JSON."""
    return round(float(value), digits) if np.isfinite(value) else None


def summarize(rows: Sequence[Mapping[str, object]], metrics: Sequence[str] = ("rmse", "phm08"),
              by: Sequence[str] = ("model",)) -> pd.DataFrame:
    """Mean, standard deviation, min, max and count of ``metrics`` over the rows of each group
    (``by``), e.g. over the folds and seeds of each model."""
    frame = pd.DataFrame(list(rows))
    if frame.empty:
        raise ValueError("no results to summarise")
    stats = frame.groupby(list(by), sort=False)[list(metrics)].agg(["mean", "std", "min", "max", "count"])
    stats.columns = [f"{m}_{s}" for m, s in stats.columns]
    return stats.reset_index()


def render_table(summary: pd.DataFrame, metrics: Sequence[str] = ("rmse", "phm08"),
                 by: Sequence[str] = ("model",)) -> str:
    """A markdown table: one row per group, ``mean ± std (min–max)`` per metric and the run count."""
    head = "| " + " | ".join([*by, *metrics, "runs"]) + " |"
    rule = "|" + "---|" * (len(by) + len(metrics) + 1)
    lines = [head, rule]
    for _, row in summary.iterrows():
        cells = [str(row[b]) for b in by]
        for m in metrics:
            sd = row[f"{m}_std"]
            spread = f" ± {sd:.2f}" if np.isfinite(sd) else ""
            cells.append(f"{row[f'{m}_mean']:.2f}{spread} ({row[f'{m}_min']:.2f}–{row[f'{m}_max']:.2f})")
        cells.append(str(int(row[f"{metrics[0]}_count"])))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
