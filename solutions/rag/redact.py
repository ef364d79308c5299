"""Compliance redaction of the knowledge base: per-kind switches over the project's one
redactor (:mod:`infra.pii`: resident IDs, bank cards, mobiles, e-mail addresses), and its
precision/recall on a labelled set.

Applied to every document text, title and author before it is embedded or stored, to every
question before it is retrieved or sent to an LLM, and to every answer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from infra import pii
from infra.pii import KINDS, PLACEHOLDER, Kind, bank_card_valid, card_network, cn_id_valid, luhn_valid

__all__ = [
    "KINDS", "PLACEHOLDER", "Kind", "RedactionCase", "RedactionConfig", "RedactionCounts", "RedactionScore",
    "StreamRedactor", "bank_card_valid", "card_network", "cn_id_valid", "evaluate_redaction", "luhn_valid",
    "redact", "redaction_fingerprint",
]


@dataclass(frozen=True)
class RedactionConfig:
    """Which kinds are redacted (each can be switched off)."""

    email: bool = True
    cn_id: bool = True
    bank_card: bool = True
    mobile: bool = True

    def enabled(self) -> tuple[Kind, ...]:
        return tuple(k for k in KINDS if getattr(self, k))


@dataclass
class RedactionCounts:
    """How many of each kind were replaced."""

    counts: Counter = field(default_factory=Counter)

    def add(self, other: RedactionCounts | Counter) -> None:
        self.counts.update(other.counts if isinstance(other, RedactionCounts) else other)

    def as_dict(self) -> dict[str, int]:
        return {k: int(self.counts.get(k, 0)) for k in KINDS}


def redact(text: str, config: RedactionConfig = RedactionConfig()) -> tuple[str, Counter]:
    """Replace every enabled kind by its placeholder.

    Returns:
        The redacted text and a ``Counter`` of replacements per kind.
    """
    return pii.redact(text, config.enabled())


def redaction_fingerprint(config: RedactionConfig = RedactionConfig()) -> str:
    """Hash of what redaction does to a text under ``config`` (:func:`infra.pii.fingerprint`).

    Part of the ingest fingerprint, so switching a kind on/off or editing a rule re-processes
    the stored documents without a manual version bump.
    """
    return pii.fingerprint(config.enabled())


class StreamRedactor(pii.StreamRedactor):
    """:class:`infra.pii.StreamRedactor` under a :class:`RedactionConfig`."""

    def __init__(self, config: RedactionConfig = RedactionConfig(), hold: int = 96) -> None:
        super().__init__(config.enabled(), hold)


# ------------------------------------------------------------------------------------
# evaluation on a labelled set


@dataclass(frozen=True)
class RedactionCase:
    """One labelled snippet: the sensitive values it holds, by kind (empty for a look-alike).

    ``group`` names the family it belongs to (``mobile``, ``near-miss:order``, ...) for reports.
    """

    text: str
    expected: dict[str, int]
    group: str = ""


@dataclass(frozen=True)
class RedactionScore:
    """Precision and recall per kind and overall, counted in replaced values."""

    per_kind: dict[str, dict[str, float]]
    precision: float
    recall: float
    misses: tuple[str, ...] = ()  # texts where the counts differ from the labels


def evaluate_redaction(cases: Iterable[RedactionCase], config: RedactionConfig = RedactionConfig()) -> RedactionScore:
    """Precision/recall of :func:`redact` against labelled counts per kind."""
    tp: Counter = Counter()
    fp: Counter = Counter()
    fn: Counter = Counter()
    misses = []
    for case in cases:
        _, got = redact(case.text, config)
        for kind in KINDS:
            exp, have = case.expected.get(kind, 0), got.get(kind, 0)
            tp[kind] += min(exp, have)
            fp[kind] += max(have - exp, 0)
            fn[kind] += max(exp - have, 0)
        if any(case.expected.get(k, 0) != got.get(k, 0) for k in KINDS):
            misses.append(case.text)

    def ratio(a: int, b: int) -> float:
        return a / b if b else 1.0

    per_kind = {
        k: {"precision": ratio(tp[k], tp[k] + fp[k]), "recall": ratio(tp[k], tp[k] + fn[k]),
            "tp": tp[k], "fp": fp[k], "fn": fn[k]}
        for k in KINDS
    }
    t, p, n = sum(tp.values()), sum(fp.values()), sum(fn.values())
    return RedactionScore(per_kind=per_kind, precision=ratio(t, t + p), recall=ratio(t, t + n), misses=tuple(misses))
