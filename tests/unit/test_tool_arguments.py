"""A model's tool arguments are held to a request body's limits (issue 22, finding 6):
too deep, too long a number, not an object: the call is refused with the reason,
never a crash."""

from __future__ import annotations

from typing import Any

from turnledger.core.strict_json import MAX_DEPTH, arguments_refusal, tool_arguments


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def test_an_object_within_the_limits_is_the_arguments() -> None:
    assert tool_arguments('{"city": "Oslo"}') == ({"city": "Oslo"}, None)
    assert tool_arguments("") == ({}, None)
    assert tool_arguments(None) == ({}, None)
    assert tool_arguments(nested(MAX_DEPTH)) == (nested(MAX_DEPTH), None)


def test_deep_text_is_refused_with_its_limit() -> None:
    text = '{"a": ' * 900 + "1" + "}" * 900
    assert tool_arguments(text) == ({}, text)
    assert arguments_refusal(text) == f"the arguments' JSON nests deeper than {MAX_DEPTH} levels"


def test_a_deep_object_a_provider_parsed_is_refused_too() -> None:
    arguments, raw = tool_arguments(nested(MAX_DEPTH + 1))
    assert arguments == {} and raw is not None
    assert arguments_refusal(raw).endswith(f"nests deeper than {MAX_DEPTH} levels")


def test_other_refusals_keep_their_reason() -> None:
    assert tool_arguments("[1, 2]") == ({}, "[1, 2]")
    assert arguments_refusal("[1, 2]") == "the arguments were not a JSON object"
    long_number = '{"n": ' + "9" * 100 + "}"
    assert arguments_refusal(long_number) == "a number is longer than 64 characters"
