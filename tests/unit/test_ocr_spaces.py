"""Spaces from geometry: where the OCR recogniser ran words together, the blank ink between its
character boxes puts the space back (synthetic boxes and ink, no engine)."""

from __future__ import annotations

import pytest

from infra.ocr import (
    box_text_with_spaces,
    gaps_between,
    join_boxes,
    line_ink,
    lines_in_order,
    spaced_text,
)


def profile(pattern: str) -> list[bool]:
    """Blank columns from a picture: ``#`` is ink, ``.`` is blank."""
    return [c == "." for c in pattern]


def test_gaps_between_measures_the_widest_blank_run_between_character_centres() -> None:
    #        C    l    a  |space|  7
    ink = "####.###.####......####"
    spans = [(0, 4), (5, 8), (9, 13), (19, 23)]
    assert gaps_between(profile(ink), spans) == [1, 1, 6]
    assert gaps_between(profile(ink), spans[:1]) == []
    # a centre past the end of the profile is clipped, not an error
    assert gaps_between(profile("##..."), [(0, 2), (40, 44)]) == [3]


def test_a_gap_as_wide_as_the_spaces_the_recogniser_read_becomes_a_space() -> None:
    # "Clause7 applies on12March": the two spaces the recogniser read are 10 and 11 px wide
    text = "Clause7 applies on12March"
    chars = "".join(text.split())
    gaps = [2] * (len(chars) - 1)
    gaps[chars.index("7") - 1] = 10  # e|7: over 0.9 x the median read gap (10.5): a space
    gaps[chars.index("a", 7) - 1] = 10  # 7|a: read
    gaps[chars.index("o", 7) - 1] = 11  # s|o: read
    gaps[chars.index("1") - 1] = 12  # n|1
    gaps[chars.index("M") - 1] = 9  # 2|M: under 0.9 x 10.5: stays joined
    assert spaced_text(text, gaps, ink_height=30) == "Clause 7 applies on 12March"


def test_without_a_read_space_the_ink_height_decides() -> None:
    assert spaced_text("on12", [2, 14, 2], ink_height=30) == "on 12"  # 14 >= 0.45 x 30
    assert spaced_text("on12", [2, 13, 2], ink_height=30) == "on12"
    assert spaced_text("ab", [1], ink_height=2) == "ab"  # never under 2 px


def test_nothing_is_inserted_inside_cjk_digits_or_before_punctuation() -> None:
    wide = 50
    assert spaced_text("轴承温度", [wide] * 3, ink_height=20) == "轴承温度"
    assert spaced_text("第7泵站", [wide] * 3, ink_height=20) == "第7泵站"
    assert spaced_text("B-12", [wide] * 3, ink_height=20) == "B-12"
    assert spaced_text("4.2", [wide] * 2, ink_height=20) == "4.2"
    assert spaced_text("14:20", [wide] * 4, ink_height=20) == "14:20"
    assert spaced_text("1700", [wide] * 3, ink_height=20) == "1700"
    assert spaced_text("end.", [wide] * 3, ink_height=20) == "e n d."
    assert spaced_text("élan", [wide] * 3, ink_height=20) == "é l a n"  # Latin with accents is spaced


def test_read_spaces_are_kept_and_mismatched_geometry_is_refused() -> None:
    assert spaced_text(" a  b ", [0], ink_height=20) == "a b"
    with pytest.raises(ValueError, match="2 gaps for 2 characters"):
        spaced_text("ab", [1, 1], ink_height=20)


def test_boxes_of_a_line_are_joined_with_a_space_only_outside_cjk() -> None:
    assert join_boxes(["hello", "world"]) == "hello world"
    assert join_boxes(["Привет", "мир"]) == "Привет мир"
    assert join_boxes(["设备维护", "报告"]) == "设备维护报告"
    assert join_boxes(["泵站", "P3", "停机"]) == "泵站P3停机"
    assert join_boxes(["温度：", "85度"]) == "温度：85度"  # full-width colon counts as CJK
    assert lines_in_order([[[10, 10], [90, 10], [90, 40], [10, 40]], [[100, 10], [190, 10], [190, 40], [100, 40]]],
                          ["第七", "泵站"]) == ["第七泵站"]


def glyph_page(glyphs: list[tuple[int, int]], size: tuple[int, int] = (200, 40), ink: int = 0,
               paper: int = 255):
    """A greyscale page with one dark bar (10-30 px high) per glyph x-range."""
    np = pytest.importorskip("numpy")
    page = np.full((size[1], size[0]), paper, dtype=np.uint8)
    for x0, x1 in glyphs:
        page[10:30, x0:x1] = ink
    return page


def test_line_ink_straightens_the_box_and_finds_blank_columns() -> None:
    pytest.importorskip("cv2")
    page = glyph_page([(20, 30), (32, 42), (60, 70)])
    ink = line_ink(page, [[10, 5], [110, 5], [110, 35], [10, 35]])
    assert ink is not None and ink.ink_height == 20
    blank = "".join("." if b else "#" for b in ink.blank.tolist())
    assert blank == "." * 10 + "#" * 10 + ".." + "#" * 10 + "." * 18 + "#" * 10 + "." * 40
    # light text on a dark ground reads the same
    inverted = line_ink(255 - page, [[10, 5], [110, 5], [110, 35], [10, 35]])
    assert inverted is not None and inverted.blank.tolist() == ink.blank.tolist()
    assert line_ink(page, [[10, 5], [20, 5], [20, 35], [10, 35]]) is None  # taller than wide
    assert line_ink(glyph_page([]), [[10, 5], [110, 5], [110, 35], [10, 35]]) is None  # no ink


def test_a_box_gets_its_missing_space_from_the_ink_between_character_boxes() -> None:
    pytest.importorskip("cv2")
    # "ab cd" read as "abcd": glyphs 10 px wide, 2 px apart within a word, 14 px between words
    xs = [(20, 30), (32, 42), (56, 66), (68, 78)]
    page = glyph_page(xs)
    quad = [[10, 5], [90, 5], [90, 35], [10, 35]]
    boxes = [[[x0, 8], [x1, 8], [x1, 32], [x0, 32]] for x0, x1 in xs]
    assert box_text_with_spaces(page, quad, "abcd", boxes) == "ab cd"  # 14 >= 0.45 x 20
    assert box_text_with_spaces(page, quad, "ab cd", boxes) == "ab cd"
    assert box_text_with_spaces(page, quad, "abcd", boxes[:1]) == "abcd"  # nothing to measure
