"""Re-create a registered version from its lineage and say whether its figures hold.

A vertical's ``reproduce`` flow reads the plan (:func:`plan_reproduction`: the recorded
parameters; refused when a major package version or Python changed), re-reads the data and
checks its content hash (:func:`check_data_hash`: refused when the data changed), re-runs
its own training with the recorded parameters under the name ``<model>-reproduce`` (the
original's champion never moves), and compares the two versions
(:func:`compare_reproduction`).
"""

from __future__ import annotations

import hashlib
import logging
import math
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NONE
from pydantic import BaseModel, ConfigDict, Field

from infra.errors import ReproductionError
from infra.registry import ModelRef
from infra.sealed import read_artifact
from tasks.lineage import Lineage, environment_differences, read_lineage

log = logging.getLogger(__name__)


class ReproductionPlan(BaseModel):
    """What to re-run: the version, its lineage, and the environment differences that do
    not block a reproduction (they may move the figures within the tolerance)."""

    model_config = ConfigDict(frozen=True)

    model: str
    lineage: Lineage
    minor_differences: list[str] = Field(default_factory=list)

    @property
    def parameters(self) -> dict[str, Any]:
        """The recorded flow parameters, defaults included."""
        return dict(self.lineage.parameters)


class MetricPair(BaseModel):
    """One metric of the original and of the reproduction."""

    model_config = ConfigDict(frozen=True)

    original: float | None
    reproduced: float | None
    diff: float | None


class ReproduceResult(BaseModel):
    """Old vs new figures of a reproduced version."""

    model_config = ConfigDict(frozen=True)

    model: str = Field(description="The version reproduced.")
    reproduction: str = Field(description="The version the re-run registered.")
    metric: str = Field(description="The metric the tolerance applies to (the primary metric).")
    tolerance: float
    original: float | None
    reproduced: float | None
    diff: float | None
    within_tolerance: bool
    weights_identical: bool = Field(description="The two weight files are byte-identical.")
    metrics: dict[str, MetricPair]
    environment_differences: list[str] = Field(default_factory=list)


def plan_reproduction(ref: ModelRef) -> ReproductionPlan:
    """The plan to re-train ``ref``; :class:`ReproductionError` without a lineage or when a
    major package version (or Python's minor version) differs from the recorded one."""
    lineage = read_lineage(ref)
    if lineage is None:
        raise ReproductionError(f"{ref.spec} has no lineage.json (registered before lineage was recorded); "
                                "it cannot be reproduced")
    if not lineage.parameters:
        raise ReproductionError(f"{ref.spec}: its lineage records no flow parameters to re-run")
    blocking, minor = environment_differences(lineage.environment)
    minor += trainer_differences(lineage)
    if blocking:
        raise ReproductionError(f"{ref.spec} was trained with other major versions: {'; '.join(blocking)} "
                                "(install the recorded versions to reproduce it)")
    for text in minor:
        log.warning("%s: environment differs (%s): figures may move within the tolerance", ref.spec, text)
    return ReproductionPlan(model=ref.spec, lineage=lineage, minor_differences=minor)


def trainer_differences(lineage: Lineage) -> list[str]:
    """Thread count and determinism the re-run would use, where they differ from the recorded
    ones (each with the setting that restores it)."""
    from infra.compute import resolve_training

    now = resolve_training(lineage.flow)
    notes = []
    recorded_threads = lineage.hardware.get("num_threads")
    if recorded_threads and recorded_threads != now.num_threads:
        notes.append(f"threads {recorded_threads} -> {now.num_threads} "
                     f"(INDUSFLOW_TRAIN_NUM_THREADS={recorded_threads} restores it)")
    if lineage.deterministic is not None and lineage.deterministic != now.deterministic:
        notes.append(f"deterministic {lineage.deterministic} -> {now.deterministic} "
                     f"(a run's HardwareRequest(deterministic={lineage.deterministic}) restores it)")
    return notes


def check_data_hash(plan: ReproductionPlan, content_hash: str, source: str | None) -> None:
    """:class:`ReproductionError` naming the data and both hashes when the data changed."""
    recorded = plan.lineage.data.content_hash
    if content_hash != recorded:
        raise ReproductionError(
            f"the data of {plan.model} changed: {source or plan.lineage.data.source or 'the input'} now has "
            f"content hash {content_hash[:16]}, the version was trained on {recorded[:16]}"
        )


def reproduction_name(ref: ModelRef) -> str:
    """Registry name of a reproduction: ``<name>-reproduce`` (never the original's champion)."""
    return f"{ref.name}-reproduce"


def _sha256(path: Path) -> str | None:
    """SHA-256 of a version's weights as they load (decrypted when sealed: two sealings of the same
    tensors differ on disk)."""
    if not path.exists():
        return None
    return hashlib.sha256(read_artifact(path)).hexdigest()


def compare_reproduction(original: ModelRef, reproduced: ModelRef, tolerance: float,
                         plan: ReproductionPlan | None = None) -> ReproduceResult:
    """Old vs new metrics; within tolerance when the primary metric moved by at most
    ``tolerance`` (absolute)."""
    metric = original.primary_metric
    pairs = {}
    for name in sorted(set(original.metrics) | set(reproduced.metrics)):
        a, b = original.metrics.get(name), reproduced.metrics.get(name)
        pairs[name] = MetricPair(original=a, reproduced=b, diff=(b - a) if a is not None and b is not None else None)
    main = pairs.get(metric, MetricPair(original=None, reproduced=None, diff=None))
    within = main.diff is not None and math.isfinite(main.diff) and abs(main.diff) <= tolerance
    same = _sha256(original.weights_path)
    return ReproduceResult(
        model=original.spec, reproduction=reproduced.spec, metric=metric, tolerance=tolerance,
        original=main.original, reproduced=main.reproduced, diff=main.diff, within_tolerance=within,
        weights_identical=same is not None and same == _sha256(reproduced.weights_path),
        metrics=pairs, environment_differences=plan.minor_differences if plan else [],
    )


def render_reproduction(result: ReproduceResult) -> str:
    """Markdown: old vs new metrics and the verdict."""
    def f(v: float | None) -> str:
        return "—" if v is None else f"{v:.4f}"

    verdict = "within" if result.within_tolerance else "OUTSIDE"
    lines = [
        f"## Reproduction of {result.model} as {result.reproduction}: {verdict} tolerance",
        "",
        (f"{result.metric}: {f(result.original)} -> {f(result.reproduced)} (diff {f(result.diff)}, "
         f"tolerance {result.tolerance}); weights {'identical' if result.weights_identical else 'differ'}"),
        "",
        "| metric | original | reproduced | diff |",
        "|---|---|---|---|",
    ]
    lines += [f"| {k} | {f(p.original)} | {f(p.reproduced)} | {f(p.diff)} |" for k, p in result.metrics.items()]
    if result.environment_differences:
        lines += ["", "Environment differences: " + "; ".join(result.environment_differences)]
    return "\n".join(lines) + "\n"


def reproduce_summary(result: ReproduceResult) -> str:
    """Plain-text summary for the command line."""
    verdict = "within tolerance" if result.within_tolerance else "NOT within tolerance"
    head = (f"reproduce {result.model} -> {result.reproduction}: {result.metric} "
            f"{result.original} -> {result.reproduced} (diff {result.diff}, tolerance {result.tolerance}): {verdict}; "
            f"weights {'identical' if result.weights_identical else 'differ'}")
    rest = [f"  {k}: {p.original} -> {p.reproduced}" for k, p in result.metrics.items()]
    return "\n".join([head, *rest])


def reproduce_exit_code(result: ReproduceResult) -> int:
    """0 within tolerance, 1 otherwise (2 is for refusals and user errors)."""
    return 0 if result.within_tolerance else 1


plan_reproduction_task = task(plan_reproduction, name="plan-reproduction", cache_policy=NONE)
check_data_hash_task = task(check_data_hash, name="check-data-hash", cache_policy=NONE)


@task(name="compare-reproduction", cache_policy=NONE)
def compare_reproduction_task(original: ModelRef, reproduced: ModelRef, tolerance: float,
                              plan: ReproductionPlan) -> ReproduceResult:
    """Compare the two versions and publish the comparison as an artifact."""
    from tasks.evaluate import artifact_key, publish_eval_report

    result = compare_reproduction(original, reproduced, tolerance, plan)
    publish_eval_report(render_reproduction(result), key=artifact_key(f"{original.name}-reproduction"),
                        description="Original vs reproduced metrics")
    return result
