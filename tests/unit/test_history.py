"""The strict history rules checked before every openai-chat request."""

from __future__ import annotations

import pytest
from turnledger.core.exceptions import InvalidHistory
from turnledger.core.models import ToolCall
from turnledger.providers.base import Message
from turnledger.providers.history import check_strict_history

SYSTEM = Message(role="system", content="be brief")


def user(text: str = "hi") -> Message:
    return Message(role="user", content=text)


def answer(text: str = "ok") -> Message:
    return Message(role="assistant", content=text)


def calling(*ids: str) -> Message:
    calls = [ToolCall(id=i, name=f"tool_{i}", arguments={}) for i in ids]
    return Message(role="assistant", content=None, tool_calls=calls)


def result(call_id: str | None) -> Message:
    return Message(role="tool", tool_call_id=call_id, name="tool", content="out")


def broken(messages: list[Message]) -> InvalidHistory:
    with pytest.raises(InvalidHistory) as caught:
        check_strict_history(messages)
    return caught.value


VALID = {
    "one user message": [user()],
    "system then user": [SYSTEM, user()],
    "several turns": [SYSTEM, user(), answer(), user(), answer(), user()],
    "completed tool turn": [user(), calling("a", "b"), result("b"), result("a")],
    "tool turn then answer then input": [
        user(),
        calling("a"),
        result("a"),
        answer(),
        user(),
    ],
    # A turn that stopped at its step limit (or whose client sent a new message
    # instead of its results) ends on tool results; the next input follows them.
    "new input right after a completed tool turn": [user(), calling("a"), result("a"), user()],
    "tool turn followed by another tool turn": [
        user(),
        calling("a"),
        result("a"),
        calling("b"),
        result("b"),
    ],
    "assistant with text and calls": [
        user(),
        Message(
            role="assistant",
            content="let me check",
            tool_calls=[ToolCall(id="a", name="t", arguments={})],
        ),
        result("a"),
    ],
    "same call id in two turns": [
        user(),
        calling("a"),
        result("a"),
        answer(),
        user(),
        calling("a"),
        result("a"),
    ],
}


@pytest.mark.parametrize("messages", VALID.values(), ids=VALID.keys())
def test_valid_histories_pass_unchanged(messages: list[Message]) -> None:
    before = list(messages)

    check_strict_history(messages)

    assert messages == before


INVALID: dict[str, tuple[list[Message], int, str]] = {
    "empty": ([], 0, "ends_with_input"),
    "only a system message": ([SYSTEM], 0, "ends_with_input"),
    "system message later": ([user(), answer(), SYSTEM, user()], 2, "system_first"),
    "starts with the assistant": ([SYSTEM, answer(), user()], 1, "alternation"),
    "two user messages in a row": ([user(), user()], 1, "alternation"),
    "two assistant messages in a row": ([user(), answer(), answer(), user()], 2, "alternation"),
    "ends with an answer": ([user(), answer()], 1, "ends_with_input"),
    "tool result after a user message": ([user(), result("a")], 1, "result_follows_call"),
    "tool result after a plain answer": (
        [user(), answer(), result("a"), user()],
        2,
        "result_follows_call",
    ),
    "missing result before the next message": (
        [user(), calling("a", "b"), result("a"), answer(), user()],
        3,
        "results_complete",
    ),
    "missing result at the end": ([user(), calling("a", "b"), result("b")], 2, "results_complete"),
    "no results at all at the end": ([user(), calling("a")], 1, "results_complete"),
    "unknown call id": ([user(), calling("a"), result("z")], 2, "result_matches_call"),
    "second result for one call": (
        [user(), calling("a", "b"), result("a"), result("a"), result("b")],
        3,
        "result_matches_call",
    ),
    "result without a call id": ([user(), calling("a"), result(None)], 2, "result_matches_call"),
    "extra result after the turn completed": (
        [user(), calling("a"), result("a"), result("a")],
        3,
        "result_follows_call",
    ),
    "repeated call ids in one message": (
        [user(), calling("a", "a"), result("a"), result("a")],
        1,
        "unique_call_ids",
    ),
}


@pytest.mark.parametrize(("messages", "index", "rule"), INVALID.values(), ids=INVALID.keys())
def test_invalid_histories_name_the_index_and_the_rule(
    messages: list[Message], index: int, rule: str
) -> None:
    error = broken(messages)

    assert error.details == {"index": index, "rule": rule}
    assert error.message.startswith(f"history message {index}: ")
    assert error.status == 500


def test_the_message_says_which_calls_lack_a_result() -> None:
    error = broken([user(), calling("a", "b", "c"), result("b"), answer(), user()])

    assert "message 1" in error.message
    assert "['a', 'c']" in error.message
