"""Turn a transaction table into per-transaction sequences for the sequence model.

Each transaction is scored with the account's preceding ``seq_len - 1`` transactions
and itself (left-padded). Every step feature is computed from the past only. The
preprocessing state (vocabularies, scaling) is plain JSON so that it is stored with the
model in the registry and re-applied at scoring time.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch.utils.data import Dataset

from solutions.fraud import feature_defs as FD
from solutions.fraud import schema as S
from solutions.fraud.feature_defs import STEP_NUMERIC, static_features

STEP_CATEGORICAL = (S.CHANNEL, S.CATEGORY)
STATIC_NUMERIC = (S.AGE, S.ACCOUNT_AGE_DAYS)
STATIC_CATEGORICAL = (S.OCCUPATION,)


def step_features(df: pd.DataFrame) -> pd.DataFrame:
    """Per-transaction step features from the account's past (:func:`feature_defs.step_features`,
    the definition online scoring shares: the whole table is one chunk with no history); ``df``
    sorted by account, time."""
    stamps = pd.DatetimeIndex(df[S.TIMESTAMP])
    absolute = stamps.tz_convert("UTC").tz_localize(None) if stamps.tz is not None else stamps
    key = pd.factorize(df[S.ACCOUNT_ID].to_numpy(), use_na_sentinel=False)[0]
    amount = df[S.AMOUNT].to_numpy(dtype="float64")
    terminal = pd.factorize(df[S.TERMINAL_ID].to_numpy())[0] if S.TERMINAL_ID in df else None
    steps = FD.step_features(FD.KeyedRows(key, absolute.as_unit("ns").asi8, (amount,)),
                             (stamps.hour + stamps.minute / 60.0).to_numpy(), stamps.dayofweek.to_numpy(), terminal)
    return pd.DataFrame(steps, index=df.index, columns=list(STEP_NUMERIC))


def _vocab(values: pd.Series) -> list[str]:
    return sorted(str(v) for v in values.dropna().unique())


@dataclass
class FraudArrays:
    """Model-ready arrays for a table sorted by (account, time)."""

    step_num: torch.Tensor  # [n, Fs]
    step_cat: torch.Tensor  # [n, 2] (0 = unknown)
    account_start: torch.Tensor  # [n] index of the account's first row
    ctx_num: torch.Tensor  # [n, Fc]
    ctx_cat: torch.Tensor  # [n, 1]
    label: torch.Tensor  # [n] float (NaN where unknown)
    order: np.ndarray  # [n] positions of the sorted rows in the input frame


class FraudPreprocessor:
    """Vocabularies and scaling learned on the training rows; JSON state.

    Args:
        window_feature_names: names of the window-feature columns used as context
            (empty to use none).
    """

    def __init__(self, window_feature_names: tuple[str, ...] = ()) -> None:
        self.window_feature_names = tuple(window_feature_names)

    # sklearn-style: learned state ends in "_"
    def fit(
        self, df: pd.DataFrame, train_mask: np.ndarray, window: pd.DataFrame | None = None
    ) -> FraudPreprocessor:
        """Learn vocabularies and scaling from the rows where ``train_mask`` is true."""
        blocks = self.training_blocks(df, train_mask, window)
        self.vocab_ = {
            col: _vocab(df.loc[np.asarray(train_mask), col]) if col in df else []
            for col in STEP_CATEGORICAL + STATIC_CATEGORICAL
        }
        self.step_mean_, self.step_std_ = _stats(blocks["step"])
        self.static_mean_, self.static_std_ = _stats(blocks["static"])
        if self.window_feature_names:
            self.window_mean_, self.window_std_ = _stats(blocks["window"])
        else:
            self.window_mean_, self.window_std_ = [], []
        return self

    def training_blocks(
        self, df: pd.DataFrame, train_mask: np.ndarray, window: pd.DataFrame | None = None
    ) -> dict[str, np.ndarray]:
        """The unscaled ``step``, ``static`` and ``window`` feature matrices of the rows where
        ``train_mask`` is true: what :meth:`fit` learns its scaling from (federated training
        merges their moments across banks without sharing the rows)."""
        sorted_df, order = self._sorted(df)
        mask = np.asarray(train_mask)[order]
        blocks = {"step": step_features(sorted_df).to_numpy()[mask], "static": self._static(sorted_df)[mask]}
        if self.window_feature_names:
            if window is None:
                raise ValueError("window features were named but not given")
            win = window[list(self.window_feature_names)].to_numpy(dtype="float64")[order]
            blocks["window"] = win[mask]
        else:
            blocks["window"] = np.zeros((int(mask.sum()), 0))
        return blocks

    @staticmethod
    def _sorted(df: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
        keys = df[[S.ACCOUNT_ID, S.TIMESTAMP]].reset_index(drop=True)
        order = keys.sort_values([S.ACCOUNT_ID, S.TIMESTAMP], kind="stable").index.to_numpy()
        return df.iloc[order].reset_index(drop=True), order

    @staticmethod
    def _static(df: pd.DataFrame) -> np.ndarray:
        def column(col: str) -> np.ndarray:
            if col not in df:
                return np.full(len(df), np.nan)
            return pd.to_numeric(df[col], errors="coerce").to_numpy(dtype="float64", na_value=np.nan)

        return static_features(*(column(col) for col in STATIC_NUMERIC))

    def transform(self, df: pd.DataFrame, window: pd.DataFrame | None = None) -> FraudArrays:
        """Arrays for ``df`` (any rows; unseen categories map to 0 = unknown)."""
        if not hasattr(self, "vocab_"):
            raise RuntimeError("FraudPreprocessor is not fitted")
        sorted_df, order = self._sorted(df)
        steps = scale_features(step_features(sorted_df).to_numpy(), self.step_mean_, self.step_std_)
        cats = np.column_stack(
            [self._encode(sorted_df, col) for col in STEP_CATEGORICAL]
        )
        account = sorted_df[S.ACCOUNT_ID].to_numpy()
        change = np.r_[True, account[1:] != account[:-1]]
        starts = np.maximum.accumulate(np.where(change, np.arange(len(account)), 0))
        ctx = [scale_features(self._static(sorted_df), self.static_mean_, self.static_std_)]
        if self.window_feature_names:
            if window is None:
                raise ValueError("this preprocessor needs window features")
            win = window[list(self.window_feature_names)].to_numpy(dtype="float64")[order]
            ctx.append(scale_features(win, self.window_mean_, self.window_std_))
        labels = (
            pd.to_numeric(sorted_df[S.LABEL], errors="coerce").to_numpy(dtype="float32")
            if S.LABEL in sorted_df
            else np.full(len(sorted_df), np.nan, dtype="float32")
        )
        return FraudArrays(
            step_num=torch.from_numpy(steps.astype("float32")),
            step_cat=torch.from_numpy(cats.astype("int64")),
            account_start=torch.from_numpy(starts.astype("int64")),
            ctx_num=torch.from_numpy(np.hstack(ctx).astype("float32")),
            ctx_cat=torch.from_numpy(self._encode(sorted_df, S.OCCUPATION)[:, None].astype("int64")),
            label=torch.from_numpy(labels),
            order=order,
        )

    def _encode(self, df: pd.DataFrame, col: str) -> np.ndarray:
        vocab = self.vocab_.get(col, [])
        if col not in df or not vocab:
            return np.zeros(len(df), dtype="int64")
        lookup = {v: i + 1 for i, v in enumerate(vocab)}
        return df[col].astype("string").map(lookup).fillna(0).to_numpy(dtype="int64")

    # -- JSON state ------------------------------------------------------------------
    def cardinalities(self) -> dict[str, int]:
        """Embedding sizes (vocabulary + unknown) per categorical column."""
        return {col: len(v) + 1 for col, v in self.vocab_.items()}

    def n_step_numeric(self) -> int:
        return len(STEP_NUMERIC) + 1  # + the "present" flag added per step

    def n_context_numeric(self) -> int:
        return len(STATIC_NUMERIC) + len(self.window_feature_names)

    def to_dict(self) -> dict[str, Any]:
        return {
            "window_feature_names": list(self.window_feature_names),
            "vocab": self.vocab_,
            "step_mean": self.step_mean_,
            "step_std": self.step_std_,
            "static_mean": self.static_mean_,
            "static_std": self.static_std_,
            "window_mean": self.window_mean_,
            "window_std": self.window_std_,
        }

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> FraudPreprocessor:
        pre = cls(tuple(state["window_feature_names"]))
        pre.vocab_ = {k: list(v) for k, v in state["vocab"].items()}
        for key in ("step", "static", "window"):
            setattr(pre, f"{key}_mean_", list(state[f"{key}_mean"]))
            setattr(pre, f"{key}_std_", list(state[f"{key}_std"]))
        return pre


def _stats(x: np.ndarray) -> tuple[list[float], list[float]]:
    if x.size == 0:
        return [0.0] * x.shape[1], [1.0] * x.shape[1]
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns: handled below
        mean = np.nanmean(x, axis=0)
        std = np.nanstd(x, axis=0)
    mean = np.nan_to_num(mean, nan=0.0)
    std = np.where(np.isfinite(std) & (std > 1e-9), std, 1.0)
    return mean.tolist(), std.tolist()


def scale_features(x: np.ndarray, mean: list[float], std: list[float]) -> np.ndarray:
    """Standardise columns with stored means/stds; NaN and inf become 0, clipped to +-10."""
    out = (x - np.asarray(mean)) / np.asarray(std)
    return np.nan_to_num(out, nan=0.0, posinf=0.0, neginf=0.0).clip(-10, 10)


class SequenceDataset(Dataset):
    """Batches of sequences gathered on the fly from :class:`FraudArrays`.

    Args:
        arrays: the full table's arrays (history rows included).
        targets: sorted-row indices of the transactions to score / train on.
        seq_len: steps per sequence (the transaction itself is the last one).
    """

    def __init__(self, arrays: FraudArrays, targets: np.ndarray, seq_len: int) -> None:
        self.a = arrays
        self.targets = torch.as_tensor(np.asarray(targets, dtype="int64"))
        self.offsets = torch.arange(-seq_len + 1, 1)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v[0] for k, v in self.__getitems__([i]).items()}

    def __getitems__(self, items: list[int]) -> dict[str, torch.Tensor]:
        g = self.targets[torch.as_tensor(items)]
        idx = g[:, None] + self.offsets[None, :]
        present = idx >= self.a.account_start[g][:, None]
        idx = torch.where(present, idx, g[:, None])
        mask = present.unsqueeze(-1)
        step_num = torch.where(mask, self.a.step_num[idx], 0.0)
        step_num = torch.cat([step_num, present.unsqueeze(-1).float()], dim=-1)
        step_cat = torch.where(mask, self.a.step_cat[idx], 0)
        return {
            "step_num": step_num,
            "step_cat": step_cat,
            "ctx_num": self.a.ctx_num[g],
            "ctx_cat": self.a.ctx_cat[g],
            "y": self.a.label[g],
        }


def collate_batch(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Batches come pre-collated from ``__getitems__``."""
    return batch
