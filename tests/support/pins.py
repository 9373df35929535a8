"""What the model saw of pins, read from the requests a fake provider recorded.

The chat wire joins the system messages into one first message: the pin block opens it,
ahead of any summary, so a pin's line is found there. The side calls (a compaction's
summary, a memory extraction) are told apart from a turn's calls by the opening of their
prompt, and carry no pin.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tests.functional.fake_openai import RecordedRequest

#: The summarizer's prompt starts with this (turnledger.context.assembly.SUMMARY_PROMPT).
SUMMARY_SIGN = "You maintain the memory of a conversation"
#: The memory extraction's prompt starts with this.
MEMORY_SIGN = "You keep a long-term memory"
#: The pin block's heading.
PIN_BLOCK = "Pinned by operators"


def first_message(request: RecordedRequest) -> str:
    """The first message ``request`` sent."""
    return str(request.json()["messages"][0].get("content") or "")


def is_summary(request: RecordedRequest) -> bool:
    return first_message(request).startswith(SUMMARY_SIGN)


def is_turn_call(request: RecordedRequest) -> bool:
    """A call of a turn, not a side call (summary or memory extraction)."""
    return not first_message(request).startswith((SUMMARY_SIGN, MEMORY_SIGN))


def assert_pinned_first(requests: Iterable[RecordedRequest], line: str, ahead_of: str) -> None:
    """Each request opens with the pin block holding ``line`` on a line of its own, ahead
    of ``ahead_of`` wherever that is sent too."""
    for request in requests:
        first = first_message(request)
        assert first.startswith(PIN_BLOCK), first
        assert f"\n{line}" in first
        if ahead_of in first:
            assert first.index(line) < first.index(ahead_of)


def rebuilt_call(context: dict[str, Any]) -> dict[str, Any]:
    """The one model call of a turn's context view (``GET .../turns/{n}/context``), after
    checking that it rebuilds byte for byte."""
    assert context["all_match"], context
    [call] = context["calls"]
    assert isinstance(call, dict)
    return call
