"""Slide numbers of a .pptx: each slide's text located in Tika's text, in presentation order."""

from __future__ import annotations

import io
import zipfile

from tasks.slides import slide_starts

RELS = ('<Relationships><Relationship Id="rId3" Type="http://x/relationships/slide" Target="slides/slide2.xml"/>'
        '<Relationship Id="rId2" Type="http://x/relationships/slide" Target="slides/slide1.xml"/>'
        '<Relationship Id="rId4" Type="http://x/relationships/slide" Target="slides/slide3.xml"/>'
        '<Relationship Id="rId1" Type="http://x/relationships/slideMaster" Target="slideMasters/m1.xml"/></Relationships>')


def pptx(order: list[str], slides: dict[str, list[str]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("ppt/_rels/presentation.xml.rels", RELS)
        z.writestr("ppt/presentation.xml", "<p:presentation><p:sldIdLst>" + "".join(
            f'<p:sldId id="{256 + i}" r:id="{rid}"/>' for i, rid in enumerate(order)) + "</p:sldIdLst></p:presentation>")
        for name, runs in slides.items():
            z.writestr(f"ppt/slides/{name}.xml", "<p:sld>" + "".join(f"<a:t>{r}</a:t>" for r in runs) + "</p:sld>")
    return buf.getvalue()


def test_slides_start_where_their_text_does_in_presentation_order() -> None:
    slides = {"slide1": ["Safety &amp; rules", "Wear a helmet."], "slide2": [], "slide3": ["Compressor C-310", "Overhaul"]}
    text = "Safety & rules\nWear a helmet.\n\nCompressor C-310\nOverhaul every 4,000 hours."
    assert slide_starts(pptx(["rId2", "rId3", "rId4"], slides), text) == (0, 31, 31)  # slide 2 has no text
    # the presentation's order, not the file names'
    swapped = "Compressor C-310\nOverhaul\n\nSafety & rules\nWear a helmet."
    assert slide_starts(pptx(["rId4", "rId2"], slides), swapped) == (0, 27)


def test_no_slide_numbers_rather_than_wrong_ones() -> None:
    slides = {"slide1": ["First slide"], "slide2": ["Second slide"], "slide3": ["Third"]}
    content = pptx(["rId2", "rId3"], slides)
    assert slide_starts(content, "Second slide\nFirst slide") == ()  # out of order: not found after the first
    assert slide_starts(content, "First slide only") == ()
    assert slide_starts(pptx(["rId2"], slides), "First slide") == ()  # one slide: no numbers
    assert slide_starts(b"not a zip", "text") == ()
