"""What the fraud vertical watches after deployment (plain functions, no Prefect).

* the monitored input features of a transactions table (:func:`monitored_features`),
  whose profile is stored beside each registered version and compared with every batch
  run's inputs;
* the delayed labels (``transaction_id,label[,labelled_at]``) and their join with past
  scores: realised PR-AUC, ROC-AUC, recall at a fixed FPR and card precision@k per
  scored day and model version (:func:`realised_performance`);
* the accumulated training data: scored transactions with their arrived labels
  (:func:`apply_labels`, :func:`training_rows`).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from solutions.fraud import schema as S

#: The input columns profiled and compared (derived ones included), when present.
#: (No weekday: a daily batch file holds one weekday, which is not drift.)
NUMERIC = (S.AMOUNT, "hour", S.AGE, S.ACCOUNT_AGE_DAYS)
CATEGORICAL = (S.CHANNEL, S.CATEGORY, S.OCCUPATION)
#: The scored day of a joined row.
DAY = "day"


def monitored_features(transactions: pd.DataFrame) -> pd.DataFrame:
    """The monitored columns of a validated transactions table: amount, hour of day, the
    static attributes, channel, category and occupation (those present)."""
    out = pd.DataFrame(index=transactions.index)
    for col in NUMERIC:
        if col in transactions:
            out[col] = pd.to_numeric(transactions[col], errors="coerce")
    ts = pd.to_datetime(transactions[S.TIMESTAMP])
    out["hour"] = ts.dt.hour + ts.dt.minute / 60.0
    for col in CATEGORICAL:
        if col in transactions:
            out[col] = transactions[col].astype("string")
    return out.reset_index(drop=True)


def features_beside(scores: Path) -> Path:
    """Where a batch score file's monitored input features are kept beside it (written while
    the file is scored, so drift checking never reads and validates the input a second time)."""
    return scores.with_name(f"{scores.stem}.monitored.parquet")


def latest_labels(labels: pd.DataFrame) -> pd.DataFrame:
    """One label per transaction: the latest (by ``labelled_at``, then arrival order)."""
    if labels.empty:
        return pd.DataFrame({S.TRANSACTION_ID: pd.Series(dtype="string"), S.LABEL: pd.Series(dtype="Int8")})
    frame = labels.reset_index(drop=True)
    if S.LABELLED_AT in frame:
        frame = frame.sort_values(S.LABELLED_AT, kind="stable", na_position="first")
    frame = frame.drop_duplicates(S.TRANSACTION_ID, keep="last")
    return frame[[S.TRANSACTION_ID, S.LABEL]].astype({S.TRANSACTION_ID: "string", S.LABEL: "Int8"})


def join_labels(scores: pd.DataFrame, labels: pd.DataFrame) -> pd.DataFrame:
    """Scores (``transaction_id, timestamp, score, model_version``) with their arrived label
    (NA where none arrived) and the scored day."""
    out = scores.astype({S.TRANSACTION_ID: "string"}).merge(latest_labels(labels), on=S.TRANSACTION_ID, how="left")
    out[DAY] = pd.to_datetime(out[S.TIMESTAMP]).dt.normalize()
    return out


def recall_at_fpr(y: np.ndarray, s: np.ndarray, fpr: float) -> float:
    """Share of frauds caught at the threshold that flags ``fpr`` of the legit rows."""
    legit = s[y == 0]
    if len(legit) == 0 or y.sum() == 0:
        return float("nan")
    cut = np.quantile(legit, 1.0 - fpr, method="higher")
    return float((s[y == 1] > cut).mean())


def card_precision_at_k(accounts: np.ndarray, y: np.ndarray, s: np.ndarray, k: int) -> float:
    """Of the ``k`` accounts with the highest score of the day, the share with a fraud
    (the handbook's card precision@k)."""
    frame = pd.DataFrame({"a": accounts, "y": y, "s": s}).groupby("a").agg(y=("y", "max"), s=("s", "max"))
    top = frame.sort_values("s", ascending=False, kind="stable").head(k)
    return float(top["y"].mean()) if len(top) else float("nan")


def realised_performance(joined: pd.DataFrame, *, fpr: float = 0.01, k: int = 100,
                         min_labels: int = 1) -> pd.DataFrame:
    """Per scored day and model version: labelled rows, frauds, PR-AUC, ROC-AUC, recall at
    ``fpr`` and card precision@``k`` (NaN where a day lacks a class or enough labels)."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    rows = []
    labelled = joined.loc[joined[S.LABEL].notna()]
    for (day, model, version), part in labelled.groupby([DAY, "model", "model_version"], sort=True):
        y = part[S.LABEL].astype(int).to_numpy()
        s = part["score"].to_numpy(dtype="float64")
        both = 0 < y.sum() < len(y) and len(y) >= min_labels
        rows.append({
            DAY: pd.Timestamp(day), "model": str(model), "model_version": int(version),
            "scored": int((joined[DAY] == day).sum()), "labelled": len(y), "frauds": int(y.sum()),
            "pr_auc": float(average_precision_score(y, s)) if both else math.nan,
            "roc_auc": float(roc_auc_score(y, s)) if both else math.nan,
            "recall_at_fpr": recall_at_fpr(y, s, fpr) if both else math.nan,
            "card_precision_at_k": card_precision_at_k(part[S.ACCOUNT_ID].to_numpy(), y, s, k) if both else math.nan,
        })
    return pd.DataFrame(rows, columns=[DAY, "model", "model_version", "scored", "labelled", "frauds", "pr_auc",
                                       "roc_auc", "recall_at_fpr", "card_precision_at_k"])


def pooled_metric(joined: pd.DataFrame, version: int, days: list[pd.Timestamp], metric: str = "pr_auc",
                  *, fpr: float = 0.01, k: int = 100) -> float:
    """One realised metric over the labelled rows of ``days`` scored by ``version``, pooled
    (less noisy than one day's figure)."""
    part = joined.loc[joined["model_version"].eq(version) & joined[DAY].isin(days)]
    part = part.assign(**{DAY: pd.Timestamp(0)})
    table = realised_performance(part, fpr=fpr, k=k)
    return float(table[metric].iloc[0]) if len(table) else math.nan


def apply_labels(rows: pd.DataFrame, labels: pd.DataFrame) -> pd.DataFrame:
    """Accumulated rows with the latest arrived label of each transaction (NA: none yet)."""
    latest = latest_labels(labels).set_index(S.TRANSACTION_ID)[S.LABEL]
    out = rows.copy()
    known = out[S.TRANSACTION_ID].astype("string").map(latest)
    previous = out[S.LABEL] if S.LABEL in out else pd.Series(pd.NA, index=out.index, dtype="Int8")
    out[S.LABEL] = known.astype("Int8").fillna(previous.astype("Int8"))
    return out


def training_rows(accumulated: pd.DataFrame) -> pd.DataFrame:
    """The accumulated rows a training can use: up to the last day with an arrived label;
    a transaction without a fraud report by then counts as legit (label 0)."""
    labelled = accumulated[S.LABEL].notna()
    if not labelled.any():
        return accumulated.iloc[0:0]
    last_day = pd.to_datetime(accumulated.loc[labelled, S.TIMESTAMP]).dt.normalize().max()
    keep = pd.to_datetime(accumulated[S.TIMESTAMP]) < last_day + pd.Timedelta(days=1)
    out = accumulated.loc[keep].copy()
    out[S.LABEL] = out[S.LABEL].fillna(0).astype("int8")
    return out.reset_index(drop=True)
