"""The candidates of a ``fraud-train`` run, chosen on validation; the GBM stored without pickle.

A run trains the sequence model and the window-feature gradient-boosting baseline (fitted on
the train period only, so that validation is unseen by both); the mean of their probabilities
is a third candidate. The candidate with the highest validation PR-AUC is the one registered
(the ensemble only when it beats both alone); the test period only reports.

Registered kinds (``infra.registry``): ``torch`` (the sequence model), ``sklearn-skops`` (the
GBM in a skops file, loaded against an allow-list) and ``torch+sklearn-skops`` (both, scores
averaged).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sklearn.metrics import average_precision_score
from threadpoolctl import threadpool_limits

from infra.errors import DataValidationError
from infra.registry import KIND_SKLEARN, KIND_TORCH, KIND_TORCH_SKLEARN, SKLEARN_FILE, ModelRef
from infra.sklearn_store import load_estimator, save_estimator
from solutions.fraud import pipeline as P
from solutions.fraud import schema as S
from solutions.fraud.features import WindowFeatureBaseline
from solutions.fraud.scoring import ValTestScores, period_labels

SEQUENCE, BASELINE, ENSEMBLE = "sequence", "baseline", "ensemble"
#: Registry kind of each candidate.
KINDS = {SEQUENCE: KIND_TORCH, BASELINE: KIND_SKLEARN, ENSEMBLE: KIND_TORCH_SKLEARN}


@dataclass(frozen=True)
class BaselineCandidate:
    """The GBM fitted on the train period, its feature columns and its val/test scores."""

    model: WindowFeatureBaseline
    feature_names: list[str]
    scores: ValTestScores


def feature_columns(features: pd.DataFrame) -> list[str]:
    """The window-feature columns the baseline reads, in order."""
    return [c for c in features.columns if c != P.PERIOD]


def fit_baseline_candidate(data: pd.DataFrame, features: pd.DataFrame, seed: int,
                           n_threads: int | None = None) -> BaselineCandidate:
    """Fit the GBM on the train period only; its validation and test scores."""
    columns = feature_columns(features)
    rows = (features[P.PERIOD] == "train").to_numpy()
    labels = data[S.LABEL].to_numpy(dtype="float64")
    model = WindowFeatureBaseline(random_state=seed, n_threads=n_threads).fit(features.loc[rows, columns], labels[rows])
    return BaselineCandidate(model=model, feature_names=columns, scores=ValTestScores(
        y_val=period_labels(data, features, "val"), s_val=P.baseline_scores(model, features, "val"),
        y_test=period_labels(data, features, "test"), s_test=P.baseline_scores(model, features, "test"),
    ))


def ensemble_scores(sequence: ValTestScores, baseline: ValTestScores) -> ValTestScores:
    """The mean of the two models' probabilities (a fixed weight: nothing more is fitted on validation)."""
    return ValTestScores(y_val=sequence.y_val, s_val=(sequence.s_val + baseline.s_val) / 2,
                         y_test=sequence.y_test, s_test=(sequence.s_test + baseline.s_test) / 2)


def _pr_auc(y: np.ndarray, s: np.ndarray) -> float:
    return float(average_precision_score(y, s)) if 0 < y.sum() < len(y) else float("nan")


@dataclass(frozen=True)
class CandidateChoice:
    """Which candidate won on validation, and every candidate's validation and test PR-AUC."""

    winner: str
    val_pr_auc: dict[str, float]
    test_pr_auc: dict[str, float]
    scores: dict[str, ValTestScores] = field(repr=False)

    @property
    def kind(self) -> str:
        """The registry kind of the winner."""
        return KINDS[self.winner]

    def metrics(self) -> dict[str, float]:
        """``val/<candidate>/auprc`` and ``test/<candidate>/auprc`` of every candidate."""
        out = {f"val/{k}/auprc": v for k, v in self.val_pr_auc.items()}
        out.update({f"test/{k}/auprc": v for k, v in self.test_pr_auc.items()})
        return out

    def render(self) -> str:
        """Markdown table of the candidates (validation decides, test reports)."""
        lines = ["## Candidates (chosen on validation; the test period only reports)", "",
                 "| candidate | val PR-AUC | test PR-AUC | |", "|---|---|---|---|"]
        for name in self.val_pr_auc:
            mark = "**registered**" if name == self.winner else ""
            lines.append(f"| {name} | {self.val_pr_auc[name]:.4f} | {self.test_pr_auc[name]:.4f} | {mark} |")
        return "\n".join(lines) + "\n"


def choose_on_validation(sequence: ValTestScores, baseline: ValTestScores | None,
                         allowed: Sequence[str] | None = None) -> CandidateChoice:
    """The candidate with the highest validation PR-AUC (on a tie the simpler, listed first).

    Args:
        sequence: the sequence model's scores.
        baseline: the GBM's scores (None: not trained; the ensemble is then no candidate either).
        allowed: the candidates that may be registered (None: all); the others are still reported.

    Raises:
        ValueError: none of ``allowed`` was trained.
    """
    candidates = {SEQUENCE: sequence}
    if baseline is not None:
        candidates[BASELINE] = baseline
        candidates[ENSEMBLE] = ensemble_scores(sequence, baseline)
    val = {k: _pr_auc(v.y_val, v.s_val) for k, v in candidates.items()}
    test = {k: _pr_auc(v.y_test, v.s_test) for k, v in candidates.items()}
    eligible = [k for k in candidates if allowed is None or k in allowed]
    if not eligible:
        raise ValueError(f"none of the candidates {list(allowed or [])} was trained (trained: {list(candidates)})")
    winner = eligible[0]
    for name in eligible:
        value = val[name]
        if np.isfinite(value) and (not np.isfinite(val[winner]) or value > val[winner]):
            winner = name
    return CandidateChoice(winner=winner, val_pr_auc=val, test_pr_auc=test, scores=candidates)


# ------------------------------------------------------------------------------------
# the GBM in the registry (skops, no pickle)


def baseline_files(baseline: BaselineCandidate, folder: Path) -> dict[str, Path]:
    """Write the GBM as a skops file in ``folder``; ``{file name: path}`` for the registry."""
    return {SKLEARN_FILE: save_estimator(baseline.model.model_, folder / SKLEARN_FILE)}


def baseline_params(baseline: BaselineCandidate, delay_days: float) -> dict[str, Any]:
    """JSON parameters of a registered GBM: its feature columns and window settings."""
    return {"baseline": {"architecture": "HistGradientBoostingClassifier", "features": baseline.feature_names,
                         "delay_days": float(delay_days), "n_threads": baseline.model.n_threads}}


@dataclass(frozen=True)
class StoredBaseline:
    """A registered GBM ready to score window features."""

    estimator: Any
    feature_names: list[str]
    n_threads: int | None = 1

    def scores(self, features: pd.DataFrame, period: str, source: str = "input") -> np.ndarray:
        """Fraud probabilities of the rows of ``period``, in row order.

        Raises:
            DataValidationError: a window feature the model needs is missing.
        """
        missing = [c for c in self.feature_names if c not in features]
        if missing:
            raise DataValidationError(f"the model needs window features {missing}, which this file cannot give",
                                      source=source)
        rows = (features[P.PERIOD] == period).to_numpy()
        return self.probabilities(features.loc[rows, self.feature_names])

    def probabilities(self, x: pd.DataFrame) -> np.ndarray:
        """Fraud probabilities of feature rows whose columns are :attr:`feature_names` (the online path)."""
        with threadpool_limits(self.n_threads or 1):
            return self.estimator.predict_proba(x)[:, 1]


def load_baseline(ref: ModelRef) -> StoredBaseline | None:
    """The GBM of a version whose kind holds one (None for a sequence-only version)."""
    if ref.kind not in (KIND_SKLEARN, KIND_TORCH_SKLEARN):
        return None
    info = ref.params.get("baseline") or {}
    if "features" not in info:
        raise ValueError(f"{ref.spec} is of kind {ref.kind} but its params name no baseline features")
    return StoredBaseline(load_estimator(ref.file(SKLEARN_FILE)), list(info["features"]), info.get("n_threads") or 1)
