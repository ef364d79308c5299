"""Follow-up questions resolved against the previous turns (solutions.rag.conversation)."""

from __future__ import annotations

from infra.llm import ChatMessage
from solutions.rag.conversation import (
    MAX_TURNS,
    Turn,
    is_follow_up,
    redacted_turns,
    standalone_question,
)

DOSE = Turn("What is the dose of Larkspur syrup for children?", "5 ml twice a day [1].")


class FakeChat:
    """A chat endpoint that answers ``reply`` and keeps the messages it was sent."""

    def __init__(self, reply: str) -> None:
        self.reply = reply
        self.sent: list[list[ChatMessage]] = []

    def complete(self, messages: list[ChatMessage]) -> str:
        self.sent.append(messages)
        return self.reply


def test_a_question_without_history_is_its_own_retrieval_question() -> None:
    assert standalone_question("  What is the notice period?  ") == "What is the notice period?"
    assert standalone_question("What is the notice period?", [], FakeChat("ignored")) == "What is the notice period?"


def test_without_an_llm_a_follow_up_carries_the_previous_questions_key_terms() -> None:
    resolved = standalone_question("And for adults?", [DOSE])
    assert resolved.startswith("And for adults?")
    assert {"larkspur", "syrup", "dose"} <= set(resolved.lower().split())
    assert "children" not in resolved  # "for adults" replaces "for children"
    pronoun = standalone_question("How often is it taken?", [DOSE])
    assert "larkspur" in pronoun and "children" in pronoun
    # a question that stands on its own is left alone
    new = "What notice period does the Harbourview lease set for the tenant?"
    assert standalone_question(new, [DOSE]) == new
    # a follow-up of a follow-up still carries the topic of the first question
    assert "larkspur" in standalone_question("What about in winter?", [DOSE, Turn("And for adults?", "20 ml")])


def test_chinese_follow_ups_are_recognised() -> None:
    assert is_follow_up("那成人呢？") and is_follow_up("它多久服用一次？")
    resolved = standalone_question("成人呢？", [Turn("儿童服用拉克斯珀糖浆的剂量是多少？")])
    assert resolved.startswith("成人呢？") and "糖浆" in resolved and "剂量" in resolved
    assert not is_follow_up("哈博维尤租约规定的通知期是多少天？")


def test_with_an_llm_the_condensed_standalone_question_is_used_and_every_turn_is_redacted() -> None:
    chat = FakeChat("Standalone question: What is the dose of Larkspur syrup for adults? Call 13812345678.")
    history = [Turn("What is the dose of Larkspur syrup for children? I am at 13912345678", "5 ml [1]")]
    resolved = standalone_question("And for adults? Mail me at jane.doe@example.com", history, chat)
    assert resolved.startswith("What is the dose of Larkspur syrup for adults?")
    assert "13812345678" not in resolved  # the reply is redacted as well
    (messages,) = chat.sent
    sent = " ".join(m.content for m in messages)
    assert "13912345678" not in sent and "jane.doe@example.com" not in sent
    assert "Larkspur" in sent and "And for adults?" in sent and messages[0].role == "system"


def test_an_unusable_llm_reply_falls_back_to_the_key_terms() -> None:
    for reply in ("", "   ", "x" * 2000, "line one\nline two\nline three", "Adults take 20 ml [1]."):
        resolved = standalone_question("And for adults?", [DOSE], FakeChat(reply))
        assert "larkspur" in resolved and "children" not in resolved, reply


def test_history_is_bounded_and_redacted() -> None:
    turns = redacted_turns([{"question": f"Question {i} from 13812345678?", "answer": "a" * 10_000}
                            for i in range(20)] + [{"question": "  ", "answer": ""}])
    assert len(turns) == MAX_TURNS - 1  # the last MAX_TURNS, the empty one dropped
    assert turns[-1].question.startswith("Question 19") and all("13812345678" not in t.question for t in turns)
    assert all(len(t.answer) <= 4000 for t in turns)
