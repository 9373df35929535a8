"""The Chat Completions face's parts that need no runner: the chunk encoder, fed deltas as a
live stream would feed them, and the body's refusals by name."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from turnledger.api.openai.chat_schemas import ChatCompletionCreate
from turnledger.api.openai.chat_streaming import (
    CallDelta,
    Delta,
    Finish,
    TextDelta,
    chunks,
    deltas_of,
)
from turnledger.core.exceptions import UnsupportedParameter, UnsupportedValue

HEAD = {"id": "chatcmpl-1_c", "created": 1, "model": "demo-1"}
USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def parsed(events: Iterator[str]) -> list[Any]:
    """Each event's data: a chunk, or the closing ``[DONE]``."""
    out: list[Any] = []
    for event in events:
        assert event.startswith("data: ") and event.endswith("\n\n"), event
        data = event.removeprefix("data: ").strip()
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_chunks_follow_deltas_as_they_come() -> None:
    """The encoder yields each chunk as its delta arrives (a live stream can feed it)."""
    seen: list[str] = []

    def live() -> Iterator[Delta]:
        for piece in ("Hel", "lo"):
            seen.append(piece)
            yield TextDelta(piece)
        yield Finish("stop", USAGE)

    events = chunks(HEAD, live(), include_usage=False)
    first = json.loads(next(events).removeprefix("data: "))
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    assert seen == []
    assert json.loads(next(events).removeprefix("data: "))["choices"][0]["delta"] == {
        "content": "Hel"
    }
    assert seen == ["Hel"]
    rest = parsed(events)
    assert [c["choices"][0]["delta"] for c in rest[:-1]] == [{"content": "lo"}, {}]
    assert rest[-2]["choices"][0]["finish_reason"] == "stop"
    assert rest[-1] == "[DONE]"
    assert all("usage" not in c for c in rest[:-1])


def test_usage_comes_last_when_asked() -> None:
    deltas = [CallDelta(0, "call_1", "f", '{"a":1}'), Finish("tool_calls", USAGE)]
    out = parsed(chunks(HEAD, deltas, include_usage=True))
    assert out[-1] == "[DONE]"
    usage_chunk = out[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"] == USAGE
    assert all(c["usage"] is None for c in out[:-2])
    assert {c["object"] for c in out[:-1]} == {"chat.completion.chunk"}
    assert {c["id"] for c in out[:-1]} == {"chatcmpl-1_c"}
    [call] = out[1]["choices"][0]["delta"]["tool_calls"]
    assert call == {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "f", "arguments": '{"a":1}'},
    }
    assert out[2]["choices"][0]["finish_reason"] == "tool_calls"


def test_deltas_of_a_finished_answer() -> None:
    """The draft's pieces when they add up to the text, else the text as one delta."""
    finish = Finish("stop", USAGE)
    assert list(deltas_of("Hello", [], finish, ["Hel", "lo"])) == [
        TextDelta("Hel"),
        TextDelta("lo"),
        finish,
    ]
    assert list(deltas_of("Hello", [], finish, ["other"])) == [TextDelta("Hello"), finish]
    assert list(deltas_of(None, [], finish, None)) == [finish]


def body(**fields: Any) -> ChatCompletionCreate:
    return ChatCompletionCreate.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "Hi"}], **fields}
    )


@pytest.mark.parametrize(
    ("fields", "error", "param"),
    [
        ({"seed": 1}, UnsupportedParameter, "seed"),
        ({"n": 3}, UnsupportedValue, "n"),
        (
            {"tool_choice": {"type": "function", "function": {"name": "f"}}},
            UnsupportedValue,
            "tool_choice",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f"}, "cache": True}]},
            UnsupportedParameter,
            "tools.0.cache",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "c",
                                "type": "function",
                                "function": {"name": "f", "arguments": "{}", "x": 1},
                            }
                        ],
                    }
                ]
            },
            UnsupportedParameter,
            "messages.0.tool_calls.0.function.x",
        ),
    ],
)
def test_what_is_not_taken_is_refused_by_name(
    fields: dict[str, Any], error: type[Exception], param: str
) -> None:
    with pytest.raises(error) as raised:
        body(**fields).check()
    assert raised.value.details == {"param": param}  # type: ignore[attr-defined]


def test_null_fields_and_n_1_are_taken() -> None:
    """Clients that send every field send unset ones as ``null``."""
    body(seed=None, logprobs=None, n=1, tool_choice="auto", stream=True).check()


def test_a_message_name_is_refused() -> None:
    """A participant's ``name`` would be dropped: refused by name instead."""
    with pytest.raises(UnsupportedParameter) as raised:
        body(messages=[{"role": "user", "content": "Hi", "name": "ann"}]).check()
    assert raised.value.details == {"param": "messages.0.name"}
