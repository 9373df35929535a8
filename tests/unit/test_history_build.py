"""Strict histories are built from the working context, not rejected."""

from __future__ import annotations

import pytest
from turnledger.core.exceptions import InvalidHistory
from turnledger.core.models import ToolCall
from turnledger.providers.base import Message
from turnledger.providers.history import build_strict_history, check_strict_history


def system(text: str) -> Message:
    return Message(role="system", content=text)


def user(text: str) -> Message:
    return Message(role="user", content=text)


def answer(text: str | None) -> Message:
    return Message(role="assistant", content=text)


def calling(*ids: str, text: str | None = None) -> Message:
    calls = [ToolCall(id=i, name="t", arguments={}) for i in ids]
    return Message(role="assistant", content=text, tool_calls=calls)


def result(call_id: str) -> Message:
    return Message(role="tool", tool_call_id=call_id, name="t", content="out")


BUILT = {
    "several user items of one input": (
        [user("a"), user("b"), user("c")],
        [user("a\n\nb\n\nc")],
    ),
    "a tool result then user messages": (
        [user("go"), calling("x"), result("x"), user("also"), user("this")],
        [user("go"), calling("x"), result("x"), user("also\n\nthis")],
    ),
    "system prompt and a summary": (
        [system("Be brief."), system("Summary of earlier conversation: a"), user("hi")],
        [system("Be brief.\n\nSummary of earlier conversation: a"), user("hi")],
    ),
    "an empty answer between two inputs": (
        [user("a"), answer(None), user("b"), answer("  "), user("c")],
        [user("a\n\nb\n\nc")],
    ),
    "an answer followed by a tool call": (
        [user("a"), answer("Let me look."), calling("x"), result("x")],
        [user("a"), calling("x", text="Let me look."), result("x")],
    ),
    "an empty system prompt": ([system(""), user("a")], [user("a")]),
    "already strict": (
        [system("s"), user("a"), answer("b"), user("c")],
        [system("s"), user("a"), answer("b"), user("c")],
    ),
}


@pytest.mark.parametrize(("given", "built"), BUILT.values(), ids=BUILT.keys())
def test_the_built_history_is_strict_and_loses_nothing(
    given: list[Message], built: list[Message]
) -> None:
    assert build_strict_history(given) == built
    check_strict_history(built)  # the assertion the providers keep


def test_a_history_no_building_can_repair_is_still_a_bug() -> None:
    with pytest.raises(InvalidHistory) as caught:
        build_strict_history([user("a"), result("x")])

    assert caught.value.details == {"index": 1, "rule": "result_follows_call"}


def test_a_call_without_its_result_is_still_a_bug() -> None:
    with pytest.raises(InvalidHistory):
        build_strict_history([user("a"), calling("x", "y"), result("x")])
