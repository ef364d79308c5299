"""Batch scoring of an inbox: a processed-files ledger, quarantine and fan-out.

Generic over verticals. A scoring flow lists the files of an inbox (a folder or a glob of
CSV/Parquet files), keeps those whose content the ledger has not seen, scores each in a
task (on the flow's task runner: threads or Dask), and records every outcome:

- ``scored``: the output file, rows and model version; the same content is never scored
  again, under any name;
- ``quarantined``: the file could not be read or validated; a copy and the reason go to
  ``<home>/quarantine/<ledger>/`` and the file is not retried until its content changes;
- a file whose scoring failed for another reason (a bug, a lost worker) is not recorded
  and is retried by the next run; the run ends Failed after scoring the others.

The ledger is an append-only JSON-lines file under ``<home>/ledgers/`` written under an
exclusive lock; its last line for a content hash wins.
"""

from __future__ import annotations

import fcntl
import glob
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from prefect import task
from prefect.cache_policies import NONE
from pydantic import BaseModel, ConfigDict, Field

from infra.errors import IndusflowError
from infra.home import home_layout
from infra.store import check_name, safe_join, sha256_file, write_json_atomic

log = logging.getLogger(__name__)

TABLE_SUFFIXES = (".csv", ".parquet", ".pq")


class InboxFile(BaseModel):
    """A file found in an inbox, identified by its content."""

    path: str
    sha256: str
    size: int
    mtime_ns: int | None = None

    @property
    def name(self) -> str:
        return Path(self.path).name


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
    """One line of the ledger."""

    sha256: str
    path: str
    size: int
    mtime_ns: int | None = Field(default=None, description="Lets the next scan skip re-hashing an untouched file.")
    status: Literal["scored", "quarantined"]
    reason: str | None = None
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
        """The latest entry per content hash."""
        out: dict[str, LedgerEntry] = {}
        if not self.path.exists():
            return out
        with open(self.path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    entry = LedgerEntry.model_validate_json(line)
                except ValueError:  # a torn last line after a crash: ignore it, say so
                    log.warning("ledger %s line %d is not a valid entry; ignored", self.path, number)
                    continue
                out[entry.sha256] = entry
        return out

    def record(self, entry: LedgerEntry) -> None:
        with self._locked(), open(self.path, "a", encoding="utf-8") as handle:
            handle.write(entry.model_dump_json() + "\n")
            handle.flush()
            os.fsync(handle.fileno())


def list_inbox(location: str | Path, suffixes: tuple[str, ...] = TABLE_SUFFIXES) -> list[Path]:
    """The data files at ``location``: a folder (its files, not sub-folders), a glob, or one file.

    Hidden files and partial downloads (``.part``, ``.tmp``, ``.crdownload``) are skipped.
    """
    text = str(location)
    path = Path(text).expanduser()
    if any(ch in text for ch in "*?["):
        candidates = [Path(p) for p in glob.glob(str(path), recursive=True)]
    elif path.is_dir():
        candidates = list(path.iterdir())
    elif path.is_file():
        candidates = [path]
    else:
        candidates = []
    keep = []
    for p in candidates:
        if not p.is_file() or p.name.startswith("."):
            continue
        if p.suffix.lower() in {".part", ".tmp", ".crdownload"}:
            continue
        if p.suffix.lower() in suffixes:
            keep.append(p.resolve())
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
    for path in list_inbox(location, suffixes):
        stat = path.stat()
        if settle_s and now - stat.st_mtime < settle_s:
            settling += 1  # probably still being copied in; the next run takes it
            continue
        digest = stamps.get((str(path), stat.st_size, stat.st_mtime_ns)) or sha256_file(path)
        if digest in known:
            seen += 1
            continue
        if digest in hashes:
            duplicates += 1
            continue
        hashes.add(digest)
        pending.append(InboxFile(path=str(path), sha256=digest, size=stat.st_size, mtime_ns=stat.st_mtime_ns))
    return InboxScan(location=str(location), pending=pending, seen_before=seen, settling=settling,
                     duplicates=duplicates)


def _is_bad_input(exc: BaseException) -> bool:
    """Errors that mean "this file is bad", not "the job is broken"."""
    if isinstance(exc, IndusflowError):
        return True
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"ArrowException", "ParserError", "EmptyDataError", "UnicodeDecodeError"})


def score_one(score: Callable[[InboxFile], ScoredFile], file: InboxFile) -> FileOutcome:
    """Score one file; a bad-input error becomes a quarantine outcome, anything else raises."""
    started = time.perf_counter()
    try:
        result = score(file)
    except Exception as exc:
        if not _is_bad_input(exc):
            raise
        return FileOutcome(file=file, status="quarantined", reason=f"{type(exc).__name__}: {exc}",
                           seconds=time.perf_counter() - started)
    return FileOutcome(file=file, status="scored", scored=result, seconds=time.perf_counter() - started)


@task(name="score-file", cache_policy=NONE, task_run_name="score-{file.name}")
def score_file_task(score: Callable[[InboxFile], ScoredFile], file: InboxFile) -> FileOutcome:
    return score_one(score, file)


def quarantine(file: InboxFile, reason: str, ledger: FileLedger) -> LedgerEntry:
    """Copy a bad file and its reason to ``<home>/quarantine/<ledger>/``; record it."""
    folder = home_layout().quarantine(ledger.name)
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{file.sha256[:12]}-{file.name}"
    target = safe_join(folder, stem)
    try:
        shutil.copy2(file.path, target)
    except OSError as exc:  # the original stays where it is; the reason is what matters
        log.warning("could not copy %s to quarantine: %s", file.path, exc)
    write_json_atomic(folder / f"{stem}.reason.json", {"path": file.path, "sha256": file.sha256, "reason": reason})
    entry = LedgerEntry(sha256=file.sha256, path=file.path, size=file.size, mtime_ns=file.mtime_ns,
                        status="quarantined", reason=reason)
    ledger.record(entry)
    log.warning("quarantined %s: %s", file.path, reason)
    return entry


def score_inbox(files: list[InboxFile], score: Callable[[InboxFile], ScoredFile],
                ledger: FileLedger) -> list[FileOutcome]:
    """Fan the files out on the flow's task runner; record each outcome as it completes."""
    futures = [score_file_task.submit(score, f) for f in files]
    outcomes: list[FileOutcome] = []
    for file, future in zip(files, futures):
        try:
            outcome = future.result()
        except Exception as exc:  # not a data problem: leave it for the next run
            log.error("scoring %s failed (%s: %s); it stays in the inbox for the next run",
                      file.path, type(exc).__name__, exc)
            outcomes.append(FileOutcome(file=file, status="failed", reason=f"{type(exc).__name__}: {exc}"))
            continue
        if outcome.status == "scored" and outcome.scored is not None:
            ledger.record(LedgerEntry(sha256=file.sha256, path=file.path, size=file.size, mtime_ns=file.mtime_ns,
                                      status="scored",
                                      output=outcome.scored.output, rows=outcome.scored.rows,
                                      model=outcome.scored.model))
        else:
            quarantine(file, outcome.reason or "unknown", ledger)
        outcomes.append(outcome)
    return outcomes


def render_inbox_report(title: str, scan: InboxScan, outcomes: list[FileOutcome], model: str) -> str:
    """Markdown: what was scored, quarantined (with reasons) or failed."""
    counts = {s: sum(o.status == s for o in outcomes) for s in ("scored", "quarantined", "failed")}
    lines = [
        f"## {title} with {model}", "",
        f"Inbox `{scan.location}`: {len(scan.pending)} new file(s), {scan.seen_before} already handled, "
        f"{scan.duplicates} duplicate(s) in this scan, {scan.settling} still changing.", "",
        f"Scored {counts['scored']}, quarantined {counts['quarantined']}, failed {counts['failed']}.", "",
    ]
    if outcomes:
        lines += ["| file | status | rows | output / reason |", "|---|---|---|---|"]
        for o in outcomes:
            detail = o.scored.output if o.scored else (o.reason or "")
            detail = detail.replace("|", "\\|").replace("\n", " ")[:300]
            rows = o.scored.rows if o.scored else ""
            lines.append(f"| `{o.file.name}` | {o.status} | {rows} | {detail} |")
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


def process_inbox(job: str, location: str, model: str, make_scorer: Callable[[str], Callable[[InboxFile], ScoredFile]],
                  *, settle_s: float = 30.0) -> InboxRun:
    """One batch-scoring run: scan the inbox against the job's ledger, resolve ``model`` to one
    exact version (only when there is something to score: a schedule may fire before the first
    training), fan the files out, record outcomes, publish the report artifact.

    ``make_scorer(model_spec)`` returns the vertical's per-file scoring function (picklable,
    e.g. a ``functools.partial`` of a module-level function, so it can run on Dask workers).
    Raises after scoring the others when a file failed for a reason other than bad input.
    """
    from infra.registry import ModelRegistry
    from tasks.evaluate import artifact_key, publish_eval_report

    started = time.perf_counter()
    ledger = FileLedger(job)
    scan = scan_inbox(location, ledger, settle_s=settle_s)
    if not scan.pending:
        log.info("inbox %s: no new file (%d seen before, %d still changing)", location, scan.seen_before, scan.settling)
        return InboxRun(model=model, inbox=location, new_files=0, seen_before=scan.seen_before, scored=0, quarantined=0,
                        failed=0, rows=0, flagged=0, outputs=[], quarantine={}, seconds=time.perf_counter() - started)
    spec = ModelRegistry().resolve(model).spec  # one version for the whole run
    log.info("inbox %s: %d new file(s), %d seen before; scoring with %s", location, len(scan.pending), scan.seen_before, spec)
    outcomes = score_inbox(scan.pending, make_scorer(spec), ledger)
    counts = outcome_counts(outcomes)
    publish_eval_report(render_inbox_report(job, scan, outcomes, spec), key=artifact_key(job),
                        description="Inbox scoring: scored, quarantined and failed files")
    if counts["failed"]:
        raise RuntimeError(f"{counts['failed']} file(s) failed to score for reasons other than bad input; "
                           "they stay in the inbox for the next run (see the log)")
    return InboxRun(
        model=spec, inbox=location, new_files=len(scan.pending), seen_before=scan.seen_before,
        scored=counts["scored"], quarantined=counts["quarantined"], failed=counts["failed"],
        rows=sum(o.scored.rows for o in outcomes if o.scored),
        flagged=sum(o.scored.flagged or 0 for o in outcomes if o.scored),
        outputs=[o.scored.output for o in outcomes if o.scored],
        quarantine={o.file.path: o.reason or "" for o in outcomes if o.status == "quarantined"},
        seconds=time.perf_counter() - started,
    )


def inbox_summary(job: str, run: InboxRun, rows: str = "rows", flagged: str = "flagged") -> str:
    """The command line's summary of a batch-scoring run."""
    lines = [f"{job} with {run.model}: inbox {run.inbox}: {run.new_files} new file(s), {run.seen_before} seen before; "
             f"scored {run.scored} ({run.rows} {rows}, {run.flagged} {flagged}), quarantined {run.quarantined}, "
             f"failed {run.failed}"]
    lines += [f"  quarantined {path}: {reason}" for path, reason in run.quarantine.items()]
    return "\n".join(lines)

