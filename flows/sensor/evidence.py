"""``sensor-evidence``: the RULs the serving API predicted with the sensor champion and its
challenger, judged by the failure events that came later, per version; recommends (and with
--promote, starts) promoting the challenger."""

from __future__ import annotations

from functools import partial
from typing import Annotated, Literal

from prefect import flow, task
from prefect.cache_policies import NONE
from pydantic import Field

from flows.sensor.monitoring import all_failures
from solutions.sensor.config import AlignConfig
from solutions.sensor.monitoring import judge_served
from tasks.evaluate import publish_eval_report
from tasks.online_evidence import EvidenceRule, OnlineEvidence, evidence_markdown, online_evidence

evidence_task = task(online_evidence, name="online-evidence", cache_policy=NONE)


@flow(name="sensor-evidence", log_prints=True)
def sensor_evidence(
    model: str = "sensor-rul",
    metric: Literal["rmse", "mae"] = "rmse",
    min_predictions: Annotated[int, Field(ge=1)] = 30,
    min_assets: Annotated[int, Field(ge=1)] = 5,
    alpha: Annotated[float, Field(gt=0, lt=1)] = 0.05,
    rul_cap: Annotated[float | None, Field(gt=0)] = None,
    promote: bool = False,
) -> OnlineEvidence:
    """Judge the RUL each served version (champion, challenger) predicted by the failure events
    that came since (the failures files `sensor monitor` took in): true RUL = failure time -
    the end of the scored window, in the serving API's grid steps. Report each version's realised RMSE (or MAE)
    with a 95% bootstrap interval that draws whole assets, and the paired bootstrap test of the
    challenger against the champion on the windows both predicted. The rule recommends
    promote, keep or insufficient. With --promote, a promote recommendation promotes the
    challenger; a model that needs approval waits for a second person first (`approve`).
    Predictions of requests sent as aligned grid rows carry no clock and are not judged.

    Args:
        model: the served model's registry NAME (its champion and challenger aliases are compared).
        metric: the error compared (lower is better).
        min_predictions: judged predictions both versions made, at least, before the rule decides.
        min_assets: failed assets among them, at least.
        alpha: significance of the paired test ('the challenger's error is lower').
        rul_cap: cap the true RUL at this many steps, as the models' training targets are (default: uncapped).
        promote: act on a promote recommendation (through approval where the model needs it).
    """
    rule = EvidenceRule(metric=metric, min_labels=min_predictions, min_subjects=min_assets, alpha=alpha)
    judge = partial(judge_served, failures=all_failures(), step_seconds=AlignConfig().step_seconds, rul_cap=rul_cap)
    evidence = evidence_task(model, rule, promote=promote, judge=judge, noun="predictions", subject="assets")
    publish_eval_report(evidence_markdown(evidence), f"{model}-online-evidence",
                        description=f"{model}: {evidence.recommendation}")
    print(f"{model}: {evidence.recommendation}: {evidence.reason}")
    return evidence
