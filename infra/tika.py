"""Apache Tika clients: embedded (PyPI ``iscc-tika``, no JVM) or a Tika server over HTTP.

Both return the same contract: the extracted plain text (the document's own text followed by
that of its embedded documents) and Tika's metadata of the document as ``dict[str, list[str]]``.
The server answers ``/rmeta/text`` (one JSON object per document, container first), so it also
returns each embedded document separately (``TikaResult.embedded``); the embedded parser can't.
Parse failures raise :class:`TikaParseError`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Protocol

from infra.errors import IndusflowError
from infra.secrets import http_error_text, scrub, shown_url
from infra.settings import TikaSettings, get_tika_settings

log = logging.getLogger(__name__)


class TikaParseError(IndusflowError):
    """Tika could not turn the bytes into text."""


@dataclass(frozen=True)
class EmbeddedResult:
    """One document embedded in another (an archive member, an attachment), from ``/rmeta``."""

    resource_path: str  # e.g. "/inner.zip/a.pdf" (Tika's X-TIKA:embedded_resource_path)
    depth: int
    text: str
    metadata: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class TikaResult:
    """Text and metadata of one parsed document.

    ``text`` holds the embedded documents' text too; where the client lists them separately
    (``embedded``), ``own_text`` is the container's own text alone.
    """

    text: str
    metadata: dict[str, list[str]] = field(default_factory=dict)
    own_text: str | None = None
    embedded: tuple[EmbeddedResult, ...] = ()


class TikaClient(Protocol):
    """What the parse task needs from Tika."""

    lists_embedded: bool  # True when parse() returns embedded documents separately

    def parse(self, data: bytes, name: str, path: str | None = None) -> TikaResult:
        """Parse ``data`` (a file's bytes; ``name`` is a hint; ``path`` the file on disk, if one)."""
        ...


def _as_lists(meta: dict) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, value in (meta or {}).items():
        if value is None:
            continue
        out[str(key)] = [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]
    return out


#: Extracted text is cut at this many characters: about 2,500 pages of prose, far beyond any document the
#: knowledge base answers from, while a text bomb stays a few MB of memory per parse.
MAX_CHARS = 5_000_000
#: Seconds a Tika server request may take: a large PDF's parse on a busy server takes tens of seconds.
TIMEOUT_S = 120.0


class EmbeddedTika:
    """Tika compiled to native code (``iscc-tika``)."""

    lists_embedded = False

    def __init__(self, max_chars: int = MAX_CHARS) -> None:
        self.max_chars = max_chars

    def parse(self, data: bytes, name: str, path: str | None = None) -> TikaResult:
        from iscc_tika import Extractor

        extractor = Extractor()  # a fresh one per document: no state leaks between files
        extractor.set_extract_string_max_length(self.max_chars)
        try:
            if path:  # Tika then also sees the file name (charset hints for plain text)
                text, meta = extractor.extract_file_to_string(path)
            else:
                text, meta = extractor.extract_bytes_to_string(bytearray(data))
        except Exception as exc:  # iscc-tika raises TypeError(ParseError(...)) and others
            raise TikaParseError(f"{type(exc).__name__}: {exc}"[:500]) from exc
        return TikaResult(text=text or "", metadata=_as_lists(meta))


class TikaServer:
    """A Tika server reached over HTTP through the PyPI ``tika`` client (``PUT /rmeta/text``)."""

    lists_embedded = True

    def __init__(self, url: str, timeout_s: float = TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def parse(self, data: bytes, name: str, path: str | None = None) -> TikaResult:
        from tika import parser as tika_parser
        from tika import tika as tika_core

        tika_core.TikaClientOnly = True  # never download or start a server jar
        headers = {"Content-Disposition": f"attachment; filename={_header_safe(name)}"}
        try:
            status, body = tika_parser.from_buffer(
                data, serverEndpoint=self.url, headers=headers, requestOptions={"timeout": self.timeout_s},
                raw_response=True,
            )
        except Exception as exc:  # noqa: BLE001 - any client failure is named, scrubbed
            raise TikaParseError(f"tika server {shown_url(self.url)}: {type(exc).__name__}: "
                                 f"{scrub(str(exc))}"[:500]) from None
        if status == 422:  # Tika: unprocessable entity (encrypted or corrupt)
            raise TikaParseError(f"tika server answered {http_error_text(422, str(body), limit=300)}")
        if status != 200:
            raise TikaParseError(f"tika server answered {http_error_text(status, str(body or ''))}")
        return rmeta_result(body)


def _header_safe(name: str) -> str:
    return "".join(ch if 32 <= ord(ch) < 127 and ch not in '";\\' else "_" for ch in name)[:200] or "document"


def rmeta_result(body: str | bytes | None) -> TikaResult:
    """A :class:`TikaResult` from Tika's ``/rmeta/text`` JSON list (container first).

    Raises:
        TikaParseError: the answer is not such a list, or the container itself failed to parse.
    """
    try:
        items = json.loads(body or "null")
    except ValueError as exc:
        raise TikaParseError(f"tika server: not JSON ({exc})") from exc
    if not isinstance(items, list) or not items or not all(isinstance(i, dict) for i in items):
        raise TikaParseError("tika server: expected a JSON list of metadata objects from /rmeta/text")
    container, rest = items[0], items[1:]
    meta = _as_lists({k: v for k, v in container.items() if k != "X-TIKA:content"})
    failure = _first_value(meta, "X-TIKA:EXCEPTION:container_exception")
    own = str(container.get("X-TIKA:content") or "")
    if failure and not own.strip():
        raise TikaParseError(failure.strip().splitlines()[0][:500])
    embedded = []
    for item in rest:
        emeta = _as_lists({k: v for k, v in item.items() if k != "X-TIKA:content"})
        depth = _first_value(emeta, "X-TIKA:embedded_depth")
        embedded.append(EmbeddedResult(
            resource_path=_first_value(emeta, "X-TIKA:embedded_resource_path") or _first_value(emeta, "resourceName"),
            depth=int(depth) if depth.isdigit() else 1, text=str(item.get("X-TIKA:content") or ""), metadata=emeta,
        ))
    text = "\n".join([own, *(e.text for e in embedded if e.text)])
    return TikaResult(text=text, metadata=meta, own_text=own, embedded=tuple(embedded))


def _first_value(meta: dict[str, list[str]], key: str) -> str:
    values = meta.get(key) or [""]
    return str(values[0])


def tika_client(settings: TikaSettings | None = None) -> TikaClient:
    """The configured Tika: a server when a URL is set, else embedded."""
    settings = settings or get_tika_settings()
    if settings.server_url:
        log.info("parsing with a Tika server")
        return TikaServer(settings.server_url)
    return EmbeddedTika()
