"""Register a trained model version and apply the champion rule."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NONE
from pydantic import BaseModel, ConfigDict

from infra.registry import ChampionComparison, ModelRef, ModelRegistry, PromotionDecision
from infra.sealed import discard_plaintext
from infra.settings import get_governance_settings
from tasks.lineage import LINEAGE_FILE, Lineage, lineage_json, render_lineage

log = logging.getLogger(__name__)


class RegistrationResult(BaseModel):
    """The new version and whether it became the champion."""

    model_config = ConfigDict(frozen=True)

    model: ModelRef
    decision: PromotionDecision
    lineage: Lineage | None = None


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
    comparison: ChampionComparison | None = None,
    recompare: Callable[[ModelRef], ChampionComparison | None] | None = None,
    lineage: Lineage | None = None,
    kind: str = "torch",
    extra_files: Mapping[str, Any] | None = None,
) -> RegistrationResult:
    """Write ``module``'s weights as a new version, then try to promote it to champion.

    Args:
        champion_value: the current champion's primary metric on the same evaluation
            data, when the caller re-scored it; else its stored metric is compared.
        higher_is_better: False for errors such as RMSE (lower wins the champion rule).
        strict: raise :class:`~infra.errors.QualityGateError` if it is not promoted
            (the version stays registered, the champion does not move).
        comparison: the candidate compared with a named champion version (value and
            paired-bootstrap p-value); replaces ``champion_value``.
        recompare: compares the candidate with another champion version; called inside the
            registry lock when the champion moved since ``comparison`` (compare-and-swap).
        lineage: stored as ``lineage.json`` in the version folder.
        kind: what the version loads into (``infra.registry.KIND_*``).
        extra_files: file name -> path of files stored beside the weights (e.g. a skops
            model); ``module`` may be None when such a file is the whole model.

    The significance gate (``INDUSFLOW_GOVERNANCE_SIGNIFICANCE_ALPHA``) applies when set. A model
    that needs approval (:func:`tasks.approval.approval_required`) is only decided: a win comes back
    ``awaiting_approval`` and :func:`tasks.approval.approval_gate` moves it once approved.
    """
    from tasks.approval import approval_required

    registry = ModelRegistry()
    with tempfile.TemporaryDirectory() as tmp:
        extra = {**(extra_files or {}), **lineage_files(lineage, Path(tmp))}
        ref = registry.register(
            name,
            module.state_dict() if module is not None else {},
            params=params,
            metrics=metrics,
            primary_metric=primary_metric,
            higher_is_better=higher_is_better,
            data_hash=data_hash,
            parent=parent,
            tags=tags,
            kind=kind,
            extra_files=extra,
        )
    discard_plaintext(Path(p) for p in (extra_files or {}).values())  # sealed in the registry now
    decision = registry.promote(ref, champion_value=champion_value, comparison=comparison, recompare=recompare,
                                alpha=get_governance_settings().significance_alpha, strict=strict,
                                decide_only=approval_required(name))
    return RegistrationResult(model=registry.get(name, ref.version), decision=decision, lineage=lineage)


def lineage_files(lineage: Lineage | None, folder: Path) -> dict[str, Path]:
    """``{"lineage.json": path}`` written into ``folder`` (empty without a lineage)."""
    if lineage is None:
        return {}
    path = folder / LINEAGE_FILE
    path.write_text(lineage_json(lineage))
    return {LINEAGE_FILE: path}


def render_promotion(decision: PromotionDecision) -> str:
    """Markdown of a promotion decision."""
    def fmt(v: float | None) -> str:
        return "—" if v is None else f"{v:.4f}"

    verdict = ("waits for approval (four eyes)" if decision.awaiting_approval
               else "promoted to champion" if decision.promoted else "not promoted")
    approval = decision.approval
    return (
        f"## Promotion of {decision.name} v{decision.candidate_version}: {verdict}\n\n"
        f"| | version | {decision.metric} |\n|---|---|---|\n"
        f"| candidate | {decision.candidate_version} | {fmt(decision.candidate_value)} |\n"
        f"| champion before | {decision.champion_version or '—'} | {fmt(decision.champion_value)} |\n\n"
        f"Reason: {decision.reason}\n"
        + (f"\nPaired bootstrap p-value (candidate better than the champion): {decision.p_value:.4f}"
           + (f" (gate: alpha {decision.alpha})" if decision.alpha is not None else " (gate off)") + "\n"
           if decision.p_value is not None else "")
        + ("\nThe champion moved during this run: compared again inside the registry lock.\n"
           if decision.rescored_in_lock else "")
        + (f"\nApproval (four eyes): {'approved' if approval.approved else 'rejected'} by "
           f"{approval.decided_by or 'nobody (expired)'} at {approval.decided_at}: {approval.reason}. Requested by "
           f"{approval.requested_by} at {approval.requested_at} in flow run `{approval.run_id}`.\n"
           if approval is not None else "")
        + (f"\nRegistry trail head after this decision: `{decision.trail_sha256}` "
           "(`python -m flows.registry verify` checks the trail against it).\n" if decision.trail_sha256 else "")
    )


def register_and_publish(*args: Any, **kwargs: Any) -> RegistrationResult:
    """:func:`register_model`, then the promotion decision (both metrics and the reason) as
    its own artifact ``<model>-promotion``, so scheduled retrains leave a record per run."""
    from tasks.evaluate import artifact_key, publish_eval_report

    result = register_model(*args, **kwargs)
    markdown = render_promotion(result.decision)
    if result.lineage is not None:
        markdown += "\n" + render_lineage(result.lineage)
    publish_eval_report(markdown, key=artifact_key(f"{result.decision.name}-promotion"),
                        description="Champion rule: challenger vs champion on the same test data")
    return result


register_model_task = task(
    register_and_publish,
    name="register-model",
    description="Register a model version, apply the champion rule and publish the decision.",
    cache_policy=NONE,
)
