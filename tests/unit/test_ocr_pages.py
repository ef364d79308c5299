"""Which pages OCR reads, in what order, within which limits, and what it reports (a stand-in engine)."""

from __future__ import annotations

import io
import logging

import pytest

pytest.importorskip("pypdfium2")

from PIL import Image, ImageDraw

from infra.ocr import OcrError, OcrLine
from infra.settings import OcrSettings
from tasks.ocr import DocumentOcr, OcrFailure, OcrLimits, OcrText, pdf_pages_to_ocr


class CountingEngine:
    """Answers ``read n`` for the n-th page it is given; fails on the pages listed in ``fail``."""

    name = "counting"

    def __init__(self, fail: tuple[int, ...] = ()) -> None:
        self.calls = 0
        self.fail = fail
        self.sizes: list[tuple[int, int]] = []

    def read(self, image: Image.Image) -> str:
        self.calls += 1
        self.sizes.append(image.size)
        if self.calls in self.fail:
            raise OcrError("stand-in failure")
        return f"read {self.calls}"


def scanned_pdf(pages: int) -> bytes:
    images = []
    for n in range(pages):
        img = Image.new("RGB", (300, 400), "white")
        ImageDraw.Draw(img).rectangle((20, 20 + n * 10, 200, 40 + n * 10), fill="black")
        images.append(img)
    buf = io.BytesIO()
    images[0].save(buf, "PDF", resolution=72.0, save_all=True, append_images=images[1:])
    return buf.getvalue()


def test_pages_to_ocr_follow_the_text_layer_counts() -> None:
    assert pdf_pages_to_ocr({"pdf:charsPerPage": ["1200", "0", "4", "300"]}, False, 10) == [1, 2]
    assert pdf_pages_to_ocr({"pdf:charsPerPage": ["1200"]}, False, 10) == []
    assert pdf_pages_to_ocr({}, True, 10) is None  # no counts and no text: ask pdfium
    assert pdf_pages_to_ocr({}, False, 10) == []


def test_long_scans_are_cut_at_max_pages_with_progress(caplog: pytest.LogCaptureFixture) -> None:
    engine = CountingEngine()
    ocr = DocumentOcr(engine, limits=OcrLimits(max_pages=6, dpi=72))
    meta = {"pdf:charsPerPage": ["0"] * 7}
    assert ocr.wants("application/pdf", meta, "")
    with caplog.at_level(logging.INFO, logger="tasks.ocr"):
        got = ocr.read(scanned_pdf(7), "application/pdf", meta, "", "/inbox/scan.pdf")
    assert isinstance(got, OcrText)
    assert got.info.pages == (1, 2, 3, 4, 5, 6) and got.info.skipped_pages == 1 and got.info.pages_ocr == 6
    assert got.pages[:6] == tuple(f"read {n}" for n in range(1, 7)) and got.pages[6] == ""  # page 7: not read
    assert engine.sizes[0] == (300, 400)  # rendered at the configured 72 dpi: one pixel per point
    messages = [r.getMessage() for r in caplog.records]
    assert any("page 5 of 6" in m for m in messages) and any("page 6 of 6" in m for m in messages)
    assert any("only the first 6 are OCR'd" in m for m in messages)


def test_a_failed_page_is_reported_and_the_others_kept() -> None:
    ocr = DocumentOcr(CountingEngine(fail=(2,)), limits=OcrLimits(dpi=72))
    got = ocr.read(scanned_pdf(3), "application/pdf", {}, "", "/inbox/scan.pdf")
    assert isinstance(got, OcrText) and got.info.pages == (1, 3) and got.info.failed_pages == (2,)
    every = DocumentOcr(CountingEngine(fail=(1, 2)), limits=OcrLimits(dpi=72))
    failed = every.read(scanned_pdf(2), "application/pdf", {}, "", "/inbox/scan.pdf")
    assert isinstance(failed, OcrFailure) and failed.reason == "ocr_failed"


def test_pages_are_rendered_below_the_pixel_limit() -> None:
    engine = CountingEngine()
    DocumentOcr(engine, limits=OcrLimits(dpi=300, max_image_pixels=30_000)).read(
        scanned_pdf(1), "application/pdf", {}, "", "/inbox/scan.pdf")
    (w, h), = engine.sizes
    assert w * h <= 30_000 * 1.02 and w < 300  # 300 dpi would be 1250x1667: scaled down instead


class ScoredEngine:
    """Reads each page as the same scored lines."""

    name = "scored"

    def __init__(self, lines: list[OcrLine]) -> None:
        self.lines = lines

    def read(self, image: Image.Image) -> str:
        return "\n".join(line.text for line in self.lines)

    def read_lines(self, image: Image.Image) -> list[OcrLine]:
        return list(self.lines)


def test_scored_lines_are_kept_by_confidence_not_length() -> None:
    image = Image.new("RGB", (200, 100), "white")
    buf = io.BytesIO()
    image.save(buf, "PNG")
    lines = [OcrLine("PAID", 0.99), OcrLine("H+H", 0.74), OcrLine("+--+", 0.97), OcrLine("3 MAY", 0.85)]
    got = DocumentOcr(ScoredEngine(lines), limits=OcrLimits(min_confidence=0.85)).read(
        buf.getvalue(), "image/png", {}, "", "/inbox/stamp.png")
    assert isinstance(got, OcrText)
    # under the threshold, or no letter or digit: noise, dropped and counted
    assert got.pages == ("PAID\n3 MAY",) and got.info.dropped_lines == 2
    assert got.info.min_confidence == 0.85 and got.info.chars == len("PAID\n3 MAY")
    # an engine without confidences keeps every line and says so (its text is judged by length)
    plain = DocumentOcr(CountingEngine(), OcrSettings()).read(buf.getvalue(), "image/png", {}, "", "/inbox/a.png")
    assert isinstance(plain, OcrText) and plain.pages == ("read 1",) and plain.info.min_confidence is None
    assert DocumentOcr(CountingEngine()).key != DocumentOcr(CountingEngine(), limits=OcrLimits(min_confidence=0.5)).key
