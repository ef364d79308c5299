"""Per-regime normalisation and fixed-length windows over a grid table."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from solutions.sensor import schema as S
from solutions.sensor.schema import BadReadingReport

log = logging.getLogger(__name__)

MAX_REGIMES = 6
#: silhouette a KMeans split must reach to count as separate operating regimes
MIN_SILHOUETTE = 0.6
#: a feature whose most common value fills this share of a regime's steps is taken as constant
#: (C-MAPSS FD001 sensor 6: two values, one of them on 98% of the cycles)
MAX_MODE_SHARE = 0.95
#: name of the optional age channel (steps since the asset's first reading, z-scored)
AGE_CHANNEL = "age"


def _mode_share(part: np.ndarray) -> np.ndarray:
    """Share of each column's known values taken by its most common value (0 for an empty column)."""
    shares = np.zeros(part.shape[1])
    for j in range(part.shape[1]):
        col = part[:, j]
        col = col[~np.isnan(col)]
        if len(col):
            shares[j] = np.unique(col, return_counts=True)[1].max() / len(col)
    return shares


class RegimeNormalizer:
    """Z-score every sensor feature within its operating regime (scikit-learn contract).

    Regimes are KMeans clusters of the standardised operating settings (C-MAPSS FD002 and
    FD004 fly six conditions); with no settings, or ``n_regimes=1``, it is one global
    z-score. Features without variation inside regimes (constant, or one value on at least
    ``MAX_MODE_SHARE`` of each regime's steps) are dropped (``channels_``); gap
    flags pass through unchanged. Remaining NaN (gaps longer than the forward-fill
    limit) become 0, the regime mean.

    With ``age``, one more channel (``AGE_CHANNEL``, last) carries the asset's age: its grid
    step (steps since its first reading, C-MAPSS: cycle - 1), z-scored with the mean and
    standard deviation of the steps of the assets it was fitted on (the training assets).

    Args:
        n_regimes: number of regimes, or ``"auto"`` (1-6 by silhouette).
        op_prefix: operating-setting columns start with this.
        seed: KMeans seed.
        age: add the age channel.
    """

    def __init__(self, n_regimes: int | str = "auto", op_prefix: str = "op_", seed: int = 0, age: bool = False) -> None:
        self.n_regimes = n_regimes
        self.op_prefix = op_prefix
        self.seed = seed
        self.age = age

    def fit(self, grid: pd.DataFrame) -> RegimeNormalizer:
        values, ops, gaps = S.feature_columns(list(grid.columns), self.op_prefix)
        self.ops_ = ops
        ops_x = grid[ops].to_numpy(dtype="float64") if ops else np.zeros((len(grid), 0))
        known = ~np.isnan(ops_x).any(axis=1)  # steps with a setting missing past the fill limit
        if ops and not known.any():
            raise ValueError(f"the operating settings {ops} are missing at every step")
        self.op_mean_ = ops_x[known].mean(axis=0) if ops else np.zeros(0)
        sd = ops_x[known].std(axis=0) if ops else np.zeros(0)
        self.op_std_ = np.where(sd > 1e-9, sd, 1.0) if ops else np.zeros(0)
        self.centers_ = self._fit_regimes((ops_x[known] - self.op_mean_) / self.op_std_ if ops else ops_x)
        regime = self._assign(grid)
        x = grid[values].to_numpy(dtype="float64")
        k = len(self.centers_)
        self.mean_ = np.zeros((k, len(values)))
        self.std_ = np.ones((k, len(values)))
        within = np.zeros(len(values))
        mode_share = np.ones(len(values))
        for r in range(k):
            part = x[regime == r]
            if len(part):
                self.mean_[r] = np.nan_to_num(np.nanmean(part, axis=0))
                sd = np.nan_to_num(np.nanstd(part, axis=0))
                within = np.maximum(within, sd / (np.abs(self.mean_[r]) + 1.0))
                mode_share = np.minimum(mode_share, _mode_share(part))
                self.std_[r] = np.where(sd > 1e-9, sd, 1.0)
        keep = (within > 1e-5) & (mode_share < MAX_MODE_SHARE)
        self.values_ = [c for c, kk in zip(values, keep) if kk]
        self.mean_, self.std_ = self.mean_[:, keep], self.std_[:, keep]
        self.gaps_ = [g for g in gaps if grid[g].to_numpy().any()]
        steps = grid[S.STEP].to_numpy(dtype="float64") if self.age else np.zeros(0)
        self.age_mean_ = float(steps.mean()) if len(steps) else 0.0
        self.age_std_ = float(steps.std()) if len(steps) and steps.std() > 1e-9 else 1.0
        dropped = [c for c, kk in zip(values, keep) if not kk]
        if dropped:
            log.info("dropped %d feature(s) without variation: %s", len(dropped), dropped)
        log.info("normalising %d features in %d regime(s)", len(self.values_), k)
        return self

    @property
    def channels_(self) -> list[str]:
        """Model input channels, in order."""
        return [*self.values_, *self.gaps_, *([AGE_CHANNEL] if self.age else [])]

    def _fit_regimes(self, z: np.ndarray) -> np.ndarray:
        if z.shape[1] == 0 or self.n_regimes == 1:
            return np.zeros((1, z.shape[1]))
        from threadpoolctl import threadpool_limits

        # at most 5000 points: one OpenMP thread is enough, and more spin-wait on a busy machine
        with threadpool_limits(1):
            return self._cluster(z)

    def _cluster(self, z: np.ndarray) -> np.ndarray:
        from sklearn.cluster import KMeans
        from sklearn.metrics import silhouette_score

        rng = np.random.default_rng(self.seed)
        sample = z[rng.choice(len(z), size=min(len(z), 5000), replace=False)]
        if self.n_regimes != "auto":
            km = KMeans(n_clusters=int(self.n_regimes), n_init=4, random_state=self.seed).fit(sample)
            return km.cluster_centers_
        best, best_score = np.zeros((1, z.shape[1])), MIN_SILHOUETTE
        for k in range(2, MAX_REGIMES + 1):
            if len(np.unique(sample.round(6), axis=0)) < k:
                break
            km = KMeans(n_clusters=k, n_init=4, random_state=self.seed).fit(sample)
            score = silhouette_score(sample[:2000], km.labels_[:2000])
            if score > best_score + 0.02:
                best, best_score = km.cluster_centers_, score
        return best

    def regimes(self, grid: pd.DataFrame) -> np.ndarray:
        """The operating regime (0..k-1) of each row of ``grid``."""
        if not hasattr(self, "centers_"):
            raise RuntimeError("RegimeNormalizer is not fitted: call fit() first")
        return self._assign(grid)

    def _assign(self, grid: pd.DataFrame) -> np.ndarray:
        if len(self.centers_) == 1:
            return np.zeros(len(grid), dtype=np.int64)
        z = (grid[self.ops_].to_numpy(dtype="float64") - self.op_mean_) / self.op_std_
        z = np.nan_to_num(z)
        d = ((z[:, None, :] - self.centers_[None, :, :]) ** 2).sum(axis=2)
        return d.argmin(axis=1)

    def transform(self, grid: pd.DataFrame) -> np.ndarray:
        """Normalised channels as a float32 array (rows of ``grid`` x ``channels_``)."""
        if not hasattr(self, "centers_"):
            raise RuntimeError("RegimeNormalizer is not fitted: call fit() first")
        missing = [c for c in [*self.ops_, *self.values_] if c not in grid.columns]
        if missing:
            from infra.errors import DataValidationError

            raise DataValidationError(
                f"the data lacks sensor feature(s) {missing} that the model was trained on",
                column=missing[0],
            )
        regime = self._assign(grid)
        x = (grid[self.values_].to_numpy(dtype="float64") - self.mean_[regime]) / self.std_[regime]
        x = np.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)
        x = np.clip(x, -10, 10)
        gaps = np.column_stack([grid[g].to_numpy(dtype="float64") if g in grid else np.zeros(len(grid)) for g in self.gaps_]) if self.gaps_ else np.zeros((len(grid), 0))
        parts = [x, gaps]
        if self.age:
            if S.STEP not in grid.columns:
                from infra.errors import DataValidationError

                raise DataValidationError(f"the model's age channel needs the {S.STEP!r} column", column=S.STEP)
            age = (grid[S.STEP].to_numpy(dtype="float64") - self.age_mean_) / self.age_std_
            parts.append(np.clip(age, -10, 10)[:, None])
        return np.hstack(parts).astype("float32")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready state (stored with the model in the registry)."""
        return {
            "n_regimes": self.n_regimes, "op_prefix": self.op_prefix, "seed": self.seed, "ops": self.ops_,
            "op_mean": self.op_mean_.tolist(), "op_std": self.op_std_.tolist(), "centers": self.centers_.tolist(),
            "values": self.values_, "gaps": self.gaps_, "mean": self.mean_.tolist(), "std": self.std_.tolist(),
            "age": self.age, "age_mean": self.age_mean_, "age_std": self.age_std_,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RegimeNormalizer:
        self = cls(d["n_regimes"], d["op_prefix"], d["seed"], bool(d.get("age", False)))
        self.age_mean_, self.age_std_ = float(d.get("age_mean", 0.0)), float(d.get("age_std", 1.0))
        self.ops_, self.values_, self.gaps_ = list(d["ops"]), list(d["values"]), list(d["gaps"])
        self.op_mean_, self.op_std_ = np.asarray(d["op_mean"]), np.asarray(d["op_std"])
        self.centers_ = np.asarray(d["centers"]).reshape(len(d["centers"]), len(self.ops_))
        self.mean_ = np.asarray(d["mean"]).reshape(len(d["mean"]), len(self.values_))
        self.std_ = np.asarray(d["std"]).reshape(len(d["std"]), len(self.values_))
        return self


@dataclass
class WindowSet:
    """Windows of normalised channels and their labels.

    Attributes:
        x: float32 (n, channels, length).
        asset: asset id of each window.
        end_step: grid step of each window's last row.
        rul: capped RUL at the window's end (NaN when unknown).
        rul_raw: uncapped RUL at the window's end.
        fail: 1.0 if the failure is within the horizon, 0.0 if not, NaN when unknown.
    """

    x: np.ndarray
    asset: np.ndarray
    end_step: np.ndarray
    rul: np.ndarray
    rul_raw: np.ndarray
    fail: np.ndarray

    def __len__(self) -> int:
        return len(self.asset)

    def subset(self, mask: np.ndarray) -> WindowSet:
        return WindowSet(self.x[mask], self.asset[mask], self.end_step[mask], self.rul[mask], self.rul_raw[mask], self.fail[mask])

    def labelled(self) -> WindowSet:
        return self.subset(~np.isnan(self.rul))


def make_windows(
    grid: pd.DataFrame,
    normalizer: RegimeNormalizer,
    *,
    length: int,
    stride: int = 1,
    rul_cap: float = 125.0,
    horizon: int = 30,
    last_only: bool = False,
    pad: bool = False,
    pad_from: int | None = None,
    report: BadReadingReport | None = None,
) -> WindowSet:
    """Slide windows over each asset's grid rows (sorted by step); the last window of an
    asset always ends at its last row.

    Assets shorter than ``length`` are skipped and listed in ``report``, unless ``pad``
    (left-pad with the first row, as the C-MAPSS test protocol needs); padded ones are
    listed too. ``pad_from`` (training) also slides windows that end before the
    ``length``-th row, from the ``pad_from``-th row on, left-padded the same way, so a model
    meets during training the padded windows that short assets give when scored.
    """
    grid = grid.sort_values([S.ASSET, S.STEP], kind="stable").reset_index(drop=True)
    x_all = normalizer.transform(grid)
    assets = grid[S.ASSET].to_numpy()
    starts = np.flatnonzero(np.r_[True, assets[1:] != assets[:-1]])
    ends = np.r_[starts[1:], len(grid)]
    rul_all = grid[S.RUL].to_numpy(dtype="float64")
    steps = grid[S.STEP].to_numpy()
    xs, a_out, e_out, r_out = [], [], [], []
    for s, e in zip(starts, ends):
        n = e - s
        block = x_all[s:e]
        first = length if pad_from is None else min(pad_from, length)  # rows the first window needs
        if n < first and not pad:
            if report is not None:
                report.assets_without_window.append(str(assets[s]))
            continue
        lead = length - min(n, first)  # padding rows
        if lead:
            block = np.vstack([np.repeat(block[:1], lead, axis=0), block])
            if report is not None and n < length:
                report.padded_assets.append(str(assets[s]))
        m = len(block)
        if last_only:
            idx = np.array([m - 1])
        else:
            idx = np.arange(m - 1, length - 2, -stride)[::-1]
        view = np.lib.stride_tricks.sliding_window_view(block, length, axis=0)  # (m-length+1, C, length)
        xs.append(view[idx - length + 1])
        row = np.clip(idx - (m - n), 0, n - 1) + s
        a_out.append(assets[row])
        e_out.append(steps[row])
        r_out.append(rul_all[row])
    if not xs:
        c = len(normalizer.channels_)
        return WindowSet(np.zeros((0, c, length), np.float32), np.zeros(0, object), np.zeros(0, np.int64), np.zeros(0), np.zeros(0), np.zeros(0))
    rul_raw = np.concatenate(r_out)
    fail = np.where(np.isnan(rul_raw), np.nan, (rul_raw <= horizon).astype("float64"))
    return WindowSet(
        x=np.ascontiguousarray(np.concatenate(xs), dtype=np.float32),
        asset=np.concatenate(a_out),
        end_step=np.concatenate(e_out),
        rul=np.minimum(rul_raw, rul_cap),
        rul_raw=rul_raw,
        fail=fail,
    )
