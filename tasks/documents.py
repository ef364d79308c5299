"""Find and parse documents with Apache Tika; quarantine what can't become text.

Domain-agnostic: a source is a file on disk; archives (zip, tar, tgz) yield their inner
documents, other containers (7z, mbox, msg, e-mail) yield the text Tika extracts from their
embedded documents. The type comes from the content, never from the extension. Every failure
becomes a :class:`Quarantined` record with a reason; nothing is embedded as raw bytes.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import logging
import re
import tarfile
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from prefect import task
from prefect.cache_policies import NONE

from infra.errors import DataValidationError
from infra.rag_settings import TikaSettings, get_tika_settings
from infra.tika import TikaClient, TikaParseError, tika_client

log = logging.getLogger(__name__)

QUARANTINE_REASONS = ("encrypted", "corrupt", "empty", "unsupported", "too_large", "undecodable", "unreadable")


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
            raise DataValidationError("does not exist: pass existing files or folders", source=str(src))
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
# archives (zip, tar, tgz) expanded in memory


def _archive_members(data: bytes, max_members: int, max_bytes: int) -> Iterator[tuple[str, bytes | None, str]]:
    """``(member name, bytes or None, failure reason)`` of a zip or (gzipped) tar; nothing otherwise."""
    if data[:4] == b"PK\x03\x04":
        try:
            zf = zipfile.ZipFile(io.BytesIO(data))
            infos = [i for i in zf.infolist() if not i.is_dir()][:max_members]
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            yield "", None, f"corrupt: {exc}"
            return
        if not infos:
            return
        for info in infos:
            if info.flag_bits & 0x1:
                yield info.filename, None, "encrypted"
            elif info.file_size > max_bytes:
                yield info.filename, None, "too_large"
            else:
                try:
                    yield info.filename, zf.read(info), ""
                except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError, EOFError) as exc:
                    yield info.filename, None, f"corrupt: {exc}"
        return
    if data[:2] == b"\x1f\x8b" or (len(data) > 262 and data[257:262] == b"ustar"):
        try:
            tf = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")  # noqa: SIM115 (closed with the bytes)
            members = [m for m in tf.getmembers() if m.isfile()][:max_members]
        except (tarfile.TarError, OSError, EOFError) as exc:
            if data[:2] == b"\x1f\x8b":
                return  # a gzip of a single file: Tika reads it
            yield "", None, f"corrupt: {exc}"
            return
        for m in members:
            if m.size > max_bytes:
                yield m.name, None, "too_large"
                continue
            handle = tf.extractfile(m)
            if handle is not None:
                yield m.name, handle.read(), ""


_ARCHIVE_TYPES = ("application/zip", "application/x-tar", "application/gzip", "application/x-gzip",
                  "application/x-gtar", "application/x-compress")


def _tika(client: TikaClient, data: bytes, path: str) -> tuple[str, dict[str, list[str]]] | Quarantined:
    if not data:
        return Quarantined(path, "empty", "0 bytes")
    on_disk = path if "!/" not in path else None
    try:
        result = client.parse(data, path.rsplit("/", 1)[-1], on_disk)
    except TikaParseError as exc:
        reason = "encrypted" if "ncrypt" in str(exc) else "corrupt"
        return Quarantined(path, reason, str(exc)[:300])
    return result.text, result.metadata


def _document(
    data: bytes, text: str, meta: dict[str, list[str]], path: str, source: str, settings: TikaSettings
) -> ParsedDocument | Quarantined:
    text = normalise_text(text)
    failure = _failure_reason(meta, text, settings.min_chars)
    if failure:
        return Quarantined(path, failure[0], failure[1])
    return ParsedDocument(
        doc_id=doc_id_for(path), source=source, path=path, content_hash=sha256_bytes(data)[:32], text=text,
        meta=doc_meta(meta, text), page_starts=page_starts(meta, len(text)),
    )


def _parse_one(
    client: TikaClient, data: bytes, path: str, source: str, settings: TikaSettings, max_members: int, depth: int = 0
) -> list[ParsedDocument | Quarantined]:
    parsed = _tika(client, data, path)
    if isinstance(parsed, Quarantined):
        return [parsed]
    text, meta = parsed
    ctype = _first(meta, "Content-Type").split(";")[0].strip().lower()
    if ctype in _ARCHIVE_TYPES and depth < 2:
        members = list(_archive_members(data, max_members, settings.max_file_bytes))
        if members:
            items: list[ParsedDocument | Quarantined] = []
            for name, blob, failure in members:
                inner = f"{path}!/{name}" if name else path
                if blob is None:
                    reason, _, detail = failure.partition(": ")
                    items.append(Quarantined(inner, reason, detail))
                else:
                    items.extend(_parse_one(client, blob, inner, source, settings, max_members, depth + 1))
            return items
    return [_document(data, text, meta, path, source, settings)]


def parse_sources(
    sources: list[SourceFile],
    *,
    settings: TikaSettings | None = None,
    client: TikaClient | None = None,
    max_archive_members: int = 1000,
) -> ParseResult:
    """Parse each source (archives into their members); quarantine failures with a reason."""
    settings = settings or get_tika_settings()
    client = client or tika_client(settings)
    out = ParseResult()
    for src in sources:
        if src.size > settings.max_file_bytes:
            out.quarantined.append(Quarantined(src.path, "too_large", f"{src.size} bytes"))
            out.docs_per_source[src.path] = 0
            continue
        try:
            data = Path(src.path).read_bytes()
        except OSError as exc:
            out.quarantined.append(Quarantined(src.path, "unreadable", type(exc).__name__))
            out.docs_per_source[src.path] = 0
            continue
        items = _parse_one(client, data, src.path, src.path, settings, max_archive_members)
        docs = [i for i in items if isinstance(i, ParsedDocument)]
        out.documents.extend(docs)
        out.quarantined.extend(i for i in items if isinstance(i, Quarantined))
        out.docs_per_source[src.path] = len(docs)
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
