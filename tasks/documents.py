"""Find and parse documents with Apache Tika; quarantine what can't become text.

Domain-agnostic: a source is a file on disk. Containers yield their inner documents, each a
document of its own (``archive!/member`` path and id, own hash, metadata and quarantine entry):
zip, tar/tgz, 7z (PyPI ``py7zr``), mbox, e-mail attachments and Outlook .msg attachments (PyPI
``olefile``), expanded in memory with guards (see :mod:`tasks.containers`); with a Tika server
the containers are split by Tika's ``/rmeta`` instead. The type comes from the content, never
from the extension. Every failure becomes a :class:`Quarantined` record with a reason; nothing
is embedded as raw bytes.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from infra.errors import DataValidationError
from infra.pii import redact_path, redact_text, tag_key
from infra.settings import TikaSettings, get_tika_settings
from infra.tika import TikaClient, TikaParseError, TikaResult, tika_client
from tasks.containers import (
    ARCHIVE_TYPES,
    MESSAGE_TYPES,
    ArchiveLimits,
    Budget,
    Expansion,
    expand_7z,
    expand_email,
    expand_mbox,
    expand_msg,
    expand_tar,
    expand_zip,
    looks_like_mbox,
    looks_like_msg,
    safe_member_name,
)
from tasks.ocr import DocumentOcr, OcrFailure, OcrInfo, document_ocr
from tasks.slides import PPTX, slide_starts

log = logging.getLogger(__name__)

#: Documents with less text than this are quarantined as empty (a scan's stray marks, a blank template); OCR'd
#: text an engine gives confidences for is judged by infra.ocr's confidence floor instead.
MIN_CHARS = 20

@dataclass(frozen=True)
class SourceFile:
    """A file named by the user (or found under a folder they named)."""

    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class DocMeta:
    """The metadata users filter on."""

    content_type: str = ""
    title: str = ""
    author: str = ""
    created: str = ""
    modified: str = ""
    pages: int = 0
    language: str = "und"


@dataclass(frozen=True)
class ParsedDocument:
    """Normalised text of one document (a file, or an archive member ``archive!/member``)."""

    doc_id: str
    source: str
    path: str
    content_hash: str
    text: str
    meta: DocMeta
    page_starts: tuple[int, ...] = ()  # character offset where each page starts (PDF), may be approximate
    ocr: OcrInfo | None = None  # the pages read by OCR (scanned PDF pages, images), if any

    @property
    def pages_ocr(self) -> int:
        """Pages (image frames) of this document whose text came from OCR."""
        return self.ocr.pages_ocr if self.ocr else 0

    def page_at(self, offset: int) -> int | None:
        """1-based page holding character ``offset`` when the format gives pages."""
        if not self.page_starts:
            return None
        page = 0
        for i, start in enumerate(self.page_starts):
            if start <= offset:
                page = i
            else:
                break
        return page + 1


@dataclass(frozen=True)
class Quarantined:
    """A document that was not ingested, and why."""

    path: str
    reason: str
    detail: str = ""


#: What each quarantine reason means to the person who gave the file (pages, APIs). The
#: ``detail`` of a record (parser and exception text) stays in the ingest's own report.
REASON_TEXT = {
    "encrypted": "password-protected",
    "unsupported": "not a document",
    "empty": "no text found",
    "ocr_empty": "no text found (scanned, OCR read nothing)",
    "ocr_failed": "OCR failed",
    "undecodable": "text in an unreadable encoding",
    "corrupt": "damaged or not a valid file",
    "unreadable": "could not be read",
    "too_large": "too large",
    "archive_bomb": "archive bomb",
    "too_deep": "archives nested too deep",
    "unsafe_path": "unsafe name in an archive",
    "unfinished": "its ingest stopped before it finished, twice (change the file to try again)",
    "timed_out": "its ingest ran out of time (change the file to try again)",
}


def reason_text(reason: str) -> str:
    """The short human text of a quarantine reason code (``encrypted`` -> ``password-protected``)."""
    return REASON_TEXT.get(reason, "not indexed")


@dataclass
class ParseResult:
    """Documents parsed from a batch of sources, and what was quarantined."""

    documents: list[ParsedDocument] = field(default_factory=list)
    quarantined: list[Quarantined] = field(default_factory=list)
    docs_per_source: dict[str, int] = field(default_factory=dict)


def doc_id_for(path: str) -> str:
    """Stable id of a document from its path (``archive!/member`` for inner documents)."""
    return hashlib.sha256(path.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def discover(sources: Iterable[str | Path]) -> list[SourceFile]:
    """Every regular file under the given files/folders (hidden ones skipped), sorted, hashed.

    Raises:
        DataValidationError: a source does not exist.
    """
    files: dict[str, Path] = {}
    for src in sources:
        path = Path(src).expanduser()
        if not path.exists():
            raise DataValidationError("does not exist: pass existing files or folders", source=redact_path(str(src)))
        path = path.resolve()
        if path.is_file():
            files[str(path)] = path
            continue
        for child in path.rglob("*"):
            rel = child.relative_to(path)
            if any(part.startswith(".") for part in rel.parts) or not child.is_file() or child.is_symlink():
                continue
            files[str(child.resolve())] = child
    out = []
    for key in sorted(files):
        p = files[key]
        digest = hashlib.sha256()
        with open(p, "rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
        out.append(SourceFile(path=key, size=p.stat().st_size, sha256=digest.hexdigest()))
    return out


# ------------------------------------------------------------------------------------
# text normalisation and metadata

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_BLANKS = re.compile(r"\n[ \t\r\f\v]*\n(?:[ \t\r\f\v]*\n)+")
_TRAILING = re.compile(r"[ \t]+\n")
_CJK = re.compile(r"[\u4e00-\u9fff\u3400-\u4dbf]")
_KANA = re.compile(r"[\u3040-\u30ff]")
_HANGUL = re.compile(r"[\uac00-\ud7af]")
_LATIN = re.compile(r"[A-Za-z]")


def normalise_text(text: str) -> str:
    """No lone surrogates, NULs or control characters; CRLF to LF; at most one blank line."""
    text = _SURROGATE.sub("", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _CONTROL.sub(" ", text)
    text = _TRAILING.sub("\n", text)
    text = _BLANKS.sub("\n\n", text)
    return text.strip()


def guess_language(text: str, hint: str | None = None) -> str:
    """``zh``, ``ja``, ``ko`` by script share; else the (Tika) hint, else ``en``/``und``."""
    sample = text[:20000]
    cjk, latin = len(_CJK.findall(sample)), len(_LATIN.findall(sample))
    kana, hangul = len(_KANA.findall(sample)), len(_HANGUL.findall(sample))
    if kana > 20 and kana > 0.05 * max(cjk + latin, 1):
        return "ja"
    if hangul > 20:
        return "ko"
    if cjk + latin and cjk / (cjk + latin) > 0.3:
        return "zh"
    if hint:
        return hint.lower().split("-")[0][:8]
    return "en" if latin else "und"


def _first(meta: dict[str, list[str]], *keys: str) -> str:
    for key in keys:
        values = meta.get(key)
        if values and str(values[0]).strip():
            return str(values[0]).strip()
    return ""


def _iso(value: str) -> str:
    if not value:
        return ""
    try:
        return dt.datetime.fromisoformat(value).isoformat()[:25]
    except ValueError:
        return value[:32]


def doc_meta(meta: dict[str, list[str]], text: str) -> DocMeta:
    """Content type, title, author, dates, page count and language from Tika's metadata."""
    pages = _first(meta, "xmpTPg:NPages", "meta:page-count", "Page-Count", "pdf:docinfo:pages")
    return DocMeta(
        content_type=_first(meta, "Content-Type").split(";")[0].strip().lower(),
        title=_first(meta, "dc:title", "title", "pdf:docinfo:title", "dc:subject", "subject")[:500],
        author=", ".join((meta.get("dc:creator") or meta.get("meta:author") or meta.get("Author")
                          or meta.get("Message-From") or [])[:5])[:500],
        created=_iso(_first(meta, "dcterms:created", "meta:creation-date", "Creation-Date", "created")),
        modified=_iso(_first(meta, "dcterms:modified", "Last-Modified", "modified")),
        pages=int(pages) if pages.isdigit() else 0,
        language=guess_language(text, _first(meta, "dc:language", "language", "Language") or None),
    )


def page_starts(meta: dict[str, list[str]], text_len: int) -> tuple[int, ...]:
    """Approximate page start offsets from Tika's per-page character counts (PDF)."""
    per_page = [int(v) for v in meta.get("pdf:charsPerPage", []) if str(v).isdigit()]
    total = sum(per_page)
    if len(per_page) < 2 or total <= 0:
        return ()
    starts, acc = [], 0
    for n in per_page:
        starts.append(int(acc * text_len / total))
        acc += n
    return tuple(starts)


def _failure_reason(meta: dict[str, list[str]], text: str, min_chars: int) -> tuple[str, str] | None:
    warnings = " ".join(meta.get("X-TIKA:warning", []) + meta.get("X-TIKA:EXCEPTION:warn", []))
    ctype = _first(meta, "Content-Type").lower()
    if "Encrypted" in warnings or "protected" in ctype or (
        _first(meta, "pdf:encrypted") == "true" and len(text.strip()) < min_chars
    ):
        return "encrypted", warnings[:200] or ctype
    parsers = meta.get("X-TIKA:Parsed-By", [])
    if parsers and all(p.endswith("EmptyParser") for p in parsers):
        return "unsupported", f"no Tika parser for {ctype or 'this content'}"
    stripped = text.strip()
    if len(stripped) < min_chars:
        return "empty", f"{len(stripped)} characters of text"
    bad = stripped.count("\ufffd")
    if bad > 0.5 * len(stripped):
        return "undecodable", f"{bad} of {len(stripped)} characters undecodable"
    return None


# ------------------------------------------------------------------------------------
# documents and containers


def _tika(client: TikaClient, data: bytes, path: str, *, whole_file: bool = True) -> TikaResult | Quarantined:
    """Tika's text of ``data``; ``whole_file``: ``data`` is the whole file at ``path`` (Tika may
    read it from disk then, and see its name), else a part of it (an e-mail body)."""
    if not data:
        return Quarantined(path, "empty", "0 bytes")
    on_disk = path if whole_file and "!/" not in path else None
    try:
        return client.parse(data, path.rsplit("/", 1)[-1], on_disk)
    except TikaParseError as exc:
        reason = "encrypted" if "ncrypt" in str(exc) else "corrupt"
        return Quarantined(path, reason, str(exc)[:300])


def _document(
    content: bytes, text: str, meta: dict[str, list[str]], path: str, source: str, settings: TikaSettings,
    ocr: DocumentOcr | None = None,
) -> ParsedDocument | Quarantined:
    """``ocr``: read images and PDF pages without a text layer (``content`` is the file's bytes)."""
    text = normalise_text(text)
    failure = _failure_reason(meta, text, MIN_CHARS)
    ctype = _ctype(meta)
    if ocr is not None and (failure is None or failure[0] in ("empty", "unsupported")) \
            and ocr.wants(ctype, meta, text):
        got = ocr.read(content, ctype, meta, text, path)
        if isinstance(got, OcrFailure):
            if failure:
                return Quarantined(path, got.reason, got.detail)
            log.warning("OCR of %s skipped: %s", redact_path(path), got.detail)
        else:
            starts, parts, offset = [], [], 0
            for page in got.pages:
                page = normalise_text(page)
                starts.append(offset)
                parts.append(page)
                offset += len(page) + 2
            ocr_text = "\n\n".join(parts)
            info = got.info
            no_parser = {k: v for k, v in meta.items() if k != "X-TIKA:Parsed-By"}  # OCR was the parser
            # an engine that scores its lines kept only what it read with confidence: that is
            # text however short (a stamp, a one-line notice); unscored text is judged by length
            confident = info.min_confidence is not None and info.chars > 0
            failure = _failure_reason(no_parser, ocr_text, 1 if confident else MIN_CHARS)
            if failure and failure[0] == "empty":
                pages = f"{info.pages_ocr} page{'s' if info.pages_ocr != 1 else ''}"
                if info.min_confidence is not None:
                    noise = f"; {info.dropped_lines} low-confidence line{'s' if info.dropped_lines != 1 else ''} " \
                            "dropped as noise" if info.dropped_lines else ""
                    return Quarantined(path, "ocr_empty", f"no text layer; OCR ({info.engine}) found 0 characters "
                                       f"with confidence >= {info.min_confidence:g} on {pages}{noise}")
                return Quarantined(path, "ocr_empty", f"no text layer; OCR ({info.engine}) found "
                                   f"{len(ocr_text.strip())} characters on {pages} (minimum {MIN_CHARS})")
            if failure:
                return Quarantined(path, failure[0], failure[1])
            return ParsedDocument(
                doc_id=doc_id_for(path), source=source, path=path, content_hash=sha256_bytes(content)[:32],
                text=ocr_text, meta=doc_meta(meta, ocr_text), page_starts=tuple(starts) if len(starts) > 1 else (),
                ocr=info,
            )
    if failure:
        return Quarantined(path, failure[0], failure[1])
    pages = slide_starts(content, text) if ctype == PPTX else page_starts(meta, len(text))
    return ParsedDocument(
        doc_id=doc_id_for(path), source=source, path=path, content_hash=sha256_bytes(content)[:32], text=text,
        meta=doc_meta(meta, text), page_starts=pages,
    )


def _ctype(meta: dict[str, list[str]]) -> str:
    return _first(meta, "Content-Type").split(";")[0].strip().lower()


Item = ParsedDocument | Quarantined



def _office_package(data: bytes) -> bool:
    """A zip that is an office document (OOXML incl. Strict, ODF, iWork), not an archive: its
    parts are never documents of their own, whatever Tika made of the package."""
    import io
    import zipfile

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            names = set(z.namelist()[:2000])
    except (zipfile.BadZipFile, OSError, ValueError):
        return False
    return bool(names & {"[Content_Types].xml", "mimetype", "Index/Document.iwa", "index.xml"})

#: The most bytes of one nested archive read to count its members at upload (a member larger than
#: this is counted as one: the ingest's own caps still apply to it).
NESTED_COUNT_BYTES = 64 << 20


def _is_archive(head: bytes) -> bool:
    return (head[:4] == b"PK\x03\x04" or head[:6] == b"7z\xbc\xaf\x27\x1c" or head[:2] in (b"\x1f\x8b", b"BZ")
            or head[:6] == b"\xfd7zXZ\x00" or head[257:262] == b"ustar")


def archive_members(path: Path, limit: int, depth: int = 3) -> int:
    """How many members the archive at ``path`` holds (zip that is not an office package,
    tar/tgz/tbz/txz, 7z), counting at most ``limit + 1``; 0 for any other file. The members of
    a zip or tar nested in a zip or tar count too, down to ``depth`` levels (each nested archive
    read up to :data:`NESTED_COUNT_BYTES`); a 7z's entries count one each. Never writes a member."""
    with open(path, "rb") as f:
        return _count_members(f, limit, depth)


def _count_members(f: Any, limit: int, depth: int) -> int:
    import tarfile
    import zipfile

    head = f.read(512)
    f.seek(0)
    try:
        if head[:4] == b"PK\x03\x04":
            with zipfile.ZipFile(f) as z:
                infos = [i for i in z.infolist() if not i.is_dir()]
                if {i.filename for i in infos[:2000]} & {"[Content_Types].xml", "mimetype", "Index/Document.iwa",
                                                          "index.xml"}:
                    return 0
                return _count_nested(infos, lambda i: z.open(i), lambda i: i.file_size, limit, depth)
        if head[:6] == b"7z\xbc\xaf\x27\x1c":
            import py7zr

            with py7zr.SevenZipFile(f) as z:
                return min(sum(1 for e in z.list() if not e.is_directory), limit + 1)
        if head[:2] in (b"\x1f\x8b", b"BZ") or head[:6] == b"\xfd7zXZ\x00" or head[257:262] == b"ustar":
            with tarfile.open(fileobj=f) as t:
                files = (m for m in t if m.isfile())
                return _count_nested(files, t.extractfile, lambda m: m.size, limit, depth)
    except Exception:  # noqa: BLE001 - an unreadable directory: the ingest quarantines the file with its reason
        return 0
    return 0


def _count_nested(members: Any, open_member: Callable[[Any], Any], size: Callable[[Any], int], limit: int,
                  depth: int) -> int:
    """Members counted one each, plus those of the zips and tars among them (at most ``limit + 1``)."""
    import io

    count = 0
    for member in members:
        count += 1
        if count > limit:
            return count
        if depth <= 1 or size(member) > NESTED_COUNT_BYTES:
            continue
        with open_member(member) as handle:
            head = handle.read(512)
            if _is_archive(head):
                inner = io.BytesIO(head + handle.read(NESTED_COUNT_BYTES))
                count += _count_members(inner, limit - count, depth - 1)
    return min(count, limit + 1)


class _Walker:
    """Parses one source file, expanding the containers in it under one byte budget."""

    def __init__(self, client: TikaClient, settings: TikaSettings, limits: ArchiveLimits, source: str,
                 ocr: DocumentOcr | None = None) -> None:
        self.client = client
        self.settings = settings
        self.limits = limits
        self.source = source
        self.budget = Budget(limits.max_total_bytes, members=limits.max_members)
        self.ocr = ocr

    def parse(self, data: bytes, path: str, depth: int = 0) -> list[Item]:
        if getattr(self.client, "lists_embedded", False):
            return self._tika_first(data, path, depth)
        expansion = self._sniffed(data)
        if expansion is not None:
            return self._expanded(expansion, data, path, depth)
        parsed = _tika(self.client, data, path)
        if isinstance(parsed, Quarantined):
            if data[:4] == b"PK\x03\x04" and not _office_package(data):  # a zip Tika gave up on (e.g. a bomb)
                expansion = expand_zip(data, self.limits, self.budget)
                if expansion.members:
                    return self._expanded(expansion, data, path, depth)
            return [parsed]
        ctype = _ctype(parsed.metadata)
        if ctype == "application/zip" and not _office_package(data):
            expansion = expand_zip(data, self.limits, self.budget)
        elif ctype == "message/rfc822":
            expansion = expand_email(data, self.limits, self.budget)
        if expansion is not None:
            return self._expanded(expansion, data, path, depth, parsed)
        return [_document(data, parsed.text, parsed.metadata, path, self.source, self.settings, self.ocr)]

    def _sniffed(self, data: bytes) -> Expansion | None:
        """Containers recognised from their bytes alone (tar, 7z, mbox, Outlook .msg with attachments)."""
        if data[:6] == b"7z\xbc\xaf\x27\x1c":
            return expand_7z(data, self.limits, self.budget)
        if data[:2] in (b"\x1f\x8b", b"BZ") or data[:6] == b"\xfd7zXZ\x00" or data[257:262] == b"ustar":
            return expand_tar(data, self.limits, self.budget)  # None for a gzip of one file: Tika reads it
        if looks_like_mbox(data):
            return expand_mbox(data, self.limits, self.budget)
        if looks_like_msg(data):
            return expand_msg(data, self.limits, self.budget)
        return None

    def _expanded(
        self, exp: Expansion, data: bytes, path: str, depth: int, parsed: TikaResult | None = None
    ) -> list[Item]:
        if depth >= self.limits.max_depth:
            return [Quarantined(path, "too_deep", f"containers nested deeper than {self.limits.max_depth} levels")]
        if exp.failure:
            return [Quarantined(path, *exp.failure)]
        items: list[Item] = []
        if exp.body is not None:  # an e-mail: its body (attachments removed) is a document of its own
            body = _tika(self.client, exp.body, path, whole_file=False)  # never the file on disk: attachments
            items.append(body if isinstance(body, Quarantined) else
                         _document(exp.body, body.text, parsed.metadata if parsed else body.metadata, path,
                                   self.source, self.settings))
        elif exp.body_text is not None:  # an Outlook message: its own text, Tika's metadata
            whole = parsed or _tika(self.client, data, path)
            meta = {} if isinstance(whole, Quarantined) else whole.metadata
            items.append(_document(data, exp.body_text, meta, path, self.source, self.settings))
        for m in exp.members:
            inner = f"{path}!/{m.name}" if m.name else path
            if m.data is None:
                items.append(Quarantined(inner, m.reason, m.detail))
            else:
                items.extend(self.parse(m.data, inner, depth + 1))
        return items

    def _tika_first(self, data: bytes, path: str, depth: int) -> list[Item]:
        """A client that lists embedded documents (Tika server ``/rmeta``): containers split by Tika."""
        parsed = _tika(self.client, data, path)
        if isinstance(parsed, Quarantined):
            return [parsed]
        ctype = _ctype(parsed.metadata)
        splits = ctype in ARCHIVE_TYPES or ctype in MESSAGE_TYPES
        if not splits or not parsed.embedded:
            return [_document(data, parsed.text, parsed.metadata, path, self.source, self.settings, self.ocr)]
        if depth >= self.limits.max_depth:
            return [Quarantined(path, "too_deep", f"containers nested deeper than {self.limits.max_depth} levels")]
        # every embedded entry whose nearest listed ancestor is a container is a document of its own;
        # entries inside a non-container document (an image in a .docx) add their text to it
        docs: dict[str, list] = {}  # resource path -> [text parts, metadata]
        failures: list[Item] = []
        containers = {""}
        taken = skipped = 0
        for e in sorted(parsed.embedded, key=lambda e: e.resource_path):
            rp = "/" + e.resource_path.strip("/")
            parent = max((p for p in list(docs) + list(containers) if rp.startswith(p + "/")), key=len, default="")
            if parent not in containers:
                docs[parent][0].append(e.text)
                continue
            etype = _ctype(e.metadata)
            if etype in ARCHIVE_TYPES or (etype in MESSAGE_TYPES and not e.text.strip()):
                containers.add(rp)
                continue
            name = safe_member_name(rp[1:])  # Tika roots resource paths at "/"
            if name is None:
                failures.append(Quarantined(f"{path}!/{rp.lstrip('/')[:200]}", "unsafe_path",
                                            "member name escapes the archive or holds control characters"))
                continue
            if e.depth > self.limits.max_depth:
                failures.append(Quarantined(f"{path}!/{name}", "too_deep",
                                            f"containers nested deeper than {self.limits.max_depth} levels"))
                continue
            if taken >= self.limits.max_members or not self.budget.take_member():
                skipped += 1
                continue
            taken += 1
            error = " ".join(e.metadata.get("X-TIKA:EXCEPTION:embedded_exception", [])
                             + e.metadata.get("X-TIKA:EXCEPTION:container_exception", []))
            if error and not e.text.strip():
                reason = "encrypted" if "ncrypt" in error else "corrupt"
                failures.append(Quarantined(f"{path}!/{name}", reason, error.strip().splitlines()[0][:300]))
                continue
            docs[rp] = [[e.text], e.metadata]
        items: list[Item] = []
        if ctype in MESSAGE_TYPES:
            items.append(_document(data, parsed.own_text or "", parsed.metadata, path, self.source, self.settings))
        for rp, (parts, meta) in docs.items():
            text = "\n".join(p for p in parts if p)
            items.append(_document(text.encode("utf-8", "surrogatepass"), text, meta,
                                   f"{path}!/{safe_member_name(rp[1:])}", self.source, self.settings))
        if skipped:
            failures.append(Quarantined(path, "too_large", f"{skipped} more members over the limit of "
                                        f"{self.limits.max_members} per file (all its archives together) were "
                                        "skipped"))
        return items + failures


def redact_names(item: Item, key: bytes) -> Item:
    """``item`` as it may leave the parser: its source, path and id from the redacted path
    (:func:`infra.pii.redact_path`), a quarantine detail redacted as text."""
    if isinstance(item, Quarantined):
        return replace(item, path=redact_path(item.path, key), detail=redact_text(item.detail))
    path = redact_path(item.path, key)
    return replace(item, source=redact_path(item.source, key), path=path, doc_id=doc_id_for(path))


def parse_sources(
    sources: list[SourceFile],
    *,
    settings: TikaSettings | None = None,
    client: TikaClient | None = None,
    max_archive_members: int = 1000,
) -> ParseResult:
    """Parse each source (containers into their inner documents); quarantine failures with a reason.

    What comes out is named by redacted paths (personal data in file, folder and member names
    replaced by tagged placeholders): the source of a document is ``redact_path(file path)``.
    Images and PDF pages without a text layer are read by the configured OCR
    (:class:`infra.settings.OcrSettings`); each document says which pages (``ocr``).
    """
    settings = settings or get_tika_settings()
    client = client or tika_client(settings)
    ocr = document_ocr(tika_url=settings.server_url)
    limits = ArchiveLimits(max_members=max_archive_members, max_member_bytes=settings.max_file_bytes)
    out = ParseResult()
    key = tag_key()
    for src in sources:
        name = redact_path(src.path, key)
        if src.size > settings.max_file_bytes:
            out.quarantined.append(Quarantined(name, "too_large", f"{src.size} bytes"))
            out.docs_per_source[name] = 0
            continue
        try:
            data = Path(src.path).read_bytes()
        except OSError as exc:
            out.quarantined.append(Quarantined(name, "unreadable", type(exc).__name__))
            out.docs_per_source[name] = 0
            continue
        items = [redact_names(i, key) for i in _Walker(client, settings, limits, src.path, ocr).parse(data, src.path)]
        docs = [i for i in items if isinstance(i, ParsedDocument)]
        out.documents.extend(docs)
        out.quarantined.extend(i for i in items if isinstance(i, Quarantined))
        out.docs_per_source[name] = len(docs)
    if out.quarantined:
        log.info("parsed %d documents, quarantined %d", len(out.documents), len(out.quarantined))
    return out


def render_quarantine(items: list[Quarantined]) -> str:
    """Markdown table of quarantined documents."""
    if not items:
        return "No document was quarantined."
    lines = ["| document | reason | detail |", "|---|---|---|"]
    for q in items:
        detail = q.detail.replace("|", "/").replace("\n", " ")[:160]
        lines.append(f"| {Path(q.path).name if '!/' not in q.path else q.path.rsplit('/', 2)[-1]} | {q.reason} | {detail} |")
    return "\n".join(lines)


parse_sources_task = task(name="parse-documents", cache_policy=NONE, retries=0)(parse_sources)
