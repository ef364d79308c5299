"""A challenger in production, and the record of every served score.

A :class:`ChallengerRoute` is a second :class:`~infra.serving.slot.ModelSlot` of a model,
following another alias (``challenger``), with its own hot reload and circuit breaker, in one
of two modes:

* ``shadow``: the challenger scores every request beside the champion; only the champion's
  scores are returned, both are recorded;
* ``split``: a stable share of subjects (accounts, assets) is answered by the challenger. The
  share is chosen by a keyed hash of the subject id (HMAC-SHA256 with a key derived from the
  audit salt), so an account is answered by the same side on every request and every replica,
  and no client can pick its side.

Wherever the challenger cannot answer (its alias unset, its version still loading, its breaker
open, its call failed, a request without the inputs it needs), the champion answers and the
response names the champion's version: a challenger never fails a request.

:class:`ScoreLog` appends every served score (model, version, role, the subject's id, whether
that score decided the response) to ``<home>/serving/scores/<model>/scores-<UTC date>.jsonl``,
from a background thread, one line per model call and role. The monitor flows join delayed
labels to it per version (:func:`read_score_log`). Ids are transaction ids or asset ids:
never account ids, amounts or other request content.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

import numpy as np
import orjson

from infra.registry import ModelRef
from infra.serving.breaker import BreakerOpen
from infra.serving.slot import ModelSlot

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

#: Folder of the score log under ``<home>/serving/``.
SCORES_DIR = "scores"
SHADOW = "shadow"
SPLIT = "split"
ChallengerMode = Literal["shadow", "split"]
CHAMPION_ROLE = "champion"
CHALLENGER_ROLE = "challenger"
#: Lines of the score log holding labels that arrived later (``scores`` are the 0/1 labels).
LABEL_ROLE = "label"


@dataclass
class ChallengerRoute(Generic[T]):
    """A model's challenger: its slot, its mode and (split) the share of subjects it answers."""

    slot: ModelSlot[T]
    mode: str = SHADOW
    share: float = 0.1
    salt: bytes = b""

    def __post_init__(self) -> None:
        if self.mode not in (SHADOW, SPLIT):
            raise ValueError(f"challenger mode {self.mode!r}: use {SHADOW!r} or {SPLIT!r}")
        if not 0.0 < self.share < 1.0:
            raise ValueError(f"challenger share {self.share}: a share strictly between 0 and 1")

    def current(self) -> tuple[ModelRef, T] | None:
        """The loaded challenger, or None while it cannot be called (no alias, loading, breaker open)."""
        if not self.slot.ready or self.slot.breaker.is_open:
            return None
        try:
            return self.slot.current()
        except Exception:  # noqa: BLE001 - cleared between the two reads
            return None

    def answers(self, subjects: Sequence[Any]) -> np.ndarray:
        """Per subject id, whether the challenger answers it (always False in shadow mode)."""
        if self.mode != SPLIT:
            return np.zeros(len(subjects), dtype=bool)
        limit = int(self.share * 2**64)
        return np.fromiter(
            (int.from_bytes(hmac.new(self.salt, str(s).encode("utf-8", "surrogatepass"), hashlib.sha256)
                            .digest()[:8], "big") < limit for s in subjects),
            dtype=bool, count=len(subjects))

    def call(self, fn: Callable[[], R]) -> R | None:
        """``fn()`` counted by the challenger's breaker; None when the breaker is open or ``fn``
        fails (logged and counted: a challenger never fails a request, the champion answers)."""
        try:
            with self.slot.breaker.guard(ignore=()):
                return fn()
        except BreakerOpen:
            return None
        except Exception as exc:  # noqa: BLE001 - see above
            if self.slot.metrics is not None:
                self.slot.metrics.model_errors.labels(model=self.slot.label, stage="score").inc()
            log.warning("challenger %s: its call failed (%s: %s); the champion answers", self.slot.label,
                        type(exc).__name__, exc)
            return None


@dataclass(frozen=True)
class ScoreRecord:
    """One model call's scores of one role, as one line of the score log."""

    model: str
    version: int
    role: str
    ids: list[str]
    scores: list[float]
    decided: list[bool]
    extra: dict[str, list[Any]] | None = None  # e.g. the sensor's step and failure probability


class ScoreLog:
    """Append-only record of served scores (see the module docstring); writes happen off the
    request path, in batches, each batch one ``write`` on a file opened for appending (so
    replicas sharing a home interleave whole lines)."""

    def __init__(self, folder: Path, *, flush_s: float = 0.5) -> None:
        self.folder = folder
        self.flush_s = flush_s
        self._queue: queue.SimpleQueue[tuple[str, ScoreRecord] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.dropped = 0

    def record(self, record: ScoreRecord) -> None:
        """Queue ``record`` (stamped now); the writer thread starts on first use."""
        if not record.ids:
            return
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="score-log", daemon=True)
                    self._thread.start()
        self._queue.put((dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"), record))

    def _run(self) -> None:
        """Write what arrived within ``flush_s`` of the first queued record, in one go, until closed."""
        while True:
            batch = [self._queue.get()]
            deadline = time.monotonic() + self.flush_s
            while batch[-1] is not None and len(batch) < 4096 and (left := deadline - time.monotonic()) > 0:
                try:
                    batch.append(self._queue.get(timeout=left))
                except queue.Empty:
                    break
            self._write([entry for entry in batch if entry is not None])
            if batch[-1] is None:
                return

    def _write(self, batch: list[tuple[str, ScoreRecord]]) -> None:
        by_file: dict[Path, list[bytes]] = {}
        for at, rec in batch:
            line = {"at": at, "model": rec.model, "version": rec.version, "role": rec.role, "ids": rec.ids,
                    "scores": rec.scores, "decided": rec.decided, **(rec.extra or {})}
            path = self.folder / rec.model / f"scores-{at[:10]}.jsonl"
            by_file.setdefault(path, []).append(orjson.dumps(line, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
        for path, lines in by_file.items():
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(fd, b"".join(lines))
                finally:
                    os.close(fd)
            except OSError as exc:
                self.dropped += len(lines)
                log.error("score log: %d line(s) not written to %s: %s", len(lines), path.name, exc)

    def record_labels(self, model: str, ids: Sequence[str], labels: Sequence[int], source: str | None = None) -> None:
        """Queue labels that became known (``/v1/fraud/labels``), with the key that sent them (``source``):
        the evidence flows join them to the scores and count them per source."""
        if ids:
            self.record(ScoreRecord(model=model, version=0, role=LABEL_ROLE, ids=[str(i) for i in ids],
                                    scores=[float(v) for v in labels], decided=[False] * len(ids),
                                    extra={"source": [source] * len(ids)} if source else None))

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued and stop the writer."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout=timeout_s)


def read_score_log(folder: Path, model: str) -> list[dict[str, Any]]:
    """Every served score of ``model`` under a score-log ``folder``, one dict per (line, id):
    ``at``, ``version``, ``role``, ``id``, ``score``, ``decided`` and the line's extra columns."""
    out: list[dict[str, Any]] = []
    base = folder / model
    if not base.is_dir():
        return out
    for path in sorted(base.glob("scores-*.jsonl")):
        for number, raw in enumerate(path.read_bytes().splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                line = orjson.loads(raw)
            except orjson.JSONDecodeError:
                log.warning("score log %s line %d: not JSON (a write cut short?); skipped", path.name, number)
                continue
            extra = {k: v for k, v in line.items()
                     if k not in ("at", "model", "version", "role", "ids", "scores", "decided")}
            for i, (ident, score, decided) in enumerate(zip(line["ids"], line["scores"], line["decided"],
                                                             strict=True)):
                out.append({"at": line["at"], "version": int(line["version"]), "role": line["role"], "id": ident,
                            "score": score, "decided": bool(decided), **{k: v[i] for k, v in extra.items()}})
    return out
