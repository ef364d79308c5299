"""``rag-ask``: retrieve the top-k chunks and answer with numbered citations."""

from __future__ import annotations

from prefect import flow

from flows.rag.steps import answer_question_task
from solutions.rag.config import AskParams
from solutions.rag.results import AskResult


@flow(name="rag-ask", log_prints=False)
def rag_ask(question: str, params: AskParams = AskParams(), previous: list[str] | None = None) -> AskResult:  # noqa: B008 - a frozen typed default renders a UI form
    """Retrieve the top-k chunks (dense, BM25 or hybrid, with metadata filters) and answer with
    numbered citations: through the configured chat-completions endpoint, or extractively.
    With ``stream`` the LLM's answer is printed as it is generated.

    Args:
        question: The question, in any language the corpus holds.
        params: Retriever, fusion weights, filters and answer options.
        previous: Earlier questions of the conversation, oldest first: a follow-up ("and for
            adults?") is resolved against them into a standalone question for retrieval.
    """
    return answer_question_task(question, params, previous=previous or [])
