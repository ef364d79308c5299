"""RAG knowledge base flows: ``rag-ingest``, ``rag-ask`` and ``rag-eval``.

Command line: ``python -m flows.rag {ingest,ask,eval} --help`` (see :mod:`flows.rag.cli`).
"""

from __future__ import annotations

from flows.rag.ask import rag_ask
from flows.rag.evaluate import rag_eval
from flows.rag.ingest import rag_ingest
from solutions.rag.results import AskResult, EvalResult
from tasks.ingest import IngestResult

__all__ = ["AskResult", "EvalResult", "IngestResult", "rag_ask", "rag_eval", "rag_ingest"]
