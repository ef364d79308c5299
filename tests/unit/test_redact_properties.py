"""Properties of the PII redactor on generated inputs (hypothesis): idempotent, leaves nothing it
would match again, keeps look-alikes, removes every valid value wherever it is embedded."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from infra.pii import StreamRedactor, find, redact, redact_path
from solutions.rag.redaction_cases import ean13_digit, id_check_char, luhn_digit

FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FULL = str.maketrans("0123456789X", "０１２３４５６７８９Ｘ")

# free text: letters that spell no context word, CJK, digits, separators and e-mail punctuation
noise = st.text(alphabet=st.sampled_from(list("xyzqjkXYZ 客户退款说明，。：、-._@+0123456789１２３")), max_size=60)
# text that can sit next to a value: no digit, no separator-then-digit at the joint
words = st.text(alphabet=st.sampled_from(list("xyzqjkXYZ客户退款说明的了，。：、")), max_size=20)


@st.composite
def resident_ids(draw) -> str:
    region = draw(st.integers(100000, 999999))
    birth = draw(st.dates(min_value=dt.date(1900, 1, 1), max_value=dt.date.today()))
    body = f"{region}{birth:%Y%m%d}{draw(st.integers(0, 999)):03d}"
    value = body + id_check_char(body)
    form = draw(st.sampled_from(["plain", "spaced", "dashed", "fullwidth", "lower"]))
    if form == "spaced":
        return f"{value[:6]} {value[6:14]} {value[14:]}"
    if form == "dashed":
        return f"{value[:6]}-{value[6:14]}-{value[14:]}"
    if form == "fullwidth":
        return value.translate(FULL)
    return value.lower() if form == "lower" else value


@st.composite
def mobiles(draw) -> str:
    digits = "1" + draw(st.sampled_from("3456789")) + "".join(str(draw(st.integers(0, 9))) for _ in range(9))
    sep = draw(st.sampled_from(["", " ", "-", "."]))
    prefix = draw(st.sampled_from(["", "+86 ", "0086", "(+86)", "+86-"]))
    return prefix + (f"{digits[:3]}{sep}{digits[3:7]}{sep}{digits[7:]}" if sep else digits)


@st.composite
def cards(draw) -> str:
    prefix, length = draw(st.sampled_from([("4", 16), ("51", 16), ("2221", 16), ("62", 16), ("62", 19), ("34", 15),
                                           ("37", 15), ("6011", 16), ("3530", 16)]))
    body = prefix + "".join(str(draw(st.integers(0, 9))) for _ in range(length - len(prefix) - 1))
    value = body + luhn_digit(body)
    if length == 16 and draw(st.booleans()):
        sep = draw(st.sampled_from([" ", "-"]))
        return sep.join(value[i : i + 4] for i in range(0, 16, 4))
    return value


emails = st.builds(lambda user, host, tld: f"{user}@{host}.{tld}",
                   st.from_regex(r"[a-z][a-z0-9._]{0,10}[a-z0-9]", fullmatch=True),
                   st.from_regex(r"[a-z][a-z0-9-]{0,8}[a-z]", fullmatch=True), st.sampled_from(["com", "cn", "org", "net"]))


@st.composite
def near_misses(draw) -> str:
    kind = draw(st.sampled_from(["order", "ean13", "timestamp", "landline", "version", "bad-id"]))
    if kind == "order":  # date-prefixed 18-digit order number, Luhn-valid or not
        day = draw(st.dates(min_value=dt.date(2015, 1, 1), max_value=dt.date(2030, 12, 31)))
        body = f"{day:%Y%m%d}" + "".join(str(draw(st.integers(0, 9))) for _ in range(9))
        return body + luhn_digit(body)
    if kind == "ean13":
        body = "69" + "".join(str(draw(st.integers(0, 9))) for _ in range(10))
        return body + ean13_digit(body)
    if kind == "timestamp":
        return str(draw(st.integers(1_000_000_000_000, 1_999_999_999_999)))
    if kind == "landline":
        area = draw(st.sampled_from(["010", "021", "0755", "0571"]))
        return f"{area}-{draw(st.integers(20000000, 89999999))}"
    if kind == "version":
        version = ".".join(str(draw(st.integers(0, 9999))) for _ in range(draw(st.integers(2, 4))))
        # a three-part version laid out 1[3-9]x.xxxx.xxxx is a mobile number written with dots, which the
        # redactor must redact: a true ambiguity, not a near miss (a drawn "130.1000.1000" failed CI)
        assume(not re.fullmatch(r"1[3-9]\d\.\d{4}\.\d{4}", version))
        return version
    # an ID with a wrong check character; not from Fujian (35), Gansu (62), Ningxia (64) or Xinjiang
    # (65), whose 18-digit numbers can also be valid JCB, UnionPay and Discover (644-649) card numbers
    # (a true ambiguity: a drawn "645350..." was a Luhn-valid Discover number, redacted as a card)
    province = draw(st.sampled_from([11, 12, 13, 14, 15, 21, 22, 23, 31, 32, 33, 34, 36, 37, 41, 42, 43, 44, 45, 46,
                                     50, 51, 52, 53, 54, 61, 63]))
    region = province * 10000 + draw(st.integers(0, 9999))
    birth = draw(st.dates(min_value=dt.date(1900, 1, 1), max_value=dt.date(2020, 1, 1)))
    body = f"{region}{birth:%Y%m%d}{draw(st.integers(0, 999)):03d}"
    return body + draw(st.sampled_from([c for c in "0123456789X" if c != id_check_char(body)]))


@FAST
@given(noise)
def test_idempotent_and_nothing_left_to_match(text: str) -> None:
    once, _ = redact(text)
    assert redact(once)[0] == once
    assert find(once) == []
    assert len(find(once)) <= len(find(text))


@FAST
@given(st.lists(st.tuples(words, near_misses()), min_size=1, max_size=4), words)
@example([("", "130.1000.10000")], "")  # dotted like a mobile, but its last group is too long
def test_near_misses_survive_with_their_tokens(parts: list[tuple[str, str]], tail: str) -> None:
    text = "".join(f"{w} {n} " for w, n in parts) + tail
    out, counts = redact(text)
    assert out == text and not counts


@FAST
@given(words, st.one_of(resident_ids(), mobiles(), cards(), emails), words)
def test_valid_values_are_removed_wherever_they_sit(left: str, value: str, right: str) -> None:
    text = f"{left} {value} {right}" if "@" in value else f"{left}{value}{right}"
    out, counts = redact(text)
    assert sum(counts.values()) == 1, (text, out)
    digits = "".join(ch for ch in value.translate(str.maketrans("０１２３４５６７８９", "0123456789")) if ch.isdigit())
    assert value not in out and (len(digits) < 8 or digits[-8:] not in "".join(c for c in out if c.isdigit()))


@FAST
@given(st.lists(st.one_of(words, resident_ids().map(lambda v: v.replace(" ", "")), mobiles(), emails), min_size=1,
                max_size=4))
def test_path_redaction_keeps_prefixes_and_distinct_names(parts: list[str]) -> None:
    key = b"k" * 32
    names = [p.replace("/", "_") or "x" for p in parts]
    path = "/" + "/".join(names)
    red = redact_path(path, key)
    assert redact_path(red, key) == red
    for cut in range(1, len(names)):
        assert red.startswith(redact_path("/" + "/".join(names[:cut]), key) + "/")
    assert find(red) == []


@settings(FAST, derandomize=True)  # CI must not depend on which examples a run draws: the known miss is below
@given(st.lists(st.one_of(noise, resident_ids(), mobiles(), cards(), emails), max_size=6),
       st.integers(1, 40))
def test_streamed_redaction_equals_whole_text(parts: list[str], size: int) -> None:
    text = " ".join(parts)
    guard = StreamRedactor()
    shown = "".join(guard.feed(text[i : i + size]) for i in range(0, len(text), size)) + guard.flush()
    assert shown == redact(text)[0]


@pytest.mark.xfail(strict=True, reason="known miss, found by the property test above in a CI run (also on the code "
                   "before round 3): after long digit runs the stream releases '100000-20000101-0009' unredacted "
                   "while the whole text redacts it as [CN_ID]")
def test_streamed_redaction_after_long_digit_runs() -> None:
    parts = ["100000200001010009", "0" * 20, "0" * 20, "0" * 20, "2221000000000009", "100000-20000101-0009"]
    text = " ".join(parts)
    guard = StreamRedactor()
    shown = "".join(guard.feed(ch) for ch in text) + guard.flush()
    assert shown == redact(text)[0]


def test_a_dotted_mobile_that_could_be_a_version_is_redacted() -> None:
    # the ambiguity the near-miss generator leaves out: privacy wins over a three-part version number
    out, counts = redact("build 130.1000.1000 shipped")
    assert out == "build [MOBILE] shipped" and counts["mobile"] == 1
