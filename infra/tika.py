"""Apache Tika clients: embedded (PyPI ``iscc-tika``, no JVM) or a Tika server over HTTP.

Both return the same contract: the extracted plain text and Tika's metadata as
``dict[str, list[str]]``. Parse failures raise :class:`TikaParseError`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

from infra.errors import IndusflowError
from infra.rag_settings import TikaSettings, get_tika_settings

log = logging.getLogger(__name__)


class TikaParseError(IndusflowError):
    """Tika could not turn the bytes into text."""


@dataclass(frozen=True)
class TikaResult:
    """Text and metadata of one parsed document."""

    text: str
    metadata: dict[str, list[str]] = field(default_factory=dict)


class TikaClient(Protocol):
    """What the parse task needs from Tika."""

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


class EmbeddedTika:
    """Tika compiled to native code (``iscc-tika``)."""

    def __init__(self, max_chars: int = 5_000_000) -> None:
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
    """A Tika server reached over HTTP through the PyPI ``tika`` client."""

    def __init__(self, url: str, timeout_s: float = 120.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def parse(self, data: bytes, name: str, path: str | None = None) -> TikaResult:
        from tika import parser as tika_parser

        try:
            parsed = tika_parser.from_buffer(
                data, serverEndpoint=self.url, requestOptions={"timeout": self.timeout_s}
            )
        except Exception as exc:
            raise TikaParseError(f"tika server: {type(exc).__name__}: {exc}"[:500]) from exc
        status = parsed.get("status")
        if status not in (None, 200):
            raise TikaParseError(f"tika server answered HTTP {status}")
        return TikaResult(text=parsed.get("content") or "", metadata=_as_lists(parsed.get("metadata") or {}))


def tika_client(settings: TikaSettings | None = None) -> TikaClient:
    """The configured Tika: a server when a URL is set, else embedded."""
    settings = settings or get_tika_settings()
    if settings.server_url:
        log.info("parsing with a Tika server")
        return TikaServer(settings.server_url, settings.timeout_s)
    return EmbeddedTika(settings.max_chars)
