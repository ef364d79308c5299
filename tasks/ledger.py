"""Batch scoring of an inbox: a processed-files ledger, quarantine and fan-out.

Generic over verticals. A scoring flow lists the files of an inbox (a folder or a glob of
CSV/Parquet files), keeps those whose content the ledger has not seen, scores each in a
task (on the flow's task runner: threads or Dask), and records every outcome:

- ``scored``: the output file, rows and model version; the same content is never scored
  again, under any name;
- ``quarantined``: reading or validating the file's content raised (any error, a
  timestamp out of range included); a copy and the reason go to
  ``<home>/quarantine/<ledger>/`` and the file is not retried until its content changes;
- ``released``: scoring failed for a reason that is not the file's (no model, a worker
  that cannot reach the home, permission denied, disk full, a bug): the file is never
  quarantined nor counted as seen, and the next run retries it; the run ends Failed after
  scoring the others.

A run **claims** its files under the ledger lock before scoring them (a ``claimed`` line
with its owner), so two runs on one inbox never score a file twice; a claim whose process
is gone (same host) or older than the claim timeout is taken over.

The inbox never leads outside itself: a symbolic link (or a file reached through one) is
refused with a reason, never read, hashed or copied. Error messages quote no cell of a
file, only a bounded, redacted list of its column names.

The ledger is an append-only JSON-lines file under ``<home>/ledgers/`` written under an
exclusive lock; its last line for a content hash wins.
"""

from __future__ import annotations

import fcntl
import glob
import logging
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from prefect import task
from prefect.cache_policies import NONE
from pydantic import BaseModel, ConfigDict, Field

from infra.errors import DataValidationError, IndusflowError, InfrastructureError, RegistryError
from infra.home import home_layout
from infra.pii import redact_path, redact_text
from infra.registry import ModelRef
from infra.store import check_name, safe_join, sha256_file, write_json_atomic
from infra.tables import bounded, content_error
from tasks.progress import track

log = logging.getLogger(__name__)

TABLE_SUFFIXES = (".csv", ".parquet", ".pq")
#: Statuses that settle a content hash for good (until the content changes).
SETTLED = ("scored", "quarantined")
#: A claim older than this is taken over by another run (its run died on another host).
CLAIM_TIMEOUT_S = 6 * 3600.0
#: Longest reason kept in the ledger, the report and the quarantine folder.
MAX_REASON_CHARS = 400


class InboxFile(BaseModel):
    """A file found in an inbox, identified by its content."""

    path: str
    sha256: str
    size: int
    mtime_ns: int | None = None

    @property
    def name(self) -> str:
        return Path(self.path).name

    @property
    def shown(self) -> str:
        """The path as it is stored, logged and shown (ledger, quarantine, reports, task-run
        names): redacted name by name, like a document's path (a mobile number in a file name
        becomes a tagged placeholder). ``path`` itself is only read."""
        return redact_path(self.path)

    @property
    def shown_name(self) -> str:
        return Path(self.shown).name


def locate(recorded: str) -> Path | None:
    """The file a ledger entry's (redacted) path stands for: the path itself when it exists, else
    the file of the same folder whose redacted path it is; None when it is gone."""
    path = Path(recorded)
    if path.exists():
        return path
    if path.parent.is_dir():
        for candidate in path.parent.iterdir():
            if redact_path(str(candidate)) == recorded:
                return candidate
    return None


class ScoredFile(BaseModel):
    """What a vertical's scoring function returns for one file."""

    output: str
    rows: int
    model: str
    flagged: int | None = None


class FileOutcome(BaseModel):
    """One file's outcome in a run."""

    file: InboxFile
    status: Literal["scored", "quarantined", "failed"]
    reason: str | None = None
    scored: ScoredFile | None = None
    seconds: float = 0.0


class LedgerEntry(BaseModel):
    """One line of the ledger (frozen: readers share the entries this process has parsed)."""

    model_config = ConfigDict(frozen=True)

    sha256: str
    path: str
    size: int
    mtime_ns: int | None = Field(default=None, description="Lets the next scan skip re-hashing an untouched file.")
    status: Literal["scored", "quarantined", "claimed", "released"]
    reason: str | None = None
    owner: str | None = Field(default=None, description="The run holding a claim: host:pid:run-id.")
    output: str | None = None
    rows: int | None = None
    model: str | None = None
    at: datetime = Field(default_factory=lambda: datetime.now(UTC))


class InboxScan(BaseModel):
    """The files of an inbox split into new ones and those already in the ledger."""

    location: str
    pending: list[InboxFile]
    seen_before: int
    settling: int = Field(description="Files skipped because they changed in the last seconds.")
    duplicates: int = Field(description="Files whose content appears twice in this scan.")
    refused: dict[str, str] = Field(default_factory=dict,
                                    description="Files not read at all (symbolic links out of the inbox) -> why.")
    claimed_elsewhere: int = Field(default=0, description="New files another running job had claimed.")


class _ReadState:
    """What this process has parsed of one ledger file: its latest entries up to ``offset``."""

    def __init__(self, inode: int) -> None:
        self.inode = inode
        self.offset = 0
        self.lines = 0
        self.latest: dict[str, LedgerEntry] = {}


_READ_LOCK = threading.Lock()
_READ_CACHE: dict[str, _ReadState] = {}


class FileLedger:
    """Append-only record of the files a job has handled, keyed by content hash."""

    def __init__(self, name: str, root: Path | None = None) -> None:
        self.name = check_name(name, "ledger name")
        self.path = safe_join(root or home_layout().ledgers(), f"{self.name}.jsonl")

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def entries(self) -> dict[str, LedgerEntry]:
        """The latest entry per content hash.

        The ledger only grows, and a deployment reads it several times per run for years: this
        process keeps what it parsed and reads only the lines appended since (a file that
        shrank or was replaced is read again from the start). A line still being written
        (no newline yet) is left for the next read.
        """
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return {}
        key = str(self.path)
        with _READ_LOCK:
            cached = _READ_CACHE.get(key)
            if cached is None or cached.inode != stat.st_ino or stat.st_size < cached.offset:
                cached = _ReadState(inode=stat.st_ino)
            if stat.st_size > cached.offset:
                self._read_from(cached)
            _READ_CACHE[key] = cached
            return dict(cached.latest)

    def _read_from(self, state: _ReadState) -> None:
        with open(self.path, "rb") as handle:
            handle.seek(state.offset)
            data = handle.read()
        complete = data.rfind(b"\n") + 1  # bytes up to the last full line
        for raw in data[:complete].splitlines():
            state.lines += 1
            line = raw.strip()
            if not line:
                continue
            try:
                entry = LedgerEntry.model_validate_json(line)
            except ValueError:  # a torn line after a crash: ignore it, say so
                log.warning("ledger %s line %d is not a valid entry; ignored", self.path, state.lines)
                continue
            state.latest[entry.sha256] = entry
        state.offset += complete

    def _append(self, entries: list[LedgerEntry]) -> None:
        if not entries:
            return
        with open(self.path, "a+b") as handle:
            # after a crash mid-write the file ends in a torn line: end it first, or the
            # next entry would be glued to it and lost with it
            size = os.fstat(handle.fileno()).st_size
            torn = size > 0 and os.pread(handle.fileno(), 1, size - 1) != b"\n"
            text = "".join(e.model_dump_json() + "\n" for e in entries)
            handle.write((("\n" if torn else "") + text).encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())

    def record(self, entry: LedgerEntry) -> None:
        with self._locked():
            self._append([entry])

    def claim(self, files: list[InboxFile], owner: str,
              timeout_s: float = CLAIM_TIMEOUT_S) -> tuple[list[InboxFile], int, int]:
        """Claim ``files`` for the run ``owner`` under the lock, reading the ledger inside it.

        Returns the files claimed now, how many were settled in the meantime (another run
        scored or quarantined them) and how many another live run holds.
        """
        claimed: list[InboxFile] = []
        settled = elsewhere = 0
        with self._locked():
            known = self.entries()
            for f in files:
                entry = known.get(f.sha256)
                if entry is not None and entry.status in SETTLED:
                    settled += 1
                elif entry is not None and entry.status == "claimed" and entry.owner != owner \
                        and not claim_is_stale(entry, timeout_s):
                    elsewhere += 1
                else:
                    claimed.append(f)
            self._append([LedgerEntry(sha256=f.sha256, path=f.shown, size=f.size, mtime_ns=f.mtime_ns,
                                      status="claimed", owner=owner) for f in claimed])
        return claimed, settled, elsewhere


def scored_entries(job: str, outputs: list[str] | None = None) -> list[LedgerEntry]:
    """The files ``job`` scored (only those that wrote one of ``outputs``, if given), oldest first."""
    keep = set(outputs) if outputs is not None else None
    entries = [e for e in FileLedger(job).entries().values()
               if e.status == "scored" and e.output and (keep is None or e.output in keep)]
    return sorted(entries, key=lambda e: e.at)


def run_owner() -> str:
    """A claim owner for this run: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def claim_is_stale(entry: LedgerEntry, timeout_s: float = CLAIM_TIMEOUT_S) -> bool:
    """A claim whose process is gone (same host) or that is older than ``timeout_s``."""
    host, _, rest = (entry.owner or "").partition(":")
    pid = rest.partition(":")[0]
    if host == socket.gethostname() and pid.isdigit():
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
    return (datetime.now(UTC) - entry.at).total_seconds() > timeout_s


def list_inbox(location: str | Path, suffixes: tuple[str, ...] = TABLE_SUFFIXES,
               refused: dict[str, str] | None = None) -> list[Path]:
    """The data files at ``location``: a folder (its files, not sub-folders), a glob, or one file.

    Hidden files and partial downloads (``.part``, ``.tmp``, ``.crdownload``) are skipped. A
    symbolic link, or a file whose real path leaves the inbox, is never followed: it is
    left out and, when ``refused`` is given, named there with the reason.
    """
    text = str(location)
    path = Path(text).expanduser()
    if any(ch in text for ch in "*?["):
        candidates = [Path(p) for p in glob.glob(str(path), recursive=True)]
        magic = next(i for i, part in enumerate(path.parts) if any(ch in part for ch in "*?["))
        base = Path(*path.parts[:magic]) if magic else Path(".")
    elif path.is_dir():
        candidates = list(path.iterdir())
        base = path
    elif path.is_file() or path.is_symlink():
        candidates = [path]
        base = path.parent
    else:
        candidates = []
        base = path
    root = base.resolve()
    keep = []
    for p in candidates:
        if p.name.startswith(".") or p.suffix.lower() in {".part", ".tmp", ".crdownload"}:
            continue
        if p.suffix.lower() not in suffixes:
            continue
        if p.is_symlink():
            if refused is not None:
                refused[redact_path(str(p))] = "a symbolic link: the inbox never follows links (copy the file in instead)"
            continue
        if not p.is_file():
            continue
        real = p.resolve()
        if not real.is_relative_to(root):
            if refused is not None:
                refused[redact_path(str(p))] = "reached through a symbolic link that leaves the inbox"
            continue
        keep.append(real)
    return sorted(keep)


def scan_inbox(location: str | Path, ledger: FileLedger, *, settle_s: float = 0.0,
               suffixes: tuple[str, ...] = TABLE_SUFFIXES) -> InboxScan:
    """New files of the inbox: content not in the ledger, not modified in the last ``settle_s``."""
    known = ledger.entries()
    # files untouched since they were recorded (same path, size and mtime) are not re-hashed
    stamps = {(e.path, e.size, e.mtime_ns): e.sha256 for e in known.values() if e.mtime_ns is not None}
    now = time.time()
    pending: list[InboxFile] = []
    seen = settling = duplicates = 0
    hashes: set[str] = set()
    refused: dict[str, str] = {}
    for path in list_inbox(location, suffixes, refused):
        stat = path.stat(follow_symlinks=False)
        if settle_s and now - stat.st_mtime < settle_s:
            settling += 1  # probably still being copied in; the next run takes it
            continue
        digest = stamps.get((redact_path(str(path)), stat.st_size, stat.st_mtime_ns)) or sha256_file(path)
        if digest in known and known[digest].status in SETTLED:
            seen += 1
            continue
        if digest in hashes:
            duplicates += 1
            continue
        hashes.add(digest)
        pending.append(InboxFile(path=str(path), sha256=digest, size=stat.st_size, mtime_ns=stat.st_mtime_ns))
    for name, why in refused.items():
        log.warning("inbox %s: %s not read: %s", location, name, why)
    return InboxScan(location=str(location), pending=pending, seen_before=seen, settling=settling,
                     duplicates=duplicates, refused=refused)


def is_infrastructure_error(exc: BaseException) -> bool:
    """Errors of the machine or the set-up, not of the file: no model, a missing setting, a
    worker that cannot reach the home, permission denied, disk full, out of memory."""
    if isinstance(exc, (InfrastructureError, RegistryError, MemoryError)):
        return True
    return isinstance(exc, OSError) and exc.errno is not None


def _is_bad_input(exc: BaseException) -> bool:
    """Errors that mean "this file is bad", not "the job is broken"."""
    if is_infrastructure_error(exc):
        return False
    if isinstance(exc, IndusflowError):
        return True
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"ArrowException", "ParserError", "EmptyDataError", "UnicodeDecodeError"})


@contextmanager
def reading_content(source: str) -> Iterator[None]:
    """Around reading and validating one file: any error there is the file's content
    (a :class:`DataValidationError` with a bounded message), unless it is the machine's."""
    try:
        yield
    except DataValidationError:
        raise
    except Exception as exc:
        if is_infrastructure_error(exc):
            raise
        raise DataValidationError(f"cannot be read: {content_error(exc)}", source=source) from exc


def check_still_regular(file: InboxFile) -> None:
    """Refuse a file that was swapped for a symbolic link after the scan; raise
    :class:`InfrastructureError` (the file is released, not quarantined) when this machine does not
    see the file's folder at all: a worker without the inbox volume must not judge the files."""
    if os.path.islink(file.path):
        raise DataValidationError("became a symbolic link after the scan; not read", source=file.shown)
    folder = os.path.dirname(file.path) or "."
    if not os.path.isdir(folder) or (not os.path.lexists(file.path) and _empty(folder)):
        # no folder, or an empty one where the scan saw this file: the inbox volume is not mounted
        # here (an empty mount point); a file deleted from a folder that holds others is the file's
        raise InfrastructureError(
            f"this worker cannot see the inbox folder of {file.shown_name!r}: is the inbox volume mounted on every "
            "worker of the pool? The file is released for the next run")


def _empty(folder: str) -> bool:
    try:
        with os.scandir(folder) as entries:
            return next(entries, None) is None
    except OSError:
        return True


def score_one(score: Callable[[InboxFile], ScoredFile], file: InboxFile) -> FileOutcome:
    """Score one file; a bad-input error becomes a quarantine outcome, anything else raises."""
    started = time.perf_counter()
    try:
        check_still_regular(file)
        result = score(file)
    except Exception as exc:
        if not _is_bad_input(exc):
            raise
        return FileOutcome(file=file, status="quarantined",
                           reason=bounded(redact_text(f"{type(exc).__name__}: {exc}"), MAX_REASON_CHARS),
                           seconds=time.perf_counter() - started)
    return FileOutcome(file=file, status="scored", scored=result, seconds=time.perf_counter() - started)


@task(name="score-file", cache_policy=NONE, task_run_name="score-{file.shown_name}")
def score_file_task(score: Callable[[InboxFile], ScoredFile], file: InboxFile) -> FileOutcome:
    return score_one(score, file)


def copy_owner_only(source: Path, target: Path) -> None:
    """Copy ``source`` (never through a link) to ``target``, readable by its owner only from the
    moment it exists, whatever the original's mode."""
    src = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(src, "rb") as inp:
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        os.fchmod(out, 0o600)  # a copy already there keeps its mode otherwise
        with os.fdopen(out, "wb") as dst:
            shutil.copyfileobj(inp, dst)


def quarantine(file: InboxFile, reason: str, ledger: FileLedger) -> LedgerEntry:
    """Copy a bad file and its reason to ``<home>/quarantine/<ledger>/``; record it."""
    folder = home_layout().quarantine(ledger.name)
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{file.sha256[:12]}-{file.shown_name}"
    target = safe_join(folder, stem)
    reason = redact_text(reason)
    if os.path.islink(file.path):  # never copy what a link points to
        log.warning("not copying %s to quarantine: it is a symbolic link", file.shown)
    else:
        try:
            copy_owner_only(Path(file.path), target)
        except OSError as exc:  # the original stays where it is; the reason is what matters
            log.warning("could not copy %s to quarantine: %s", file.shown, redact_text(str(exc)))
    write_json_atomic(folder / f"{stem}.reason.json", {"path": file.shown, "sha256": file.sha256, "reason": reason})
    entry = LedgerEntry(sha256=file.sha256, path=file.shown, size=file.size, mtime_ns=file.mtime_ns,
                        status="quarantined", reason=reason)
    ledger.record(entry)
    log.warning("quarantined %s: %s", file.shown, reason)
    return entry


def release(file: InboxFile, reason: str, ledger: FileLedger) -> None:
    """Give up a claim without settling the file: the next run retries it."""
    ledger.record(LedgerEntry(sha256=file.sha256, path=file.shown, size=file.size, mtime_ns=file.mtime_ns,
                              status="released", reason=reason))


def score_inbox(files: list[InboxFile], score: Callable[[InboxFile], ScoredFile],
                ledger: FileLedger) -> list[FileOutcome]:
    """Fan the files out on the flow's task runner; record each outcome as it completes.

    A file that failed for a reason other than its content is released, not settled. A single
    file on this process's thread pool is scored in the calling thread (still as a task run):
    nothing would run beside it, and the hop to a fresh pool thread cost ~5% at 100k rows.
    """
    from prefect.context import FlowRunContext

    from infra.runners import runs_on_local_threads

    context = FlowRunContext.get()
    here = len(files) == 1 and (context is None or runs_on_local_threads(context.task_runner))
    futures: list[Any] = [None] if here else [score_file_task.submit(score, f) for f in files]
    outcomes: list[FileOutcome] = []
    meter = track(len(files), f"score {ledger.name}", "files",
                  description=f"{ledger.name}: % of the {len(files)} claimed files handled")
    with meter:
        for file, future in zip(files, futures, strict=True):
            outcomes.append(_settle_outcome(score, file, future, ledger))
            meter.advance()
    return outcomes


def _settle_outcome(score: Callable[[InboxFile], ScoredFile], file: InboxFile, future: Any,
                    ledger: FileLedger) -> FileOutcome:
    """Wait for one file's outcome and record it in the ledger (scored, quarantined or released)."""
    try:
        outcome = score_file_task(score, file) if future is None else future.result()
    except Exception as exc:  # noqa: BLE001 - not a data problem: leave it for the next run
        reason = bounded(redact_text(f"{type(exc).__name__}: {exc}"), MAX_REASON_CHARS)
        log.error("scoring %s failed (%s); it stays in the inbox for the next run", file.shown, reason)
        release(file, reason, ledger)
        return FileOutcome(file=file, status="failed", reason=reason)
    if outcome.status == "scored" and outcome.scored is not None:
        ledger.record(LedgerEntry(sha256=file.sha256, path=file.shown, size=file.size, mtime_ns=file.mtime_ns,
                                  status="scored", output=outcome.scored.output, rows=outcome.scored.rows,
                                  model=outcome.scored.model))
    else:
        quarantine(file, outcome.reason or "unknown", ledger)
    return outcome


def render_inbox_report(title: str, scan: InboxScan, outcomes: list[FileOutcome], model: str) -> str:
    """Markdown: what was scored, quarantined (with reasons) or failed."""
    counts = {s: sum(o.status == s for o in outcomes) for s in ("scored", "quarantined", "failed")}
    lines = [
        f"## {title} with {model}", "",
        (f"Inbox `{scan.location}`: {len(scan.pending)} new file(s), {scan.seen_before} already handled, "
        f"{scan.duplicates} duplicate(s) in this scan, {scan.settling} still changing, "
        f"{scan.claimed_elsewhere} claimed by another run, {len(scan.refused)} refused (links)."), "",
        (f"Scored {counts['scored']}, quarantined {counts['quarantined']}, failed {counts['failed']} "
        "(failed files stay in the inbox for the next run)."), "",
    ]
    for name, why in scan.refused.items():
        lines.append(f"- refused `{Path(name).name}`: {why}")
    if scan.refused:
        lines.append("")
    if outcomes:
        lines += ["| file | status | rows | output / reason |", "|---|---|---|---|"]
        for o in outcomes:
            detail = o.scored.output if o.scored else (o.reason or "")
            detail = detail.replace("|", "\\|").replace("\n", " ")[:300]
            rows = o.scored.rows if o.scored else ""
            lines.append(f"| `{o.file.shown_name}` | {o.status} | {rows} | {detail} |")
    return "\n".join(lines) + "\n"


def outcome_counts(outcomes: list[FileOutcome]) -> dict[str, Any]:
    return {s: sum(o.status == s for o in outcomes) for s in ("scored", "quarantined", "failed")}


class InboxRun(BaseModel):
    """What one batch-scoring run did with its inbox (a vertical's flow result extends it)."""

    model_config = ConfigDict(frozen=True)

    model: str = Field(description="The exact version used (the requested name when nothing was new).")
    inbox: str
    new_files: int
    seen_before: int
    scored: int
    quarantined: int
    failed: int
    rows: int = Field(description="Rows written over all scored files.")
    flagged: int = Field(description="Rows flagged (above the model's threshold) over all scored files.")
    outputs: list[str]
    quarantine: dict[str, str] = Field(description="Quarantined file -> reason.")
    seconds: float
    claimed_elsewhere: int = Field(default=0, description="New files left to another run that had claimed them.")
    refused: dict[str, str] = Field(default_factory=dict, description="Files never read (symbolic links) -> why.")


def process_inbox(job: str, location: str, model: str, make_scorer: Callable[[ModelRef], Callable[[InboxFile], ScoredFile]],
                  *, settle_s: float = 30.0) -> InboxRun:
    """One batch-scoring run: scan the inbox against the job's ledger, resolve ``model`` to one
    exact version (only when there is something to score: a schedule may fire before the first
    training), claim the new files, fan them out, record outcomes, publish the report artifact.

    ``make_scorer(model_ref)`` returns the vertical's per-file scoring function (picklable,
    e.g. a ``functools.partial`` of a module-level function, so it can run on Dask workers).
    It receives the version resolved here, once, with its absolute path: a worker reads the
    model from there, never resolves it against its own settings.
    Raises after scoring the others when a file failed for a reason other than bad input.
    """
    from infra.registry import ModelRegistry
    from tasks.evaluate import artifact_key, publish_eval_report

    started = time.perf_counter()
    ledger = FileLedger(job)
    scan = scan_inbox(location, ledger, settle_s=settle_s)

    def nothing(seen: int, note: str, elsewhere: int = 0) -> InboxRun:
        log.info("inbox %s: no new file (%d seen before, %d still changing%s)", location, seen, scan.settling, note)
        return InboxRun(model=model, inbox=location, new_files=0, seen_before=seen, scored=0, quarantined=0,
                        failed=0, rows=0, flagged=0, outputs=[], quarantine={}, seconds=time.perf_counter() - started,
                        claimed_elsewhere=elsewhere, refused=scan.refused)

    if not scan.pending:
        return nothing(scan.seen_before, "")
    ref = ModelRegistry().resolve(model)  # one version for the whole run; a missing model fails the run
    spec = ref.spec
    files, settled, elsewhere = ledger.claim(scan.pending, run_owner())
    scan = scan.model_copy(update={"pending": files, "seen_before": scan.seen_before + settled,
                                   "claimed_elsewhere": elsewhere})
    if not files:
        return nothing(scan.seen_before, f", {elsewhere} claimed by another run", elsewhere)
    log.info("inbox %s: %d new file(s), %d seen before; scoring with %s", location, len(files), scan.seen_before, spec)
    outcomes = score_inbox(files, make_scorer(ref), ledger)
    counts = outcome_counts(outcomes)
    publish_eval_report(render_inbox_report(job, scan, outcomes, spec), key=artifact_key(job),
                        description="Inbox scoring: scored, quarantined and failed files")
    if counts["failed"]:
        raise RuntimeError(f"{counts['failed']} file(s) failed to score for reasons other than bad input; "
                           "they stay in the inbox for the next run (see the log)")
    return InboxRun(
        model=spec, inbox=location, new_files=len(files), seen_before=scan.seen_before,
        scored=counts["scored"], quarantined=counts["quarantined"], failed=counts["failed"],
        rows=sum(o.scored.rows for o in outcomes if o.scored),
        flagged=sum(o.scored.flagged or 0 for o in outcomes if o.scored),
        outputs=[o.scored.output for o in outcomes if o.scored],
        quarantine={o.file.shown: o.reason or "" for o in outcomes if o.status == "quarantined"},
        seconds=time.perf_counter() - started, claimed_elsewhere=elsewhere, refused=scan.refused,
    )


def inbox_summary(job: str, run: InboxRun, rows: str = "rows", flagged: str = "flagged") -> str:
    """The command line's summary of a batch-scoring run."""
    lines = [(f"{job} with {run.model}: inbox {run.inbox}: {run.new_files} new file(s), {run.seen_before} seen before; "
             f"scored {run.scored} ({run.rows} {rows}, {run.flagged} {flagged}), quarantined {run.quarantined}, "
             f"failed {run.failed}")]
    lines += [f"  quarantined {path}: {reason}" for path, reason in run.quarantine.items()]
    lines += [f"  refused {path}: {reason}" for path, reason in run.refused.items()]
    return "\n".join(lines)

