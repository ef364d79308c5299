"""OCR engines and page rendering: text from images and from PDF pages without a text layer.

Three engines read one page image each and return its text, lines in reading order
(:meth:`read`); an engine that scores what it reads also gives each line its confidence
(``read_lines``, see :func:`read_lines`), so a caller can tell a short line read with
certainty from low-confidence noise:

- ``rapidocr``: embedded, PyPI ``rapidocr`` on ONNX Runtime with the PP-OCR detection and
  recognition models (Chinese + English) shipped inside the wheel; nothing is downloaded.
  Scores every text box (its recognition confidence, 0-1). Its character boxes give back the
  spaces its recogniser drops between words on scans (:func:`spaced_text`).
- ``tesseract``: PyPI ``pytesseract`` over a ``tesseract`` binary on ``PATH`` (optional).
- ``tika``: the configured Tika server OCRs the page image (its Tesseract parser; the
  ``X-Tika-OCRLanguage`` header names the languages).

:func:`ocr_engine` picks one from :class:`infra.settings.OcrSettings`. PDF pages are rendered
with PyPI ``pypdfium2``; images are decoded with Pillow after their size was checked.
"""

from __future__ import annotations

import importlib.util
import io
import itertools
import logging
import shutil
import statistics
import threading
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from infra.errors import IndusflowError
from infra.secrets import scrub, shown_url
from infra.settings import OcrSettings

if TYPE_CHECKING:
    from PIL.Image import Image

log = logging.getLogger(__name__)

ENGINES = ("rapidocr", "tesseract", "tika")


class OcrError(IndusflowError):
    """An OCR engine is unavailable, or could not read an image or page.

    ``reason`` is the quarantine reason it stands for: ``corrupt`` (the image or PDF can't be
    decoded), ``too_large`` (over the pixel limit) or ``ocr_failed`` (the engine failed).
    """

    def __init__(self, message: str, reason: str = "ocr_failed") -> None:
        super().__init__(message)
        self.reason = reason


class OcrEngine(Protocol):
    """Reads the text of one page image."""

    name: str

    def read(self, image: Image) -> str:
        """The text of ``image``, one line per text line, in reading order."""
        ...


@dataclass(frozen=True)
class OcrLine:
    """One line an engine read: its text and the engine's confidence (0-1; None when the
    engine gives none)."""

    text: str
    confidence: float | None = None


def read_lines(engine: OcrEngine, image: Image) -> list[OcrLine]:
    """The lines ``engine`` reads in ``image``, scored when the engine scores them (its
    ``read_lines``), else its text line by line with no confidence."""
    scored = getattr(engine, "read_lines", None)
    if scored is not None:
        return list(scored(image))
    return [OcrLine(line) for line in engine.read(image).splitlines() if line.strip()]


# ------------------------------------------------------------------------------------
# engines

_RAPID_LOCK = threading.Lock()
_RAPID: dict[tuple, Any] = {}  # loaded engines by their parameters (the models load once per process)


def lines_in_order(boxes: Sequence[Sequence[Sequence[float]]], texts: Sequence[str]) -> list[str]:
    """Text boxes (four corner points each) grouped into lines top to bottom, words left to right.

    A box joins the current line when its vertical centre lies inside the line's first box.
    """
    return [line.text for line in scored_lines_in_order(boxes, texts, [None] * len(texts))]


def scored_lines_in_order(boxes: Sequence[Sequence[Sequence[float]]], texts: Sequence[str],
                          scores: Sequence[float | None]) -> list[OcrLine]:
    """As :func:`lines_in_order`, each line with the lowest confidence of its boxes (a line is
    only as certain as its least certain word)."""
    items = []
    for box, text, score in zip(boxes, texts, scores, strict=True):
        ys = [float(p[1]) for p in box]
        xs = [float(p[0]) for p in box]
        items.append((min(ys), max(ys), min(xs), text, score))
    items.sort(key=lambda i: ((i[0] + i[1]) / 2, i[2]))
    lines: list[list[tuple[float, float, float, str, float | None]]] = []
    for item in items:
        centre = (item[0] + item[1]) / 2
        if lines and lines[-1][0][0] <= centre <= lines[-1][0][1]:
            lines[-1].append(item)
        else:
            lines.append([item])
    out = []
    for line in lines:
        words = [i for i in sorted(line, key=lambda i: i[2]) if i[3].strip()]
        known = [float(i[4]) for i in words if i[4] is not None]
        out.append(OcrLine(join_boxes([i[3] for i in words]), min(known) if known else None))
    return out


# ------------------------------------------------------------------------------------
# spaces from geometry: the recogniser runs words together ("Clause7", "on12March") on blurred
# scans and tight spacing; the blank ink between its characters shows where the spaces were.

#: A gap between two characters is a space the recogniser missed when it is at least this share
#: of the median gap where it did read a space in the same line (its own calibration of the
#: font, size and spacing at hand). Tuned with bench/ocr_spaces_bench.py.
SPACE_OF_READ_SPACES = 0.9
#: In a line where it read no space: a gap of at least this share of the line's ink height
#: (ascender to descender). Conservative: on the tuning pages 20 of 4,820 letter gaps ("ll",
#: "il" in blurred scans) reached 0.4, one reached 0.45.
SPACE_OF_INK_HEIGHT = 0.45
#: Gaps narrower than this many pixels are never spaces (one pixel is noise at small sizes).
MIN_SPACE_PX = 2
#: No space is inserted before these characters, nor after the next set (punctuation and
#: hyphens have wide side bearings: "B-12", "p.", "(see" must stay as they are), nor between
#: two digits.
_NO_SPACE_BEFORE = frozenset(".,;:!?)]}%'\"-/")
_NO_SPACE_AFTER = frozenset("([{'\"-/")
#: Scripts written without spaces between words: Han, kana, CJK symbols and punctuation,
#: full-width forms. No space is inserted next to them, and their boxes are joined without one.
_UNSPACED_RANGES = ((0x3000, 0x30FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF),
                    (0xFF00, 0xFFEF), (0x20000, 0x2FA1F))


def _unspaced(ch: str) -> bool:
    code = ord(ch)
    return any(lo <= code <= hi for lo, hi in _UNSPACED_RANGES)


def _spaced_script(ch: str) -> bool:
    """Whether ``ch`` belongs to text written with spaces between words (ASCII, Latin, Greek,
    Cyrillic): the only places where a space may be inserted."""
    if ch.isascii():
        return ch.isprintable()
    return unicodedata.name(ch, "").split(" ")[0] in ("LATIN", "GREEK", "CYRILLIC")


def join_boxes(texts: Sequence[str]) -> str:
    """The texts of one line's boxes, left to right: a space between them, except where either
    side of the join is CJK (Chinese is written without spaces, also next to Latin and digits:
    "泵站P3停机")."""
    out = ""
    for text in texts:
        if out and not (_unspaced(out[-1]) or _unspaced(text[0])):
            out += " "
        out += text
    return out


def gaps_between(blank: Sequence[bool], spans: Sequence[tuple[float, float]]) -> list[int]:
    """For each pair of consecutive characters, the widest run of blank columns between their
    centres (in pixels).

    Args:
        blank: per column of the straightened line, whether it holds no ink.
        spans: each character's left and right x in the same columns, in reading order (the
            engine's character boxes).
    """
    centres = [(a + b) / 2 for a, b in spans]
    gaps = []
    for left, right in itertools.pairwise(centres):
        lo, hi = max(int(min(left, right)), 0), min(int(max(left, right)) + 1, len(blank))
        best = run = 0
        for column in blank[lo:hi]:
            run = run + 1 if column else 0
            best = max(best, run)
        gaps.append(best)
    return gaps


def _space_threshold(gaps: Sequence[float], read: set[int], ink_height: float) -> float:
    """The narrowest gap that counts as a space in this line (see ``SPACE_OF_READ_SPACES``)."""
    seen = [gaps[i - 1] for i in read]
    if seen:
        return max(SPACE_OF_READ_SPACES * statistics.median(seen), MIN_SPACE_PX)
    return max(SPACE_OF_INK_HEIGHT * ink_height, MIN_SPACE_PX)


def spaced_text(text: str, gaps: Sequence[float], ink_height: float) -> str:
    """``text`` with a space where the recogniser read none but the line's ink has one.

    ``gaps[i]`` is the blank width (pixels) between the i-th and the next non-space character
    of ``text`` (:func:`gaps_between`). A gap about as wide as the spaces the recogniser did
    read in this line (``SPACE_OF_READ_SPACES`` of their median; with none read,
    ``SPACE_OF_INK_HEIGHT``) becomes a space, only between characters of scripts written with
    spaces, never between digits nor next to punctuation that takes none. Spaces already in
    ``text`` are kept (runs of them as one); none is removed.
    """
    chars = [c for c in text if not c.isspace()]
    if len(gaps) != max(len(chars) - 1, 0):
        raise ValueError(f"{len(gaps)} gaps for {len(chars)} characters")
    read: set[int] = set()  # indexes of characters the recogniser put a space before
    count = 0
    for c in text:
        if c.isspace():
            read.add(count)
        else:
            count += 1
    threshold = _space_threshold(gaps, {i for i in read if 0 < i < len(chars)}, ink_height)
    out: list[str] = []
    for i, c in enumerate(chars):
        if (i in read and out) or (i and _missed_space(chars[i - 1], c, gaps[i - 1], threshold)):
            out.append(" ")
        out.append(c)
    return "".join(out)


def _missed_space(before: str, after: str, gap: float, threshold: float) -> bool:
    if gap < threshold or before in _NO_SPACE_AFTER or after in _NO_SPACE_BEFORE:
        return False
    if after.isdigit() and (before.isdigit() or before in ".,:"):
        # digits are set in equal-width cells, so a narrow "1" leaves gaps as wide as a tight
        # space ("1 7:45"); "4.2", "1,000" and "14:20" keep their dot, comma and colon
        return False
    return _spaced_script(before) and _spaced_script(after)


@dataclass(frozen=True)
class LineInk:
    """A text box straightened to a rectangle: which of its columns hold no ink, the height of
    its ink (ascender to descender, pixels) and the transform from page to box coordinates."""

    blank: Any  # numpy bool array, one per column
    ink_height: float
    transform: Any  # 3x3 numpy perspective matrix


def line_ink(gray: Any, quad: Sequence[Sequence[float]]) -> LineInk | None:
    """The ink of one text box of a greyscale page (numpy uint8), or None for a box that is
    taller than wide (vertical text) or blank.

    A pixel is ink when it is darker than halfway between paper and ink (light text on a dark
    ground is inverted first); a column with at most one ink pixel is blank, so a speck of
    scanner noise does not close a gap.
    """
    import cv2
    import numpy as np

    q = np.asarray(quad, dtype=np.float32)
    width = int(max(np.linalg.norm(q[0] - q[1]), np.linalg.norm(q[3] - q[2])) + 0.5)
    height = int(max(np.linalg.norm(q[0] - q[3]), np.linalg.norm(q[1] - q[2])) + 0.5)
    if width < 2 or height < 2 or height > width:
        return None
    target = np.array([[0, 0], [width, 0], [width, height], [0, height]], dtype=np.float32)
    transform = cv2.getPerspectiveTransform(q, target)
    crop = cv2.warpPerspective(gray, transform, (width, height), flags=cv2.INTER_LINEAR,
                               borderMode=cv2.BORDER_REPLICATE)
    lo, hi = np.percentile(crop, (2, 95))
    if hi - lo < 16:  # no contrast: nothing to measure
        return None
    middle = (lo + hi) / 2
    ink = crop < middle if np.median(crop) >= middle else crop > middle
    rows = np.flatnonzero(ink.sum(axis=1) >= max(1, 0.01 * width))
    ink_height = float(rows[-1] - rows[0] + 1) if rows.size else float(height)
    return LineInk(ink.sum(axis=0) <= 1, ink_height, transform)


def box_text_with_spaces(gray: Any, quad: Sequence[Sequence[float]], text: str,
                         char_boxes: Sequence[Sequence[Sequence[float]]]) -> str:
    """``text`` of one text box with the spaces its ink shows (:func:`spaced_text`), given the
    engine's character boxes (page coordinates, one per non-space character of ``text``);
    ``text`` unchanged where the box can't be measured."""
    import cv2
    import numpy as np

    ink = line_ink(gray, quad)
    if ink is None or len(char_boxes) < 2:
        return text
    corners = np.asarray(char_boxes, dtype=np.float32).reshape(-1, 4, 2)
    in_box = cv2.perspectiveTransform(corners.reshape(1, -1, 2), ink.transform).reshape(-1, 4, 2)
    spans = [(float(c[:, 0].min()), float(c[:, 0].max())) for c in in_box]
    return spaced_text(text, gaps_between(ink.blank.tolist(), spans), ink.ink_height)


def _texts_with_spaces(gray: Any, boxes: list, texts: list[str], word_results: Any) -> list[str]:
    """Each box's text with the spaces its ink shows. rapidocr leaves out the character boxes
    of a box it has none for, so they are matched to the texts by their characters; a box
    whose characters don't match keeps its text as read."""
    import cv2

    chars = [[(str(t), b) for t, _score, b in line] for line in (word_results or ()) if line]
    out, k = [], 0
    for quad, text in zip(boxes, texts, strict=True):
        if k < len(chars) and "".join(t for t, _ in chars[k]) == "".join(text.split()):
            try:
                text = box_text_with_spaces(gray, quad, text, [b for _, b in chars[k]])
            except (cv2.error, ValueError) as exc:  # a degenerate box: the text as read is still good
                log.debug("OCR spacing skipped for one box: %s", type(exc).__name__)
            k += 1
        out.append(text)
    return out


#: CPU threads of the embedded OCR: one, so a page's OCR leaves the other cores to the ingest's embedding and to
#: the API's requests (ONNX Runtime's own default takes every core).
RAPIDOCR_THREADS = 1


class RapidOcr:
    """Embedded OCR: ``rapidocr`` with its packaged ONNX models, on :data:`RAPIDOCR_THREADS` CPU threads."""

    name = "rapidocr"

    def __init__(self, threads: int = RAPIDOCR_THREADS, side_len: int = 960) -> None:
        self.threads = threads
        self.side_len = side_len

    @staticmethod
    def available() -> bool:
        return importlib.util.find_spec("rapidocr") is not None

    def _engine(self) -> Any:
        key = (self.threads, self.side_len)
        with _RAPID_LOCK:
            if key not in _RAPID:
                from rapidocr import RapidOCR

                _RAPID[key] = RapidOCR(params={
                    "Global.log_level": "error",
                    "Global.use_cls": False,  # its 180-degree guesses turned correct lines upside down (CER 0.2)
                    # a box per character: where the recogniser ran words together, the ink
                    # between its characters shows the spaces (box_text_with_spaces)
                    "Global.return_word_box": True,
                    "Global.return_single_char_box": True,
                    "Det.limit_type": "max",  # shrink big pages to side_len, never blow small images up
                    "Det.limit_side_len": self.side_len,
                    "EngineConfig.onnxruntime.intra_op_num_threads": self.threads or -1,
                    "EngineConfig.onnxruntime.inter_op_num_threads": 1,
                })
            return _RAPID[key]

    def read_lines(self, image: Image) -> list[OcrLine]:
        """The lines of ``image`` in reading order, each with its recognition confidence."""
        import numpy as np

        engine = self._engine()
        try:
            with _RAPID_LOCK:  # one page at a time per process: parse batches may run on threads
                out = engine(np.asarray(image.convert("RGB")))
        except Exception as exc:  # onnxruntime / opencv errors on odd images
            raise OcrError(f"rapidocr: {type(exc).__name__}: {exc}"[:300]) from exc
        if out.boxes is None or not out.txts:
            return []
        boxes = out.boxes.tolist()
        texts = _texts_with_spaces(np.asarray(image.convert("L")), boxes, list(out.txts), out.word_results)
        scores = list(out.scores) if out.scores is not None else [None] * len(texts)
        return [line for line in scored_lines_in_order(boxes, texts, scores) if line.text]

    def read(self, image: Image) -> str:
        return "\n".join(line.text for line in self.read_lines(image))


class TesseractOcr:
    """Tesseract through ``pytesseract`` (the ``tesseract`` binary must be on ``PATH``)."""

    name = "tesseract"

    def __init__(self, languages: str = "eng", timeout_s: float = 120.0) -> None:
        self.languages = languages
        self.timeout_s = timeout_s

    @staticmethod
    def available() -> bool:
        return importlib.util.find_spec("pytesseract") is not None and shutil.which("tesseract") is not None

    def read(self, image: Image) -> str:
        import pytesseract

        try:
            text = pytesseract.image_to_string(image, lang=self.languages, timeout=self.timeout_s)
        except Exception as exc:  # TesseractError, missing language data, timeout
            raise OcrError(f"tesseract: {type(exc).__name__}: {exc}"[:300]) from exc
        return "\n".join(line.strip() for line in text.splitlines() if line.strip())


class TikaServerOcr:
    """The Tika server's OCR: each page image is ``PUT`` to ``/tika`` as PNG, plain text back."""

    name = "tika"

    def __init__(self, url: str, languages: str = "eng", timeout_s: float = 120.0) -> None:
        self.url = url.rstrip("/")
        self.languages = languages
        self.timeout_s = timeout_s

    def headers(self) -> dict[str, str]:
        """The request headers: plain text back, OCR on, the OCR languages."""
        return {"Accept": "text/plain", "Content-Type": "image/png", "X-Tika-OCRskipOcr": "false",
                "X-Tika-OCRLanguage": self.languages}

    def read(self, image: Image) -> str:
        import requests

        buf = io.BytesIO()
        image.convert("RGB").save(buf, format="PNG")
        try:
            resp = requests.put(f"{self.url}/tika", data=buf.getvalue(), headers=self.headers(),
                                timeout=self.timeout_s)
        except requests.RequestException as exc:
            raise OcrError(f"tika server {shown_url(self.url)}: {type(exc).__name__}: {scrub(str(exc))}"[:300]) from None
        if resp.status_code not in (200, 204):
            raise OcrError(f"tika server {shown_url(self.url)} answered HTTP {resp.status_code} to an OCR request")
        resp.encoding = resp.encoding or "utf-8"
        return "\n".join(line.strip() for line in (resp.text or "").splitlines() if line.strip())


def ocr_engine(settings: OcrSettings, tika_url: str | None = None, *, tika_timeout_s: float = 120.0) -> OcrEngine | None:
    """The configured OCR engine; None when OCR is off (or ``auto`` finds no engine).

    ``auto`` takes rapidocr when installed, else Tesseract when installed, else the Tika server
    when one is configured.

    Raises:
        OcrError: the engine named in the settings is not available here.
    """
    choice = settings.engine
    if choice == "off":
        return None
    if choice in ("auto", "rapidocr") and RapidOcr.available():
        return RapidOcr()
    if choice == "rapidocr":
        raise OcrError("INDUSFLOW_OCR_ENGINE=rapidocr but PyPI rapidocr is not installed: "
                       "pip install 'indusflow[rag]' (or rapidocr), or choose another engine")
    if choice in ("auto", "tesseract") and TesseractOcr.available():
        return TesseractOcr(settings.languages, tika_timeout_s)
    if choice == "tesseract":
        raise OcrError("INDUSFLOW_OCR_ENGINE=tesseract but pytesseract or the tesseract binary is missing: "
                       "pip install pytesseract and install tesseract (e.g. apt-get install tesseract-ocr)")
    if choice in ("auto", "tika") and tika_url:
        return TikaServerOcr(tika_url, settings.languages, tika_timeout_s)
    if choice == "tika":
        raise OcrError("INDUSFLOW_OCR_ENGINE=tika needs a Tika server: set INDUSFLOW_TIKA_SERVER_URL")
    log.warning("no OCR engine available: scanned pages and images will be quarantined as empty")
    return None


def available_engines(tika_url: str | None = None) -> list[str]:
    """The engines that can run here, in ``auto``'s order of preference."""
    found = []
    if RapidOcr.available():
        found.append("rapidocr")
    if TesseractOcr.available():
        found.append("tesseract")
    if tika_url:
        found.append("tika")
    return found


# ------------------------------------------------------------------------------------
# images and pages


def open_image_frames(data: bytes, max_pixels: int, max_frames: int) -> tuple[list[Image], int]:
    """The frames of an image file (a multi-page TIFF has several), and how many were left out.

    The size is checked before any pixel is decoded.

    Raises:
        OcrError: Pillow cannot read the image, or a frame is over ``max_pixels``.
    """
    from PIL import Image as PILImage
    from PIL import ImageSequence, UnidentifiedImageError

    try:
        img = PILImage.open(io.BytesIO(data))
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise OcrError(f"not a readable image ({type(exc).__name__})", "corrupt") from exc
    frames: list[Image] = []
    total = getattr(img, "n_frames", 1)
    try:
        for i, frame in enumerate(ImageSequence.Iterator(img)):
            if i >= max_frames:
                break
            w, h = frame.size
            if w * h > max_pixels:
                raise OcrError(f"image of {w}x{h} pixels is over the OCR limit of {max_pixels} pixels "
                               "(tasks.ocr.OcrLimits.max_image_pixels)", "too_large")
            frames.append(frame.convert("RGB"))
    except (OSError, ValueError, SyntaxError) as exc:  # truncated or corrupt pixel data
        raise OcrError(f"image data unreadable ({type(exc).__name__}: {exc})"[:300], "corrupt") from exc
    return frames, max(0, total - len(frames))


class _pdf:
    """``with _pdf(data) as pdf``: a pdfium document, closed on exit."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.doc: Any = None

    def __enter__(self) -> Any:
        import pypdfium2 as pdfium

        try:
            self.doc = pdfium.PdfDocument(self.data)
        except Exception as exc:  # PdfiumError: password, corrupt
            raise OcrError(f"pdfium cannot open the PDF ({exc})"[:300], "corrupt") from exc
        return self.doc

    def __exit__(self, *exc: object) -> None:
        if self.doc is not None:
            self.doc.close()


def pdf_pages(data: bytes, wanted: Sequence[int], *, dpi: int, max_pixels: int) -> Iterator[tuple[int, str, Image | None]]:
    """For each 0-based page index of the PDF: ``(index, text layer, rendered image or None)``.

    Pages in ``wanted`` are rendered at ``dpi`` (lowered where a page would be over
    ``max_pixels``); the others only give their text layer.

    Raises:
        OcrError: pdfium cannot open the PDF or render a page.
    """
    wanted_set = set(wanted)
    with _pdf(data) as pdf:
        for i in range(len(pdf)):
            page = pdf[i]
            try:
                textpage = page.get_textpage()
                text = textpage.get_text_bounded() or ""
                textpage.close()
                image = None
                if i in wanted_set:
                    w_pt, h_pt = page.get_size()
                    scale = dpi / 72
                    if w_pt * h_pt * scale * scale > max_pixels:
                        scale = (max_pixels / max(w_pt * h_pt, 1.0)) ** 0.5
                    image = page.render(scale=scale).to_pil()
            except OcrError:
                raise
            except Exception as exc:
                raise OcrError(f"pdfium cannot render page {i + 1} ({type(exc).__name__})") from exc
            finally:
                page.close()
            yield i, text, image
