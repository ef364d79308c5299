"""Thumbs up or down on knowledge-base answers: stored redacted, one JSON line per vote, and
exported as a QA set that ``python -m flows.rag eval`` reads (:func:`solutions.rag.evaluation.load_qa`).

A record holds the (redacted) question, the question retrieval used, the answer, the vote, the
time, the passages the answer cited (chunk id, document name and stored, redacted path) and the
id of the key that voted (never its secret). Every record is bounded (texts cut, at most
:data:`MAX_PASSAGES` passages: a line under :data:`MAX_VOTE_BYTES`), and so are one key's votes
on a collection (:data:`MAX_KEY_BYTES`, :class:`VoteBudget`). The file is the collection's
``<home>/rag/feedback/<collection>.jsonl``, mode 0600.

The evaluation set counts one vote per key and question (its latest): a question is kept when
more keys voted it up than down, at least ``min_voters`` of them up, its answer citing a passage;
its row names the keys that voted it up (``voters``) and the export counts the votes of each
key, so a set stuffed by one key shows.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from infra.pii import redact_text
from solutions.rag.collections import check_collection_name

Vote = Literal["up", "down"]
FEEDBACK_FILE = "{collection}.jsonl"
#: The most characters of each text a vote stores, and the most cited passages.
MAX_CHARS = {"question": 1000, "retrieval_question": 1000, "answer": 2000}
MAX_PASSAGES = 20
#: A stored vote is at most this long (the cuts above keep it so).
MAX_VOTE_BYTES = 16 * 1024
#: The most bytes of votes one key may store on one collection.
MAX_KEY_BYTES = 1 << 20
UNATTRIBUTED = "unattributed"  # the key of a vote recorded before votes were attributed


class CitedPassage(BaseModel):
    """A passage an answer cited, as the feedback stores it."""

    model_config = ConfigDict(frozen=True)

    chunk_id: str
    document: str = Field(description="The document's name in the collection (redacted).")
    path: str = Field(description="The chunk's stored (redacted) path: a gold id of the evaluation set.")


class FeedbackRecord(BaseModel):
    """One vote on one answer (every text redacted)."""

    model_config = ConfigDict(frozen=True)

    time: str
    collection: str
    vote: Vote
    question: str
    retrieval_question: str = ""
    answer: str = ""
    answered: bool = True
    mode: str = ""
    passages: list[CitedPassage] = Field(default_factory=list)
    key_id: str = Field(default=UNATTRIBUTED, description="The id of the key that voted (never its secret).")


class FeedbackExport(BaseModel):
    """What ``rag feedback-export`` wrote."""

    collection: str
    votes: int = Field(description="Votes counted for the collection (one per key and question: its latest).")
    up: int
    down: int
    questions: int = Field(description="Questions written to the evaluation set.")
    out: str = Field(description="The evaluation set (JSONL for `python -m flows.rag eval --data`).")
    keys: dict[str, int] = Field(default_factory=dict,
                                 description="Votes of each key (its id), after one vote per key and question.")


def export_feedback(path: Path, collection: str, out: Path, min_voters: int = 1) -> FeedbackExport:
    """Write the evaluation set of the collection's feedback file ``path`` to ``out``."""
    records = latest_votes(load_feedback(path))
    n = write_eval_set(records, out, min_voters=min_voters)
    keys = dict(Counter(r.key_id for r in records).most_common())
    return FeedbackExport(collection=collection, votes=len(records), up=sum(r.vote == "up" for r in records),
                          down=sum(r.vote == "down" for r in records), questions=n, out=str(out), keys=keys)


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def feedback_record(collection: str, vote: Vote, question: str, answer: str, passages: Sequence[CitedPassage], *,
                    retrieval_question: str = "", answered: bool = True, mode: str = "",
                    key_id: str = UNATTRIBUTED) -> FeedbackRecord:
    """A record of one vote by the key ``key_id``, its texts redacted (:func:`infra.pii.redact_text`)
    and cut to :data:`MAX_CHARS`, its passages to :data:`MAX_PASSAGES`."""
    def text(name: str, value: str) -> str:
        return redact_text(value[: 2 * MAX_CHARS[name]])[: MAX_CHARS[name]]

    return FeedbackRecord(time=now(), collection=collection, vote=vote, question=text("question", question),
                          retrieval_question=text("retrieval_question", retrieval_question),
                          answer=text("answer", answer), answered=answered, mode=mode[:20], key_id=key_id[:80],
                          passages=[CitedPassage(chunk_id=p.chunk_id[:80], document=redact_text(p.document)[:200],
                                                 path=redact_text(p.path)[:300]) for p in passages[:MAX_PASSAGES]])


def feedback_path(folder: Path, collection: str) -> Path:
    """The collection's feedback file under ``folder`` (``<home>/rag/feedback``)."""
    return folder / FEEDBACK_FILE.format(collection=check_collection_name(collection))


class VoteLimit(ValueError):
    """A key has stored :data:`MAX_KEY_BYTES` of votes on a collection."""


class VoteBudget:
    """Bytes of votes each key stored in each feedback file, counted from the file once (the first
    vote on it in this process) and then as votes are appended (a replica beside this one counts
    its own appends: the bound holds per process)."""

    def __init__(self, max_key_bytes: int = MAX_KEY_BYTES) -> None:
        self.max_key_bytes = max_key_bytes
        self._used: dict[Path, Counter[str]] = {}
        self._lock = threading.Lock()

    def append(self, path: Path, record: FeedbackRecord) -> None:
        """Append ``record`` (:func:`append_feedback`), or VoteLimit when its key has no room left."""
        line = record.model_dump_json() + "\n"
        with self._lock:
            if path not in self._used:
                self._used[path] = Counter()
                for r in load_feedback(path):
                    self._used[path][r.key_id] += len(r.model_dump_json()) + 1
            used = self._used[path]
            if used[record.key_id] + len(line) > self.max_key_bytes:
                raise VoteLimit(f"this key's votes on collection {record.collection!r} reached "
                                f"{self.max_key_bytes} bytes; no more are recorded")
            append_feedback(path, record)
            used[record.key_id] += len(line)


def append_feedback(path: Path, record: FeedbackRecord) -> None:
    """Append ``record`` as one line to ``path`` (created with mode 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (record.model_dump_json() + "\n").encode()
    if len(line) > MAX_VOTE_BYTES:
        raise ValueError(f"a vote is {len(line)} bytes long; at most {MAX_VOTE_BYTES} are stored")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, line)  # one write of one line: appends of concurrent votes do not interleave
    finally:
        os.close(fd)


def load_feedback(path: Path) -> list[FeedbackRecord]:
    """The records of a feedback file (none when it does not exist; unreadable lines skipped)."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                out.append(FeedbackRecord.model_validate_json(line))
            except ValueError:
                continue
    return out


def _question(r: FeedbackRecord) -> str:
    return (r.retrieval_question or r.question).strip()


def latest_votes(records: Iterable[FeedbackRecord]) -> list[FeedbackRecord]:
    """One vote per key and question: each key's latest, in the order they were last given."""
    latest: dict[tuple[str, str], FeedbackRecord] = {}
    for r in records:
        if _question(r):
            latest.pop((r.key_id, _question(r)), None)
            latest[(r.key_id, _question(r))] = r
    return list(latest.values())


def eval_rows(records: Iterable[FeedbackRecord], min_voters: int = 1) -> list[dict[str, object]]:
    """The evaluation set of the votes: one ``{"id", "question", "gold_ids", "voters"}`` row per
    question that more keys voted up than down (each key's latest vote counting once), at least
    ``min_voters`` of them up, on an answered question citing a passage; its gold ids are the
    passages the up-votes cited, ``voters`` the ids of the keys that voted it up."""
    by_question: dict[str, list[FeedbackRecord]] = {}
    for r in latest_votes(records):
        by_question.setdefault(_question(r), []).append(r)
    rows: list[dict[str, object]] = []
    for question, votes in by_question.items():
        ups = [r for r in votes if r.vote == "up" and r.answered]
        gold = list(dict.fromkeys(p.path for r in ups for p in r.passages if p.path))
        if len(ups) > len(votes) - len(ups) and len(ups) >= min_voters and gold:
            rows.append({"id": f"feedback-{len(rows) + 1}", "question": question, "gold_ids": gold,
                         "voters": sorted({r.key_id for r in ups})})
    return rows


def write_eval_set(records: Iterable[FeedbackRecord], out: Path, min_voters: int = 1) -> int:
    """Write the evaluation set of ``records`` to ``out`` as JSONL (``rag eval --data``); returns
    the number of questions."""
    rows = eval_rows(records, min_voters)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return len(rows)
