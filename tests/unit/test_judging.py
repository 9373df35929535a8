"""Replay judging (issue 42) as a table: trajectory modes, argument rules with per-tool
overrides, and each constraint, with no store or model."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from turnledger.core.models import Pin, ToolCall
from turnledger.tools.registry import ToolRegistry
from turnledger.turn.judging import Expect, JudgedTurn, judge

REGISTRY = ToolRegistry.from_json(
    '{"tools": ['
    '{"name": "pay", "parameters": {"type": "object"}, "require_approval": '
    '{"when": {"argument": "amount", "in": [100, 1000]}},'
    ' "executor": {"type": "http", "url": "http://127.0.0.1:9"}},'
    '{"name": "look", "parameters": {"type": "object"}, "executor": {"type": "client"}}]}'
)


def call(name: str, **arguments: Any) -> ToolCall:
    return ToolCall(id=f"c_{name}", name=name, arguments=arguments)


A, B = call("look", city="Oslo", unit="c"), call("pay", amount=100, note="x")


def verdict(expect: dict[str, Any], recorded: list[ToolCall], candidate: list[ToolCall]) -> bool:
    [judged] = judge(
        Expect.model_validate(expect), [JudgedTurn(1, recorded, candidate, None, [])], REGISTRY
    )
    return judged.passed


@pytest.mark.parametrize(
    ("mode", "candidate", "passed"),
    [
        ("strict", [A, B], True),
        ("strict", [B, A], False),
        ("unordered", [B, A], True),
        ("unordered", [A], False),
        ("subset", [A], True),
        ("subset", [A, call("look", city="Rome")], False),
        ("superset", [A, B, call("look", city="Rome")], True),
        ("superset", [A], False),
    ],
)
def test_trajectory_modes(mode: str, candidate: list[ToolCall], passed: bool) -> None:
    assert verdict({"tool_calls": {"mode": mode}}, [A, B], candidate) is passed


def test_argument_rules_and_per_tool_overrides() -> None:
    other = call("look", city="Oslo", unit="f")
    more = call("look", city="Oslo", unit="c", lang="pt")
    assert not verdict({"tool_calls": {}}, [A], [other])
    assert verdict({"tool_calls": {"args": "ignore"}}, [A], [other])
    assert verdict({"tool_calls": {"args": "subset"}}, [A], [more])
    assert not verdict({"tool_calls": {"args": "subset"}}, [more], [A])
    only_city = {"tool_calls": {"overrides": {"look": {"fields": ["city"]}}}}
    assert verdict(only_city, [A], [other])
    assert not verdict(only_city, [A], [call("look", city="Rome", unit="c")])
    assert verdict({"tool_calls": {"overrides": {"look": {"args": "ignore"}}}}, [A], [other])


def test_constraints_name_what_failed() -> None:
    pin = Pin(
        id="pin_1",
        kind="fact",
        text="Answer in Portuguese.",
        author="ops",
        added_at=datetime(2026, 1, 1, tzinfo=UTC),
        sequence=1,
    )
    expect = Expect.model_validate(
        {
            "constraints": [
                {"type": "never_call", "tool": "pay"},
                {"type": "before", "first": "look", "then": "pay"},
                {"type": "requires_approval", "tool": "pay"},
                {"type": "pin_respected", "pin_id": "pin_1", "field": "lang", "equals": "pt"},
            ]
        }
    )
    turns = [
        JudgedTurn(1, [], [call("pay", amount=5)], '{"lang": "en"}', [pin]),
        JudgedTurn(2, [], [A], '{"lang": "pt"}', [pin]),
        JudgedTurn(3, [], [call("pay", amount=100)], "not json", []),
    ]
    first, second, third = judge(expect, turns, REGISTRY)
    assert [f.constraint for f in first.failures] == [
        "never_call",
        "before",
        "requires_approval",
        "pin_respected:pin_1",
    ]
    assert first.failures[3].actual == "en"
    assert second.passed and second.failures == []
    # look was called in turn 2; amount 100 needs approval; the pin is no longer in force.
    assert [f.constraint for f in third.failures] == ["never_call"]
