"""Thumbs up or down on knowledge-base answers: stored redacted, one JSON line per vote, and
exported as a QA set that ``python -m flows.rag eval`` reads (:func:`solutions.rag.evaluation.load_qa`).

A record holds the (redacted) question, the question retrieval used, the answer, the vote, the
time, and the passages the answer cited: chunk id, document name and stored (redacted) path.
Never the key that voted. The file is the collection's ``<home>/rag/feedback/<collection>.jsonl``,
mode 0600.

The evaluation set keeps the thumbs-up votes on answered questions that cite a passage: the
question retrieval used, with the cited documents' paths as gold ids (what ``rag eval``'s
recall compares), the latest vote of a question counting.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from infra.pii import redact_text
from solutions.rag.collections import check_collection_name

Vote = Literal["up", "down"]
FEEDBACK_FILE = "{collection}.jsonl"


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


class FeedbackExport(BaseModel):
    """What ``rag feedback-export`` wrote."""

    collection: str
    votes: int = Field(description="Votes recorded for the collection.")
    up: int
    down: int
    questions: int = Field(description="Questions written to the evaluation set.")
    out: str = Field(description="The evaluation set (JSONL for `python -m flows.rag eval --data`).")


def export_feedback(path: Path, collection: str, out: Path) -> FeedbackExport:
    """Write the evaluation set of the collection's feedback file ``path`` to ``out``."""
    records = load_feedback(path)
    n = write_eval_set(records, out)
    return FeedbackExport(collection=collection, votes=len(records), up=sum(r.vote == "up" for r in records),
                          down=sum(r.vote == "down" for r in records), questions=n, out=str(out))


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def feedback_record(collection: str, vote: Vote, question: str, answer: str, passages: Sequence[CitedPassage], *,
                    retrieval_question: str = "", answered: bool = True, mode: str = "") -> FeedbackRecord:
    """A record of one vote, its texts redacted (:func:`infra.pii.redact_text`)."""
    return FeedbackRecord(time=now(), collection=collection, vote=vote, question=redact_text(question),
                          retrieval_question=redact_text(retrieval_question), answer=redact_text(answer),
                          answered=answered, mode=mode,
                          passages=[CitedPassage(chunk_id=p.chunk_id, document=redact_text(p.document),
                                                 path=redact_text(p.path)) for p in passages])


def feedback_path(folder: Path, collection: str) -> Path:
    """The collection's feedback file under ``folder`` (``<home>/rag/feedback``)."""
    return folder / FEEDBACK_FILE.format(collection=check_collection_name(collection))


def append_feedback(path: Path, record: FeedbackRecord) -> None:
    """Append ``record`` as one line to ``path`` (created with mode 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (record.model_dump_json() + "\n").encode()
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


def eval_rows(records: Iterable[FeedbackRecord]) -> list[dict[str, object]]:
    """The evaluation set of the votes: one ``{"id", "question", "gold_ids"}`` row per question
    whose latest vote is a thumbs-up on an answered question citing a passage."""
    latest: dict[str, FeedbackRecord] = {}
    for r in records:
        question = (r.retrieval_question or r.question).strip()
        if question:
            latest[question] = r
    rows: list[dict[str, object]] = []
    for question, r in latest.items():
        gold = list(dict.fromkeys(p.path for p in r.passages if p.path))
        if r.vote == "up" and r.answered and gold:
            rows.append({"id": f"feedback-{len(rows) + 1}", "question": question, "gold_ids": gold})
    return rows


def write_eval_set(records: Iterable[FeedbackRecord], out: Path) -> int:
    """Write the evaluation set of ``records`` to ``out`` as JSONL (``rag eval --data``); returns
    the number of questions."""
    rows = eval_rows(records)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return len(rows)
