"""Approval rules: which tool calls wait for a human, and which for the client.

A tool's ``require_approval`` in the registry is ``true``, ``false``, or a
declarative condition on the call's arguments::

    {"when": {"argument": "environment", "equals": "production"}}
    {"when": {"argument": "target.env", "in": ["prod", "staging"]}}
    {"when": {"argument": "dry_run", "not_equals": true}}
    {"any": [condition, ...]}        {"all": [condition, ...]}

``argument`` is a dotted path into nested objects. A missing argument makes
``equals`` and ``in`` false and ``not_equals`` true (a value that is absent is
not equal to anything). Values compare as JSON: ``true`` never equals ``1``.

A turn's own ``require_approval`` list can only add requirements: nothing in
:func:`~turnledger.tools.registry.requirement` (what a call of a registered tool
waits for) lets it waive a rule of the registry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Discriminator, Field, JsonValue, StrictBool, Tag

from ..core.models import arguments_sha256 as arguments_sha256  # its home before core

_MISSING: Any = object()


def _lookup(arguments: Mapping[str, Any], path: str) -> Any:
    """The value at dotted ``path`` in ``arguments``, or ``_MISSING``."""
    value: Any = arguments
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _json_equal(left: Any, right: Any) -> bool:
    """Equality of JSON values: like ``==`` except that booleans are not numbers."""
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    if isinstance(left, int | float) and isinstance(right, int | float):
        return left == right
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(
            _json_equal(a, b) for a, b in zip(left, right, strict=True)
        )
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(_json_equal(left[k], right[k]) for k in left)
    return type(left) is type(right) and bool(left == right)


class _Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, serialize_by_alias=True)

    #: The key that tells this shape apart in the union it belongs to.
    tag: ClassVar[str]


class Equals(_Rule):
    """``{"argument": A, "equals": V}``: the argument is present and equal to ``V``."""

    tag = "equals"

    argument: str = Field(min_length=1)
    equals: JsonValue

    def holds(self, arguments: Mapping[str, Any]) -> bool:
        """Whether the clause is true of ``arguments``."""
        value = _lookup(arguments, self.argument)
        return value is not _MISSING and _json_equal(value, self.equals)


class In(_Rule):
    """``{"argument": A, "in": [V, ...]}``: the argument is present and one of the values."""

    tag = "in"

    argument: str = Field(min_length=1)
    in_: list[JsonValue] = Field(alias="in")

    def holds(self, arguments: Mapping[str, Any]) -> bool:
        """Whether the clause is true of ``arguments``."""
        value = _lookup(arguments, self.argument)
        return value is not _MISSING and any(_json_equal(value, v) for v in self.in_)


class NotEquals(_Rule):
    """``{"argument": A, "not_equals": V}``: the argument is absent or not equal to ``V``."""

    tag = "not_equals"

    argument: str = Field(min_length=1)
    not_equals: JsonValue

    def holds(self, arguments: Mapping[str, Any]) -> bool:
        """Whether the clause is true of ``arguments``."""
        value = _lookup(arguments, self.argument)
        return value is _MISSING or not _json_equal(value, self.not_equals)


_OPERATORS = ("equals", "in", "not_equals")


def _operator_of(value: Any) -> str | None:
    if isinstance(value, Mapping):
        return next((op for op in _OPERATORS if op in value), None)
    return value.tag if isinstance(value, _Rule) else None


Clause = Annotated[
    Annotated[Equals, Tag("equals")]
    | Annotated[In, Tag("in")]
    | Annotated[NotEquals, Tag("not_equals")],
    Discriminator(
        _operator_of,
        custom_error_type="invalid_clause",
        custom_error_message="a 'when' clause needs 'argument' and one of: equals, in, not_equals",
    ),
]


class When(_Rule):
    """``{"when": clause}``: one test on one argument."""

    tag = "when"

    when: Clause

    def matches(self, arguments: Mapping[str, Any]) -> bool:
        """Whether the condition is true of ``arguments``."""
        return self.when.holds(arguments)


class AnyOf(_Rule):
    """``{"any": [condition, ...]}``: at least one condition is true."""

    tag = "any"

    any: list[Condition] = Field(min_length=1)

    def matches(self, arguments: Mapping[str, Any]) -> bool:
        """Whether the condition is true of ``arguments``."""
        return any(c.matches(arguments) for c in self.any)


class AllOf(_Rule):
    """``{"all": [condition, ...]}``: every condition is true."""

    tag = "all"

    all: list[Condition] = Field(min_length=1)

    def matches(self, arguments: Mapping[str, Any]) -> bool:
        """Whether the condition is true of ``arguments``."""
        return all(c.matches(arguments) for c in self.all)


_COMBINATORS = ("when", "any", "all")


def _combinator_of(value: Any) -> str | None:
    if isinstance(value, Mapping):
        return next((key for key in _COMBINATORS if key in value), None)
    return value.tag if isinstance(value, _Rule) else None


Condition = Annotated[
    Annotated[When, Tag("when")] | Annotated[AnyOf, Tag("any")] | Annotated[AllOf, Tag("all")],
    Discriminator(
        _combinator_of,
        custom_error_type="invalid_condition",
        custom_error_message="a condition is an object with one key: when, any or all",
    ),
]

AnyOf.model_rebuild()
AllOf.model_rebuild()


def _rule_kind(value: Any) -> str | None:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Mapping | _Rule):
        return "condition"
    return None


#: A registry's ``require_approval``: ``true``, ``false`` or a :data:`Condition`.
ApprovalRule = Annotated[
    Annotated[StrictBool, Tag("bool")] | Annotated[Condition, Tag("condition")],
    Discriminator(
        _rule_kind,
        custom_error_type="invalid_approval_rule",
        custom_error_message="must be true, false, or a condition (when, any, all)",
    ),
]


def approval_required(rule: bool | When | AnyOf | AllOf, arguments: Mapping[str, Any]) -> bool:
    """Whether a registry rule (``true``, ``false`` or a condition) asks for approval."""
    if isinstance(rule, bool):
        return rule
    return rule.matches(arguments)
