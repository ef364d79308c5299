"""Compliance redaction: mainland China resident ID numbers (checksum verified), bank card
numbers (Luhn verified), mobile numbers and e-mail addresses become typed placeholders.

Applied to every text before it is embedded or stored, and to every answer.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import inspect
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["email", "cn_id", "bank_card", "mobile"]
KINDS: tuple[Kind, ...] = ("email", "cn_id", "bank_card", "mobile")  # order of application
PLACEHOLDER: dict[Kind, str] = {
    "email": "[EMAIL]",
    "cn_id": "[CN_ID]",
    "bank_card": "[BANK_CARD]",
    "mobile": "[MOBILE]",
}

_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_ID_CHECK = "10X98765432"

_EMAIL = re.compile(r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,24}\b")
_CN_ID = re.compile(r"(?<![0-9A-Za-z])[1-9]\d{16}[0-9Xx](?![0-9A-Za-z])")
# contiguous 13-19 digits, or the printed groupings 4-4-4-4(-1..3) and Amex 4-6-5 with one
# consistent separator (so runs of table numbers like "2013 2014 1234 5678 90" do not join up)
_CARD = re.compile(
    r"(?<![\d-])(?:\d{13,19}|\d{4}([ -])\d{4}\1\d{4}\1\d{4}(?:\1?\d{1,3})?|\d{4}([ -])\d{6}\2\d{5})(?![\d-])"
)
_MOBILE = re.compile(r"(?<![\d+])(?:(?:\+|00)86[ -]?)?1[3-9]\d(?:[ -]?\d{4}){2}(?!\d)")


def cn_id_valid(candidate: str) -> bool:
    """True for an 18-character resident ID with a valid birth date and ISO 7064 checksum."""
    if len(candidate) != 18 or not candidate[:17].isdigit():
        return False
    try:
        birth = dt.date(int(candidate[6:10]), int(candidate[10:12]), int(candidate[12:14]))
    except ValueError:
        return False
    if not dt.date(1900, 1, 1) <= birth <= dt.date.today():
        return False
    total = sum(int(d) * w for d, w in zip(candidate[:17], _ID_WEIGHTS, strict=True))
    return _ID_CHECK[total % 11] == candidate[17].upper()


def luhn_valid(digits: str) -> bool:
    """Luhn checksum of a digit string."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def bank_card_valid(candidate: str) -> bool:
    """13-19 digits (spaces/dashes allowed), a card-network first digit (2-6) and Luhn valid."""
    digits = re.sub(r"[ -]", "", candidate)
    if not 13 <= len(digits) <= 19 or digits[0] not in "23456":
        return False
    if len(set(digits)) == 1:
        return False
    return luhn_valid(digits)


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


def _sub(pattern: re.Pattern, text: str, kind: Kind, check, counts: Counter) -> str:
    def repl(m: re.Match) -> str:
        if check is None or check(m.group(0)):
            counts[kind] += 1
            return PLACEHOLDER[kind]
        return m.group(0)

    return pattern.sub(repl, text)


def _rules() -> dict[Kind, tuple[re.Pattern, Callable[[str], bool] | None]]:
    return {
        "email": (_EMAIL, None),
        "cn_id": (_CN_ID, cn_id_valid),
        "bank_card": (_CARD, bank_card_valid),
        "mobile": (_MOBILE, None),
    }


def redact(text: str, config: RedactionConfig = RedactionConfig()) -> tuple[str, Counter]:
    """Replace every enabled kind by its placeholder.

    Returns:
        The redacted text and a ``Counter`` of replacements per kind.
    """
    counts: Counter = Counter()
    rules = _rules()
    for kind in config.enabled():
        pattern, check = rules[kind]
        text = _sub(pattern, text, kind, check, counts)
    return text, counts


def redaction_fingerprint(config: RedactionConfig = RedactionConfig()) -> str:
    """Hash of what redaction does to a text under ``config``: the enabled kinds in order, and
    for each its pattern, flags, placeholder and validator code (``luhn_valid`` included).

    Part of the ingest fingerprint, so switching a kind on/off or editing a rule re-processes
    the stored documents without a manual version bump.
    """
    rules = _rules()
    parts = []
    for kind in config.enabled():
        pattern, check = rules[kind]
        code = inspect.getsource(check) if check else ""
        if check is bank_card_valid:
            code += inspect.getsource(luhn_valid)
        parts.append(f"{kind}\x1f{pattern.pattern}\x1f{pattern.flags}\x1f{PLACEHOLDER[kind]}\x1f{code}")
    parts.append(inspect.getsource(_sub))
    return hashlib.sha256("\x1e".join(parts).encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------
# evaluation on a labelled set


@dataclass(frozen=True)
class RedactionCase:
    """One labelled snippet: the sensitive values it holds, by kind (empty for a look-alike)."""

    text: str
    expected: dict[str, int]


@dataclass(frozen=True)
class RedactionScore:
    """Precision and recall per kind and overall, counted in replaced values."""

    per_kind: dict[str, dict[str, float]]
    precision: float
    recall: float


def evaluate_redaction(cases: Iterable[RedactionCase], config: RedactionConfig = RedactionConfig()) -> RedactionScore:
    """Precision/recall of :func:`redact` against labelled counts per kind."""
    tp: Counter = Counter()
    fp: Counter = Counter()
    fn: Counter = Counter()
    for case in cases:
        _, got = redact(case.text, config)
        for kind in KINDS:
            exp, have = case.expected.get(kind, 0), got.get(kind, 0)
            tp[kind] += min(exp, have)
            fp[kind] += max(have - exp, 0)
            fn[kind] += max(exp - have, 0)

    def ratio(a: int, b: int) -> float:
        return a / b if b else 1.0

    per_kind = {
        k: {"precision": ratio(tp[k], tp[k] + fp[k]), "recall": ratio(tp[k], tp[k] + fn[k]),
            "tp": tp[k], "fp": fp[k], "fn": fn[k]}
        for k in KINDS
    }
    t, p, n = sum(tp.values()), sum(fp.values()), sum(fn.values())
    return RedactionScore(per_kind=per_kind, precision=ratio(t, t + p), recall=ratio(t, t + n))


class StreamRedactor:
    """Redact text that arrives in pieces (a streamed LLM answer) before it is shown.

    The last ``hold`` characters stay buffered, and text is released only at a point that
    cannot lie inside an e-mail, an ID or a (space-separated) card or phone number, so a value
    split across pieces is still caught.
    """

    def __init__(self, config: RedactionConfig = RedactionConfig(), hold: int = 96) -> None:
        self.config = config
        self.hold = hold
        self._buf = ""

    @staticmethod
    def _in_run(text: str, i: int) -> bool:
        ch = text[i]
        if ch.isascii() and (ch.isalnum() or ch in "@._%+-"):
            return True
        return ch in " -" and i > 0 and text[i - 1].isdigit()

    def feed(self, piece: str) -> str:
        """Add a piece; return the redacted text that is safe to show now."""
        self._buf += piece
        red, _ = redact(self._buf, self.config)
        cut = len(red) - self.hold
        while cut > 0 and (self._in_run(red, cut - 1) or self._in_run(red, cut)):
            cut -= 1
        if cut <= 0:
            return ""
        self._buf = red[cut:]
        return red[:cut]

    def flush(self) -> str:
        """The rest, redacted."""
        red, _ = redact(self._buf, self.config)
        self._buf = ""
        return red
