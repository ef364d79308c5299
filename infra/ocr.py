"""OCR engines and page rendering: text from images and from PDF pages without a text layer.

Three engines read one page image each and return its text, lines in reading order
(:meth:`read`); an engine that scores what it reads also gives each line its confidence
(``read_lines``, see :func:`read_lines`), so a caller can tell a short line read with
certainty from low-confidence noise:

- ``rapidocr``: embedded, PyPI ``rapidocr`` on ONNX Runtime with the PP-OCR detection and
  recognition models (Chinese + English) shipped inside the wheel; nothing is downloaded.
  Scores every text box (its recognition confidence, 0-1).
- ``tesseract``: PyPI ``pytesseract`` over a ``tesseract`` binary on ``PATH`` (optional).
- ``tika``: the configured Tika server OCRs the page image (its Tesseract parser; the
  ``X-Tika-OCRLanguage`` header names the languages).

:func:`ocr_engine` picks one from :class:`infra.settings.OcrSettings`. PDF pages are rendered
with PyPI ``pypdfium2``; images are decoded with Pillow after their size was checked.
"""

from __future__ import annotations

import importlib.util
import io
import logging
import shutil
import threading
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
        out.append(OcrLine(" ".join(i[3] for i in words), min(known) if known else None))
    return out


class RapidOcr:
    """Embedded OCR: ``rapidocr`` with its packaged ONNX models, on one CPU thread by default."""

    name = "rapidocr"

    def __init__(self, threads: int = 1, side_len: int = 960) -> None:
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
        scores = list(out.scores) if out.scores is not None else [None] * len(out.txts)
        return [line for line in scored_lines_in_order(out.boxes.tolist(), list(out.txts), scores) if line.text]

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
        return RapidOcr(threads=settings.threads)
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
                               "(INDUSFLOW_OCR_MAX_IMAGE_PIXELS)", "too_large")
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
