"""Online evidence: the served scores of each version, joined to the labels that arrived later,
as realised metrics per version with bootstrap intervals, and a paired comparison of the
challenger with the champion on the same transactions (or, for an error metric, the same
predictions: a RUL judged once the asset failed).

The serving API records every served score in its score log (both versions score every row
when a challenger is paired, in shadow and in split mode) and every label given to
``/v1/fraud/labels`` (:mod:`infra.serving.challenger`); label files (transaction_id, label) can
be added. A rule (:class:`EvidenceRule`: metric, minimum labels and positives, significance)
turns the paired test into a recommendation: ``promote`` the challenger, ``keep`` the champion,
or ``insufficient`` evidence. Promotion goes through :func:`tasks.champion.promote_by_hand`, so a
model that needs approval waits for a second person instead of moving.

Labels are evidence only as good as whoever sent them. The API records each label with the key
that sent it (``source``), only for transactions it scored; label files count as the source
``file``. The first served score of a (version, transaction) is the one judged: scoring the same
id again later cannot rewrite the evidence. The rule reports the labels per source and refuses to
recommend (``insufficient``) when one source sent more than ``max_source_share`` of the labels it
judges, or when the API's labels arrived more than ``max_label_rate_ratio`` times faster than the
transactions were scored (a burst of labels right after the scores is what steering looks like;
send a backlog as a label file through the monitor's inbox instead).

A vertical whose truth is not a label per served id (the sensor's failure events, which give
the true RUL of every prediction made before them) passes a ``judge``: a function turning the
score-log rows into judged rows, their true values by id and, where several rows share one
subject (an asset predicted many times), the subject of each id. The bootstrap then draws
whole subjects, so many predictions of a few assets do not pass for many independent cases.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from infra.home import home_layout
from infra.registry import CHALLENGER, CHAMPION, ModelRegistry, PromotionDecision
from infra.serving.challenger import LABEL_ROLE, SCORES_DIR, read_score_log
from tasks.cards import intervals, paired
from tasks.stats import Interval, PairedTest

log = logging.getLogger(__name__)


#: Metrics of a 0/1 label (the rule counts positives); the others are errors of a true value.
CLASSIFICATION = ("pr_auc", "roc_auc")
#: Score-log rows, the true value of each judged id, and (or None) the subject of each id.
Judged = tuple[Sequence[Mapping[str, Any]], Mapping[str, float], Mapping[str, str] | None]


class EvidenceRule(BaseModel):
    """When the online evidence recommends the challenger."""

    model_config = ConfigDict(frozen=True)

    metric: Literal["pr_auc", "roc_auc", "rmse", "mae"] = Field(
        default="pr_auc", description="Metric compared (pr_auc, roc_auc: higher is better; rmse, mae: lower).")
    min_labels: int = Field(default=200, ge=1, description="Labelled rows both versions scored, at least.")
    min_positives: int = Field(default=10, ge=1, description="Positive labels among them, at least (pr_auc, "
                               "roc_auc).")
    min_subjects: int = Field(default=1, ge=1, description="Distinct subjects among them (e.g. failed assets), at "
                              "least, where rows are grouped by subject.")
    alpha: float = Field(default=0.05, gt=0, lt=1, description="Significance of the paired bootstrap test.")
    max_source_share: float = Field(default=0.8, gt=0, le=1, description="Largest share of the judged labels one "
                                    "source (API key, or the label files) may have sent (1: no limit).")
    max_label_rate_ratio: float = Field(default=10.0, gt=0, description="Labels sent through the API may arrive at "
                                        "most this many times faster than the transactions were scored (each rate "
                                        "over at least a minute).")


#: Where the minute floor of the rate check comes from: a batch sent within a minute is one minute.
RATE_FLOOR_S = 60.0
UNATTRIBUTED = "unattributed"
FILE_SOURCE = "file"


class LabelOrigin(BaseModel):
    """Who sent a label, and when it arrived (None: a label file, no arrival time)."""

    model_config = ConfigDict(frozen=True)

    source: str
    at: str | None = None


class VersionEvidence(BaseModel):
    """One version's realised metric on the labelled transactions it scored."""

    model_config = ConfigDict(frozen=True)

    version: int
    roles: list[str] = Field(description="How it served: champion, challenger (or both, over time).")
    scored: int = Field(description="Transactions it scored.")
    decided: int = Field(description="Of those, how many it answered (the response carried its score).")
    labelled: int
    positives: int = Field(description="Positive labels among the labelled (0 for an error metric).")
    subjects: int | None = Field(default=None, description="Distinct subjects among the labelled, where rows are "
                                 "grouped by subject (the bootstrap draws whole subjects).")
    metric: Interval | None = Field(description="The metric with its 95% bootstrap interval (None: no labels).")


class OnlineEvidence(BaseModel):
    """The evidence flow's result."""

    model_config = ConfigDict(frozen=True)

    model: str
    rule: EvidenceRule
    champion_version: int | None
    challenger_version: int | None
    labels: int = Field(description="Distinct labelled transaction ids read.")
    versions: list[VersionEvidence]
    paired: PairedTest | None = Field(description="Challenger vs champion on the labelled transactions both scored.")
    recommendation: Literal["promote", "keep", "insufficient", "no_challenger"]
    reason: str
    promotion: PromotionDecision | None = Field(default=None, description="The move, when asked to act on it.")
    label_sources: dict[str, int] = Field(default_factory=dict, description="Judged labels (scored by both) per "
                                          "source: the API key that sent them, or 'file'.")
    rows_are: str = Field(default="transactions", description="What one judged row is, in words.")
    subjects_are: str = Field(default="subjects", description="What a subject is (grouped rows), in words.")


def _latest(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[int, str], Mapping[str, Any]]:
    """(version, id) -> its first served score (the id scored again later does not replace it)."""
    out: dict[tuple[int, str], Mapping[str, Any]] = {}
    for r in rows:
        out.setdefault((int(r["version"]), str(r["id"])), r)
    return out


def _rate(times: Sequence[str]) -> float:
    """Items per second over their arrival span (at least :data:`RATE_FLOOR_S`)."""
    stamps = sorted(dt.datetime.fromisoformat(t) for t in times)
    return len(stamps) / max((stamps[-1] - stamps[0]).total_seconds(), RATE_FLOOR_S) if stamps else 0.0


def label_doubt(both: Sequence[str], provenance: Mapping[str, LabelOrigin], served: Sequence[Mapping[str, Any]],
                rule: EvidenceRule) -> tuple[dict[str, int], str | None]:
    """(labels per source among the judged ids, why the labels cannot be trusted, or None)."""
    sources = Counter(provenance[i].source if i in provenance else UNATTRIBUTED for i in both)
    if not both:
        return dict(sources), None
    top, count = sources.most_common(1)[0]
    if count / len(both) > rule.max_source_share:
        return dict(sources), (f"one label source ({top}) sent {count} of the {len(both)} judged labels "
                               f"({count / len(both):.0%} > {rule.max_source_share:.0%}): labels from one sender "
                               "could steer the comparison")
    sent = [provenance[i].at for i in both if i in provenance and provenance[i].at]
    scored = [str(r["at"]) for r in served if r["role"] == CHAMPION]
    label_rate, score_rate = _rate(sent), _rate(scored)
    if sent and score_rate and label_rate > rule.max_label_rate_ratio * score_rate:
        return dict(sources), (f"labels arrived {label_rate / score_rate:.0f} times faster than the transactions were "
                               f"scored (limit {rule.max_label_rate_ratio:g}): a burst right after the scores; send a "
                               "backlog as a label file")
    return dict(sources), None


def _groups(ids: Sequence[str], groups: Mapping[str, str] | None) -> np.ndarray | None:
    return None if groups is None else np.array([groups[i] for i in ids], dtype=object)


def _better(test: PairedTest, alpha: float) -> bool:
    """The challenger (A) is better than the champion, in the metric's direction, at ``alpha``."""
    return (test.diff > 0 if test.higher_is_better else test.diff < 0) and test.p_value < alpha


def collect_evidence(name: str, score_rows: Sequence[Mapping[str, Any]], labels: Mapping[str, float],
                     rule: EvidenceRule, champion: int | None, challenger: int | None, *,
                     groups: Mapping[str, str] | None = None, noun: str = "transactions",
                     subject: str = "subjects", provenance: Mapping[str, LabelOrigin] | None = None) -> OnlineEvidence:
    """Realised metrics per version and the paired test, from score-log rows and labels (or true
    values) by id; ``groups`` gives each labelled id's subject (cluster bootstrap); ``noun`` and
    ``subject`` name the rows and the subjects in the reason; ``provenance`` (who sent each label)
    turns on the label-source checks (:func:`label_doubt`)."""
    served = [r for r in score_rows if r["role"] != LABEL_ROLE]
    latest = _latest(served)
    classify = rule.metric in CLASSIFICATION
    versions: list[VersionEvidence] = []
    for version in sorted({v for v, _ in latest}):
        ids = [i for v, i in latest if v == version]
        rows = [latest[(version, i)] for i in ids]
        known = [i for i in ids if i in labels]
        y = np.array([labels[i] for i in known], dtype="float64")
        s = np.array([latest[(version, i)]["score"] for i in known], dtype="float64")
        defined = 0 < y.sum() < len(y) if classify else len(known) >= 2
        metric = intervals(y, s, [rule.metric], groups=_groups(known, groups))[0] if known and defined else None
        versions.append(VersionEvidence(
            version=version, roles=sorted({r["role"] for r in served if int(r["version"]) == version}),
            scored=len(ids), decided=sum(bool(r["decided"]) for r in rows), labelled=len(known),
            positives=int(y.sum()) if classify else 0,
            subjects=len({groups[i] for i in known}) if groups is not None else None, metric=metric))
    test: PairedTest | None = None
    sources: dict[str, int] = {}
    if champion is None or challenger is None or challenger == champion:
        recommendation, reason = "no_challenger", "no challenger version to compare (set one: flows.registry challenger)"
    else:
        both = [i for v, i in latest if v == challenger and (champion, i) in latest and i in labels]
        y = np.array([labels[i] for i in both], dtype="float64")
        positives = int(y.sum()) if classify else 0
        subjects = len({groups[i] for i in both}) if groups is not None else None
        counted = (f"{positives} positive" if classify else
                   f"{subjects} {subject}" if subjects is not None else "true values")
        short = (len(both) < rule.min_labels
                 or (classify and (positives < rule.min_positives or positives == len(both)))
                 or (subjects is not None and subjects < rule.min_subjects))
        doubt = None
        if provenance is not None:
            sources, doubt = label_doubt(both, provenance, served, rule)
        if doubt is not None and not short:
            recommendation, reason = "insufficient", f"{len(both)} labelled {noun}, but {doubt}"
        elif short:
            recommendation = "insufficient"
            need = (f"{rule.min_positives} positives" if classify else
                    f"{rule.min_subjects} {subject}" if subjects is not None else "no more")
            reason = (f"{len(both)} labelled {noun} scored by both v{champion} and v{challenger}, {counted}; "
                      f"the rule needs {rule.min_labels} and {need}")
        else:
            s_ch = np.array([latest[(challenger, i)]["score"] for i in both], dtype="float64")
            s_champ = np.array([latest[(champion, i)]["score"] for i in both], dtype="float64")
            test = paired(rule.metric, y, s_ch, s_champ, groups=_groups(both, groups))
            better = _better(test, rule.alpha)
            recommendation = "promote" if better else "keep"
            reason = (f"on {len(both)} labelled {noun} ({counted}) {rule.metric} of challenger "
                      f"v{challenger} {test.a:.4f} vs champion v{champion} {test.b:.4f} (difference {test.diff:+.4f}, "
                      f"95% interval {test.diff_low:+.4f} to {test.diff_high:+.4f}, p = {test.p_value:.4f}): "
                      + ("better at the rule's significance" if better else
                         f"not better at alpha {rule.alpha}"))
    return OnlineEvidence(model=name, rule=rule, champion_version=champion, challenger_version=challenger,
                          labels=len(labels), versions=versions, paired=test, recommendation=recommendation,
                          reason=reason, rows_are=noun, subjects_are=subject, label_sources=sources)


def read_labels(score_rows: Sequence[Mapping[str, Any]], files: Sequence[Mapping[str, int]] = ()) -> dict[str, int]:
    """Labels by transaction id: those the API recorded, then those of label files (a later one wins)."""
    out = {str(r["id"]): int(r["score"]) for r in score_rows if r["role"] == LABEL_ROLE}
    for extra in files:
        out.update({str(k): int(v) for k, v in extra.items()})
    return out


def label_provenance(score_rows: Sequence[Mapping[str, Any]],
                     files: Sequence[Mapping[str, int]] = ()) -> dict[str, LabelOrigin]:
    """Who sent the label :func:`read_labels` keeps for each id (the API key, ``file``), and when."""
    out = {str(r["id"]): LabelOrigin(source=str(r.get("source") or UNATTRIBUTED), at=str(r["at"]))
           for r in score_rows if r["role"] == LABEL_ROLE}
    for extra in files:
        out.update({str(k): LabelOrigin(source=FILE_SOURCE) for k in extra})
    return out


def online_evidence(name: str, rule: EvidenceRule | None = None, *, label_files: Sequence[Mapping[str, int]] = (),
                    promote: bool = False, registry: ModelRegistry | None = None,
                    scores_dir: Path | None = None,
                    judge: Callable[[Sequence[Mapping[str, Any]]], Judged] | None = None,
                    noun: str = "transactions", subject: str = "subjects") -> OnlineEvidence:
    """Evidence for ``name``'s champion and challenger from the home's score log; with ``promote``
    and a ``promote`` recommendation, the challenger is promoted (waiting for approval where the
    model needs it: inside a flow run). ``judge`` (see the module docstring) replaces the labels
    by id (the API's and ``label_files``) with the vertical's own truth."""
    from tasks.champion import promote_by_hand

    registry = registry or ModelRegistry()
    rule = rule or EvidenceRule()
    aliases = registry.aliases(name) if name in registry.models() else {}
    rows = read_score_log(scores_dir or home_layout().serving() / SCORES_DIR, name)
    labels: Mapping[str, float]
    groups: Mapping[str, str] | None = None
    provenance = None
    if judge is None:
        labels, provenance = read_labels(rows, label_files), label_provenance(rows, label_files)
    else:
        rows, labels, groups = judge(rows)
    evidence = collect_evidence(name, rows, labels, rule, aliases.get(CHAMPION), aliases.get(CHALLENGER),
                                groups=groups, noun=noun, subject=subject, provenance=provenance)
    if promote and evidence.recommendation == "promote":
        log.info("online evidence recommends %s:%s: %s", name, evidence.challenger_version, evidence.reason)
        decision = promote_by_hand(f"{name}:{evidence.challenger_version}", registry)
        evidence = evidence.model_copy(update={"promotion": decision})
    return evidence


def evidence_markdown(evidence: OnlineEvidence) -> str:
    """The evidence as a Prefect markdown artifact: one row per version, then the paired test."""
    rule = evidence.rule
    grouped = any(v.subjects is not None for v in evidence.versions)
    classify = rule.metric in CLASSIFICATION
    counted = (f"{rule.min_positives} positives" if classify else
               f"{rule.min_subjects} {evidence.subjects_are} (whole {evidence.subjects_are} resampled)" if grouped
               else "true values")
    lines = [f"# Online evidence: {evidence.model}", "",
             f"**Recommendation: {evidence.recommendation}.** {evidence.reason}.", "",
             (f"Rule: {rule.metric} ({'higher' if classify else 'lower'} is better), at least {rule.min_labels} "
              f"labelled {evidence.rows_are} and {counted} scored by both, paired bootstrap at alpha {rule.alpha}. "
              f"Labels read: {evidence.labels}."), "",
             (f"| version | served as | scored | answered | labelled | "
              f"{'positives' if classify else evidence.subjects_are} | {rule.metric} (95% CI) |"),
             "|---|---|---|---|---|---|---|"]
    for v in evidence.versions:
        m = f"{v.metric.value:.4f} ({v.metric.low:.4f} to {v.metric.high:.4f})" if v.metric else "n/a"
        count = v.positives if classify else (v.subjects if v.subjects is not None else "n/a")
        lines.append(f"| v{v.version} | {', '.join(v.roles)} | {v.scored} | {v.decided} | {v.labelled} | "
                     f"{count} | {m} |")
    if evidence.label_sources:
        total = sum(evidence.label_sources.values())
        lines += ["", "| label source | judged labels | share |", "|---|---|---|"]
        lines += [f"| {source} | {n} | {n / total:.0%} |" for source, n in
                  sorted(evidence.label_sources.items(), key=lambda item: -item[1])]
    if evidence.promotion is not None:
        lines += ["", f"Promotion: {evidence.promotion.reason}"]
    return "\n".join(lines)
