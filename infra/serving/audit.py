"""The audit log: one append-only JSON line per request, rotated by size, with no raw PII.

A line holds the time, a request id, the key id (never the key), the client address (for the
security review of refused requests; the file is owner-only), the route, the status, the
latency, and what the route reported with :func:`record_audit`: the model and the version that
scored, the row count, decision counts and the account ids *hashed* with a secret salt
(HMAC-SHA256; the salt comes from the settings, or is created once under the home), so an
auditor can follow one account across lines without the log holding its id.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import secrets
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fastapi import Request

SUBJECTS_PER_LINE = 256
#: Pseudonyms kept in memory (:meth:`AuditLog.hash_id`): a scoring request hashes each account twice
#: (its transactions' owners, then its audit line) and accounts recur across requests.
HASHES_KEPT = 32_768


def load_or_create_salt(path: Path) -> bytes:
    """The salt stored at ``path`` (created with 32 random bytes, mode 0600, on first use)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_hex(32))
        try:
            os.link(tmp, path)  # first writer wins; a racing process reads the winner's salt
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return bytes.fromhex(path.read_text().strip())


class AuditLog:
    """Append-only JSONL file, rotated to ``.1 .. .N`` when it exceeds ``max_bytes``.

    Not :class:`logging.handlers.RotatingFileHandler`: the processes of ``serve --workers N`` append to
    one file, and that handler keeps one open stream per process and rotates it under the others (their
    lines then go on into the renamed file). Here each line is one ``O_APPEND`` write of a freshly opened
    file, so a rotation by any process is seen by the next write of every process.

    Args:
        path: the live file (``<home>/serving/audit.jsonl``).
        salt: the secret salt of :meth:`hash_id`.
        max_bytes: rotation size.
        backups: rotated files kept.
    """

    def __init__(self, path: Path, salt: bytes, max_bytes: int = 50_000_000, backups: int = 5) -> None:
        self.path = path
        self._salt = salt
        self.max_bytes = max_bytes
        self.backups = backups
        self._lock = threading.Lock()
        self._keyed = hmac.new(salt, digestmod=hashlib.sha256)  # copied per id: the key is set up once
        self._pseudonym = functools.lru_cache(maxsize=HASHES_KEPT)(self._hash_text)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():  # a home from before the files were private
            os.chmod(path, 0o600)

    def split_key(self) -> bytes:
        """The key of a challenger's split (:class:`~infra.serving.challenger.ChallengerRoute`): derived
        from the salt, so replicas sharing it route each account alike, and a split reveals no pseudonym."""
        return hmac.new(self._salt, b"indusflow challenger split", hashlib.sha256).digest()

    def hash_id(self, value: Any) -> str:
        """A stable pseudonym of an identifier (16 hex chars of HMAC-SHA256 with the salt)."""
        return self._pseudonym(str(value))

    def _hash_text(self, text: str) -> str:
        digest = self._keyed.copy()
        digest.update(text.encode())
        return digest.hexdigest()[:16]

    def write(self, entry: Mapping[str, Any]) -> None:
        """Append one line (and rotate first when the file is full)."""
        line = json.dumps(entry, separators=(",", ":"), default=str) + "\n"
        with self._lock:
            try:
                size = self.path.stat().st_size
            except FileNotFoundError:
                size = 0
            if size and size + len(line) > self.max_bytes:
                self._rotate()
            # owner-only: the lines name keys, routes and pseudonyms (rotation keeps the mode)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with open(fd, "a", encoding="utf-8") as handle:
                handle.write(line)

    def _rotate(self) -> None:
        for n in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{n + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))


def record_audit(request: Request, *, model: str, model_version: int, rows: int,
                 decisions: Mapping[str, int] | None = None, subjects: Iterable[Any] = ()) -> None:
    """What a route adds to its request's audit line; ``subjects`` (raw ids) are hashed here.

    Args:
        request: the current request.
        model: registry name of the model that scored.
        model_version: the version that scored.
        rows: rows scored.
        decisions: counts per decision (``{"flagged": 3, "passed": 61}``).
        subjects: account/asset ids the request concerned (at most 256 distinct are kept).
    """
    audit: AuditLog = request.app.state.serving.audit
    hashed = sorted({audit.hash_id(s) for s in set(map(str, subjects))})  # hash_id reads str(s)
    request.state.audit = {
        "model": model, "model_version": int(model_version), "rows": int(rows),
        "decisions": {k: int(v) for k, v in (decisions or {}).items()},
        "subjects": hashed[:SUBJECTS_PER_LINE],
    }


def annotate_audit(request: Request, **fields: Any) -> None:
    """Fields a route without a model version adds to its request's audit line (the knowledge
    base: collection, retriever, counts). Only counts and names of configured things belong
    here: never request text (questions, answers), document names or raw identifiers."""
    request.state.audit = {**(getattr(request.state, "audit", None) or {}), **fields}
