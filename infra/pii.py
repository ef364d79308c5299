"""The personal-data boundary: one redactor for every text, name and path that leaves its source.

Four kinds become typed placeholders: e-mail addresses, mainland China resident ID numbers
(ISO 7064 check digit and a real birth date), bank card numbers (Luhn **and** a card-network
prefix/length, or card words right before them) and Chinese mobile numbers. Digits may be
full-width (``１３９…``) or of another script (Arabic-Indic ``١٣٩…``), grouped
(``110105 19900307 8879``, ``139.1234.5678``, ``139/1234/5678``,
``+86 139 1234 5678``) or glued to letters (``RecordID4403…``). Look-alikes survive: 18-digit
order numbers, EAN-13 barcodes, timestamps, landlines, version strings.

Three entry points, one rule set:

- :func:`redact` / :func:`redact_text` for free text (document text, titles, authors, mail
  subjects, questions, answers, error messages): ``[MOBILE]``, ``[CN_ID]``, ...;
- :func:`redact_path` for file, folder and archive-member names, which are also identities
  (a stored row's source, a cache key): each value becomes a placeholder with a short keyed tag
  (``客户_[MOBILE~3fa2c91d].txt``), so two files that differ only in the number stay two
  documents, the same file maps to the same name on every run and machine sharing the home,
  and the tag reveals nothing without the home's key (:func:`tag_key`);
- :class:`StreamRedactor` for text that arrives in pieces (a streamed LLM answer).

Domain-agnostic (it lives in ``infra`` so that ``tasks`` can name files through it); the RAG
vertical adds per-kind switches and the labelled evaluation (:mod:`solutions.rag.redact`).
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import hmac
import inspect
import os
import re
import sys
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Literal

Kind = Literal["email", "cn_id", "bank_card", "mobile"]
KINDS: tuple[Kind, ...] = ("email", "cn_id", "bank_card", "mobile")  # order of application
PLACEHOLDER: dict[Kind, str] = {
    "email": "[EMAIL]",
    "cn_id": "[CN_ID]",
    "bank_card": "[BANK_CARD]",
    "mobile": "[MOBILE]",
}
TAG_HEX = 8  # hex characters of a path tag (32 bits: distinct names in one folder stay distinct)

# Full-width digits, letters X/x and separators read as their ASCII forms (one character each,
# so a match on the folded text has the same span in the original).
_FOLD = str.maketrans({**{chr(0xFF10 + i): str(i) for i in range(10)},
                       "Ｘ": "X", "ｘ": "x", "－": "-", "．": ".", "＋": "+", "　": " ", "＠": "@",
                       "‐": "-", "‑": "-", "–": "-", "—": "-", "\u00a0": " "})

_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_ID_CHECK = "10X98765432"

_EMAIL = re.compile(
    r"(?<![A-Za-z0-9.%+-])[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,24}(?![A-Za-z0-9-])"
)
# region (6) birth date (8) sequence+check (4), contiguous or in three groups with one separator;
# letters may touch it (RecordID4403...), digits may not
_ID_DATE = r"(?:18|19|20)\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])"
_CN_ID = re.compile(
    rf"(?<![0-9])(?:[1-9]\d{{5}}{_ID_DATE}\d{{3}}[0-9Xx](?![0-9])"
    rf"|(?<![0-9][ .-])[1-9]\d{{5}}(?P<s>[ -]){_ID_DATE}(?P=s)\d{{3}}[0-9Xx](?![0-9])(?![ .-][0-9]))"
)
# contiguous 13-19 digits, or the printed groupings 4-4-4-4(-1..3) and Amex 4-6-5 with one
# consistent separator (so runs of table numbers like "2013 2014 1234 5678 90" do not join up)
_CARD = re.compile(
    r"(?<![0-9])(?:\d{13,19}(?![0-9])"
    r"|(?<![0-9][ .-])(?:\d{4}(?P<s>[ -])\d{4}(?P=s)\d{4}(?P=s)\d{4}(?:(?P=s)?\d{1,3})?"
    r"|\d{4}(?P<a>[ -])\d{6}(?P=a)\d{5})(?![0-9])(?![ .-][0-9]))"
)
# 1[3-9]x xxxx xxxx contiguous or with one consistent separator (space, dot, dash, slash), optionally
# after +86 / 0086 / (+86)
_MOBILE = re.compile(
    r"(?<![0-9])(?:(?:(?:\+|00)?86[ -]?|\(\+?86\)[ -]?)?1[3-9]\d{9}(?![0-9])"
    r"|(?<![0-9][.-])(?:(?:\+|00)?86[ -]?|\(\+?86\)[ -]?)?1[3-9]\d(?P<s>[ ./-])\d{4}(?P=s)\d{4}"
    r"(?![0-9])(?![.][0-9]))"
)

# words that make a Luhn-valid number a card even without a network prefix, and words that make
# it something else (the nearest one before the number decides)
_CARD_WORDS = re.compile(
    r"(?i)(?:卡号|卡 号|银行卡|信用卡|借记卡|储蓄卡|贷记卡|银联|卡|card|visa|master ?card|amex|unionpay|"
    r"acct|account|账号|帐号|账户|帐户)"
)
_OTHER_WORDS = re.compile(
    r"(?i)(?:订单|单号|运单|快递|物流|流水|发票|票号|批次|序列|条码|条形码|编号|商品|货号|工单|"
    r"order|tracking|invoice|serial|sku|barcode|ean|isbn|gtin|batch|ticket|reference)"
)
CONTEXT_CHARS = 24


@functools.cache
def _fold_table() -> dict[int, str]:
    """:data:`_FOLD` and every other decimal digit (Arabic-Indic ``٣``, Devanagari, ...) as ASCII."""
    digits = {c: str(unicodedata.digit(chr(c))) for c in range(0x80, sys.maxunicode + 1)
              if unicodedata.category(chr(c)) == "Nd"}
    return digits | _FOLD


def fold(text: str) -> str:
    """``text`` with full-width digits and separators and every script's decimal digits as ASCII
    (same length, same offsets)."""
    return text if text.isascii() else text.translate(_fold_table())


@functools.cache
def _format_chars() -> re.Pattern[str]:
    """Every invisible character that can split a value without showing: Unicode format
    characters (category Cf: zero-width space U+200B, soft hyphen U+00AD, joiners, direction
    marks, BOM, tags) and combining marks (Mn, Me: an accent stacked on a digit)."""
    chars = "".join(chr(c) for c in range(0xA0, sys.maxunicode + 1) if unicodedata.category(chr(c)) in ("Cf", "Mn", "Me"))
    return re.compile(f"[{re.escape(chars)}]")


def _visible(text: str) -> tuple[str, list[int] | None]:
    """``text`` without its format characters, and for each kept character its offset in ``text``
    (None when there were none to strip)."""
    if text.isascii() or not _format_chars().search(text):
        return text, None
    keep = [i for i, ch in enumerate(text) if not _format_chars().match(ch)]
    return "".join(text[i] for i in keep), keep


def cn_id_valid(candidate: str) -> bool:
    """True for an 18-character resident ID (separators and full-width digits allowed) with a
    birth date between 1900 and today and a valid ISO 7064 mod 11-2 check character."""
    value = re.sub(r"[ .-]", "", fold(candidate))
    if len(value) != 18 or not value[:17].isascii() or not value[:17].isdigit():
        return False
    try:
        birth = dt.date(int(value[6:10]), int(value[10:12]), int(value[12:14]))
    except ValueError:
        return False
    if not dt.date(1900, 1, 1) <= birth <= dt.date.today():
        return False
    total = sum(int(d) * w for d, w in zip(value[:17], _ID_WEIGHTS, strict=True))
    return _ID_CHECK[total % 11] == value[17].upper()


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


def card_network(digits: str) -> str | None:
    """The card network whose issuer prefix and length fit ``digits``, or None.

    Visa 4 (16/19), Mastercard 51-55 and 2221-2720 (16), American Express 34/37 (15),
    UnionPay 62 (16-19), Discover 6011/644-649/65 (16-19), JCB 3528-3589 (16-19),
    Diners 300-305/36/38/39 (14-16). Lengths of 13 (Visa's retired format, EAN-13 barcodes)
    and 17-19 outside UnionPay/Discover/JCB/Visa-19 are never a card on their own.
    """
    n = len(digits)
    p2, p3, p4 = int(digits[:2]), int(digits[:3]), int(digits[:4])
    if digits[0] == "4" and n in (16, 19):
        return "visa"
    if (51 <= p2 <= 55 or 2221 <= p4 <= 2720) and n == 16:
        return "mastercard"
    if p2 in (34, 37) and n == 15:
        return "amex"
    if p2 == 62 and 16 <= n <= 19:
        return "unionpay"
    if (p4 == 6011 or 644 <= p3 <= 649 or p2 == 65) and 16 <= n <= 19:
        return "discover"
    if 3528 <= p4 <= 3589 and 16 <= n <= 19:
        return "jcb"
    if (300 <= p3 <= 305 or p2 in (36, 38, 39)) and 14 <= n <= 16:
        return "diners"
    return None


def _context(before: str) -> str | None:
    """``"card"`` or ``"other"`` from the nearest context word in ``before``, or None."""
    best: tuple[int, str] | None = None
    for kind, pattern in (("card", _CARD_WORDS), ("other", _OTHER_WORDS)):
        for m in pattern.finditer(before):
            if best is None or m.end() > best[0]:
                best = (m.end(), kind)
    return best[1] if best else None


def bank_card_valid(candidate: str, before: str = "") -> bool:
    """A bank card number: 13-19 digits (spaces/dashes allowed), not one repeated digit, Luhn
    valid, and either a card network's prefix and length (:func:`card_network`) or a card word
    as the nearest context word in ``before`` (the text just before it). An order, invoice or
    barcode word as the nearest context word keeps it a number."""
    digits = re.sub(r"[ -]", "", fold(candidate))
    if not 13 <= len(digits) <= 19 or not digits.isdigit() or len(set(digits)) == 1:
        return False
    if not luhn_valid(digits):
        return False
    context = _context(fold(before)[-CONTEXT_CHARS:])
    if context == "card":
        return True
    return context is None and card_network(digits) is not None


def _always(_: str, __: str = "") -> bool:
    return True


def _id_check(candidate: str, _: str = "") -> bool:
    return cn_id_valid(candidate)


Rule = tuple[re.Pattern, Callable[[str, str], bool]]


def rules() -> dict[Kind, Rule]:
    """The pattern and the validator (``(match, text before it) -> bool``) of each kind."""
    return {
        "email": (_EMAIL, _always),
        "cn_id": (_CN_ID, _id_check),
        "bank_card": (_CARD, bank_card_valid),
        "mobile": (_MOBILE, _always),
    }


def find(text: str, kinds: Iterable[Kind] = KINDS) -> list[tuple[int, int, Kind]]:
    """Spans ``(start, end, kind)`` of the personal data in ``text``, left to right, not overlapping.

    Kinds are matched in ``KINDS`` order on what earlier kinds left over (an ID is never also
    counted as a card or a phone number). Format characters (zero-width spaces, soft hyphens,
    other category Cf) are stripped before matching, so a value split by them is still found;
    its span in ``text`` includes them.
    """
    visible, offsets = _visible(text)
    spans = _find_visible(visible, kinds)
    if offsets is None:
        return spans
    return [(offsets[a], offsets[b - 1] + 1, kind) for a, b, kind in spans]


def _find_visible(text: str, kinds: Iterable[Kind]) -> list[tuple[int, int, Kind]]:
    folded = fold(text)
    taken: list[tuple[int, int, Kind]] = []
    table = rules()
    wanted = [k for k in KINDS if k in set(kinds)]
    for kind in wanted:
        pattern, check = table[kind]
        masked = folded
        for a, b, _ in taken:  # what an earlier kind took is neither digits nor letters now
            masked = masked[:a] + "\x00" * (b - a) + masked[b:]
        for m in pattern.finditer(masked):
            if check(m.group(0), masked[max(0, m.start() - CONTEXT_CHARS):m.start()]):
                taken.append((m.start(), m.end(), kind))
    return sorted(taken)


def _replace(text: str, spans: list[tuple[int, int, Kind]], token: Callable[[str, Kind], str]) -> str:
    out, last = [], 0
    for a, b, kind in spans:
        out.append(text[last:a])
        out.append(token(text[a:b], kind))
        last = b
    out.append(text[last:])
    return "".join(out)


def redact(text: str, kinds: Iterable[Kind] = KINDS) -> tuple[str, Counter]:
    """Replace each value of the given kinds by its placeholder.

    Returns:
        The redacted text and a ``Counter`` of replacements per kind.
    """
    spans = find(text, kinds)
    return _replace(text, spans, lambda _, kind: PLACEHOLDER[kind]), Counter(kind for _, _, kind in spans)


def redact_text(text: str) -> str:
    """``text`` with every kind redacted (the default for logs, errors, questions, answers)."""
    return redact(text)[0] if text else text


# ------------------------------------------------------------------------------------
# names and paths


_KEY_FILE = "pii-tag.key"


def tag_key(folder: Path | None = None) -> bytes:
    """The home's key of path tags (``<home>/secrets/pii-tag.key``, made on first use, mode 0600).

    Every run and machine that shares the home tags a name the same way; without the key a tag
    can't be matched against guessed numbers.
    """
    if folder is None:
        from infra.home import home_layout

        folder = home_layout().secrets()
    path = folder / _KEY_FILE
    try:
        return path.read_bytes()
    except FileNotFoundError:
        pass
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first
        return path.read_bytes()
    with os.fdopen(fd, "wb") as handle:
        handle.write(os.urandom(32))
    return path.read_bytes()


def _tagged(key: bytes) -> Callable[[str, Kind], str]:
    def token(value: str, kind: Kind) -> str:
        canonical = re.sub(r"[^0-9A-Za-z@._%+-]", "", fold(value)).lower()
        digest = hmac.new(key, f"{kind}\x1f{canonical}".encode(), hashlib.sha256).hexdigest()[:TAG_HEX]
        return f"{PLACEHOLDER[kind][:-1]}~{digest}]"

    return token


def redact_name(name: str, key: bytes | None = None) -> str:
    """One file or member name with each personal value replaced by a tagged placeholder."""
    spans = find(name)
    if not spans:
        return name
    return _replace(name, spans, _tagged(key if key is not None else tag_key()))


def redact_path(path: str, key: bytes | None = None) -> str:
    """A path (``/`` separated, ``archive.zip!/member`` included) redacted name by name.

    Redacting each name on its own keeps prefixes: the redacted form of a folder is a prefix of
    the redacted form of every file under it. Idempotent; the same path gives the same result
    under the same key.
    """
    if not path or not find(path):
        return path
    key = key if key is not None else tag_key()
    return "/".join(redact_name(part, key) for part in path.split("/"))


# ------------------------------------------------------------------------------------
# streams and fingerprints


class StreamRedactor:
    """Redact text that arrives in pieces (a streamed LLM answer) before it is shown.

    The last ``hold`` characters stay buffered, and text is released only at a point that
    cannot lie inside an e-mail, an ID or a (separated) card or phone number, so a value
    split across pieces is still caught.
    """

    def __init__(self, kinds: Iterable[Kind] = KINDS, hold: int = 96) -> None:
        self.kinds = tuple(kinds)
        self.hold = hold
        self._buf = ""

    @staticmethod
    def _in_run(text: str, i: int) -> bool:
        ch = fold(text[i])
        if ch.isascii() and (ch.isalnum() or ch in "@._%+-()"):
            return True
        if not ch.isascii() and _format_chars().match(ch):
            return True  # may sit inside a value (find() strips it)
        return ch in " ./-" and i > 0 and fold(text[i - 1]).isdigit()

    def feed(self, piece: str) -> str:
        """Add a piece; return the redacted text that is safe to show now."""
        self._buf += piece
        red, _ = redact(self._buf, self.kinds)
        cut = len(red) - self.hold
        while cut > 0 and (self._in_run(red, cut - 1) or self._in_run(red, cut)):
            cut -= 1
        if cut <= 0:
            return ""
        self._buf = red[cut:]
        return red[:cut]

    def flush(self) -> str:
        """The rest, redacted."""
        red, _ = redact(self._buf, self.kinds)
        self._buf = ""
        return red


def fingerprint(kinds: Iterable[Kind] = KINDS) -> str:
    """Hash of what redaction does under ``kinds``: for each its pattern, placeholder and the
    code of its validator and of the matching engine. Part of an ingest fingerprint, so editing
    a rule re-processes stored documents without a manual version bump."""
    table = rules()
    parts = []
    for kind in [k for k in KINDS if k in set(kinds)]:
        pattern, check = table[kind]
        parts.append(f"{kind}\x1f{pattern.pattern}\x1f{pattern.flags}\x1f{PLACEHOLDER[kind]}\x1f"
                     + inspect.getsource(check))
    for fn in (cn_id_valid, luhn_valid, card_network, _context, find, _find_visible, _visible, _format_chars, fold,
               _fold_table):
        parts.append(inspect.getsource(fn))
    parts += [_CARD_WORDS.pattern, _OTHER_WORDS.pattern, str(CONTEXT_CHARS), repr(sorted(_FOLD.items()))]
    return hashlib.sha256("\x1e".join(parts).encode()).hexdigest()[:16]
