"""The artifact store: safe names and paths, content hashes, atomic writes (folders: infra.home)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from infra.errors import PathEscapeError

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_name(name: str, what: str = "name") -> str:
    """Validate a name used as one path component (model names, run keys)."""
    if not _SAFE_NAME.match(name) or name in {".", ".."}:
        raise ValueError(
            f"invalid {what} {name!r}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def safe_stem(path: str | Path) -> str:
    """A file-name stem of ``path`` made of safe characters (for outputs under the home), after
    the redaction boundary: a mobile number in an input's name never reaches an output's."""
    from infra.pii import redact_name

    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", redact_name(Path(path).stem)).strip("._-")[:80]
    return check_name(stem or "input", "file stem")


def safe_join(base: Path, *parts: str) -> Path:
    """Join ``parts`` under ``base`` and refuse any result outside ``base``."""
    base_resolved = base.resolve()
    candidate = base_resolved.joinpath(*parts).resolve()
    if candidate != base_resolved and base_resolved not in candidate.parents:
        raise PathEscapeError(f"path {'/'.join(parts)!r} escapes the folder {base_resolved}")
    return candidate


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def stable_hash(obj: Any) -> str:
    """Short SHA-256 of a JSON-serialisable object (keys sorted)."""
    data = json.dumps(obj, sort_keys=True, default=str).encode()
    return hashlib.sha256(data).hexdigest()[:16]


@contextmanager
def atomic_path(target: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; move it into place only on success."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON so that readers never see a half-written file."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str))


def read_json_dict(path: Path) -> dict[str, Any]:
    """A JSON object written by :func:`write_json_atomic`, or ``{}`` when the file is missing,
    unreadable or not an object (a cache or ledger that can be rebuilt)."""
    try:
        data = json.loads(path.read_text())
    except (ValueError, OSError):
        return {}
    return dict(data) if isinstance(data, dict) else {}
