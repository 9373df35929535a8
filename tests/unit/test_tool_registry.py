"""The tool registry: loading, validation at load time, lookups, argument checks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import boto3
import fastjsonschema
import pytest
from moto import mock_aws
from turnledger.core.config import Settings
from turnledger.core.exceptions import UnknownTool
from turnledger.core.models import ToolCall
from turnledger.providers.base import ToolSpec
from turnledger.tools import InvalidToolRegistry, ToolDefinition, ToolRegistry
from turnledger.tools.approval import When
from turnledger.tools.registry import (
    ClientExecutorConfig,
    HttpExecutorConfig,
    LambdaExecutorConfig,
)

EMAIL_SCHEMA = {
    "type": "object",
    "properties": {
        "to": {"type": "string"},
        "subject": {"type": "string"},
        "options": {
            "type": "object",
            "properties": {"priority": {"type": "integer"}},
        },
    },
    "required": ["to", "subject"],
    "additionalProperties": False,
}

#: The registry of the API contract's example.
REGISTRY: dict[str, Any] = {
    "tools": [
        {
            "name": "send_email",
            "description": "Send an email",
            "parameters": EMAIL_SCHEMA,
            "require_approval": True,
            "executor": {
                "type": "http",
                "url": "https://tools.example.com/email",
                "headers": {"Authorization": "Bearer x"},
                "timeout_seconds": 5,
            },
        },
        {
            "name": "delete_record",
            "parameters": {"type": "object"},
            "require_approval": {"when": {"argument": "environment", "equals": "production"}},
            "executor": {"type": "lambda", "function_name": "delete-record"},
        },
        {"name": "lookup_user", "parameters": {"type": "object"}, "executor": {"type": "client"}},
    ]
}


def tool(**overrides: Any) -> dict[str, Any]:
    return {"name": "t", "parameters": {"type": "object"}, "executor": {"type": "client"}} | (
        overrides
    )


def load(*tools: dict[str, Any]) -> ToolRegistry:
    return ToolRegistry.from_json(json.dumps({"tools": list(tools)}))


@pytest.fixture
def registry() -> ToolRegistry:
    return ToolRegistry.from_json(json.dumps(REGISTRY))


# --- loading -----------------------------------------------------------------------------


def test_loads_a_valid_registry_file(tmp_path: Path) -> None:
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(REGISTRY), encoding="utf-8")

    registry = ToolRegistry.from_file(path)

    assert registry.names == ["send_email", "delete_record", "lookup_user"]
    email = registry.get("send_email")
    assert email.description == "Send an email"
    assert email.require_approval is True
    assert email.executor == HttpExecutorConfig(
        type="http",
        url="https://tools.example.com/email",
        headers={"Authorization": "Bearer x"},
        timeout_seconds=5,
    )
    delete = registry.get("delete_record")
    assert isinstance(delete.require_approval, When)
    assert delete.executor == LambdaExecutorConfig(type="lambda", function_name="delete-record")
    lookup = registry.get("lookup_user")
    assert lookup.executor == ClientExecutorConfig(type="client")
    assert lookup.require_approval is False
    assert lookup.description == ""


def test_the_empty_registry_has_no_tools() -> None:
    registry = ToolRegistry.empty()
    assert len(registry) == 0
    assert registry.select(None) == []


def test_a_schema_without_a_type_describes_an_object() -> None:
    registry = load(tool(parameters={"properties": {"a": {"type": "string"}}}))

    assert registry.get("t").parameters == {
        "type": "object",
        "properties": {"a": {"type": "string"}},
    }


def test_parameters_default_to_any_object() -> None:
    registry = load({"name": "t", "executor": {"type": "client"}})
    assert registry.get("t").parameters == {"type": "object"}


@pytest.mark.parametrize(
    ("tools", "expected"),
    [
        pytest.param(
            [tool(name="dup"), tool(name="dup")], "tool 'dup': duplicate name", id="duplicate"
        ),
        pytest.param([tool(name="send email")], "tool 'send email': name", id="name-space"),
        pytest.param([tool(name="x" * 65)], "name: String should match", id="name-too-long"),
        pytest.param([tool(name="")], "tool '': name", id="name-empty"),
        pytest.param(
            [
                tool(
                    name="bad", parameters={"type": "object", "properties": {"a": {"type": "nope"}}}
                )
            ],
            "tool 'bad': parameters is not a valid JSON Schema",
            id="unknown-type-in-schema",
        ),
        pytest.param(
            [tool(name="bad", parameters={"type": "object", "required": "a"})],
            "tool 'bad': parameters is not a valid JSON Schema: required must be an array",
            id="required-not-array",
        ),
        pytest.param(
            [tool(name="bad", parameters={"type": "object", "properties": 5})],
            "tool 'bad': parameters is not a valid JSON Schema",
            id="properties-not-object",
        ),
        pytest.param(
            [tool(name="bad", parameters={"type": "string"})],
            "tool 'bad': parameters: must describe a JSON object",
            id="schema-not-an-object",
        ),
        pytest.param(
            [tool(name="bad", parameters={"$ref": "https://schemas.example.com/a.json"})],
            "remote $ref 'https://schemas.example.com/a.json' is not allowed",
            id="remote-ref",
        ),
        pytest.param(
            [tool(name="bad", executor={"type": "ftp"})],
            "tool 'bad': executor: Input tag 'ftp'",
            id="unknown-executor",
        ),
        pytest.param(
            [tool(name="bad", executor={"type": "http", "url": "ftp://x/y"})],
            "tool 'bad': executor.http.url: must be an absolute http:// or https:// URL",
            id="http-url-scheme",
        ),
        pytest.param(
            [tool(name="bad", executor={"type": "http"})],
            "tool 'bad': executor.http.url: Field required",
            id="http-url-missing",
        ),
        pytest.param(
            [tool(name="bad", executor={"type": "http", "url": "http://x", "timeout_seconds": 0})],
            "tool 'bad': executor.http.timeout_seconds",
            id="zero-timeout",
        ),
        pytest.param(
            [
                tool(
                    name="bad",
                    executor={"type": "http", "url": "http://x", "deferred_ttl_seconds": 60},
                )
            ],
            "tool 'bad': executor.http: deferred_ttl_seconds is for a tool declared "
            '"deferred": true',
            id="ttl-of-a-tool-not-deferred",
        ),
        pytest.param(
            [tool(name="bad", executor={"type": "lambda", "function_name": "f", "url": "u"})],
            "tool 'bad': executor.lambda.url: Extra inputs are not permitted",
            id="extra-key-in-executor",
        ),
        pytest.param(
            [tool(name="bad", colour="red")],
            "tool 'bad': colour: Extra inputs are not permitted",
            id="extra-key-in-tool",
        ),
        pytest.param(
            [tool(name="bad", require_approval="yes")],
            "tool 'bad': require_approval: must be true, false, or a condition",
            id="approval-not-bool",
        ),
        pytest.param(
            [tool(name="bad", require_approval={"when": {"argument": "a", "equal": 1}})],
            "tool 'bad': require_approval",
            id="approval-bad-operator",
        ),
        pytest.param(
            [{"executor": {"type": "client"}}], "tool #0: name: Field required", id="no-name"
        ),
        pytest.param([tool(name="bad", executor=None)], "tool 'bad': executor", id="no-executor"),
        pytest.param([5], "tool #0", id="tool-not-object"),
    ],
)
def test_invalid_registries_fail_to_load_naming_the_tool(tools: list[Any], expected: str) -> None:
    with pytest.raises(InvalidToolRegistry) as raised:
        load(*tools)
    assert expected in raised.value.message
    assert any(expected in line for line in raised.value.details["errors"])


def test_every_invalid_tool_is_reported_at_once() -> None:
    with pytest.raises(InvalidToolRegistry) as raised:
        load(tool(name="a", colour=1), tool(name="ok"), tool(name="b", executor={"type": "?"}))
    errors = raised.value.details["errors"]
    assert [line.split(":")[0] for line in errors] == ["tool 'a'", "tool 'b'"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{", "tool registry is not valid JSON"),
        ("[]", 'tool registry must be a JSON object {"tools": [...]}'),
        ('{"tool": []}', "tools: Field required"),
        ('{"tools": [], "version": 2}', "version: Extra inputs are not permitted"),
        ('{"tools": {}}', "tools: Input should be a valid list"),
    ],
)
def test_documents_of_the_wrong_shape_fail_to_load(text: str, expected: str) -> None:
    with pytest.raises(InvalidToolRegistry, match="tool registry") as raised:
        ToolRegistry.from_json(text)
    assert expected in raised.value.message


def test_a_missing_file_fails_to_load_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "absent.json"
    with pytest.raises(InvalidToolRegistry, match=r"cannot read tool registry .*absent\.json"):
        ToolRegistry.from_file(path)


def test_a_file_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "tools.json"
    path.write_text(json.dumps({"tools": [tool(name="a b")]}), encoding="utf-8")
    with pytest.raises(InvalidToolRegistry, match=r"tools\.json is invalid: tool 'a b'"):
        ToolRegistry.from_file(path)


def test_the_registry_error_is_an_internal_error() -> None:
    """A bad registry is the deployment's fault: it maps to 500, not to a client error."""
    with pytest.raises(InvalidToolRegistry) as raised:
        ToolRegistry.from_json("[]")
    assert raised.value.status == 500
    assert raised.value.code == "internal_error"


def test_constructing_with_duplicates_is_rejected() -> None:
    definition = ToolDefinition.model_validate(tool(name="a"))
    with pytest.raises(InvalidToolRegistry, match="tool 'a': duplicate name"):
        ToolRegistry([definition, definition])


def test_each_schema_is_compiled_once_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled: list[Any] = []
    real_compile = fastjsonschema.compile

    def counting_compile(schema: Any, **kwargs: Any) -> Any:
        compiled.append(schema)
        return real_compile(schema, **kwargs)

    monkeypatch.setattr(fastjsonschema, "compile", counting_compile)
    registry = ToolRegistry.from_json(json.dumps(REGISTRY))
    assert len(compiled) == 3

    email = registry.get("send_email")
    for _ in range(5):
        assert email.validate_arguments({"to": "a@example.com", "subject": "hi"}) is None
    assert len(compiled) == 3


# --- lookups -----------------------------------------------------------------------------


def test_get_unknown_tool_names_it_and_the_registered_ones(registry: ToolRegistry) -> None:
    with pytest.raises(UnknownTool) as raised:
        registry.get("nope")
    assert raised.value.status == 422
    assert raised.value.code == "unknown_tool"
    assert raised.value.details == {
        "tool": "nope",
        "registered": ["send_email", "delete_record", "lookup_user"],
    }


def test_select_none_is_every_tool_in_registry_order(registry: ToolRegistry) -> None:
    assert [t.name for t in registry.select(None)] == ["send_email", "delete_record", "lookup_user"]


def test_select_keeps_the_requested_order_and_drops_repeats(registry: ToolRegistry) -> None:
    selected = registry.select(["lookup_user", "send_email", "lookup_user"])
    assert [t.name for t in selected] == ["lookup_user", "send_email"]


def test_select_empty_offers_no_tools(registry: ToolRegistry) -> None:
    assert registry.select([]) == []


def test_select_unknown_names_every_unknown_tool(registry: ToolRegistry) -> None:
    with pytest.raises(UnknownTool) as raised:
        registry.select(["send_email", "fly", "swim"])
    assert raised.value.details["unknown"] == ["fly", "swim"]
    assert raised.value.details["tool"] == "fly"
    assert raised.value.details["registered"] == registry.names


def test_specs_are_what_the_model_sees(registry: ToolRegistry) -> None:
    assert registry.specs(["send_email"]) == [
        ToolSpec(name="send_email", description="Send an email", parameters=EMAIL_SCHEMA)
    ]
    assert [s.name for s in registry.specs()] == registry.names


def test_membership_and_iteration(registry: ToolRegistry) -> None:
    assert "send_email" in registry
    assert "fly" not in registry
    assert [t.name for t in registry] == registry.names


# --- arguments ---------------------------------------------------------------------------


def test_valid_arguments_pass(registry: ToolRegistry) -> None:
    email = registry.get("send_email")
    args = {"to": "a@example.com", "subject": "hi", "options": {"priority": 1}}
    assert email.validate_arguments(args) is None


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"subject": "hi"}, "arguments is missing required property 'to'"),
        ({}, "arguments is missing required property 'to', 'subject'"),
        ({"to": 5, "subject": "hi"}, "arguments.to must be string"),
        (
            {"to": "a", "subject": "hi", "options": {"priority": "high"}},
            "arguments.options.priority must be integer",
        ),
        ({"to": "a", "subject": "hi", "cc": "b"}, "arguments must not contain {'cc'} properties"),
    ],
)
def test_invalid_arguments_say_which_field_and_why(
    registry: ToolRegistry, arguments: dict[str, Any], message: str
) -> None:
    error = registry.get("send_email").validate_arguments(arguments)
    assert error == f"invalid arguments for tool send_email: {message}"


def test_validation_never_writes_defaults_into_the_arguments() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "default": 3}}}
    definition = ToolDefinition.model_validate(tool(parameters=schema))
    arguments: dict[str, Any] = {}

    assert definition.validate_arguments(arguments) is None
    assert arguments == {}


def test_a_call_whose_arguments_were_not_json_is_invalid(registry: ToolRegistry) -> None:
    call = ToolCall(id="c1", name="send_email", arguments={}, raw_arguments='{"to": "a@')

    error = registry.get("send_email").validate_call(call)

    assert error is not None
    assert error.startswith("invalid arguments for tool send_email: ")
    assert "the arguments were not a JSON object" in error
    assert '{"to": "a@' in error


def test_a_call_with_valid_arguments_is_valid(registry: ToolRegistry) -> None:
    call = ToolCall(id="c1", name="send_email", arguments={"to": "a", "subject": "b"})
    assert registry.get("send_email").validate_call(call) is None


# --- SSM and settings --------------------------------------------------------------------


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        yield


@pytest.mark.parametrize("parameter_type", ["String", "SecureString"])
def test_loads_from_an_ssm_parameter(
    aws: None, parameter_type: Literal["String", "SecureString"]
) -> None:
    ssm = boto3.client("ssm", region_name="us-east-1")
    ssm.put_parameter(Name="/turnledger/tools", Value=json.dumps(REGISTRY), Type=parameter_type)

    registry = ToolRegistry.from_parameter("/turnledger/tools", ssm_client=ssm)

    assert registry.names == ["send_email", "delete_record", "lookup_user"]


def test_loads_from_ssm_with_the_default_client(aws: None) -> None:
    ssm = boto3.client("ssm", region_name="us-east-1")
    ssm.put_parameter(Name="/default/tools", Value=json.dumps(REGISTRY), Type="String")

    registry = ToolRegistry.from_parameter("/default/tools")

    assert registry.names == ["send_email", "delete_record", "lookup_user"]


def test_a_missing_parameter_fails_to_load(aws: None) -> None:
    ssm = boto3.client("ssm", region_name="us-east-1")
    with pytest.raises(InvalidToolRegistry, match="cannot read tool registry parameter /absent"):
        ToolRegistry.from_parameter("/absent", ssm_client=ssm)


def test_an_invalid_parameter_names_the_parameter_and_the_tool(aws: None) -> None:
    ssm = boto3.client("ssm", region_name="us-east-1")
    ssm.put_parameter(
        Name="/bad/tools", Value=json.dumps({"tools": [tool(name="a b")]}), Type="String"
    )
    with pytest.raises(
        InvalidToolRegistry, match="tool registry parameter /bad/tools is invalid: tool 'a b'"
    ):
        ToolRegistry.from_parameter("/bad/tools", ssm_client=ssm)


def test_settings_choose_the_file(tmp_path: Path) -> None:
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(REGISTRY), encoding="utf-8")

    registry = ToolRegistry.from_settings(Settings(tools_file=str(path)))

    assert registry.names == ["send_email", "delete_record", "lookup_user"]


def test_settings_choose_the_parameter(aws: None) -> None:
    ssm = boto3.client("ssm", region_name="us-east-1")
    ssm.put_parameter(Name="/settings/tools", Value=json.dumps(REGISTRY), Type="String")

    registry = ToolRegistry.from_settings(Settings(tools_parameter="/settings/tools"))

    assert registry.names == ["send_email", "delete_record", "lookup_user"]


def test_settings_without_a_registry_mean_no_tools() -> None:
    assert len(ToolRegistry.from_settings(Settings())) == 0


def test_settings_with_both_sources_are_rejected() -> None:
    with pytest.raises(InvalidToolRegistry, match="not both"):
        ToolRegistry.from_settings(Settings(tools_file="a.json", tools_parameter="/a"))
