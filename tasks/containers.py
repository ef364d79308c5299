"""Expand containers (zip, tar/tgz, 7z, mbox, e-mail, Outlook .msg) into their inner documents.

Plain functions, no Prefect: everything happens in memory and nothing is written to disk.
Guards: a cap on members per container, on bytes per member, on bytes expanded from one
source in total, on the expansion ratio (zip bombs) and on nesting depth (checked by the
caller); member names with path tricks (``..``, absolute paths, control characters, our
``!/`` separator) are refused; repeated names get a ``~2`` suffix so every inner document
keeps its own stable path.
"""

from __future__ import annotations

import copy
import email
import email.policy
import io
import logging
import re
import tarfile
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from email.message import EmailMessage

log = logging.getLogger(__name__)

ARCHIVE_TYPES = ("application/zip", "application/x-tar", "application/gzip", "application/x-gzip",
                 "application/x-gtar", "application/x-compress", "application/x-7z-compressed",
                 "application/x-bzip2", "application/x-xz", "application/mbox")
MESSAGE_TYPES = ("message/rfc822", "application/vnd.ms-outlook")
BOMB_MIN_BYTES = 1 << 20  # below this a high ratio is just a very compressible small file

_OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
_UNSAFE_CHARS = re.compile(r"[\x00-\x1f\x7f]")
_MBOX_FROM = re.compile(rb"(?:\A|\n)From [^\n]*\n")


@dataclass(frozen=True)
class ArchiveLimits:
    """Guards applied while expanding the containers of one source file."""

    max_members: int = 1000
    max_member_bytes: int = 50 * 1024 * 1024
    #: bytes one source file may expand to, all its members (nested ones) together: ten of the largest members
    max_total_bytes: int = 512 * 1024 * 1024
    #: members (over 1 MiB) expanding more than this many times their compressed size are archive bombs; text
    #: and office files compress 3-20 times, a zip bomb's layers a thousand times and more
    max_ratio: float = 200.0
    #: archives nested deeper than this are quarantined
    max_depth: int = 3


@dataclass(frozen=True)
class Member:
    """One inner document: its safe name and bytes, or why it was not taken."""

    name: str
    data: bytes | None
    reason: str = ""
    detail: str = ""


@dataclass
class Expansion:
    """What a container holds.

    ``body``/``body_text`` is the container's own document where it has one (an e-mail body
    without its attachments); ``failure`` is set when the container itself can't be read.
    """

    kind: str
    members: list[Member] = field(default_factory=list)
    body: bytes | None = None
    body_text: str | None = None
    failure: tuple[str, str] | None = None


@dataclass
class Budget:
    """Bytes and members left to expand from one source file, shared by all the containers nested
    in it (a zip of zips of many members counts every member against one cap)."""

    left: int
    members: int | None = None  # None: only each container's own max_members applies

    def take(self, n: int) -> bool:
        if n > self.left:
            return False
        self.left -= n
        return True

    def take_member(self) -> bool:
        """False once the source's members are all taken."""
        if self.members is None:
            return True
        if self.members <= 0:
            return False
        self.members -= 1
        return True


def safe_member_name(name: str) -> str | None:
    """The member name as a relative ``/`` path, or None when it tries a path trick."""
    name = name.replace("\\", "/")
    if _UNSAFE_CHARS.search(name) or "!/" in name or re.match(r"^[A-Za-z]:", name) or name.startswith("/"):
        return None
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        return None
    return "/".join(parts)


def _zip_name(info: zipfile.ZipInfo) -> str:
    """Member name decoded as written: UTF-8 when flagged, else UTF-8, GB18030 or cp437 (zip's default)."""
    if info.flag_bits & 0x800:
        return info.filename
    raw = info.filename.encode("cp437", "replace")
    for codec in ("utf-8", "gb18030"):
        try:
            return raw.decode(codec)
        except UnicodeDecodeError:
            continue
    return info.filename


class _Collector:
    """Applies name checks, de-duplication, member/byte caps and the ratio guard."""

    def __init__(self, kind: str, packed: int, limits: ArchiveLimits, budget: Budget) -> None:
        self.out = Expansion(kind)
        self.packed = max(packed, 1)
        self.limits = limits
        self.budget = budget
        self.seen: dict[str, int] = {}
        self.taken = 0
        self.expanded = 0
        self.skipped = 0

    def name(self, raw: str) -> str | None:
        safe = safe_member_name(raw)
        if safe is None:
            self.out.members.append(Member(_UNSAFE_CHARS.sub("?", raw).replace("!/", "!_")[:200] or "?", None,
                                           "unsafe_path", "member name escapes the archive or holds control characters"))
            return None
        n = self.seen.get(safe, 0) + 1
        self.seen[safe] = n
        return safe if n == 1 else f"{safe}~{n}"

    def room(self) -> bool:
        """False (and counts it) once max_members members were taken, from this container or from
        all those of its source together."""
        if self.taken >= self.limits.max_members or not self.budget.take_member():
            self.skipped += 1
            return False
        return True

    def check(self, name: str, size: int, packed: int | None = None) -> bool:
        """Record a failure and return False when a member of ``size`` bytes must not be read."""
        if size > self.limits.max_member_bytes:
            self.out.members.append(Member(name, None, "too_large", f"{size} bytes expanded"))
            return False
        ratio_base = packed if packed is not None else self.packed
        if (size > BOMB_MIN_BYTES and size > self.limits.max_ratio * max(ratio_base, 1)) or (
            self.expanded + size > BOMB_MIN_BYTES and self.expanded + size > self.limits.max_ratio * self.packed
        ):
            self.out.members.append(Member(name, None, "archive_bomb",
                                           f"expands over {self.limits.max_ratio:g}x its compressed size"))
            return False
        if not self.budget.take(size):
            self.out.members.append(Member(name, None, "too_large", "the source expands beyond "
                                           f"{self.limits.max_total_bytes} bytes in total"))
            return False
        return True

    def add(self, name: str, data: bytes) -> None:
        self.taken += 1
        self.expanded += len(data)
        self.out.members.append(Member(name, data))

    def fail(self, name: str, reason: str, detail: str = "") -> None:
        self.out.members.append(Member(name, None, reason, detail[:300]))

    def done(self) -> Expansion:
        if self.skipped:
            self.out.members.append(Member("", None, "too_large", f"{self.skipped} more members over the limit of "
                                           f"{self.limits.max_members} per file (all its archives together) were "
                                           "skipped"))
        return self.out


def _read_capped(handle: io.BufferedIOBase | None, cap: int) -> bytes | None:
    if handle is None:
        return None
    data = handle.read(cap + 1)
    return None if len(data) > cap else data


def expand_zip(data: bytes, limits: ArchiveLimits, budget: Budget) -> Expansion:
    """Members of a zip archive."""
    col = _Collector("zip", len(data), limits, budget)
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        infos = [i for i in zf.infolist() if not i.is_dir()]
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        col.out.failure = ("corrupt", str(exc)[:300])
        return col.out
    for info in infos:
        name = col.name(_zip_name(info))
        if name is None or not col.room():
            continue
        if info.flag_bits & 0x1:
            col.fail(name, "encrypted", "password-protected zip member")
            continue
        if not col.check(name, info.file_size, info.compress_size):
            continue
        try:
            blob = _read_capped(zf.open(info), limits.max_member_bytes)
        except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError, EOFError, RuntimeError) as exc:
            col.fail(name, "corrupt", f"{type(exc).__name__}: {exc}")
            continue
        if blob is None:
            col.fail(name, "too_large", "member larger than its header says")
        else:
            col.add(name, blob)
    return col.done()


def expand_tar(data: bytes, limits: ArchiveLimits, budget: Budget) -> Expansion | None:
    """Members of a (gzip/bzip2/xz compressed) tar; None when the bytes are not a tar."""
    try:
        tf = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")  # noqa: SIM115 (closed with the bytes)
        members = tf.getmembers()
    except (tarfile.TarError, OSError, EOFError, ValueError):
        return None
    col = _Collector("tar", len(data), limits, budget)
    for m in members:
        if not m.isfile():
            continue  # folders, links and devices are not documents
        name = col.name(m.name)
        if name is None or not col.room() or not col.check(name, m.size):
            continue
        try:
            blob = _read_capped(tf.extractfile(m), limits.max_member_bytes)
        except (tarfile.TarError, OSError, EOFError) as exc:
            col.fail(name, "corrupt", f"{type(exc).__name__}: {exc}")
            continue
        if blob is not None:
            col.add(name, blob)
    return col.done()


def expand_7z(data: bytes, limits: ArchiveLimits, budget: Budget) -> Expansion | None:
    """Members of a 7z archive with PyPI ``py7zr``; None when it is not installed."""
    try:
        import py7zr
        from py7zr.io import BytesIOFactory
    except ImportError:
        return None
    col = _Collector("7z", len(data), limits, budget)
    try:
        with py7zr.SevenZipFile(io.BytesIO(data)) as sz:
            if sz.needs_password():
                col.out.failure = ("encrypted", "password-protected 7z archive")
                return col.out
            infos = [i for i in sz.list() if not i.is_directory]
            wanted: dict[str, str] = {}
            for info in infos:
                name = col.name(info.filename)
                if name is None or not col.room() or not col.check(name, int(info.uncompressed or 0)):
                    continue
                wanted[info.filename] = name
            if not wanted:
                return col.done()
            factory = BytesIOFactory(limits.max_member_bytes + 1)
            sz.extract(targets=list(wanted), factory=factory)
    except Exception as exc:  # noqa: BLE001 (py7zr raises many types: Bad7zFile, CrcError, LZMAError, ...)
        reason = "encrypted" if "password" in str(exc).lower() else "corrupt"
        col.out.failure = (reason, f"{type(exc).__name__}: {exc}"[:300])
        return col.out
    for raw, name in wanted.items():
        try:
            product = factory.get(raw)
        except KeyError:
            col.fail(name, "corrupt", "member could not be extracted")
            continue
        product.seek(0)
        blob = product.read()
        if len(blob) > limits.max_member_bytes:
            col.fail(name, "too_large", f"over {limits.max_member_bytes} bytes")
        else:
            col.add(name, blob)
    return col.done()


def looks_like_mbox(data: bytes) -> bool:
    """An mbox starts with a ``From `` line followed by mail headers."""
    return data.startswith(b"From ") and re.search(rb"\n[A-Za-z][A-Za-z0-9-]*: ", data[:4096]) is not None


def expand_mbox(data: bytes, limits: ArchiveLimits, budget: Budget) -> Expansion:
    """Each message of an mbox as ``NNNNN-<subject>.eml``."""
    col = _Collector("mbox", len(data), limits, budget)
    starts = [m.end() for m in _MBOX_FROM.finditer(data)]
    ends = [m.start() for m in _MBOX_FROM.finditer(data)][1:] + [len(data)]
    for i, (a, b) in enumerate(zip(starts, ends, strict=True), 1):
        raw = re.sub(rb"(?m)^>(>*From )", rb"\1", data[a:b])  # mboxrd un-quoting
        subject = email.message_from_bytes(raw[:8192], policy=email.policy.default).get("subject") or "message"
        stem = re.sub(r"[^\w.-]+", "_", str(subject))[:60].strip("_") or "message"
        name = col.name(f"{i:05d}-{stem}.eml")
        if name is None or not col.room() or not col.check(name, len(raw), len(raw)):
            continue
        col.add(name, raw)
    return col.done()


def _is_attachment(part: EmailMessage) -> bool:
    if part.get_content_type() == "message/rfc822":
        return True
    if part.is_multipart():
        return False
    if part.get_content_disposition() == "attachment" or part.get_filename():
        return True
    return part.get_content_maintype() not in ("text",)


def _attachments(msg: EmailMessage) -> Iterable[EmailMessage]:
    if _is_attachment(msg) and msg.get_content_type() == "message/rfc822":
        yield msg
        return
    if msg.is_multipart():
        for part in msg.iter_parts():
            if _is_attachment(part):
                yield part
            elif part.is_multipart():
                yield from _attachments(part)


def _strip_attachments(msg: EmailMessage) -> None:
    if not msg.is_multipart():
        return
    kept = [p for p in msg.get_payload() if not _is_attachment(p)]
    for p in kept:
        _strip_attachments(p)
    msg.set_payload(kept)


def expand_email(data: bytes, limits: ArchiveLimits, budget: Budget) -> Expansion | None:
    """Attachments of an RFC 822 message, and the message without them; None when it has none."""
    try:
        msg = email.message_from_bytes(data, policy=email.policy.default)
    except Exception:  # noqa: BLE001 (a message the stdlib can't read stays one document)
        return None
    parts = list(_attachments(msg)) if msg.is_multipart() else []
    if not parts:
        return None
    col = _Collector("email", len(data), limits, budget)
    for n, part in enumerate(parts, 1):
        if part.get_content_type() == "message/rfc822":
            inner = part.get_payload()
            inner = inner[0] if isinstance(inner, list) and inner else inner
            blob = inner.as_bytes() if hasattr(inner, "as_bytes") else b""
            default = f"message-{n}.eml"
        else:
            blob = part.get_payload(decode=True) or b""
            default = f"attachment-{n}"
        name = col.name(part.get_filename() or default)
        if name is None or not col.room() or not col.check(name, len(blob), len(blob)):
            continue
        col.add(name, blob)
    body = copy.deepcopy(msg)
    _strip_attachments(body)
    try:
        col.out.body = body.as_bytes()
    except Exception:  # noqa: BLE001 (re-serialising a broken message: keep the whole message)
        col.out.body = data
    return col.done()


def _ole_text(ole, path: list[str]) -> str:
    for suffix, codec in (("001F", "utf-16-le"), ("001E", "cp1252")):
        stream = path[:-1] + [path[-1] + suffix]
        if ole.exists("/".join(stream)):
            return ole.openstream(stream).read().decode(codec, "replace").rstrip("\x00")
    return ""


def looks_like_msg(data: bytes) -> bool:
    """An Outlook .msg: an OLE2 file holding a MAPI property stream."""
    if not data.startswith(_OLE_MAGIC):
        return False
    try:
        import olefile
    except ImportError:
        return False
    try:
        with olefile.OleFileIO(data) as ole:
            return bool(ole.exists("__properties_version1.0")) and any(
                e[0].startswith("__substg1.0_") for e in ole.listdir(streams=True, storages=False))
    except Exception:  # noqa: BLE001 (olefile raises several types on a damaged OLE file)
        return False


def expand_msg(data: bytes, limits: ArchiveLimits, budget: Budget) -> Expansion | None:
    """Attachments of an Outlook .msg (PyPI ``olefile``) and its own text; None without attachments."""
    try:
        import olefile
    except ImportError:
        return None
    try:
        ole = olefile.OleFileIO(data)
    except Exception:  # noqa: BLE001 (olefile raises several types on a damaged OLE file)
        return None
    with ole:
        storages = sorted({e[0] for e in ole.listdir(streams=True, storages=True)
                           if e[0].startswith("__attach_version1.0_#")})
        if not storages:
            return None
        col = _Collector("msg", len(data), limits, budget)
        for n, storage in enumerate(storages, 1):
            raw_name = (_ole_text(ole, [storage, "__substg1.0_3707"]) or _ole_text(ole, [storage, "__substg1.0_3704"])
                        or _ole_text(ole, [storage, "__substg1.0_3001"]) or f"attachment-{n}")
            name = col.name(raw_name)
            if name is None or not col.room():
                continue
            stream = [storage, "__substg1.0_37010102"]
            if not ole.exists("/".join(stream)):
                col.fail(name, "unsupported", "embedded Outlook item (not a file attachment)")
                continue
            size = ole.get_size("/".join(stream))
            if not col.check(name, size):
                continue
            col.add(name, ole.openstream(stream).read())
        subject = _ole_text(ole, ["__substg1.0_0037"])
        body = _ole_text(ole, ["__substg1.0_1000"])
        col.out.body_text = f"{subject}\n\n{body}".strip() if body else None
    return col.done()
