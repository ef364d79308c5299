"""Slide numbers of a PowerPoint (.pptx) document: where each slide's text starts in Tika's text.

Tika's plain text of a presentation runs the slides together; the package itself lists the slides
in presentation order (``ppt/presentation.xml`` through its relationships) and holds each slide's
text runs (``<a:t>``). Each slide's first text run is found in Tika's text, in order, after the
previous one; a slide without text starts where the next one does. When a slide's text cannot be
found the document gets no slide numbers (never wrong ones).
"""

from __future__ import annotations

import html
import io
import logging
import posixpath
import re
import zipfile

log = logging.getLogger(__name__)

PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
MAX_SLIDES = 2000
MAX_PART_BYTES = 8 * 1024 * 1024  # a slide's XML larger than this is not read (and no numbers are given)
_REL = re.compile(r"<Relationship\b[^>]*>")
_ATTR = re.compile(r'\b(Id|Type|Target)="([^"]*)"')
_SLIDE_ID = re.compile(r'<p:sldId\b[^>]*\br:id="([^"]+)"')
_RUN = re.compile(r"<a:t>([^<]*)</a:t>")


def _read(z: zipfile.ZipFile, name: str) -> str | None:
    try:
        info = z.getinfo(name)
    except KeyError:
        return None
    if info.file_size > MAX_PART_BYTES:
        return None
    return z.read(info).decode("utf-8", "replace")


def slide_runs(content: bytes) -> list[list[str]] | None:
    """The text runs of each slide in presentation order; None when the package cannot be read."""
    try:
        with zipfile.ZipFile(io.BytesIO(content)) as z:
            rels, pres = _read(z, "ppt/_rels/presentation.xml.rels"), _read(z, "ppt/presentation.xml")
            if rels is None or pres is None:
                return None
            targets = {}
            for rel in _REL.findall(rels):
                attrs = dict(_ATTR.findall(rel))
                if attrs.get("Type", "").endswith("/slide"):
                    targets[attrs.get("Id", "")] = attrs.get("Target", "")
            order = _SLIDE_ID.findall(pres)[:MAX_SLIDES]
            slides = []
            for rid in order:
                target = targets.get(rid)
                if not target:
                    return None
                part = target.lstrip("/") if target.startswith("/") else posixpath.normpath(f"ppt/{target}")
                xml = _read(z, part)
                if xml is None:
                    return None
                slides.append([html.unescape(t) for t in _RUN.findall(xml)])
            return slides
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        log.debug("no slide numbers: %s", type(exc).__name__)
        return None


def _key(run: str) -> str:
    return " ".join(run.replace("\xa0", " ").split())


def slide_starts(content: bytes, text: str) -> tuple[int, ...]:
    """Start offset of every slide in ``text`` (Tika's text of the .pptx ``content``), two slides
    or more; ``()`` when there are fewer or a slide's text is not found in order."""
    slides = slide_runs(content)
    if not slides or len(slides) < 2:
        return ()
    starts: list[int | None] = []
    pos = 0
    for runs in slides:
        needle = next((k for k in map(_key, runs) if len(k) >= 2), None)
        if needle is None:
            starts.append(None)  # a slide without text: it starts where the next one does
            continue
        at = text.find(needle, pos)
        if at < 0:
            return ()
        line = text.rfind("\n", pos, at)
        starts.append(line + 1 if line >= 0 else at)  # from the start of its line
        pos = at + len(needle)
    filled: list[int] = []
    nxt = len(text)
    for s in reversed(starts):
        nxt = s if s is not None else nxt
        filled.append(nxt)
    out = list(reversed(filled))
    out[0] = 0
    return tuple(out)
