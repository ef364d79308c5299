"""Scoring and evaluation pieces of the fraud vertical, as plain functions (no Prefect).

Period labels and checks, the baseline's and the sequence model's validation/test scores,
the champion re-scored on a run's own test period, the rows of a new fraud pattern, and
the scores table a scoring run writes. The fraud flows wrap these in thin tasks
(:mod:`flows.fraud.steps`); the online path can call them directly.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from infra.errors import DataValidationError
from infra.registry import KIND_SKLEARN, ModelRef, ModelRegistry
from solutions.fraud import feature_defs as FD
from solutions.fraud import pipeline as P
from solutions.fraud import schema as S
from solutions.fraud.config import SequenceModelConfig
from solutions.fraud.model import FraudSequenceModel
from solutions.fraud.sequences import FraudPreprocessor

log = logging.getLogger(__name__)

#: The periods a training run needs, each with both classes.
TRAINING_PERIODS: tuple[str, ...] = ("train", "val", "test")


@dataclass(frozen=True)
class ValTestScores:
    """Labels and scores of one model on the validation and the test period.

    The decision threshold is chosen on validation and applied to test.
    """

    y_val: np.ndarray
    s_val: np.ndarray
    y_test: np.ndarray
    s_test: np.ndarray


# ------------------------------------------------------------------------------------
# periods


def period_labels(data: pd.DataFrame, features: pd.DataFrame, period: str) -> np.ndarray:
    """0/1 labels of the rows of ``period``, in row order."""
    return data.loc[(features[P.PERIOD] == period).to_numpy(), S.LABEL].to_numpy(dtype="int64")


def period_counts(periods: pd.Series) -> dict[str, int]:
    """Rows per period (``{"train": n, ...}``)."""
    return {str(k): int(v) for k, v in periods.value_counts().items()}


def check_both_classes(data: pd.DataFrame, features: pd.DataFrame, split_text: str, source: str,
                       periods: tuple[str, ...] = TRAINING_PERIODS) -> None:
    """Raise :class:`DataValidationError` unless every period holds frauds and legit rows.

    Args:
        data: the validated transactions (with labels).
        features: their window features with the period column.
        split_text: the split's description, for the message.
        source: the input the rows came from, for the message.
        periods: the periods to check.
    """
    for period in periods:
        y = period_labels(data, features, period)
        if len(y) == 0 or y.sum() == 0 or y.sum() == len(y):
            raise DataValidationError(
                f"the {period} period ({split_text}) has {len(y)} rows and {int(y.sum())} frauds; "
                "both classes are needed: adjust --train-days/--val-days/--delay-days/--test-days",
                source=source,
            )


def pattern_rows(data: pd.DataFrame, features: pd.DataFrame, period: str, scenario: str) -> np.ndarray | None:
    """Rows of ``period`` that are legit or of ``scenario`` (None without a scenario column
    or when the period holds no row of that scenario)."""
    if S.SCENARIO not in data:
        return None
    rows = data.loc[(features[P.PERIOD] == period).to_numpy(), S.SCENARIO].fillna("")
    keep = rows.isin(["", scenario]).to_numpy()
    return keep if (rows == scenario).any() else None


# ------------------------------------------------------------------------------------
# models' scores


def baseline_val_test(data: pd.DataFrame, features: pd.DataFrame, seed: int,
                      n_threads: int | None = None) -> ValTestScores:
    """Fit the window-feature baseline on train + val; its validation and test scores."""
    labels = data[S.LABEL].to_numpy(dtype="float64")
    model = P.fit_baseline(features, labels, seed=seed, n_threads=n_threads)
    return ValTestScores(
        y_val=period_labels(data, features, "val"), s_val=P.baseline_scores(model, features, "val"),
        y_test=period_labels(data, features, "test"), s_test=P.baseline_scores(model, features, "test"),
    )


def sequence_val_test(model: FraudSequenceModel, setup: P.SequenceSetup, data: pd.DataFrame,
                      features: pd.DataFrame) -> ValTestScores:
    """The sequence model's validation and test scores, in input-row order."""
    return ValTestScores(
        y_val=period_labels(data, features, "val"), s_val=P.score_period(model, setup, "val"),
        y_test=period_labels(data, features, "test"), s_test=P.score_period(model, setup, "test"),
    )


def train_pos_weight(data: pd.DataFrame, features: pd.DataFrame, negative_rate: float = 1.0) -> float:
    """The BCE class weight from the train period's labels."""
    return P.pos_weight_for(period_labels(data, features, "train").astype("float64"), negative_rate)


def scores_for(model_ref: ModelRef, registry: ModelRegistry, data: pd.DataFrame, features: pd.DataFrame,
               period: str) -> np.ndarray:
    """A registered version's scores on one period of this data (its own preprocessing), of
    whichever kind it is: the sequence model, the GBM or their ensemble (mean)."""
    from solutions.fraud.candidates import load_baseline

    parts = []
    if model_ref.kind != KIND_SKLEARN:
        model, pre, cfg = P.model_from_params(model_ref.params, registry.load_state_dict(model_ref))
        setup = P.sequence_setup(data, features, cfg, preprocessor=pre, periods=(period,))
        parts.append(P.score_period(model, setup, period))
    baseline = load_baseline(model_ref)
    if baseline is not None:
        parts.append(baseline.scores(features, period))
    return np.mean(parts, axis=0)


def champion_pr_auc(registry: ModelRegistry, model_name: str, data: pd.DataFrame, features: pd.DataFrame,
                    period: str = "test", champion: ModelRef | None = None) -> float | None:
    """The current champion's (or ``champion``'s) PR-AUC on this run's period (a fair comparison), if any.

    None when there is no champion or it cannot score this data (the registry's stored
    metric is then compared instead).
    """
    from sklearn.metrics import average_precision_score

    if champion is None:
        champion = registry.champion(model_name) if model_name in registry.models() else None
    if champion is None:
        return None
    try:
        scores = scores_for(champion, registry, data, features, period)
    except (KeyError, ValueError, RuntimeError) as exc:
        log.warning("could not re-score champion %s on this data (%s); using its stored metric", champion.spec, exc)
        return None
    return float(average_precision_score(period_labels(data, features, period), scores))


@dataclass(frozen=True)
class AdaptScores:
    """One model's test scores on the new data (with the rows of its new pattern) and on
    the old data (forgetting)."""

    y_new: np.ndarray
    s_new: np.ndarray
    pattern: np.ndarray | None
    y_old: np.ndarray
    s_old: np.ndarray


def parent_test_scores(parent: ModelRef, registry: ModelRegistry, new: tuple[pd.DataFrame, pd.DataFrame],
                       old: tuple[pd.DataFrame, pd.DataFrame], scenario: str = "new_pattern") -> AdaptScores:
    """A registered version, as registered, on the test periods of ``new`` and ``old``
    (each ``(transactions, features)``)."""
    return AdaptScores(
        y_new=period_labels(*new, "test"), s_new=scores_for(parent, registry, *new, "test"),
        pattern=pattern_rows(*new, "test", scenario),
        y_old=period_labels(*old, "test"), s_old=scores_for(parent, registry, *old, "test"),
    )


def adapted_test_scores(model: FraudSequenceModel, setup: P.SequenceSetup, pre: FraudPreprocessor,
                        cfg: SequenceModelConfig, new: tuple[pd.DataFrame, pd.DataFrame],
                        old: tuple[pd.DataFrame, pd.DataFrame], scenario: str = "new_pattern") -> AdaptScores:
    """A fine-tuned model (``setup``: its data module over the new data) on both test periods."""
    old_setup = P.sequence_setup(*old, cfg, preprocessor=pre, periods=("test",))
    return AdaptScores(
        y_new=period_labels(*new, "test"), s_new=P.score_period(model, setup, "test"),
        pattern=pattern_rows(*new, "test", scenario),
        y_old=period_labels(*old, "test"), s_old=P.score_period(model, old_setup, "test"),
    )


def winner(sequence_pr_auc: float, baseline_pr_auc: float | None) -> str:
    """Which model had the higher test PR-AUC (the sequence model on a tie)."""
    return "baseline" if baseline_pr_auc is not None and baseline_pr_auc > sequence_pr_auc else "sequence"


# ------------------------------------------------------------------------------------
# scoring new transactions


@dataclass(frozen=True)
class ScoredTransactions:
    """A scoring run's output.

    Attributes:
        table: one row per scored transaction: id, account, time, score, flagged, model,
            model_version.
        rows: the input rows scored (labels included when the file had them).
        scores: their scores, in the same order.
        threshold: the model's decision threshold.
    """

    table: pd.DataFrame
    rows: pd.DataFrame
    scores: np.ndarray
    threshold: float

    @property
    def flagged(self) -> int:
        """Rows at or above the threshold."""
        return int(self.table["flagged"].sum())


def label_delay_days(model_ref: ModelRef) -> float:
    """The label delay (days) a version's terminal windows were built with."""
    return float(model_ref.params.get("split", {}).get("delay_days", 7))


def score_transactions(net: FraudSequenceModel | None, pre: FraudPreprocessor | None, cfg: SequenceModelConfig | None,
                       model_ref: ModelRef, data: pd.DataFrame, *, source: str,
                       since: str | None = None, baseline: Any = None) -> ScoredTransactions:
    """Score validated transactions with one model version.

    Rows before ``since`` serve only as history for sequences and window features. A
    version of kind ``sklearn-skops`` scores with its GBM alone (``net`` None), one of kind
    ``torch+sklearn-skops`` with the mean of both.

    Args:
        net: the version's network (fp32, or a compressed variant of it); None for a GBM.
        pre: the preprocessor it was trained with (None for a GBM).
        cfg: its sequence settings (None for a GBM).
        model_ref: the version (threshold, split and name come from it).
        data: the validated transactions.
        source: where they came from, for error messages.
        since: score only rows at or after this timestamp.
        baseline: the version's GBM (``solutions.fraud.candidates.StoredBaseline``), if any.

    Raises:
        DataValidationError: the model needs window features this data cannot give.
    """
    threshold = float(model_ref.params.get("threshold", 0.5))
    delay = label_delay_days(model_ref)
    periods = np.full(len(data), "score", dtype=object)
    if since:
        periods[(data[S.TIMESTAMP] < pd.Timestamp(since)).to_numpy()] = "history"
    recorded = [*(pre.window_feature_names if pre is not None else ()), *(baseline.feature_names if baseline is not None else ())]
    feats = P.build_features(data, periods, delay, FD.windows_of(recorded))  # the model's windows, as online
    parts = []
    if net is not None:
        missing = [c for c in pre.window_feature_names if c not in feats]
        if missing:
            raise DataValidationError(
                f"the model needs window features {missing}, which this file cannot give "
                "(is a column such as terminal_id missing?)",
                source=source,
            )
        setup = P.sequence_setup(data, feats, cfg, preprocessor=pre, periods=("score",))
        parts.append(P.score_period(net, setup, "score"))
    if baseline is not None:
        parts.append(baseline.scores(feats, "score", source))
    if not parts:
        raise ValueError(f"{model_ref.spec}: nothing to score with (no network and no baseline)")
    scores = np.mean(parts, axis=0)
    rows = periods == "score"
    table = data.loc[rows, [S.TRANSACTION_ID, S.ACCOUNT_ID, S.TIMESTAMP]].reset_index(drop=True)
    table["score"] = scores
    table["flagged"] = scores >= threshold
    table["model"] = model_ref.name
    table["model_version"] = model_ref.version
    return ScoredTransactions(table=table, rows=data.loc[rows], scores=scores, threshold=threshold)


def labelled_part(scored: ScoredTransactions) -> tuple[np.ndarray, np.ndarray] | None:
    """(labels, scores) of the scored rows whose label is known, when both classes occur."""
    if S.LABEL not in scored.rows:
        return None
    y = scored.rows[S.LABEL]
    known = y.notna().to_numpy()
    if not known.any() or not 0 < y[known].astype(int).sum() < known.sum():
        return None
    return y[known].astype(int).to_numpy(), scored.scores[known]


def render_score_summary(scored: ScoredTransactions, model_spec: str, source: str, output: Path) -> str:
    """Markdown summary of a scoring run: rows, flagged, score quantiles, output."""
    quantiles = np.quantile(scored.scores, [0.5, 0.9, 0.99]) if len(scored.scores) else [np.nan] * 3
    return (
        f"## fraud-score with {model_spec}\n\n| | |\n|---|---|\n"
        f"| input | `{source}` |\n| rows scored | {len(scored.table)} |\n"
        f"| flagged (score ≥ {scored.threshold:.4g}) | {scored.flagged} |\n"
        f"| score p50 / p90 / p99 | {quantiles[0]:.4f} / {quantiles[1]:.4f} / {quantiles[2]:.4f} |\n"
        f"| output | `{output}` |\n"
    )
