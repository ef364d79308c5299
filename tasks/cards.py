"""Model cards: what a registered version is for, what it was trained on, how sure its
figures are, how it compares with the baseline and the champion, and what derives from it.

A card is stored twice in the version folder: ``card.json`` (the typed :class:`ModelCard`)
and ``card.md`` (its rendering), and published as a Markdown artifact ``<model>-card``.
The figures come with bootstrap 95% intervals (:mod:`tasks.stats`); comparisons are paired
bootstrap tests on the same test rows. When a variant (a compressed or exported model whose
``parent`` is this version) is registered later, :func:`refresh_card` lists it on the card.

The vertical supplies the domain parts (intended use, features, limitations, per-period
tables) as plain values; this module knows nothing of fraud or sensors.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from prefect import task
from prefect.cache_policies import NONE
from pydantic import BaseModel, ConfigDict, Field

from infra.errors import RegistryError
from infra.registry import ChampionComparison, ModelRef, ModelRegistry
from tasks.lineage import Lineage, read_lineage, render_lineage
from tasks.stats import Interval, PairedTest, bootstrap_ci, paired_bootstrap

log = logging.getLogger(__name__)

#: Seed of the bootstrap resampling: fixed, so a model card's intervals and paired tests are the same on
#: every re-run (a caller may pass its own seed).
BOOTSTRAP_SEED = 0
#: Bootstrap resamples of a card's intervals and paired tests (a caller may pass its own): 1000, the usual
#: count for 95% percentile intervals (Efron and Tibshirani suggest about 1000 or more for intervals).
BOOTSTRAP_RESAMPLES = 1000
CARD_JSON = "card.json"
CARD_MD = "card.md"


class ChampionCheck(BaseModel):
    """A candidate compared with a champion version on the candidate's test rows."""

    model_config = ConfigDict(frozen=True)

    champion: str = Field(description="name:version of the champion scored.")
    version: int
    test: PairedTest | None = Field(description="Paired test (None: the champion could not score this data).")

    def comparison(self) -> ChampionComparison:
        """The registry's view of it (for compare-and-swap promotion)."""
        return ChampionComparison(champion_version=self.version,
                                  champion_value=self.test.b if self.test is not None else None,
                                  p_value=self.test.p_value if self.test is not None else None)


def as_comparison(check: ChampionCheck | None) -> ChampionComparison | None:
    """``check.comparison()``, or None without a champion."""
    return check.comparison() if check is not None else None


class Comparison(BaseModel):
    """One paired comparison shown on a card."""

    model_config = ConfigDict(frozen=True)

    against: str = Field(description="What the model is compared with (baseline, champion v3).")
    test: PairedTest


class Variant(BaseModel):
    """A registered version derived from this one (compressed, exported, fine-tuned)."""

    model_config = ConfigDict(frozen=True)

    spec: str
    kind: str
    method: str | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    created_at: str


class Section(BaseModel):
    """A table of rows (e.g. per-day metrics)."""

    model_config = ConfigDict(frozen=True)

    title: str
    columns: list[str]
    rows: list[list[Any]]
    note: str | None = None


class ModelCard(BaseModel):
    """Everything a reviewer asks of a model version."""

    model_config = ConfigDict(frozen=True)

    model: str = Field(description="name:version")
    title: str
    intended_use: str
    data: dict[str, Any] = Field(description="Source, content hash, period and rows per split.")
    features: list[str]
    metrics: list[Interval]
    comparisons: list[Comparison] = Field(default_factory=list)
    sections: list[Section] = Field(default_factory=list)
    limitations: list[str] = Field(default_factory=list)
    promotion: dict[str, Any] | None = None
    variants: list[Variant] = Field(default_factory=list)
    lineage: Lineage | None = None


# ------------------------------------------------------------------------------------
# figures


def intervals(y: np.ndarray, s: np.ndarray, metrics: Sequence[str], *, resamples: int | None = None,
              seed: int | None = None, groups: np.ndarray | None = None,
              custom: Mapping[str, Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]] | None = None,
              ) -> list[Interval]:
    """Bootstrap 95% intervals of ``metrics`` (:data:`BOOTSTRAP_RESAMPLES`, :data:`BOOTSTRAP_SEED`);
    ``groups``: a cluster id per row, whole clusters resampled; ``custom``: a domain's metrics by
    name, as ``fn(y, s, w)`` (see ``tasks.stats.bootstrap_ci``)."""
    resamples = resamples or BOOTSTRAP_RESAMPLES
    seed = BOOTSTRAP_SEED if seed is None else seed
    custom = custom or {}
    return [bootstrap_ci(m, y, s, resamples=resamples, seed=seed, groups=groups, fn=custom.get(m)) for m in metrics]


def paired(metric: str, y: np.ndarray, s_candidate: np.ndarray, s_other: np.ndarray, *,
           resamples: int | None = None, seed: int | None = None, groups: np.ndarray | None = None) -> PairedTest:
    """Paired bootstrap of 'the candidate is better' (:data:`BOOTSTRAP_RESAMPLES`, :data:`BOOTSTRAP_SEED`);
    ``groups``: a cluster id per row, whole clusters resampled."""
    return paired_bootstrap(metric, y, s_candidate, s_other, resamples=resamples or BOOTSTRAP_RESAMPLES,
                            seed=BOOTSTRAP_SEED if seed is None else seed, groups=groups)


def check_champion(registry: ModelRegistry, name: str, metric: str, y: np.ndarray, s: np.ndarray,
                   score: Callable[[ModelRef], np.ndarray | None], champion: ModelRef | None = None,
                   ) -> ChampionCheck | None:
    """The candidate's scores ``s`` compared with the champion's (``score(champion)``) on the
    same rows; None without a champion. ``score`` returns None (or raises ValueError/
    KeyError/RuntimeError) when the champion cannot score this data."""
    if champion is None:
        champion = registry.champion(name) if name in registry.models() else None
    if champion is None:
        return None
    try:
        theirs = score(champion)
    except (KeyError, ValueError, RuntimeError) as exc:
        log.warning("could not score champion %s on this data (%s)", champion.spec, exc)
        theirs = None
    test = paired(metric, y, s, theirs) if theirs is not None else None
    return ChampionCheck(champion=champion.spec, version=champion.version, test=test)


def variants_of(registry: ModelRegistry, ref: ModelRef) -> list[Variant]:
    """Registered versions whose parent is ``ref`` (any model name), oldest first."""
    found = []
    for name in registry.models():
        for v in registry.versions(name):
            if v.parent == ref.spec and v.spec != ref.spec:
                method = v.params.get("compression", {}).get("method") if isinstance(
                    v.params.get("compression"), dict) else v.tags.get("kind")
                found.append(Variant(spec=v.spec, kind=v.kind, method=method, metrics=v.metrics,
                                     created_at=v.created_at))
    return sorted(found, key=lambda v: v.created_at)


# ------------------------------------------------------------------------------------
# rendering and storing


def _f(value: float | None, digits: int = 4) -> str:
    return "—" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:.{digits}f}"


def _cell(value: Any) -> str:
    return _f(value) if isinstance(value, float) else str(value)


def render_card(card: ModelCard) -> str:
    """The card as Markdown."""
    lines = [f"# Model card: {card.model}", "", f"**{card.title}**", "", "## Intended use", "", card.intended_use, ""]
    lines += ["## Data", ""]
    lines += [f"- {k}: {v}" for k, v in card.data.items()]
    lines += ["", "## Features", "", ", ".join(f"`{f}`" for f in card.features) or "—", ""]
    lines += ["## Test metrics (bootstrap 95% intervals)", "", "| metric | value | 95% interval | n |",
              "|---|---|---|---|"]
    lines += [f"| {m.metric} | {_f(m.value)} | [{_f(m.low)}, {_f(m.high)}] | {m.n} |" for m in card.metrics]
    if card.comparisons:
        lines += ["", "## Comparisons (paired bootstrap on the same test rows)", "",
                  "| against | metric | this model | other | difference [95%] | p (this model better) |",
                  "|---|---|---|---|---|---|"]
        for c in card.comparisons:
            t = c.test
            lines.append(f"| {c.against} | {t.metric} | {_f(t.a)} | {_f(t.b)} | {_f(t.diff)} "
                         f"[{_f(t.diff_low)}, {_f(t.diff_high)}] | {_f(t.p_value)} |")
    for section in card.sections:
        lines += ["", f"## {section.title}", "", "| " + " | ".join(section.columns) + " |",
                  "|" + "---|" * len(section.columns)]
        lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in section.rows]
        if section.note:
            lines += ["", section.note]
    if card.promotion:
        verdict = ("waits for approval" if card.promotion.get("awaiting_approval")
                   else "promoted" if card.promotion.get("promoted") else "not promoted")
        lines += ["", "## Champion rule", "", f"{verdict}: {card.promotion.get('reason', '')}"]
        approval = card.promotion.get("approval")
        if approval:
            lines += ["", (f"Approval (four eyes): {'approved' if approval.get('approved') else 'rejected'} by "
                           f"{approval.get('decided_by') or 'nobody (expired)'} at {approval.get('decided_at')} "
                           f"(requested by {approval.get('requested_by')}, flow run `{approval.get('run_id')}`): "
                           f"{approval.get('reason')}")]
        if card.promotion.get("trail_sha256"):
            lines += ["", f"Registry trail head after the decision: `{card.promotion['trail_sha256']}`"]
    lines += ["", "## Known limitations", ""] + [f"- {text}" for text in card.limitations]
    lines += ["", "## Variants derived from it", ""]
    if card.variants:
        lines += ["| version | kind | method | metrics |", "|---|---|---|---|"]
        lines += [f"| {v.spec} | {v.kind} | {v.method or '—'} | "
                  + ", ".join(f"{k} {_f(x)}" for k, x in sorted(v.metrics.items())[:4]) + " |" for v in card.variants]
    else:
        lines.append("none yet")
    if card.lineage is not None:
        lines += ["", "## Lineage", "", render_lineage(card.lineage)]
    return "\n".join(lines) + "\n"


def write_card(registry: ModelRegistry, ref: ModelRef, card: ModelCard) -> str:
    """Store ``card.json`` and ``card.md`` in the version folder; the Markdown."""
    markdown = render_card(card)
    registry.write_version_file(ref, CARD_JSON, card.model_dump_json(indent=2))
    registry.write_version_file(ref, CARD_MD, markdown)
    return markdown


def read_card(ref: ModelRef) -> ModelCard | None:
    """The card stored with a version, if any."""
    from pathlib import Path

    path = Path(ref.path) / CARD_JSON
    return ModelCard.model_validate_json(path.read_text()) if path.exists() else None


def build_card(
    ref: ModelRef,
    *,
    title: str,
    intended_use: str,
    features: Sequence[str],
    metrics: Sequence[Interval],
    comparisons: Sequence[Comparison] = (),
    sections: Sequence[Section] = (),
    limitations: Sequence[str] = (),
    promotion: Mapping[str, Any] | None = None,
    data: Mapping[str, Any] | None = None,
    registry: ModelRegistry | None = None,
) -> ModelCard:
    """A card for ``ref`` with its stored lineage, data summary and current variants."""
    registry = registry or ModelRegistry()
    lineage = read_lineage(ref)
    summary: dict[str, Any] = dict(data or {})
    if lineage is not None:
        summary.setdefault("source", lineage.data.source or "—")
        summary.setdefault("content hash", lineage.data.content_hash)
        if lineage.data.period:
            summary.setdefault("period", ", ".join(f"{k} {v}" for k, v in lineage.data.period.items()))
        if lineage.data.rows:
            summary.setdefault("rows per split", ", ".join(f"{k} {v}" for k, v in lineage.data.rows.items()))
    elif ref.data_hash:
        summary.setdefault("content hash", ref.data_hash)
    return ModelCard(
        model=ref.spec, title=title, intended_use=intended_use, data=summary, features=list(features),
        metrics=list(metrics), comparisons=list(comparisons), sections=list(sections), limitations=list(limitations),
        promotion=dict(promotion) if promotion else None, variants=variants_of(registry, ref), lineage=lineage,
    )


def small_sample_limitations(metrics: Sequence[Interval], positives: int | None = None) -> list[str]:
    """Limitations the figures themselves show (wide intervals, few positives)."""
    notes = []
    if positives is not None and positives < 100:
        notes.append(f"The test period holds only {positives} positive cases: ranking metrics are noisy.")
    for m in metrics:
        if math.isfinite(m.low) and math.isfinite(m.high) and m.high - m.low > 0.1 * max(abs(m.value), 1e-9):
            notes.append(f"{m.metric} is known only to within [{_f(m.low)}, {_f(m.high)}] (95%): "
                         "differences smaller than that are not evidence.")
    return notes


def refresh_card(registry: ModelRegistry, ref: ModelRef) -> str | None:
    """Re-render a stored card with the variants registered since; None without a card."""
    card = read_card(ref)
    if card is None:
        return None
    card = card.model_copy(update={"variants": variants_of(registry, ref)})
    return write_card(registry, ref, card)


def publish_card(markdown: str, name: str) -> None:
    """Publish the card as the Markdown artifact ``<name>-card``."""
    from tasks.evaluate import artifact_key, publish_eval_report

    publish_eval_report(markdown, key=artifact_key(f"{name}-card"), description=f"Model card of {name}")


def refresh_parent_card(ref: ModelRef) -> str | None:
    """After registering a variant: refresh (and re-publish) its parent's card."""
    if not ref.parent:
        return None
    registry = ModelRegistry()
    try:
        parent = registry.resolve(ref.parent)
    except (RegistryError, ValueError) as exc:  # a parent outside this registry: nothing to refresh
        log.info("no card refresh for %s: %s", ref.parent, exc)
        return None
    markdown = refresh_card(registry, parent)
    if markdown is not None:
        publish_card(markdown, parent.name)
    return markdown


refresh_parent_card_task = task(refresh_parent_card, name="refresh-model-card", cache_policy=NONE,
                                description="List a newly registered variant on its parent's model card.")
