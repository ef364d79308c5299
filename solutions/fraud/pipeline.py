"""Fraud pipeline steps as plain functions: features, baseline, sequence model set-up.

No Prefect here: the flows wrap these steps in tasks and join them with the generic
train / evaluate / register tasks.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from infra.determinism import seeded
from infra.tables import ColumnSpec, TableSchema, describe_columns
from solutions.fraud import schema as S
from solutions.fraud.config import SequenceModelConfig
from solutions.fraud.features import WindowFeatureBaseline, WindowFeatures
from solutions.fraud.model import FraudDataModule, FraudSequenceModel, predict_scores
from solutions.fraud.sequences import FraudPreprocessor

log = logging.getLogger(__name__)

#: Bump when feature code changes, so stored feature tables are rebuilt.
FEATURES_VERSION = "1"
PERIOD = "period"
#: Largest transaction amount accepted (amounts are >= 0), by default: a bound far above any real
#: payment, low enough that an account's running sum of amounts cannot overflow to infinity (a sum
#: of 1e308-sized amounts became ``inf``, was stored as null and broke every later score of the
#: account). Serving takes its own from ``INDUSFLOW_SERVE_FRAUD_MAX_AMOUNT``.
MAX_AMOUNT = 1e9
#: Largest |age| and |account_age_days| accepted: finite and far beyond any real value (negative
#: ones are clipped to 0 by the features, as before).
MAX_STATIC = 1e6

def transaction_schema(for_scoring: bool = False, max_amount: float = MAX_AMOUNT) -> TableSchema:
    """The validation schema of a transactions table (label optional when scoring).

    Every number is finite and bounded: ``0 <= amount <= max_amount``, ``|age|`` and
    ``|account_age_days|`` at most :data:`MAX_STATIC`.
    """
    columns = S.transaction_columns(for_scoring)
    bounds = {S.AMOUNT: max_amount, S.AGE: MAX_STATIC, S.ACCOUNT_AGE_DAYS: MAX_STATIC}
    return TableSchema(
        name="fraud-transactions-score" if for_scoring else "fraud-transactions",
        columns=tuple(
            ColumnSpec(name=n, kind=k, required=r, nullable=nl, min_value=0.0 if n == S.AMOUNT else None,
                       max_abs=bounds.get(n))
            for n, k, r, nl in columns
        ),
        time_column=S.TIMESTAMP,
        label_column=None if for_scoring else S.LABEL,
        min_rows=2,
    )


def accounts_schema() -> TableSchema:
    """The validation schema of the optional accounts table (static attributes)."""
    return TableSchema(
        name="fraud-accounts",
        columns=(
            ColumnSpec(name=S.ACCOUNT_ID, kind="id"),
            ColumnSpec(name=S.AGE, kind="float", required=False, nullable=True),
            ColumnSpec(name=S.OCCUPATION, kind="category", required=False, nullable=True),
            ColumnSpec(name=S.ACCOUNT_AGE_DAYS, kind="float", required=False, nullable=True),
        ),
    )


def merge_accounts(transactions: pd.DataFrame, accounts: pd.DataFrame) -> pd.DataFrame:
    """Join static per-account attributes (age, occupation, account age) onto transactions."""
    if S.ACCOUNT_ID not in accounts:
        raise ValueError(f"the accounts table has no {S.ACCOUNT_ID!r} column: {describe_columns(accounts.columns)}")
    dupes = accounts[S.ACCOUNT_ID].duplicated()
    if dupes.any():
        first = accounts.loc[dupes, S.ACCOUNT_ID].iloc[0]
        raise ValueError(f"the accounts table lists account {first!r} more than once")
    static = [c for c in (S.AGE, S.OCCUPATION, S.ACCOUNT_AGE_DAYS) if c in accounts]
    keep = transactions.drop(columns=[c for c in static if c in transactions])
    accounts = accounts[[S.ACCOUNT_ID, *static]].astype({S.ACCOUNT_ID: "string"})
    return keep.merge(accounts, on=S.ACCOUNT_ID, how="left")


def window_transformer(delay_days: float, windows_days: Sequence[int] | None = None) -> WindowFeatures:
    """The window-feature transformer used by the baseline and as model context (``windows_days``
    None: :data:`~solutions.fraud.feature_defs.WINDOWS_DAYS`; a trained model's: ``windows_of``)."""
    return WindowFeatures(delay_days=round(delay_days), windows_days=windows_days)


def build_features(df: pd.DataFrame, periods: np.ndarray, delay_days: float,
                   windows_days: Sequence[int] | None = None) -> pd.DataFrame:
    """Window features of every row plus its period (history/train/val/delay/test)."""
    wf = window_transformer(delay_days, windows_days).fit(df)
    feats = wf.transform(df)
    feats[PERIOD] = periods
    return feats.reset_index(drop=True)


def context_feature_names(features: pd.DataFrame) -> tuple[str, ...]:
    """Numeric window features fed to the sequence model (no one-hots, no statics)."""
    skip = {PERIOD, S.AGE, S.ACCOUNT_AGE_DAYS}
    return tuple(c for c in features.columns if "=" not in c and c not in skip)


def fit_baseline(
    features: pd.DataFrame, labels: np.ndarray, seed: int = 0, n_threads: int | None = None
) -> WindowFeatureBaseline:
    """Fit the gradient-boosting baseline on the train and val rows."""
    rows = features[PERIOD].isin(["train", "val"]).to_numpy()
    X = features.loc[rows].drop(columns=[PERIOD])
    return WindowFeatureBaseline(random_state=seed, n_threads=n_threads).fit(X, labels[rows])


def baseline_scores(model: WindowFeatureBaseline, features: pd.DataFrame, period: str) -> np.ndarray:
    """Baseline fraud probabilities for one period's rows, in row order."""
    rows = (features[PERIOD] == period).to_numpy()
    return model.predict_proba(features.loc[rows].drop(columns=[PERIOD]))[:, 1]


@dataclass
class SequenceSetup:
    """Everything the sequence model needs for one table."""

    preprocessor: FraudPreprocessor
    datamodule: FraudDataModule
    row_index: dict[str, np.ndarray]  # period -> input-row positions, in the loaders' order


def sequence_setup(
    df: pd.DataFrame,
    features: pd.DataFrame,
    cfg: SequenceModelConfig,
    *,
    preprocessor: FraudPreprocessor | None = None,
    periods: tuple[str, ...] = ("train", "val", "test"),
) -> SequenceSetup:
    """Fit (or reuse) the preprocessor and build a data module over ``periods``.

    Targets are sorted by (account, time) inside each period; ``row_index`` maps them
    back to the input rows so scores line up with labels and ids.
    """
    period = features[PERIOD].to_numpy()
    if preprocessor is None:
        names = context_feature_names(features) if cfg.use_window_features else ()
        preprocessor = FraudPreprocessor(names).fit(df, period == "train", features)
    arrays = preprocessor.transform(df, features)
    sorted_period = period[arrays.order]
    splits = {p: np.flatnonzero(sorted_period == p) for p in periods}
    splits = {p: idx for p, idx in splits.items() if len(idx)}
    row_index = {p: arrays.order[idx] for p, idx in splits.items()}
    dm = FraudDataModule(arrays, splits, cfg.seq_len, cfg.batch_size, cfg.negative_rate, cfg.seed)
    return SequenceSetup(preprocessor, dm, row_index)


def build_model(
    preprocessor: FraudPreprocessor, cfg: SequenceModelConfig, pos_weight: float
) -> FraudSequenceModel:
    """A fresh sequence model sized for ``preprocessor``'s features; its initial weights
    follow ``cfg.seed`` alone."""
    with seeded(cfg.seed):
        return _new_model(preprocessor, cfg, pos_weight)


def _new_model(preprocessor: FraudPreprocessor, cfg: SequenceModelConfig, pos_weight: float) -> FraudSequenceModel:
    return FraudSequenceModel(
        n_step_numeric=preprocessor.n_step_numeric(),
        cardinalities=preprocessor.cardinalities(),
        n_context_numeric=preprocessor.n_context_numeric(),
        hidden=cfg.hidden,
        mlp_hidden=cfg.mlp_hidden,
        dropout=cfg.dropout,
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        loss=cfg.loss,
        focal_gamma=cfg.focal_gamma,
        pos_weight=pos_weight,
    )


def pos_weight_for(labels: np.ndarray, negative_rate: float = 1.0) -> float:
    """sqrt(negatives seen / positives): a softened class weight for BCE."""
    pos = float(np.nansum(labels))
    neg = (float(np.sum(~np.isnan(labels))) - pos) * negative_rate
    return float(np.sqrt(neg / pos)) if pos > 0 else 1.0


def model_params(model: FraudSequenceModel, preprocessor: FraudPreprocessor, cfg: SequenceModelConfig, **extra: Any) -> dict[str, Any]:
    """JSON parameters that rebuild the model and its preprocessing from the registry."""
    return {
        "architecture": "FraudSequenceModel",
        "hparams": dict(model.hparams),
        "preprocessor": preprocessor.to_dict(),
        "seq_len": cfg.seq_len,
        "config": cfg.model_dump(),
        **extra,
    }


def model_from_params(params: dict[str, Any], state_dict: dict[str, Any]) -> tuple[FraudSequenceModel, FraudPreprocessor, SequenceModelConfig]:
    """Rebuild a registered model (weights already read safely by the registry)."""
    if params.get("architecture") != "FraudSequenceModel":
        raise ValueError(f"not a fraud sequence model: {params.get('architecture')!r}")
    model = FraudSequenceModel(**params["hparams"])
    model.load_state_dict(state_dict)
    model.eval()
    return model, FraudPreprocessor.from_dict(params["preprocessor"]), SequenceModelConfig(**params["config"])


def preprocessing_from_params(params: dict[str, Any]) -> tuple[FraudPreprocessor, SequenceModelConfig]:
    """The preprocessor and sequence settings a registered model (or a variant of it) was trained with."""
    return FraudPreprocessor.from_dict(params["preprocessor"]), SequenceModelConfig(**params["config"])


def score_period(model: FraudSequenceModel, setup: SequenceSetup, period: str) -> np.ndarray:
    """Sequence-model probabilities for one period, in the input-row order of that period."""
    scores = predict_scores(model, setup.datamodule, period)
    rows = setup.row_index[period]
    return scores[np.argsort(rows, kind="stable")].astype("float64")
