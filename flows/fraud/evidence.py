"""``fraud-evidence``: the served scores of the fraud champion and its challenger, joined to the
labels that arrived later, per version; recommends (and with --promote, starts) promoting the
challenger."""

from __future__ import annotations

from typing import Annotated, Literal

from prefect import flow, task
from prefect.cache_policies import NONE
from pydantic import Field

from flows.fraud.monitoring import all_labels
from solutions.fraud import schema as S
from tasks.evaluate import publish_eval_report
from tasks.online_evidence import EvidenceRule, OnlineEvidence, evidence_markdown, online_evidence

evidence_task = task(online_evidence, name="online-evidence", cache_policy=NONE)


@flow(name="fraud-evidence", log_prints=True)
def fraud_evidence(
    model: str = "fraud-seq",
    metric: Literal["pr_auc", "roc_auc"] = "pr_auc",
    min_labels: Annotated[int, Field(ge=1)] = 200,
    min_positives: Annotated[int, Field(ge=1)] = 10,
    alpha: Annotated[float, Field(gt=0, lt=1)] = 0.05,
    max_source_share: Annotated[float, Field(gt=0, le=1)] = 0.8,
    max_label_rate_ratio: Annotated[float, Field(gt=0)] = 10.0,
    promote: bool = False,
) -> OnlineEvidence:
    """Join the labels that arrived later (through /v1/fraud/labels, and the label files the
    monitor took in) to the scores the serving API recorded for each version, champion and
    challenger; report each version's realised metric with a 95% bootstrap interval and the
    paired bootstrap test of the challenger against the champion on the transactions both
    scored. Labels count per source (the API key that sent them, or the label files): the rule
    recommends nothing when one source sent most of them or they arrived in a burst far faster
    than the scores. The rule recommends promote, keep or insufficient. With --promote, a promote
    recommendation promotes the challenger; a model that needs approval waits for a second
    person first (the approval of `approve`).

    Args:
        model: the served model's registry NAME (its champion and challenger aliases are compared).
        metric: the metric compared.
        min_labels: labelled transactions both versions scored, at least, before the rule decides.
        min_positives: positive labels among them, at least.
        alpha: significance of the paired test ('the challenger is better').
        max_source_share: largest share of the judged labels one source may have sent (1: no limit).
        max_label_rate_ratio: how many times faster than the scores the API's labels may have arrived.
        promote: act on a promote recommendation (through approval where the model needs it).
    """
    monitor_labels = all_labels()
    files = [dict(zip(monitor_labels[S.TRANSACTION_ID].astype(str), monitor_labels[S.LABEL].astype(int),
                      strict=True))] if len(monitor_labels) else []
    rule = EvidenceRule(metric=metric, min_labels=min_labels, min_positives=min_positives, alpha=alpha,
                        max_source_share=max_source_share, max_label_rate_ratio=max_label_rate_ratio)
    evidence = evidence_task(model, rule, label_files=files, promote=promote)
    publish_eval_report(evidence_markdown(evidence), f"{model}-online-evidence",
                     description=f"{model}: {evidence.recommendation}")
    print(f"{model}: {evidence.recommendation}: {evidence.reason}")
    return evidence
