"""The fraud vertical's part of a model card: intended use, features, known limitations,
per-day metrics and card precision@k (plain functions, no Prefect)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from sklearn.metrics import average_precision_score

from solutions.fraud import schema as S
from solutions.fraud.sequences import STATIC_CATEGORICAL, STATIC_NUMERIC, STEP_CATEGORICAL, STEP_NUMERIC

TITLE = "Fraud sequence model (GRU over each account's recent transactions + window features)"
INTENDED_USE = (
    "Ranks card/account transactions by fraud risk so that investigators review the riskiest first, "
    "and flags those above the threshold chosen on the validation period. Decision support for a "
    "fraud team with labels arriving after a delay; not an automatic block/deny decision, and not "
    "for credit, pricing or any decision about a person beyond fraud review."
)
LIMITATIONS = (
    ("Trained on one time window: fraud patterns that were absent from it (a new attack) are scored "
     "poorly until the model is adapted or retrained; watch drift and realised precision."),
    ("Labels in the delay period are unknown at training time; the terminal-risk features use only "
     "labels older than the delay, so they lag a fast-moving attack."),
    ("Accounts with little history get short, padded sequences: their scores lean on the window and "
     "static features."),
    ("Scores are ranks more than calibrated probabilities (class weights and negative subsampling "
     "shift them); use the stored threshold or a cost-based one, not 0.5."),
)
#: Default k of card precision@k (cards an investigator team checks per day).
DEFAULT_K = 100


def feature_names(window_feature_names: tuple[str, ...] | list[str]) -> list[str]:
    """Per-step, static and window features the sequence model sees (``step/``, ``static/``,
    ``window/`` prefixes: the same name can be a per-step and a window feature)."""
    return ([f"step/{n}" for n in (*STEP_NUMERIC, *STEP_CATEGORICAL)]
            + [f"static/{n}" for n in (*STATIC_NUMERIC, *STATIC_CATEGORICAL)]
            + [f"window/{n}" for n in window_feature_names])


def card_precision_at_k(day: pd.DataFrame, k: int) -> tuple[float, int]:
    """Share of compromised accounts among the ``k`` accounts with the highest score of one
    day (an account is compromised when one of its transactions that day is fraud).

    ``day`` holds ``account_id``, ``label`` and ``score``; returns (precision, k used)."""
    per_account = day.groupby(S.ACCOUNT_ID, sort=True).agg(score=("score", "max"), fraud=(S.LABEL, "max"))
    used = min(k, len(per_account))
    if used == 0:
        return math.nan, 0
    top = per_account.sort_values("score", ascending=False, kind="stable").head(used)
    return float(top["fraud"].sum() / used), used


def per_day_metrics(test: pd.DataFrame, scores: np.ndarray, k: int = DEFAULT_K) -> list[dict[str, object]]:
    """Per test day: transactions, frauds, PR-AUC (None without a fraud) and card precision@k.

    Args:
        test: the test period's rows (``timestamp``, ``account_id``, ``label``), in score order.
        scores: the model's score of each row.
        k: accounts checked per day.
    """
    frame = pd.DataFrame({
        "day": pd.to_datetime(test[S.TIMESTAMP]).dt.floor("D").to_numpy(),
        S.ACCOUNT_ID: test[S.ACCOUNT_ID].to_numpy(),
        S.LABEL: test[S.LABEL].to_numpy(dtype="int64"),
        "score": np.asarray(scores, dtype="float64"),
    })
    rows = []
    for day, part in frame.groupby("day", sort=True):
        frauds = int(part[S.LABEL].sum())
        pr_auc = float(average_precision_score(part[S.LABEL], part["score"])) if 0 < frauds < len(part) else None
        cp, used = card_precision_at_k(part, k)
        rows.append({"day": str(pd.Timestamp(day).date()), "transactions": len(part), "frauds": frauds,
                     "pr_auc": pr_auc, f"card_precision@{k}": cp, "k_used": used})
    return rows


def mean_card_precision(rows: list[dict[str, object]], k: int = DEFAULT_K) -> float:
    """Mean of the per-day card precision@k (the handbook's summary figure)."""
    values = [float(r[f"card_precision@{k}"]) for r in rows if not math.isnan(float(r[f"card_precision@{k}"]))]
    return float(np.mean(values)) if values else math.nan
