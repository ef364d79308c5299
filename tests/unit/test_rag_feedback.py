"""Votes under a hostile key (issue 46): each vote and each key's votes are bounded, votes are
attributed to the key, one vote per key and question counts, and the export names its sources."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from solutions.rag.feedback import (
    MAX_VOTE_BYTES,
    CitedPassage,
    VoteBudget,
    VoteLimit,
    eval_rows,
    export_feedback,
    feedback_record,
    load_feedback,
)

GOLD = [CitedPassage(chunk_id="c1", document="lease.txt", path="/kb/legal/lease.txt")]


def _vote(key: str, vote: str = "up", question: str = "What notice does the lease set?", **kw):
    return feedback_record("legal", vote, question, "Ninety-seven days [1].", GOLD, key_id=key, **kw)


def test_a_vote_is_bounded_whatever_the_request_holds() -> None:
    passages = [CitedPassage(chunk_id="c" * 64, document="d" * 200, path="/p" * 150) for _ in range(50)]
    record = feedback_record("legal", "up", "q" * 4000, "a" * 20000, passages, retrieval_question="r" * 8000,
                             key_id="k1")
    assert len(record.model_dump_json()) < MAX_VOTE_BYTES  # main's code stored ~32 KB and more per vote
    assert record.key_id == "k1" and len(record.passages) <= 20


def test_a_key_stops_at_its_share_of_the_feedback_file_also_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "legal.jsonl"
    budget = VoteBudget(max_key_bytes=4000)
    with pytest.raises(VoteLimit):
        for i in range(100):
            budget.append(path, _vote("flood", question=f"question {i}"))
    stored = path.stat().st_size
    assert 3000 < stored <= 4000
    budget.append(path, _vote("other"))  # another key keeps its own share
    with pytest.raises(VoteLimit):  # a new process counts what the file holds
        VoteBudget(max_key_bytes=4000).append(path, _vote("flood", question="one more"))
    assert {r.key_id for r in load_feedback(path)} == {"flood", "other"}


def test_one_key_cannot_stuff_or_overturn_the_evaluation_set(tmp_path: Path) -> None:
    flood = [_vote("flood", "up") for _ in range(50)] + [_vote("flood", "up", question=f"junk {i}") for i in range(5)]
    honest = [_vote("alice", "down"), _vote("bob", "down")]
    rows = eval_rows(flood + honest)
    # the lease question: 1 key up, 2 down -> out (main's code: the latest vote won, 50 copies counted)
    assert [r["question"] for r in rows] == [f"junk {i}" for i in range(5)]
    assert all(r["voters"] == ["flood"] for r in rows)  # every row names who put it there
    assert eval_rows(flood + honest, min_voters=2) == []  # a team can ask for two independent keys
    path = tmp_path / "legal.jsonl"
    path.write_text("".join(r.model_dump_json() + "\n" for r in flood + honest))
    out = tmp_path / "eval.jsonl"
    export = export_feedback(path, "legal", out)
    assert export.keys == {"flood": 6, "alice": 1, "bob": 1} and export.votes == 8 and export.questions == 5
    assert all(json.loads(line)["voters"] == ["flood"] for line in out.read_text().splitlines())
