"""Approval rules: conditions on arguments, what a call waits for, and argument hashes."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError
from turnledger.tools import ToolDefinition, arguments_sha256, requirement
from turnledger.tools.approval import ApprovalRule, Condition, approval_required

CONDITION: TypeAdapter[Any] = TypeAdapter(Condition)
RULE: TypeAdapter[Any] = TypeAdapter(ApprovalRule)


def matches(condition: dict[str, Any], arguments: dict[str, Any]) -> bool:
    return approval_required(RULE.validate_python(condition), arguments)


def define(
    require_approval: Any = False, executor: str = "http", name: str = "delete_record"
) -> ToolDefinition:
    executors = {
        "http": {"type": "http", "url": "https://tools.example.com/x"},
        "lambda": {"type": "lambda", "function_name": "fn"},
        "client": {"type": "client"},
    }
    return ToolDefinition.model_validate(
        {"name": name, "require_approval": require_approval, "executor": executors[executor]}
    )


# --- operators ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("clause", "arguments", "expected"),
    [
        ({"equals": "production"}, {"env": "production"}, True),
        ({"equals": "production"}, {"env": "staging"}, False),
        ({"equals": "production"}, {}, False),
        ({"equals": None}, {"env": None}, True),
        ({"equals": None}, {}, False),
        ({"equals": 1}, {"env": 1.0}, True),
        ({"equals": 1}, {"env": True}, False),
        ({"equals": True}, {"env": 1}, False),
        ({"equals": True}, {"env": True}, True),
        ({"equals": "1"}, {"env": 1}, False),
        ({"equals": ["a", 1]}, {"env": ["a", 1]}, True),
        ({"equals": ["a", 1]}, {"env": ["a", True]}, False),
        ({"equals": {"a": [1]}}, {"env": {"a": [1]}}, True),
        ({"equals": {"a": [1]}}, {"env": {"a": [1], "b": 2}}, False),
        ({"in": ["production", "staging"]}, {"env": "staging"}, True),
        ({"in": ["production", "staging"]}, {"env": "dev"}, False),
        ({"in": ["production", "staging"]}, {}, False),
        ({"in": []}, {"env": "dev"}, False),
        ({"in": [0, 1]}, {"env": False}, False),
        ({"not_equals": "dev"}, {"env": "production"}, True),
        ({"not_equals": "dev"}, {"env": "dev"}, False),
        ({"not_equals": "dev"}, {}, True),
        ({"not_equals": False}, {"env": 0}, True),
    ],
)
def test_operators(clause: dict[str, Any], arguments: dict[str, Any], expected: bool) -> None:
    assert matches({"when": {"argument": "env", **clause}}, arguments) is expected


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"target": {"env": "prod"}}, True),
        ({"target": {"env": "dev"}}, False),
        ({"target": {}}, False),
        ({"target": "prod"}, False),
        ({"target": None}, False),
        ({"target.env": "prod"}, False),
        ({}, False),
    ],
)
def test_dotted_paths_reach_into_nested_objects(arguments: dict[str, Any], expected: bool) -> None:
    assert matches({"when": {"argument": "target.env", "equals": "prod"}}, arguments) is expected


def test_a_missing_nested_argument_is_not_equal_to_anything() -> None:
    condition = {"when": {"argument": "a.b.c", "not_equals": 1}}
    assert matches(condition, {"a": {"b": {}}}) is True
    assert matches(condition, {"a": {"b": {"c": 1}}}) is False


# --- combinators -------------------------------------------------------------------------

PROD = {"when": {"argument": "env", "equals": "prod"}}
BIG = {"when": {"argument": "count", "in": [100, 1000]}}
NOT_DRY = {"when": {"argument": "dry_run", "not_equals": True}}


@pytest.mark.parametrize(
    ("condition", "arguments", "expected"),
    [
        ({"any": [PROD, BIG]}, {"env": "prod"}, True),
        ({"any": [PROD, BIG]}, {"count": 100}, True),
        ({"any": [PROD, BIG]}, {"env": "dev", "count": 1}, False),
        ({"all": [PROD, BIG]}, {"env": "prod", "count": 1000}, True),
        ({"all": [PROD, BIG]}, {"env": "prod", "count": 1}, False),
        ({"all": [PROD, NOT_DRY]}, {"env": "prod"}, True),
        ({"all": [PROD, NOT_DRY]}, {"env": "prod", "dry_run": True}, False),
        ({"all": [{"any": [PROD, BIG]}, NOT_DRY]}, {"count": 100}, True),
        ({"all": [{"any": [PROD, BIG]}, NOT_DRY]}, {"count": 100, "dry_run": True}, False),
        ({"any": [{"all": [PROD, BIG]}, {"any": [NOT_DRY]}]}, {"dry_run": True}, False),
        ({"any": [{"all": [PROD, BIG]}, {"any": [NOT_DRY]}]}, {"dry_run": False}, True),
    ],
)
def test_any_and_all_nest(
    condition: dict[str, Any], arguments: dict[str, Any], expected: bool
) -> None:
    assert matches(condition, arguments) is expected


def test_conditions_serialize_back_to_the_registry_shape() -> None:
    condition = {"all": [{"any": [PROD, BIG]}, NOT_DRY]}
    assert CONDITION.dump_python(CONDITION.validate_python(condition)) == condition


@pytest.mark.parametrize(
    "condition",
    [
        pytest.param({"when": {"argument": "env"}}, id="no-operator"),
        pytest.param({"when": {"argument": "env", "equals": 1, "in": [1]}}, id="two-operators"),
        pytest.param({"when": {"argument": "env", "greater_than": 1}}, id="unknown-operator"),
        pytest.param({"when": {"equals": 1}}, id="no-argument"),
        pytest.param({"when": {"argument": "", "equals": 1}}, id="empty-argument"),
        pytest.param({"when": {"argument": "env", "in": "prod"}}, id="in-not-a-list"),
        pytest.param({"when": {"argument": "env", "equals": 1}, "any": [PROD]}, id="two-keys"),
        pytest.param({"any": []}, id="empty-any"),
        pytest.param({"all": []}, id="empty-all"),
        pytest.param({"any": PROD}, id="any-not-a-list"),
        pytest.param({"none": [PROD]}, id="unknown-combinator"),
        pytest.param({"any": [{"when": {"argument": "x"}}]}, id="nested-invalid"),
        pytest.param({}, id="empty"),
    ],
)
def test_malformed_conditions_are_rejected(condition: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        CONDITION.validate_python(condition)


@pytest.mark.parametrize("rule", ["true", 1, 0, None, [PROD]])
def test_require_approval_is_a_bool_or_a_condition(rule: Any) -> None:
    with pytest.raises(ValidationError, match="must be true, false, or a condition"):
        RULE.validate_python(rule)


# --- requirement -------------------------------------------------------------------------


def test_a_registry_true_needs_approval_whatever_the_call_says() -> None:
    tool = define(require_approval=True)
    assert requirement(tool, {}, extra_approval=set()) == "approval"
    assert requirement(tool, {}, extra_approval={"other_tool"}) == "approval"


def test_a_registry_false_needs_nothing_unless_the_call_adds_it() -> None:
    tool = define(require_approval=False)
    assert requirement(tool, {}, extra_approval=set()) == "none"
    assert requirement(tool, {}, extra_approval={"other_tool"}) == "none"
    assert requirement(tool, {}, extra_approval={"delete_record"}) == "approval"


def test_a_condition_decides_per_call_and_the_call_can_only_add() -> None:
    tool = define(
        require_approval={"when": {"argument": "environment", "equals": "production"}},
        executor="lambda",
    )
    assert requirement(tool, {"environment": "production"}, extra_approval=set()) == "approval"
    assert requirement(tool, {"environment": "staging"}, extra_approval=set()) == "none"
    assert (
        requirement(tool, {"environment": "staging"}, extra_approval={"delete_record"})
        == "approval"
    )


def test_a_client_tool_always_waits_for_the_client() -> None:
    """Rule: the caller runs a client tool; no approval list changes who runs it."""
    tool = define(executor="client", name="lookup_user")
    assert requirement(tool, {}, extra_approval=set()) == "client"
    assert requirement(tool, {}, extra_approval={"lookup_user"}) == "client"
    strict = define(require_approval=True, executor="client", name="lookup_user")
    assert requirement(strict, {}, extra_approval=set()) == "client"


def test_extra_approval_accepts_any_collection_of_names() -> None:
    tool = define()
    assert requirement(tool, {}, extra_approval=["delete_record"]) == "approval"
    assert requirement(tool, {}) == "none"


# --- argument hashes ---------------------------------------------------------------------


def test_sha256_is_of_canonical_json() -> None:
    canonical = '{"a":1,"b":{"c":"é","d":[1,2]}}'
    expected = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    assert arguments_sha256({"b": {"d": [1, 2], "c": "é"}, "a": 1}) == expected


def test_sha256_is_stable_under_key_order() -> None:
    one = {"to": "ada@example.com", "options": {"cc": ["x"], "priority": 1}, "n": 1.5}
    two = {"n": 1.5, "options": {"priority": 1, "cc": ["x"]}, "to": "ada@example.com"}
    assert arguments_sha256(one) == arguments_sha256(two)


@pytest.mark.parametrize(
    "changed",
    [
        {"to": "eve@example.com", "options": {"priority": 1}},
        {"to": "ada@example.com", "options": {"priority": 2}},
        {"to": "ada@example.com", "options": {"priority": 1}, "extra": None},
        {"to": "ada@example.com", "options": {"priority": True}},
        {"to": "ada@example.com"},
    ],
)
def test_sha256_changes_with_any_argument(changed: dict[str, Any]) -> None:
    approved = {"to": "ada@example.com", "options": {"priority": 1}}
    assert arguments_sha256(changed) != arguments_sha256(approved)
