"""RAG knowledge base flows: ``rag-ingest``, ``rag-ask``, ``rag-eval`` and ``rag-feedback-export``.

Command line: ``python -m flows.rag {ingest,ask,eval,feedback-export} --help`` (see :mod:`flows.rag.cli`).
The names below are imported on first use (PEP 562): importing the package's ``cli`` does
not import the flows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flows.cli import lazy_exports

#: exported name -> the module that defines it
_EXPORTS = {
    "AskResult": "solutions.rag.results",
    "EvalResult": "solutions.rag.results",
    "IngestResult": "tasks.ingest",
    "rag_ask": "flows.rag.ask",
    "rag_eval": "flows.rag.evaluate",
    "rag_feedback_export": "flows.rag.feedback",
    "rag_ingest": "flows.rag.ingest",
}

__all__ = [
    "AskResult",
    "EvalResult",
    "IngestResult",
    "rag_ask",
    "rag_eval",
    "rag_feedback_export",
    "rag_ingest",
]

if TYPE_CHECKING:
    from flows.rag.ask import rag_ask
    from flows.rag.evaluate import rag_eval
    from flows.rag.feedback import rag_feedback_export
    from flows.rag.ingest import rag_ingest
    from solutions.rag.results import AskResult, EvalResult
    from tasks.ingest import IngestResult

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
