"""``rag-feedback-export``: the thumbs-up answers of a knowledge-base collection as a QA set for
``rag eval``."""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from infra.home import home_layout
from solutions.rag.collections import DEFAULT
from solutions.rag.feedback import FeedbackExport, export_feedback, feedback_path


@flow(name="rag-feedback-export", log_prints=False)
def rag_feedback_export(collection: str = DEFAULT, out: str = "kb_feedback_eval.jsonl",
                        min_voters: int = 1) -> FeedbackExport:
    """Export the votes on a collection's answers (given on the ``/kb`` page) as an evaluation set:
    each question more keys voted up than down (one vote per key: its latest), with the documents
    its answer cited as gold ids and the keys that voted it up (JSONL for
    ``python -m flows.rag eval --data OUT --collection C``); the summary counts each key's votes.

    Args:
        collection: The knowledge-base collection whose votes to export.
        out: The JSONL file to write.
        min_voters: The fewest keys that must have voted a question up (2 or more: no key alone
            puts a question into the set).
    """
    return export_feedback(feedback_path(home_layout().kb_feedback(), collection), collection, Path(out).expanduser(),
                           min_voters=min_voters)
