"""OCR benchmark: character error rate and seconds per page of each available engine; one JSON line.

Pages are rendered here from real text (English: the text layer of ``testPDF.pdf`` in
``../shared/data/docs``; Chinese: CMRC 2018 trial passages in ``../shared/data/qa``) in a real
TrueType font on an A4 page at 150 dpi, as a scanner would deliver them: ``clean``, and
``scanned`` (rotated 1 degree, blurred, speckled, saved as JPEG quality 40). Every page goes
through the same path as ingestion: an image-only PDF, rendered back by pdfium, read by the
engine. CER = edit distance / reference length after whitespace normalisation (removed for
Chinese).

Usage: python bench/ocr_bench.py [--pages 2] [--engines rapidocr,tesseract]
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
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from PIL import Image, ImageDraw, ImageFilter, ImageFont

from infra.ocr import OcrError, RapidOcr, TesseractOcr, pdf_pages
from solutions.rag.evaluation import cer

DATA = ROOT.parent / "shared" / "data"
FONTS = {"en": Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"),
         "zh": Path("/usr/share/fonts/truetype/wqy/wqy-microhei.ttc")}


def wrap(text: str, font: ImageFont.FreeTypeFont, width: int, lang: str) -> list[str]:
    units = list(text) if lang == "zh" else text.split()
    lines, cur = [], ""
    for u in units:
        cand = (cur + u) if lang == "zh" or not cur else f"{cur} {u}"
        if font.getlength(cand) > width and cur:
            lines.append(cur)
            cur = u
        else:
            cur = cand
    return lines + ([cur] if cur else [])


def page_texts(lang: str, pages: int) -> list[str]:
    if lang == "en":
        import pypdfium2 as pdfium

        doc = pdfium.PdfDocument(str(DATA / "docs" / "testPDF.pdf"))
        text = " ".join(" ".join(doc[i].get_textpage().get_text_bounded().split()) for i in range(len(doc)))
        words = text.split()
        size = len(words) // pages
        return [" ".join(words[i * size:(i + 1) * size]) for i in range(pages)]
    qa = json.loads((DATA / "qa" / "cmrc2018_trial_squad.json").read_text(encoding="utf-8"))
    contexts = [p["context"] for d in qa["data"] for p in d["paragraphs"]]
    return ["".join(c.split())[:420] for c in contexts[:pages]]


def render_page(text: str, lang: str, scanned: bool, seed: int) -> tuple[bytes, str]:
    """An image-only PDF of one A4 page at 150 dpi, and the reference text (the rendered lines)."""
    font = ImageFont.truetype(str(FONTS[lang]), 22)
    img = Image.new("L", (1240, 1754), 255)
    draw = ImageDraw.Draw(img)
    lines = wrap(text, font, 1240 - 2 * 110, lang)[:40]
    for i, line in enumerate(lines):
        draw.text((110, 120 + 38 * i), line, font=font, fill=0)
    if scanned:
        rng = random.Random(seed)
        img = img.rotate(1.0, resample=Image.BICUBIC, fillcolor=255).filter(ImageFilter.GaussianBlur(0.8))
        px = img.load()
        for _ in range(4000):
            px[rng.randrange(img.width), rng.randrange(img.height)] = rng.choice((0, 90, 200))
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=40)
        img = Image.open(io.BytesIO(buf.getvalue()))
    out = io.BytesIO()
    img.convert("RGB").save(out, "PDF", resolution=150.0)
    return out.getvalue(), "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=2, help="pages per language and condition")
    ap.add_argument("--engines", default="rapidocr,tesseract")
    args = ap.parse_args()
    engines = {"rapidocr": RapidOcr() if RapidOcr.available() else None,
               "tesseract": TesseractOcr() if TesseractOcr.available() else None}
    out: dict[str, object] = {"bench": "ocr", "load_avg": [round(x, 2) for x in os.getloadavg()],
                              "pages": args.pages, "dpi": 150}
    if engines["rapidocr"]:
        t = time.perf_counter()
        engines["rapidocr"]._engine()  # model load, reported apart
        out["rapidocr_load_s"] = round(time.perf_counter() - t, 2)
    for name in args.engines.split(","):
        engine = engines.get(name)
        if engine is None:
            out[name] = "not available"
            continue
        for lang in ("en", "zh"):
            if not FONTS[lang].exists():
                continue
            if name == "tesseract":
                engine = TesseractOcr("eng" if lang == "en" else "chi_sim")
            for scanned in (False, True):
                scores, secs = [], []
                for i, text in enumerate(page_texts(lang, args.pages)):
                    pdf, ref = render_page(text, lang, scanned, seed=i)
                    ((_, _, image),) = list(pdf_pages(pdf, [0], dpi=150, max_pixels=40_000_000))
                    t = time.perf_counter()
                    try:
                        hyp = engine.read(image)
                    except OcrError as exc:  # e.g. tesseract without chi_sim data
                        out[f"{name}/{lang}"] = f"failed: {exc}"[:120]
                        break
                    secs.append(time.perf_counter() - t)
                    scores.append(cer(ref, hyp, keep_spaces=lang != "zh"))
                if scores:
                    key = f"{name}/{lang}/{'scanned' if scanned else 'clean'}"
                    out[key] = {"cer_median": round(statistics.median(scores), 4), "cer_max": round(max(scores), 4),
                                "s_per_page_median": round(statistics.median(secs), 2),
                                "ref_chars": len(ref)}
    print(json.dumps(out, ensure_ascii=False))


if __name__ == "__main__":
    main()
