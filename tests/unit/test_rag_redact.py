"""Compliance redaction: checksums, look-alikes, per-kind switches, precision/recall on the set."""

from __future__ import annotations

import pytest

from solutions.rag.redact import (
    RedactionConfig,
    bank_card_valid,
    cn_id_valid,
    evaluate_redaction,
    luhn_valid,
    redact,
)
from solutions.rag.redaction_cases import CASES


def test_checksums() -> None:
    assert cn_id_valid("11010519491231002X") and cn_id_valid("11010519491231002x")
    assert not cn_id_valid("110105194912310021")  # wrong check digit
    assert not cn_id_valid("440304198513153218")  # month 13
    assert luhn_valid("4111111111111111") and not luhn_valid("4111111111111112")
    assert bank_card_valid("4111 1111 1111 1111") and not bank_card_valid("1234567890123")


def test_typed_placeholders_and_counts() -> None:
    text, counts = redact("张三 440304198507153218 13912345678 6217001234567890122 zs@example.com 订单 4111111111111112")
    assert text == "张三 [CN_ID] [MOBILE] [BANK_CARD] [EMAIL] 订单 4111111111111112"
    assert counts == {"cn_id": 1, "mobile": 1, "bank_card": 1, "email": 1}


def test_kinds_can_be_switched_off() -> None:
    text, counts = redact("mail a.b@example.com call 13812345678", RedactionConfig(email=False))
    assert "a.b@example.com" in text and "[MOBILE]" in text and counts == {"mobile": 1}


def test_precision_and_recall_on_the_labelled_set() -> None:
    score = evaluate_redaction(CASES)
    positives = [c for c in CASES if c.expected]
    assert len(CASES) >= 200 and 0.4 <= len(positives) / len(CASES) <= 0.6
    for kind, row in score.per_kind.items():
        assert row["tp"] >= 15, kind
        assert row["precision"] >= 0.99 and row["recall"] >= 0.99, (kind, row, score.misses)
    groups = {c.group.split(":")[1] for c in CASES if c.group.startswith("near-miss:")}
    assert {"order", "ean13", "timestamp", "landline", "version"} <= groups


def test_the_formats_the_issue_names() -> None:
    assert redact("RecordID440304198507153218 ok")[0] == "RecordID[CN_ID] ok"
    assert redact("身份证 110105 19900307 8879")[0] == "身份证 [CN_ID]"
    assert redact("证件 ４４０３０４１９８５０７１５３２１８")[0] == "证件 [CN_ID]"
    for mobile in ("139.1234.5678", "139-1234-5678", "+86 139 1234 5678", "(+86)13912345678", "１３９１２３４５６７８"):
        assert redact(f"tel {mobile} now")[0] == "tel [MOBILE] now", mobile
    assert redact("order 202311150000123454 and EAN 6901234567892")[1] == {}
    assert bank_card_valid("9558801234567890128", before="工资卡号") and not bank_card_valid("9558801234567890128")
    assert not bank_card_valid("6225880123456789017", before="订单编号 ")


def test_stream_redactor_catches_values_split_across_pieces() -> None:
    from solutions.rag.redact import StreamRedactor

    text = "Reach jane.doe@example.com or 4111 1111 1111 1111 or 13812345678 today. 北京的身份证440304198507153218。" * 3
    for size in (1, 3, 7, 50):
        guard = StreamRedactor()
        shown = "".join(guard.feed(text[i : i + size]) for i in range(0, len(text), size)) + guard.flush()
        assert shown == redact(text)[0], size


def test_table_numbers_do_not_join_into_a_card() -> None:
    text = "Year 2013 2014 1234 5678 90 and totals 4111 1111-1111 1111"
    assert redact(text)[1].get("bank_card", 0) == 0


def test_redaction_fingerprint_follows_kinds_and_rules(monkeypatch) -> None:
    import re

    from infra import pii as redact_mod
    from solutions.rag.redact import RedactionConfig, redaction_fingerprint

    base = redaction_fingerprint(RedactionConfig())
    assert base == redaction_fingerprint(RedactionConfig())
    assert len({base, redaction_fingerprint(RedactionConfig(email=False)),
                redaction_fingerprint(RedactionConfig(mobile=False))}) == 3
    monkeypatch.setattr(redact_mod, "_EMAIL", re.compile(r"\S+@\S+"))
    assert redaction_fingerprint(RedactionConfig()) != base
    assert redaction_fingerprint(RedactionConfig(email=False)) == redaction_fingerprint(RedactionConfig(email=False))


def test_path_tags_are_keyed_stable_and_distinct(tmp_path) -> None:
    from infra.pii import redact_path, tag_key

    key = tag_key(tmp_path)
    assert tag_key(tmp_path) == key and len(key) == 32 and (tmp_path / "pii-tag.key").stat().st_mode & 0o777 == 0o600
    a = redact_path("/kb/客户_13712345678.txt", key)
    assert a == redact_path("/kb/客户_13712345678.txt", key) and "13712345678" not in a
    assert a.startswith("/kb/客户_[MOBILE~") and a.endswith("].txt")
    assert a != redact_path("/kb/客户_13712345679.txt", key)  # two files stay two documents
    assert a != redact_path("/kb/客户_13712345678.txt", b"another home's key" * 2)
    assert redact_path("/kb/plain/notes.txt", key) == "/kb/plain/notes.txt"


def test_validation_errors_carry_no_personal_data() -> None:
    from infra.errors import DataValidationError

    err = DataValidationError("row holds 440304198507153218", source="/in/客户_13712345678.csv", column="a@b.com")
    assert str(err) == "/in/客户_[MOBILE].csv, column '[EMAIL]': row holds [CN_ID]"


def test_values_split_by_invisible_format_characters_are_still_redacted() -> None:
    """Zero-width spaces, soft hyphens and other category-Cf characters cannot hide a value from the
    redactor, in one text or streamed in pieces."""
    from solutions.rag.redact import StreamRedactor

    zwsp, shy, wj, bom = "\u200b", "\u00ad", "\u2060", "\ufeff"
    text = (f"call 139{zwsp}1234{shy}5678, mail zhang{wj}.san@exa{zwsp}mple.com, "
            f"ID 440304{bom}19850715321{shy}8, card 6217{zwsp}0012{zwsp}3456{zwsp}7890{zwsp}122.")
    red, counts = redact(text)
    assert red == "call [MOBILE], mail [EMAIL], ID [CN_ID], card [BANK_CARD].", red
    assert dict(counts) == {"mobile": 1, "email": 1, "cn_id": 1, "bank_card": 1}
    stream = StreamRedactor(hold=8)
    shown = "".join(stream.feed(ch) for ch in text) + stream.flush()
    assert shown == red


@pytest.mark.parametrize("text", [
    "call ١٣٩١٢٣٤٥٦٧٨ today",  # Arabic-Indic digits
    "call ۱۳۹۱۲۳۴۵۶۷۸ today",  # Extended Arabic-Indic (Persian) digits
    "call 139/1234/5678 today",  # slashes between the groups
    "call 1\u03013912345678 today",  # a combining mark stacked on a digit
    "call 139\u03021234\u03025678 today",
])
def test_digits_of_other_scripts_slashes_and_combining_marks_do_not_hide_a_mobile(text: str) -> None:
    """Issue 46: each of these passed main's redactor untouched."""
    from infra.pii import StreamRedactor, redact_text

    assert redact_text(text) == "call [MOBILE] today", text
    stream = StreamRedactor()
    assert "".join(stream.feed(ch) for ch in text) + stream.flush() == "call [MOBILE] today"


def test_slashes_keep_dates_and_fractions_as_they_are() -> None:
    from infra.pii import redact_text

    for text in ("2024/1234/5678", "on 2023/12/31", "ratio 139/1234", "139/1234/56789", "0139/1234/5678"):
        assert redact_text(text) == text, text
    # a path of numbers is still redacted name by name (a slash after a number ends it)
    assert redact_text("/130 0000 0000/139 1234 5678") == "/[MOBILE]/[MOBILE]"
