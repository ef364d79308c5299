"""OCR of parsed documents: images, and the PDF pages that have no text layer.

:class:`DocumentOcr` decides from Tika's content type and per-page character counts which
pages need OCR, reads them with the configured engine (:mod:`infra.ocr`) and returns the
document's text with those pages filled in, plus what was done (which pages, which engine).
Lines the engine reads with a confidence under :attr:`OcrLimits.min_confidence` (or
holding no letter or digit) are dropped as noise; what is kept is text however short (a stamp,
a one-line notice), so a scored OCR text is never judged by its length. The text then goes
through the same normalisation, quarantine checks and redaction as any parsed text. Per collection, an OCR ledger beside the quarantine cache keeps which documents
had pages OCR'd (``pages_ocr``), so a document listing can show it for every stored document.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from infra.home import home_layout
from infra.ocr import OcrEngine, OcrError, OcrLine, ocr_engine, open_image_frames, pdf_pages, read_lines
from infra.pii import redact_path
from infra.settings import OcrSettings, get_ocr_settings, get_tika_settings
from infra.store import check_name, read_json_dict, safe_join, write_json_atomic

if TYPE_CHECKING:
    from tasks.documents import ParsedDocument, SourceFile

log = logging.getLogger(__name__)

#: Image types OCR reads (Tika's content types); vector formats (SVG) carry their text already.
IMAGE_TYPES = frozenset({
    "image/png", "image/jpeg", "image/tiff", "image/bmp", "image/gif", "image/webp", "image/x-portable-pixmap",
    "image/x-ms-bmp", "image/jp2",
})
PDF_TYPE = "application/pdf"
#: Pages read between two progress lines in the log.
PROGRESS_EVERY = 5


@dataclass(frozen=True)
class OcrInfo:
    """What OCR did for one document."""

    engine: str
    pages: tuple[int, ...]  # 1-based pages (image frames) read by OCR
    chars: int  # characters OCR found
    skipped_pages: int = 0  # pages that needed OCR but were over OcrLimits.max_pages
    failed_pages: tuple[int, ...] = ()  # pages the engine or renderer failed on
    seconds: float = 0.0
    #: The confidence the engine's lines were judged by; None when the engine gives none (its
    #: text is then judged by length, as a text layer is).
    min_confidence: float | None = None
    dropped_lines: int = 0  # lines read under min_confidence (noise), left out of the text

    @property
    def pages_ocr(self) -> int:
        """Pages read by OCR."""
        return len(self.pages)


@dataclass(frozen=True)
class OcrText:
    """A document's text after OCR, page by page (image frames, or every page of a PDF: its text
    layer, with the OCR'd text on the pages that needed it)."""

    pages: tuple[str, ...]
    info: OcrInfo


@dataclass(frozen=True)
class OcrFailure:
    """OCR was needed but could not run (unreadable or too large image, unreadable PDF)."""

    reason: str
    detail: str


def pdf_pages_to_ocr(meta: dict[str, list[str]], text_is_empty: bool, min_page_chars: int) -> list[int] | None:
    """0-based PDF pages whose text layer is under ``min_page_chars`` characters (Tika's
    ``pdf:charsPerPage``); None when Tika gave no per-page counts and the text is not empty."""
    per_page = meta.get("pdf:charsPerPage") or []
    counts = [int(v) for v in per_page if str(v).strip().isdigit()]
    if counts and len(counts) == len(per_page):
        return [i for i, n in enumerate(counts) if n < min_page_chars]
    return [] if not text_is_empty else None  # None: every page


@dataclass(frozen=True)
class OcrLimits:
    """How pages are read: fixed values, each with its reason (tests pass their own)."""

    #: resolution PDF pages are rendered at: 150 dpi puts 10-point text at about 20 pixels high, what the OCR
    #: models read well; 300 dpi costs four times the pixels
    dpi: int = 150
    #: pages OCR'd per document at most (the rest are skipped and counted): at 13-31 s a page for rapidocr on 2
    #: cores (bench/ocr_bench.py, docs/rag.md), 100 pages is already most of an hour
    max_pages: int = 100
    #: larger images are quarantined and PDF pages rendered below it: 40 MP is an A4 page at 600 dpi, while a
    #: decompression bomb's billions of pixels never reach memory
    max_image_pixels: int = 40_000_000
    #: PDF pages with fewer text-layer characters than this are OCR'd (a page number or a header is no text layer)
    min_page_chars: int = 10
    #: OCR lines read with less confidence than this (0-1) are dropped as noise; a page with a line above it keeps
    #: its text however short (a stamp, a one-line notice: tests/integration/test_rag_ocr.py)
    min_confidence: float = 0.85


@dataclass
class DocumentOcr:
    """OCR of the documents of one parse run (the engine loads once)."""

    engine: OcrEngine
    settings: OcrSettings = field(default_factory=OcrSettings)
    limits: OcrLimits = field(default_factory=OcrLimits)

    @property
    def key(self) -> dict[str, object]:
        """What changes the stored text of an OCR'd document (part of the ingest pipeline key)."""
        lim = self.limits
        return {"engine": self.engine.name, "dpi": lim.dpi, "max_pages": lim.max_pages,
                "languages": self.settings.languages, "max_image_pixels": lim.max_image_pixels,
                "min_page_chars": lim.min_page_chars, "min_confidence": lim.min_confidence}

    @property
    def scored(self) -> bool:
        """Whether the engine gives each line a confidence (the text is judged by it)."""
        return hasattr(self.engine, "read_lines")

    def kept(self, lines: list[OcrLine]) -> tuple[str, int]:
        """``(text, lines dropped)``: the lines read with confidence, one per line; a line under
        ``min_confidence`` or without a letter or digit is noise."""
        keep, dropped = [], 0
        for line in lines:
            if line.confidence is not None and (line.confidence < self.limits.min_confidence
                                                or not any(ch.isalnum() for ch in line.text)):
                dropped += 1
            else:
                keep.append(line.text)
        return "\n".join(keep), dropped

    def wants(self, ctype: str, meta: dict[str, list[str]], text: str) -> bool:
        """Whether ``ctype``/``meta`` name an image, or a PDF with pages lacking a text layer."""
        if ctype in IMAGE_TYPES:
            return True
        if ctype == PDF_TYPE:
            pages = pdf_pages_to_ocr(meta, not text.strip(), self.limits.min_page_chars)
            return pages is None or bool(pages)
        return False

    def read(self, data: bytes, ctype: str, meta: dict[str, list[str]], text: str,
             label: str) -> OcrText | OcrFailure:
        """OCR ``data`` (the file's bytes); ``label`` names it in progress lines (redacted first)."""
        shown = redact_path(label)
        try:
            if ctype in IMAGE_TYPES:
                return self._image(data, shown)
            return self._pdf(data, meta, text, shown)
        except OcrError as exc:
            return OcrFailure(exc.reason, str(exc))

    def _read_page(self, image: object, page: int, total: int, shown: str, started: float,
                   dropped: list[int]) -> str | None:
        """The kept text of one page (its dropped lines counted into ``dropped``); None when the engine failed."""
        try:
            text, noise = self.kept(read_lines(self.engine, image))  # type: ignore[arg-type]
        except OcrError as exc:
            log.warning("OCR of %s page %d failed: %s", shown, page, exc)
            return None
        dropped.append(noise)
        if total > 1 and (page % PROGRESS_EVERY == 0 or page == total):
            log.info("OCR (%s) %s: page %d of %d, %.1f s", self.engine.name, shown, page, total,
                     time.perf_counter() - started)
        return text

    def _info(self, pages: list[int], chars: int, skipped: int, failed: list[int], started: float,
              dropped: list[int]) -> OcrInfo:
        return OcrInfo(self.engine.name, tuple(pages), chars, skipped, tuple(failed),
                       round(time.perf_counter() - started, 3),
                       self.limits.min_confidence if self.scored else None, sum(dropped))

    def _image(self, data: bytes, shown: str) -> OcrText | OcrFailure:
        started = time.perf_counter()
        frames, skipped = open_image_frames(data, self.limits.max_image_pixels, self.limits.max_pages)
        if skipped:
            log.warning("%s: %d image frames, only the first %d are OCR'd (OcrLimits.max_pages)", shown,
                        len(frames) + skipped, len(frames))
        texts: list[str] = []
        pages: list[int] = []
        failed: list[int] = []
        dropped: list[int] = []
        for n, frame in enumerate(frames, start=1):
            text = self._read_page(frame, n, len(frames), shown, started, dropped)
            if text is None:
                failed.append(n)
                continue
            pages.append(n)
            texts.append(text)
        info = self._info(pages, sum(len(t.strip()) for t in texts), skipped, failed, started, dropped)
        if not pages:
            return OcrFailure("ocr_failed", f"{self.engine.name} failed on every frame of the image")
        return OcrText(tuple(texts), info)

    def _pdf(self, data: bytes, meta: dict[str, list[str]], text: str, shown: str) -> OcrText | OcrFailure:
        started = time.perf_counter()
        need = pdf_pages_to_ocr(meta, not text.strip(), self.limits.min_page_chars)
        layers: dict[int, str] = {}
        if need is None:  # no per-page counts from Tika: ask pdfium which pages have no text
            for i, layer, _ in pdf_pages(data, (), dpi=self.limits.dpi, max_pixels=self.limits.max_image_pixels):
                layers[i] = layer
            need = [i for i, layer in layers.items() if len(layer.strip()) < self.limits.min_page_chars]
        todo, skipped = need[: self.limits.max_pages], max(0, len(need) - self.limits.max_pages)
        if skipped:
            log.warning("%s: %d pages without a text layer, only the first %d are OCR'd "
                        "(OcrLimits.max_pages)", shown, len(need), len(todo))
        texts: list[str] = []
        pages: list[int] = []
        failed: list[int] = []
        dropped: list[int] = []
        chars = 0
        for i, layer, image in pdf_pages(data, todo, dpi=self.limits.dpi, max_pixels=self.limits.max_image_pixels):
            page_text = layer
            if image is not None:
                read = self._read_page(image, len(pages) + len(failed) + 1, len(todo), shown, started, dropped)
                if read is None:
                    failed.append(i + 1)
                else:
                    pages.append(i + 1)
                    chars += len(read.strip())
                    page_text = read if len(layer.strip()) == 0 else f"{layer.strip()}\n{read}"
            texts.append(page_text)
        info = self._info(pages, chars, skipped, failed, started, dropped)
        if todo and not pages:
            return OcrFailure("ocr_failed", f"{self.engine.name} failed on every page it was given ({len(todo)})")
        return OcrText(tuple(texts), info)


def document_ocr(settings: OcrSettings | None = None, tika_url: str | None = None) -> DocumentOcr | None:
    """The OCR of this run from the settings (None when off or no engine is available).

    Raises:
        infra.ocr.OcrError: the engine the settings name is not available.
    """
    settings = settings or get_ocr_settings()
    if settings.engine == "off":
        return None
    tika = get_tika_settings()
    engine = ocr_engine(settings, tika_url if tika_url is not None else tika.server_url)
    return DocumentOcr(engine, settings) if engine else None


def ocr_key() -> dict[str, object] | None:
    """What of the OCR set-up changes stored text (None when OCR is off): part of the ingest key."""
    ocr = document_ocr()
    return ocr.key if ocr else None


# ------------------------------------------------------------------------------------
# per-collection ledger of OCR'd documents


@dataclass(frozen=True)
class OcrRecord:
    """One stored document that had pages OCR'd (as kept in the collection's OCR ledger)."""

    path: str
    engine: str
    pages_ocr: int
    pages: tuple[int, ...]
    skipped_pages: int = 0
    failed_pages: tuple[int, ...] = ()


def ocr_ledger_path(collection: str) -> Path:
    """The OCR ledger of ``collection`` (source -> file hash and OCR records of its documents)."""
    return safe_join(home_layout().rag(), f"{check_name(collection, 'collection name')}-ocr.json")


def load_ocr_ledger(collection: str) -> dict[str, dict]:
    """The OCR ledger of ``collection`` (empty when missing or unreadable)."""
    return read_json_dict(ocr_ledger_path(collection))


def ocr_records(collection: str) -> dict[str, OcrRecord]:
    """Every document of ``collection`` with OCR'd pages, by its (redacted) path."""
    out = {}
    for entry in load_ocr_ledger(collection).values():
        for r in entry.get("documents", []):
            out[r["path"]] = OcrRecord(r["path"], r["engine"], int(r["pages_ocr"]), tuple(r["pages"]),
                                       int(r.get("skipped_pages", 0)), tuple(r.get("failed_pages", ())))
    return out


def update_ocr_ledger(ledger: dict[str, dict], source: str, source_hash: str, records: list[OcrRecord]) -> None:
    """Record (or forget, when ``records`` is empty) the OCR'd documents of one source."""
    if records:
        ledger[source] = {"hash": source_hash, "documents": [asdict(r) for r in records]}
    else:
        ledger.pop(source, None)


def save_ocr_ledger(collection: str, ledger: dict[str, dict]) -> None:
    """Write the OCR ledger of ``collection`` atomically."""
    write_json_atomic(ocr_ledger_path(collection), ledger)


class OcrItem(BaseModel):
    """A document some of whose pages (or image frames) were read by OCR in this run."""

    model_config = ConfigDict(frozen=True)

    path: str
    engine: str
    pages_ocr: int = Field(description="Pages (image frames) read by OCR.")
    pages: list[int] = Field(description="Their 1-based numbers.")
    skipped_pages: int = Field(default=0, description="Pages over OcrLimits.max_pages, not read.")
    failed_pages: list[int] = Field(default_factory=list, description="Pages the OCR engine failed on.")


def record_ocr(ledger: dict[str, dict], collection: str, batch: Sequence[SourceFile], name: Mapping[str, str],
               hashes: Mapping[str, str], documents: Sequence[ParsedDocument]) -> list[OcrItem]:
    """Keep the OCR'd documents of a parsed batch in the collection's OCR ledger; return them."""
    items: list[OcrItem] = []
    for f in batch:
        src = name[f.path]
        records = [OcrRecord(d.path, d.ocr.engine, d.ocr.pages_ocr, d.ocr.pages, d.ocr.skipped_pages,
                             d.ocr.failed_pages) for d in documents if d.source == src and d.ocr]
        update_ocr_ledger(ledger, src, hashes[src], records)
        items.extend(OcrItem(path=r.path, engine=r.engine, pages_ocr=r.pages_ocr, pages=list(r.pages),
                             skipped_pages=r.skipped_pages, failed_pages=list(r.failed_pages)) for r in records)
    if batch:
        save_ocr_ledger(collection, ledger)
    return items


def ocr_summary(items: Sequence[OcrItem]) -> str:
    """``N in M documents (engines)``: the OCR line of an ingest summary."""
    engines = f" ({', '.join(sorted({i.engine for i in items}))})" if items else ""
    return f"{sum(i.pages_ocr for i in items)} in {len(items)} documents{engines}"


def render_ocr(items: Sequence[OcrItem]) -> str:
    """Markdown table of the documents read by OCR: engine, pages read, skipped, failed."""
    lines = ["| document | engine | pages read by OCR | skipped | failed |", "|---|---|---|---|---|"]
    for i in items:
        name = i.path.rsplit("/", 1)[-1]
        lines.append(f"| {name} | {i.engine} | {i.pages_ocr} ({_page_list(i.pages)}) | {i.skipped_pages} | "
                     f"{_page_list(i.failed_pages) or 0} |")
    return "\n".join(lines)


def _page_list(pages: Sequence[int]) -> str:
    shown = ", ".join(str(p) for p in pages[:20])
    return shown + (f", … ({len(pages)} in all)" if len(pages) > 20 else "")
