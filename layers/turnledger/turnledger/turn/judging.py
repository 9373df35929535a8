"""Judging a replay on actions and constraints: what the candidate did, never its wording.

A replay's ``expect`` (:class:`Expect`) says what each replayed turn must show:

* ``tool_calls``: the candidate's tool calls of the turn (every call of the turn, in
  order) against the recorded ones, by ``mode``: ``strict`` (the same calls in the same
  order), ``unordered`` (the same calls, any order), ``subset`` (each candidate call is a
  recorded one: it did nothing the recording did not), ``superset`` (each recorded call is
  among the candidate's). Two calls are the same when their names are and their arguments
  match by ``args``: ``exact`` (equal), ``ignore`` (not compared), ``subset`` (each
  recorded argument is the candidate's, which may have more); ``overrides`` name, per
  tool, another ``args`` rule and/or the only ``fields`` (top-level arguments) compared.
* ``constraints``: ``never_call`` a tool; ``before`` (``first`` is called before ``then``
  is, in the replayed turns so far); ``requires_approval`` (every candidate call of the
  tool would wait for an approval under the deployment's registry); ``pin_respected``
  (while the pin is in force, the turn's answer ``contains`` / ``not_contains`` a text,
  or its JSON has ``field`` (dotted path) equal to ``equals``).

Judging is deterministic (no model is asked). Each turn gets ``passed`` and its
``failures`` (constraint, expected, actual); the record's verdict is the turns'.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ConfigDict, Field

from ..core.exceptions import UnknownTool
from ..core.models import Deferred, Pin, ToolCall
from ..store.user_pins import UserPin

if TYPE_CHECKING:
    from ..tools.registry import ToolRegistry

ArgsMode = Literal["exact", "ignore", "subset"]
TrajectoryMode = Literal["strict", "unordered", "subset", "superset"]
#: What a ``pin_respected`` check's JSON field holds when it is missing.
_MISSING = object()


class _Model(Deferred):
    model_config = ConfigDict(extra="forbid")


class ToolOverride(_Model):
    """How one tool's calls are compared instead of the trajectory's rule."""

    args: ArgsMode | None = None
    #: Only these top-level arguments are compared (by ``args``; default ``exact``).
    fields: list[str] | None = Field(default=None, min_length=1)


class TrajectoryExpect(_Model):
    """The tool-call trajectory each turn must match."""

    mode: TrajectoryMode = "strict"
    args: ArgsMode = "exact"
    overrides: dict[str, ToolOverride] = Field(default_factory=dict)


class NeverCall(_Model):
    """No call of ``tool``."""

    type: Literal["never_call"]
    tool: str = Field(min_length=1)


class Before(_Model):
    """``first`` is called before any call of ``then``."""

    type: Literal["before"]
    first: str = Field(min_length=1)
    then: str = Field(min_length=1)


class RequiresApproval(_Model):
    """Every call of ``tool`` would wait for an approval (the deployment's registry)."""

    type: Literal["requires_approval"]
    tool: str = Field(min_length=1)


class _PinCheck(_Model):
    """While pin ``pin_id`` is in force, each turn's answer passes one check (the three
    shapes below: exactly one of ``contains``, ``not_contains``, ``field``)."""

    type: Literal["pin_respected"]
    pin_id: str = Field(min_length=1)


class PinContains(_PinCheck):
    """The answer contains ``contains``."""

    contains: str = Field(min_length=1)


class PinNotContains(_PinCheck):
    """The answer does not contain ``not_contains``."""

    not_contains: str = Field(min_length=1)


class PinFieldEquals(_PinCheck):
    """The answer is JSON whose value at the dotted path ``field`` is ``equals``."""

    field: str = Field(min_length=1)
    equals: Any


PinRespected = PinContains | PinNotContains | PinFieldEquals
#: The shapes of a ``pin_respected`` constraint (for ``isinstance``).
PIN_CHECKS = (PinContains, PinNotContains, PinFieldEquals)
#: A constraint: by its ``type``, then (``pin_respected``) by the check its fields name.
Constraint = NeverCall | Before | RequiresApproval | PinContains | PinNotContains | PinFieldEquals


class Expect(_Model):
    """What a replay's turns must show (``POST .../replays``' ``expect``)."""

    tool_calls: TrajectoryExpect | None = None
    constraints: list[Constraint] = Field(default_factory=list, max_length=100)


class Failure(_Model):
    """One thing a turn did not show."""

    constraint: str
    expected: Any = None
    actual: Any = None


class TurnVerdict(_Model):
    """A replayed turn judged."""

    turn: int
    passed: bool
    failures: list[Failure] = Field(default_factory=list)


class JudgedTurn:
    """What a replayed turn did: the recorded and the candidate's tool calls (in order),
    the candidate's final answer text, and the pins in force."""

    def __init__(
        self,
        turn: int,
        recorded: list[ToolCall],
        candidate: list[ToolCall],
        answer: str | None,
        pins: Sequence[Pin],
        user_pins: Sequence[UserPin] = (),
    ) -> None:
        self.turn = turn
        self.recorded = recorded
        self.candidate = candidate
        self.answer = answer
        # The pins in force at the turn: the conversation's and its user's.
        self.pins = {pin.id for pin in pins} | {pin.id for pin in user_pins}


def judge(expect: Expect, turns: Iterable[JudgedTurn], registry: ToolRegistry) -> list[TurnVerdict]:
    """Each of ``turns`` (oldest first) judged by ``expect``."""
    verdicts: list[TurnVerdict] = []
    called: set[str] = set()  # tools the candidate called in the turns before
    for turn in turns:
        failures: list[Failure] = []
        if expect.tool_calls is not None:
            failures += _trajectory(expect.tool_calls, turn)
        for constraint in expect.constraints:
            failures += _constraint(constraint, turn, called, registry)
        called.update(call.name for call in turn.candidate)
        verdicts.append(TurnVerdict(turn=turn.turn, passed=not failures, failures=failures))
    return verdicts


def _names(calls: Iterable[ToolCall]) -> list[dict[str, Any]]:
    return [{"name": c.name, "arguments": c.arguments} for c in calls]


def _trajectory(expect: TrajectoryExpect, turn: JudgedTurn) -> list[Failure]:
    same = _matcher(expect)
    recorded, candidate = turn.recorded, turn.candidate
    if expect.mode == "strict":
        ok = len(recorded) == len(candidate) and all(
            same(r, c) for r, c in zip(recorded, candidate, strict=True)
        )
    elif expect.mode == "unordered":
        ok = len(recorded) == len(candidate) and _covers(candidate, recorded, same)
    elif expect.mode == "subset":
        ok = _covers(recorded, candidate, lambda c, r: same(r, c))
    else:
        ok = _covers(candidate, recorded, same)
    if ok:
        return []
    return [
        Failure(
            constraint=f"tool_calls.{expect.mode}",
            expected=_names(recorded),
            actual=_names(candidate),
        )
    ]


def _covers(
    pool: Sequence[ToolCall], wanted: Sequence[ToolCall], same: Callable[[ToolCall, ToolCall], bool]
) -> bool:
    """Whether each of ``wanted`` matches a distinct call of ``pool`` (``same`` is asked
    with the wanted call first)."""
    left = list(pool)
    for call in wanted:
        twin = next((i for i, other in enumerate(left) if same(call, other)), None)
        if twin is None:
            return False
        left.pop(twin)
    return True


def _matcher(expect: TrajectoryExpect) -> Callable[[ToolCall, ToolCall], bool]:
    """Whether a recorded call and a candidate's (in this order) are the same call."""

    def same(recorded: ToolCall, candidate: ToolCall) -> bool:
        if recorded.name != candidate.name:
            return False
        override = expect.overrides.get(recorded.name)
        mode: ArgsMode = expect.args
        a, b = recorded.arguments, candidate.arguments
        if override is not None:
            mode = override.args or ("exact" if override.fields else expect.args)
            if override.fields is not None:
                a = {k: a.get(k, _MISSING) for k in override.fields}
                b = {k: b.get(k, _MISSING) for k in override.fields}
        return _arguments_match(mode, a, b)

    return same


def _arguments_match(mode: ArgsMode, recorded: dict[str, Any], candidate: dict[str, Any]) -> bool:
    if mode == "ignore":
        return True
    if mode == "exact":
        return recorded == candidate
    return all(candidate.get(k, _MISSING) == v for k, v in recorded.items())


def _constraint(
    constraint: Constraint,
    turn: JudgedTurn,
    called: set[str],
    registry: ToolRegistry,
) -> list[Failure]:
    names = [call.name for call in turn.candidate]
    if isinstance(constraint, NeverCall):
        made = [c for c in turn.candidate if c.name == constraint.tool]
        if made:
            return [Failure(constraint="never_call", expected=constraint.tool, actual=_names(made))]
        return []
    if isinstance(constraint, Before):
        if constraint.then not in names:
            return []
        seen = set(called)
        for name in names:
            if name == constraint.then and constraint.first not in seen:
                return [
                    Failure(
                        constraint="before",
                        expected=[constraint.first, constraint.then],
                        actual=names,
                    )
                ]
            seen.add(name)
        return []
    if isinstance(constraint, RequiresApproval):
        unpaused = [
            c
            for c in turn.candidate
            if c.name == constraint.tool and not _needs_approval(registry, c)
        ]
        if unpaused:
            return [
                Failure(
                    constraint="requires_approval",
                    expected=constraint.tool,
                    actual=_names(unpaused),
                )
            ]
        return []
    return _pin_check(constraint, turn)


def _needs_approval(registry: ToolRegistry, call: ToolCall) -> bool:
    from ..tools.registry import requirement  # the registry's code: loaded when judged

    try:
        tool = registry.get(call.name)
    except UnknownTool:
        return False  # not registered: nothing would pause it
    return requirement(tool, call.arguments) == "approval"


def _pin_check(constraint: PinRespected, turn: JudgedTurn) -> list[Failure]:
    if constraint.pin_id not in turn.pins:
        return []
    answer = turn.answer or ""
    name = f"pin_respected:{constraint.pin_id}"
    if isinstance(constraint, PinContains) and constraint.contains not in answer:
        return [Failure(constraint=name, expected={"contains": constraint.contains}, actual=answer)]
    if isinstance(constraint, PinNotContains) and constraint.not_contains in answer:
        return [
            Failure(
                constraint=name, expected={"not_contains": constraint.not_contains}, actual=answer
            )
        ]
    if isinstance(constraint, PinFieldEquals):
        value = _field(answer, constraint.field)
        if value is _MISSING or value != constraint.equals:
            return [
                Failure(
                    constraint=name,
                    expected={"field": constraint.field, "equals": constraint.equals},
                    actual=None if value is _MISSING else value,
                )
            ]
    return []


def _field(answer: str, path: str) -> Any:
    """The value at dotted ``path`` in the JSON ``answer`` (:data:`_MISSING`: none)."""
    try:
        value: Any = json.loads(answer)
    except ValueError:
        return _MISSING
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return _MISSING
    return value
