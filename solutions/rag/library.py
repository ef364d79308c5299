"""The documents of a knowledge-base collection as its API shows them, and the records of the
ingest jobs an upload starts.

Pure domain: names (how an uploaded file is stored), a document's status from what ingest
recorded (its inputs are parameters), and the job record (one JSON file per job under
``<home>/serving/kb-jobs``, mode 0600, written by whichever process runs the job and read by
every API replica sharing the home). Nothing here runs an ingest.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import threading
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from infra.errors import IndusflowError
from infra.pii import redact_path, redact_text
from infra.secrets import UpstreamError

MAX_NAME_BYTES = 200
MAX_RAW_NAME_BYTES = 1024  # a longer name sent by a client is refused, not redacted
JOB_ID = re.compile(r"[0-9a-f]{16}")
#: Job states; the first two are "active" (a process is, or should be, working on the job).
ACTIVE = ("queued", "running")


class UploadRefused(IndusflowError):
    """An uploaded file cannot be stored (bad name, too large, a symlink in the way)."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


# ------------------------------------------------------------------------------------
# names and files


def safe_document_name(raw: str | None) -> str:
    """The name an uploaded file is stored under: the last path component of what the client
    sent, without control characters or leading dots, redacted (:func:`infra.pii.redact_path`: a
    phone number in a name becomes a tagged placeholder), then cut to at most 200 UTF-8 bytes
    (extension kept). Cut after redaction: a placeholder is longer than what it replaces, and a
    name cut first could grow past the file system's 255 bytes (and half a number would escape
    the redactor). ValueError (naming no part of the name) when nothing usable is left, or when
    the name is over 1,024 bytes before redaction."""
    name = unicodedata.normalize("NFC", raw or "").replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(ch for ch in name if ch.isprintable()).strip().lstrip(".").strip()
    if not name or name in {".", ".."}:
        raise ValueError("the file name has no usable characters")
    if len(name.encode()) > MAX_RAW_NAME_BYTES:
        raise ValueError(f"the file name is {len(name.encode())} bytes long; at most {MAX_RAW_NAME_BYTES} are accepted")
    name = redact_path(name).lstrip(".").strip()
    if len(name.encode()) > MAX_NAME_BYTES:
        stem, dot, ext = name.rpartition(".")
        ext = dot + ext if dot and len(ext.encode()) <= 16 else ""
        base = stem if ext else name
        while len((base + ext).encode()) > MAX_NAME_BYTES:
            base = base[:-1]
        name = base.rstrip() + ext
    if not name:
        raise ValueError("the file name has no usable characters")
    return name


def iter_folder(folder: Path) -> Iterator[Path]:
    """Regular files under ``folder`` as ingest sees them (no hidden names, no symlinks)."""
    for child in sorted(folder.rglob("*")):
        rel = child.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts) or child.is_symlink() or not child.is_file():
            continue
        yield child


# ------------------------------------------------------------------------------------
# documents and their status


class IngestState(Protocol):
    """What ingest stored of one source (``tasks.index.SourceState``)."""

    chunks: dict[str, int]

    def complete(self, source_hash: str) -> bool: ...


@dataclass
class DocumentStatus:
    """One document of a collection as the API lists it."""

    name: str
    status: str  # indexed | quarantined | pending
    chunks: int = 0
    reason: str | None = None
    quarantined_members: int = 0
    in_folder: bool = True
    pages_ocr: int | None = None  # pages (image frames) read by OCR, None when none were
    updated_at: str | None = None
    source: str = field(default="", repr=False)  # the stored (redacted) source path
    path: Path | None = field(default=None, repr=False)  # the file, when in the folder

    def public(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "chunks": self.chunks, "reason": self.reason,
                "quarantined_members": self.quarantined_members, "in_folder": self.in_folder,
                "pages_ocr": self.pages_ocr, "updated_at": self.updated_at}


def quarantine_reason(items: list[dict[str, Any]], source: str, describe: Callable[[str], str]) -> str | None:
    """Why the file was not indexed, in words (``describe`` turns a reason code into them:
    ``password-protected``, ``not a document``…): its own record's reason, else its first
    member's. Never the record's detail (parser and exception text; it stays in the ingest's
    report)."""
    if not items:
        return None
    own = [q for q in items if q.get("path") == source]
    if own:
        return describe(str(own[0].get("reason", "")))
    return f"{len(items)} member{'s' if len(items) != 1 else ''} not indexed: {describe(str(items[0].get('reason', '')))}"


def quarantined_files(items: Iterable[Any], describe: Callable[[str], str]) -> dict[str, str]:
    """The files the documents list shows as quarantined, each with its reason in words, from an
    ingest's quarantine items (``path``, ``reason``, ``file_indexed``): a file counts once, however
    many of its archive members were quarantined, and not at all when it holds indexed chunks
    (its quarantined members are then counted on its row). The CLI's summary uses this, the page
    :func:`status_of`: both word a file's reason with :func:`quarantine_reason`."""
    by_file: dict[str, list[dict[str, Any]]] = {}
    for item in items:
        if not item.file_indexed:
            by_file.setdefault(item.path.split("!/", 1)[0], []).append({"path": item.path, "reason": item.reason})
    return {source: quarantine_reason(its, source, describe) or "" for source, its in by_file.items()}


def status_of(source: str, file_hash: str, state: IngestState | None, cached: dict[str, Any],
              describe: Callable[[str], str]) -> tuple[str, int, str | None, int]:
    """``(status, chunks, reason, quarantined members)`` of one file from what ingest recorded."""
    chunks = sum(state.chunks.values()) if state else 0
    items = cached.get("items", []) if cached.get("hash") == file_hash else []
    members = sum(1 for q in items if q.get("path") != source)
    if state is not None and state.complete(file_hash):
        return "indexed", chunks, None, members
    if state is None and items:
        return "quarantined", 0, quarantine_reason(items, source, describe), members
    return "pending", chunks, None, 0


# ------------------------------------------------------------------------------------
# jobs


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


@dataclass
class IngestJob:
    """One ingest run asked for by an upload, as recorded under the home.

    ``how`` says where it runs: ``process`` (a child process of the API running the
    ``rag-ingest`` flow), ``deployment`` (a flow run of the configured deployment, on its work
    pool) or ``thread`` (inside the API process). ``pid`` is the process working on it (the
    child, or the API for ``thread``), ``flow_run_id``/``flow_run_name`` its Prefect run (names
    are ``kb-<collection>-<job id>``: no document name, no personal data), ``attempts`` how many
    times it was started (a job whose process died is started again: ingest is incremental).
    """

    job_id: str
    collection: str
    files: list[dict[str, Any]]
    state: str = "queued"  # queued | running | done | failed
    created_at: str = field(default_factory=now)
    started_at: str | None = None
    finished_at: str | None = None
    error: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    how: str = "process"
    pid: int | None = None
    owner_pid: int | None = None  # the API process that queued it
    attempts: int = 0
    flow_run_id: str | None = None
    flow_run_name: str | None = None

    def public(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "collection": self.collection, "state": self.state,
                "files": [dict(f) for f in self.files],
                "created_at": self.created_at, "started_at": self.started_at, "finished_at": self.finished_at,
                "error": self.error, "counts": dict(self.counts), "flow_run_id": self.flow_run_id,
                "flow_run_name": self.flow_run_name}

    def record(self) -> dict[str, Any]:
        """Everything stored in the job's file (the public fields, and who runs it)."""
        return self.public() | {"how": self.how, "pid": self.pid, "owner_pid": self.owner_pid,
                                "attempts": self.attempts}

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> IngestJob:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def flow_run_name(job: IngestJob) -> str:
    """The Prefect run name of a job: the collection and the job id, nothing of its documents."""
    return f"kb-{job.collection}-{job.job_id}"


def job_path(folder: Path, job_id: str) -> Path:
    if not JOB_ID.fullmatch(job_id):
        raise ValueError("a job id is 16 hexadecimal characters")
    return folder / f"{job_id}.json"


def save_job(folder: Path, job: IngestJob) -> None:
    """Write the job's record atomically, readable by its owner only (mode 0600 from the start)."""
    path = job_path(folder, job.job_id)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(job.record(), out, indent=2, sort_keys=True, default=str)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load_job(folder: Path, job_id: str) -> IngestJob | None:
    """The recorded job, None when there is none (or its file is unreadable)."""
    try:
        data = json.loads(job_path(folder, job_id).read_text())
    except (OSError, ValueError):
        return None
    try:
        return IngestJob.from_record(data) if isinstance(data, dict) else None
    except TypeError:
        return None


def recorded_jobs(folder: Path) -> Iterator[IngestJob]:
    """Every readable job record of the folder."""
    for path in sorted(folder.glob("*.json")):
        if JOB_ID.fullmatch(path.stem) and (job := load_job(folder, path.stem)) is not None:
            yield job


def error_text(exc: BaseException) -> str:
    """What a caller may see of a failure: an upstream service's name and status (never its body:
    :class:`infra.secrets.UpstreamError`), our own errors' messages (they name no secret and no
    personal data) or the exception type."""
    if isinstance(exc, UpstreamError):
        text = exc.public_text()
    elif isinstance(exc, IndusflowError | ValueError):
        text = " ".join(str(exc).split())
    else:
        return f"internal error ({type(exc).__name__})"
    return redact_text(text)[:500]
