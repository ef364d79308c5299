"""Conversations with the knowledge base: a follow-up question resolved against the previous
turns into the standalone question that retrieval (and the answer) use.

Without an LLM a follow-up ("and for adults?", "what about it?", "那成人呢？") carries the
previous question's key terms (:func:`solutions.rag.support.content_query`'s terms); an
English "and for X" / "what about X" drops the words X replaces ("for children" gives way to
"for adults"). With an LLM, one short prompt asks for a condensed standalone question; an
empty or overlong reply falls back to the term rule. Every turn is redacted
(:func:`infra.pii.redact_text`) before it is used, like any question.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from infra.llm import ChatMessage
from infra.pii import redact_text
from solutions.rag.text import query_terms

log = logging.getLogger(__name__)

#: Turns of history a question is resolved against (the most recent ones).
MAX_TURNS = 8
#: Characters of a turn's question and answer kept.
MAX_QUESTION_CHARS = 4000
MAX_ANSWER_CHARS = 4000
#: Characters of a previous answer shown to the LLM when condensing.
PROMPT_ANSWER_CHARS = 600
#: Key terms carried from the previous question at most.
MAX_CARRIED = 12
#: A question with at most this many content terms and history before it is taken for a follow-up.
SHORT_TERMS = 2

CONDENSE_PROMPT = (
    "Rewrite the user's last question as one standalone question that can be understood without "
    "the conversation: replace pronouns and elliptical phrases with what they refer to. Keep the "
    "language of the last question. Reply with the question only, no answer, no explanation."
)

_PREPS = r"for|in|of|at|on|with|under|to|from|about|during|after|before|by"
_FOLLOW_EN = re.compile(
    r"^\s*(?:and|but|also|so|then|what about|how about|what of|and what about|and how about)\b"
    r"|\b(?:it|its|it's|they|them|their|this|these|those|the same)\b",
    re.IGNORECASE)
_FOLLOW_ZH = re.compile(r"^\s*(?:那|那么|还有|而|另外|再|以及)|呢\s*[?？]?\s*$|它|这个|那个|这些|那些")
#: "and for adults?", "what about in winter": the preposition and the words that replace the old ones.
_CITED = re.compile(r"\[\d{1,3}\]")
_SLOT = re.compile(rf"^\s*(?:and|but|what about|how about|and what about)?\s*({_PREPS})\s+(.+?)\s*[?.!]*\s*$",
                   re.IGNORECASE)


@dataclass(frozen=True)
class Turn:
    """One earlier turn of a conversation: the question asked and the answer shown."""

    question: str
    answer: str = ""


class Chat(Protocol):
    """The chat endpoint (:class:`infra.llm.ChatClient`): a whole completion."""

    def complete(self, messages: list[ChatMessage]) -> str: ...


def redacted_turns(history: Iterable[Turn | dict[str, Any]]) -> list[Turn]:
    """The last :data:`MAX_TURNS` turns, each question and answer redacted and cut to its limit."""
    turns = [t if isinstance(t, Turn) else Turn(str(t.get("question", "")), str(t.get("answer", "") or ""))
             for t in history]
    return [Turn(redact_text(t.question[:MAX_QUESTION_CHARS]), redact_text(t.answer[:MAX_ANSWER_CHARS]))
            for t in turns[-MAX_TURNS:] if t.question.strip()]


def is_follow_up(question: str) -> bool:
    """Whether ``question`` leans on an earlier turn: it starts like a continuation ("and…",
    "what about…", 那…, 还有…), points back (it, they, this, 它, 其…), ends in 呢, or has at most
    :data:`SHORT_TERMS` content terms."""
    if _FOLLOW_EN.search(question) or _FOLLOW_ZH.search(question):
        return True
    return len(set(query_terms(question))) <= SHORT_TERMS


def replaced_terms(question: str, previous: str) -> set[str]:
    """The previous question's terms that an English "and for X" replaces: those after the same
    preposition in ``previous`` (up to the next preposition or punctuation)."""
    slot = _SLOT.match(question)
    if not slot:
        return set()
    prep = slot.group(1).lower()
    m = re.search(rf"\b{prep}\s+(.+?)(?=\s+(?:{_PREPS})\b|[,;:?.!]|$)", previous, re.IGNORECASE)
    return set(query_terms(m.group(1))) if m else set()


def carried_question(question: str, previous: str) -> str:
    """``question`` followed by the key terms of ``previous`` it lacks (at most
    :data:`MAX_CARRIED`), without those it replaces (:func:`replaced_terms`)."""
    own = set(query_terms(question))
    dropped = replaced_terms(question, previous)
    carried = [t for t in dict.fromkeys(query_terms(previous)) if t not in own and t not in dropped]
    carried = carried[:MAX_CARRIED]
    return f"{question.strip()} {' '.join(carried)}".strip() if carried else question.strip()


def term_standalone(question: str, turns: Sequence[Turn]) -> str:
    """The retrieval question without an LLM: each turn resolved against the one before it (so a
    follow-up of a follow-up still carries the topic), then ``question`` against the last."""
    previous = ""
    for turn in turns:
        previous = carried_question(turn.question, previous) if previous and is_follow_up(turn.question) \
            else turn.question
    if previous and is_follow_up(question):
        return carried_question(question, previous)
    return question.strip()


def condense_messages(question: str, turns: Sequence[Turn]) -> list[ChatMessage]:
    """The chat request that asks for a standalone question (redacted turns only)."""
    lines = []
    for turn in turns:
        lines.append(f"User: {turn.question}")
        if turn.answer:
            lines.append(f"Assistant: {turn.answer[:PROMPT_ANSWER_CHARS]}")
    user = "Conversation:\n" + "\n".join(lines) + f"\n\nLast question: {question}\n\nStandalone question:"
    return [ChatMessage("system", CONDENSE_PROMPT), ChatMessage("user", user)]


def llm_standalone(question: str, turns: Sequence[Turn], chat: Chat) -> str | None:
    """The LLM's standalone question (redacted), or None when its reply is empty or unusable
    (more than a question's length, several lines, or an answer with citations)."""
    reply = chat.complete(condense_messages(question, turns)).strip()
    reply = re.sub(r"^(?:standalone question|question)\s*[:：]\s*", "", reply, flags=re.IGNORECASE).strip().strip('"“”')
    if not reply or len(reply) > max(4 * len(question), 400) or reply.count("\n") > 1 or _CITED.search(reply):
        return None  # not a question: too long, several lines, or an answer citing passages
    return redact_text(" ".join(reply.split()))


def standalone_question(question: str, history: Iterable[Turn | dict[str, Any]] = (), chat: Chat | None = None,
                        ) -> str:
    """The question retrieval and the answer use, redacted: ``question`` itself without history;
    with history, the LLM's condensed standalone question (``chat``), else (no chat, or an
    unusable reply) ``question`` with the previous question's key terms when it is a follow-up.

    Args:
        question: The new question (redacted here).
        history: The earlier turns, oldest first (each redacted here; the last :data:`MAX_TURNS`).
        chat: The chat endpoint, or None.
    """
    question = redact_text(question[:MAX_QUESTION_CHARS])
    turns = redacted_turns(history)
    if not turns:
        return question.strip()
    if chat is not None:
        condensed = llm_standalone(question, turns, chat)
        if condensed:
            return condensed
        log.warning("the chat endpoint gave no usable standalone question; key terms carried instead")
    return term_standalone(question, turns)
