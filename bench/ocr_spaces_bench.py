"""OCR spacing benchmark: does rapidocr keep the spaces between words? One JSON line.

Lines of English with digits next to words ("Clause 7 applies on 12 March 2024 to unit B-12")
are rendered with Pillow in real TrueType fonts under several conditions: sizes 12-26 px,
condensed, narrow, serif and monospaced faces, word spaces shrunk to 50% and 35%, letters
tracked tighter or wider, each clean and as a scan (rotated 1 degree, blurred, speckled, JPEG
quality 40). Each page is read by ``RapidOcr().read`` (the ingestion path) and scored three
ways: CER with spaces (whitespace normalised to single spaces), CER without spaces (the
characters alone) and the share of reference word boundaries the text ran together
(``lost_word_boundaries``: among boundaries whose two characters were read). The gap between
the two CERs is what spacing costs.

``tune`` is what the spacing thresholds and rules in ``infra/ocr.py`` were chosen on (two
sets of sentences and faces: the second, first kept apart, showed that gaps beside a narrow
"1" pass for tight spaces, hence no space between digits); ``held_out`` has other sentences
and faces again, written after those choices and not used for any. ``--a4`` adds a full
A4 page at 150 dpi (``bench/ocr_bench.py``'s text and rendering), clean and scanned (slow:
15-30 s a page on 2 cores).

Usage: ``python bench/ocr_spaces_bench.py [--a4] [--detail]``. To measure another checkout's
engine wrapper (e.g. before a change), put its ``infra`` first on the path:
``PYTHONPATH=/old/checkout:$PWD python bench/ocr_spaces_bench.py``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # after PYTHONPATH, so an older checkout given there wins

from PIL import Image, ImageDraw, ImageFilter, ImageFont

from infra.ocr import RapidOcr
from solutions.rag.evaluation import cer, lost_word_boundaries

FONTS = Path("/usr/share/fonts/truetype")
TUNE_TEXT = [
    "Clause 7 applies on 12 March 2024 to unit B-12 of the plant.",
    "Pay 450 EUR by 3 May or call 0800 123 4567 for help.",
    "The pump P3 failed at 14:20 in hall 2 after 36 hours.",
    "Section 4.2 of the contract was signed on 1 June by both parties.",
    "Invoice no 88 lists 3 valves, 12 seals and 1 gasket at 9 EUR each.",
    "Ref A7 in room 5 on floor 2 was cleared at 8 am on 30 April 2023.",
]
TUNE_TEXT_2 = [
    "Article 9 takes effect on 4 July 2025 for site C-40 and its staff.",
    "Tank T2 held 300 litres at 6 bar until 17:45 on day 3 of the test.",
    "Order 5521 ships in 2 boxes to gate 11 before noon on 21 October.",
    "Annex 3 of policy 18 was revised in May by the audit team of unit 6.",
    "Patient 204 received 5 mg at 08:15 and 10 mg at 20:30 on 2 August.",
    "Motor M12 ran for 48 hours at 1500 rpm in line 4 without any fault.",
]


@dataclass(frozen=True)
class Condition:
    """How one page is rendered: the face, the size (px), the word space as a share of the
    face's own, extra pixels between letters, and whether it is degraded like a scan."""

    font: str
    size: int
    word_space: float = 1.0
    tracking: float = 0.0
    scanned: bool = False


def conditions(faces: dict[str, tuple[str, int, float, float]]) -> dict[str, Condition]:
    """Each face clean and scanned."""
    return {f"{name}{'/scan' if s else ''}": Condition(*spec, scanned=s)
            for name, spec in faces.items() for s in (False, True)}


TUNE = conditions({
    "dejavu26": ("dejavu/DejaVuSans.ttf", 26, 1.0, 0.0),
    "dejavu14": ("dejavu/DejaVuSans.ttf", 14, 1.0, 0.0),
    "dejavu12": ("dejavu/DejaVuSans.ttf", 12, 1.0, 0.0),
    "condensed20": ("dejavu/DejaVuSansCondensed.ttf", 20, 1.0, 0.0),
    "narrow20": ("liberation/LiberationSansNarrow-Regular.ttf", 20, 1.0, 0.0),
    "serif18": ("dejavu/DejaVuSerif.ttf", 18, 1.0, 0.0),
    "mono20": ("dejavu/DejaVuSansMono.ttf", 20, 1.0, 0.0),
    "libserif20": ("liberation/LiberationSerif-Regular.ttf", 20, 1.0, 0.0),
    "space50%_26": ("dejavu/DejaVuSans.ttf", 26, 0.5, 0.0),
    "space35%_26": ("dejavu/DejaVuSans.ttf", 26, 0.35, 0.0),
    "tight_letters26": ("dejavu/DejaVuSans.ttf", 26, 0.6, -1.5),
    "wide_letters26": ("dejavu/DejaVuSans.ttf", 26, 1.0, 3.0),
})
TUNE_2 = conditions({
    "libsans22": ("liberation/LiberationSans-Regular.ttf", 22, 1.0, 0.0),
    "dejavu_bold20": ("dejavu/DejaVuSans-Bold.ttf", 20, 1.0, 0.0),
    "serif_condensed19": ("dejavu/DejaVuSerifCondensed.ttf", 19, 1.0, 0.0),
    "libmono18": ("liberation/LiberationMono-Regular.ttf", 18, 1.0, 0.0),
    "space60%_16": ("dejavu/DejaVuSans.ttf", 16, 0.6, 0.0),
    "wide_letters32": ("liberation/LiberationSans-Regular.ttf", 32, 1.0, 4.0),
})
HELD_OUT_TEXT = [
    "Item 14 of form W-8 was filled in on 9 January by clerk 31 in Bonn.",
    "Boiler B5 reached 95 degrees at 03:10 and tripped 2 minutes later.",
    "Lot 77 of batch 2024-06 failed test 5 at stage 3 on bench 12 today.",
    "Rule 6 bans 4 of the 19 solvents used in plant 8 since 1 April.",
    "Flight 318 left gate 7 at 9 pm with 142 people and 6 crew aboard.",
    "Page 3 of report 61 lists 24 cracks in wing 2 near rib 15 of jet 9.",
]
HELD_OUT = conditions({
    "libsans_bold18": ("liberation/LiberationSans-Bold.ttf", 18, 1.0, 0.0),
    "dejavu_serif_bold22": ("dejavu/DejaVuSerif-Bold.ttf", 22, 1.0, 0.0),
    "libserif_italic24": ("liberation/LiberationSerif-Italic.ttf", 24, 1.0, 0.0),
    "dejavu_oblique20": ("dejavu/DejaVuSans-Oblique.ttf", 20, 1.0, 0.0),
    "narrow_bold24_wide": ("liberation/LiberationSansNarrow-Bold.ttf", 24, 1.0, 2.5),
    "space70%_30": ("dejavu/DejaVuSans.ttf", 30, 0.7, 0.0),
})


def draw_line(draw: ImageDraw.ImageDraw, xy: tuple[float, float], line: str, font: ImageFont.FreeTypeFont,
              cond: Condition) -> None:
    """One line, word by word (and letter by letter when tracked), with the condition's spacing."""
    x, y = xy
    space = font.getlength(" ") * cond.word_space
    for i, word in enumerate(line.split(" ")):
        x += space if i else 0
        if not cond.tracking:
            draw.text((x, y), word, font=font, fill="black")
            x += font.getlength(word)
            continue
        for ch in word:
            draw.text((x, y), ch, font=font, fill="black")
            x += font.getlength(ch) + cond.tracking


def scan(img: Image.Image, seed: int = 0) -> Image.Image:
    """``img`` as a cheap scanner delivers it: rotated 1 degree, blurred, speckled, JPEG 40."""
    rng = random.Random(seed)
    grey = img.convert("L").rotate(1.0, resample=Image.BICUBIC, fillcolor=255, expand=True)
    grey = grey.filter(ImageFilter.GaussianBlur(0.8))
    px = grey.load()
    for _ in range(grey.width * grey.height // 300):
        px[rng.randrange(grey.width), rng.randrange(grey.height)] = rng.choice((0, 90, 200))
    buf = io.BytesIO()
    grey.save(buf, "JPEG", quality=40)
    return Image.open(io.BytesIO(buf.getvalue())).convert("RGB")


def render(lines: list[str], cond: Condition, width: int = 1400) -> Image.Image:
    font = ImageFont.truetype(str(FONTS / cond.font), cond.size)
    step = int(cond.size * 1.9)
    img = Image.new("RGB", (width, 60 + step * len(lines)), "white")
    draw = ImageDraw.Draw(img)
    for i, line in enumerate(lines):
        draw_line(draw, (40, 30 + step * i), line, font, cond)
    return scan(img) if cond.scanned else img


def score(reference: str, text: str) -> dict[str, float | int]:
    lost, seen = lost_word_boundaries(reference, text)
    return {"cer": round(cer(reference, text), 4), "cer_no_spaces": round(cer(reference, text, keep_spaces=False), 4),
            "boundaries_lost": lost, "boundaries_seen": seen}


def summary(scores: list[dict[str, float | int]]) -> dict[str, float | int]:
    """Mean CERs over the pages, boundaries pooled."""
    lost, seen = sum(s["boundaries_lost"] for s in scores), sum(s["boundaries_seen"] for s in scores)
    return {"pages": len(scores), "cer_mean": round(statistics.mean(s["cer"] for s in scores), 4),
            "cer_max": max(s["cer"] for s in scores),
            "cer_no_spaces_mean": round(statistics.mean(s["cer_no_spaces"] for s in scores), 4),
            "boundaries_lost": lost, "boundaries_seen": seen, "boundary_loss": round(lost / max(seen, 1), 4)}


def a4_pages() -> dict[str, tuple[Image.Image, str]]:
    """ocr_bench's first English A4 page, clean and scanned, as pdfium renders it back."""
    sys.path.insert(0, str(ROOT / "bench"))
    from ocr_bench import page_texts, render_page

    from infra.ocr import pdf_pages

    text = page_texts("en", 2)[0]
    out = {}
    for scanned in (False, True):
        pdf, ref = render_page(text, "en", scanned, seed=0)
        ((_, _, image),) = list(pdf_pages(pdf, [0], dpi=150, max_pixels=40_000_000))
        out[f"a4{'/scan' if scanned else ''}"] = (image, ref)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a4", action="store_true", help="add a full A4 page, clean and scanned (slow)")
    ap.add_argument("--detail", action="store_true", help="every page's scores, not only the sums")
    args = ap.parse_args()
    engine = RapidOcr()
    import infra.ocr

    out: dict[str, object] = {"bench": "ocr_spaces", "infra": str(Path(infra.ocr.__file__).parent),
                              "load_avg": [round(x, 2) for x in os.getloadavg()]}
    t = time.perf_counter()
    engine.read(Image.new("RGB", (200, 60), "white"))  # model load, apart from the pages
    out["load_s"] = round(time.perf_counter() - t, 2)
    pages: dict[str, dict[str, tuple[Image.Image, str]]] = {
        "tune": {name: (render(TUNE_TEXT, c), "\n".join(TUNE_TEXT)) for name, c in TUNE.items()}
        | {name: (render(TUNE_TEXT_2, c), "\n".join(TUNE_TEXT_2)) for name, c in TUNE_2.items()},
        "held_out": {name: (render(HELD_OUT_TEXT, c), "\n".join(HELD_OUT_TEXT)) for name, c in HELD_OUT.items()},
    }
    if args.a4:
        pages["a4"] = a4_pages()
    secs = []
    for group, items in pages.items():
        scores = {}
        for name, (image, reference) in items.items():
            t = time.perf_counter()
            text = engine.read(image)
            secs.append(time.perf_counter() - t)
            scores[name] = score(reference, text)
        out[group] = summary(list(scores.values()))
        if args.detail:
            out[f"{group}_pages"] = scores
    out["s_per_page_median"] = round(statistics.median(secs), 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
