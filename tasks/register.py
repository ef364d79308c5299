"""Register a trained model version and apply the champion rule."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NONE
from pydantic import BaseModel, ConfigDict

from infra.registry import ModelRef, ModelRegistry, PromotionDecision

log = logging.getLogger(__name__)


class RegistrationResult(BaseModel):
    """The new version and whether it became the champion."""

    model_config = ConfigDict(frozen=True)

    model: ModelRef
    decision: PromotionDecision


def register_model(
    name: str,
    module: Any,
    *,
    params: Mapping[str, Any],
    metrics: Mapping[str, float],
    primary_metric: str,
    higher_is_better: bool = True,
    data_hash: str | None = None,
    parent: str | None = None,
    champion_value: float | None = None,
    strict: bool = False,
    tags: Mapping[str, str] | None = None,
    extra_files: Mapping[str, Path] | None = None,
) -> RegistrationResult:
    """Write ``module``'s weights as a new version, then try to promote it to champion.

    Args:
        champion_value: the current champion's primary metric on the same evaluation
            data, when the caller re-scored it; else its stored metric is compared.
        higher_is_better: False for errors such as RMSE (lower wins the champion rule).
        strict: raise :class:`~infra.errors.QualityGateError` if it is not promoted
            (the version stays registered, the champion does not move).
        extra_files: file name -> path of files stored in the version folder (e.g. the
            reference profile of :mod:`tasks.monitoring`).
    """
    registry = ModelRegistry()
    ref = registry.register(
        name,
        module.state_dict(),
        params=params,
        metrics=metrics,
        primary_metric=primary_metric,
        higher_is_better=higher_is_better,
        data_hash=data_hash,
        parent=parent,
        tags=tags,
        extra_files=extra_files,
    )
    decision = registry.promote(ref, champion_value=champion_value, strict=strict)
    return RegistrationResult(model=registry.get(name, ref.version), decision=decision)


def render_promotion(decision: PromotionDecision) -> str:
    """Markdown of a promotion decision."""
    def fmt(v: float | None) -> str:
        return "—" if v is None else f"{v:.4f}"

    verdict = "promoted to champion" if decision.promoted else "not promoted"
    return (
        f"## Promotion of {decision.name} v{decision.candidate_version}: {verdict}\n\n"
        f"| | version | {decision.metric} |\n|---|---|---|\n"
        f"| candidate | {decision.candidate_version} | {fmt(decision.candidate_value)} |\n"
        f"| champion before | {decision.champion_version or '—'} | {fmt(decision.champion_value)} |\n\n"
        f"Reason: {decision.reason}\n"
    )


def register_and_publish(*args: Any, **kwargs: Any) -> RegistrationResult:
    """:func:`register_model`, then the promotion decision (both metrics and the reason) as
    its own artifact ``<model>-promotion``, so scheduled retrains leave a record per run."""
    from tasks.evaluate import artifact_key, publish_eval_report

    result = register_model(*args, **kwargs)
    publish_eval_report(render_promotion(result.decision), key=artifact_key(f"{result.decision.name}-promotion"),
                        description="Champion rule: challenger vs champion on the same test data")
    return result


register_model_task = task(
    register_and_publish,
    name="register-model",
    description="Register a model version, apply the champion rule and publish the decision.",
    cache_policy=NONE,
)
