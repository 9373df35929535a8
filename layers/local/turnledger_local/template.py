"""Read ``template.yaml``: routes and table definitions for the local runner and tests.

Local runs and tests take the API routes and the table's key schema from the
template itself, so they cannot drift from what is deployed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

#: The repository root (``layers/local/turnledger_local/template.py`` -> three levels up).
PROJECT_ROOT = Path(__file__).resolve().parents[3]
TEMPLATE_PATH = PROJECT_ROOT / "template.yaml"


class _CfnLoader(yaml.SafeLoader):
    """A YAML loader that keeps CloudFormation short-form tags (``!Ref``, ``!Sub``...)."""


def _tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
    # !Ref and !Condition are the long forms' Ref and Condition; every other tag an Fn::.
    name = suffix if suffix in {"Ref", "Condition"} else f"Fn::{suffix}"
    return {name: value}


_CfnLoader.add_multi_constructor("!", _tag)


def load_template(path: Path = TEMPLATE_PATH) -> dict[str, Any]:
    """The parsed template, with short-form tags as their long-form mappings."""
    with path.open(encoding="utf-8") as handle:
        # _CfnLoader is a SafeLoader subclass: no arbitrary Python objects.
        loaded = yaml.load(handle, Loader=_CfnLoader)
    if not isinstance(loaded, dict):
        raise ValueError(f"{path} is not a template")
    return loaded


def table_definition(
    template: dict[str, Any],
    resource: str,
    table_name: str,
    parameters: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``create_table`` arguments for the table ``resource`` of ``template``, named ``table_name``.

    Keeps what both DynamoDB Local and moto understand: attribute definitions,
    key schema, indexes and billing mode; an index or attribute behind a condition is
    there as the template's ``parameters`` (default: the parameters' defaults) decide.
    """
    props = template["Resources"][resource]["Properties"]
    values = parameter_values(template, parameters or {})
    definition: dict[str, Any] = {
        "TableName": table_name,
        "AttributeDefinitions": resolve(template, props["AttributeDefinitions"], values),
        "KeySchema": props["KeySchema"],
        "BillingMode": props.get("BillingMode", "PAY_PER_REQUEST"),
    }
    indexes = resolve(template, props.get("GlobalSecondaryIndexes") or [], values)
    if indexes:
        definition["GlobalSecondaryIndexes"] = [
            {k: v for k, v in index.items() if k in {"IndexName", "KeySchema", "Projection"}}
            for index in indexes
        ]
    return definition


def ttl_attribute(template: dict[str, Any], resource: str) -> str | None:
    """The TTL attribute of the table ``resource``, when TTL is enabled."""
    spec = template["Resources"][resource]["Properties"].get("TimeToLiveSpecification") or {}
    return spec.get("AttributeName") if spec.get("Enabled") else None


@dataclass(frozen=True)
class Route:
    """One HTTP API route of a function."""

    method: str
    path: str
    function: str
    code_uri: str
    handler: str
    #: False for routes the template opens with ``Auth: {Authorizer: NONE}``.
    authorized: bool = True

    @property
    def route_key(self) -> str:
        """The API Gateway route key, e.g. ``GET /v1/conversations/{id}``."""
        return f"{self.method} {self.path}"


def routes(template: dict[str, Any]) -> list[Route]:
    """Every ``HttpApi`` event route of every ``AWS::Serverless::Function``, guarded as SAM
    guards it: by the authorizer the route names (``NONE``: open), else by its API's
    ``DefaultAuthorizer`` (the ``HttpApi`` its ``ApiId`` names, or ``Globals.HttpApi`` for
    SAM's implicit one), else open."""
    found: list[Route] = []
    for name, resource in template.get("Resources", {}).items():
        if resource.get("Type") != "AWS::Serverless::Function":
            continue
        props = resource.get("Properties", {})
        for event in (props.get("Events") or {}).values():
            if event.get("Type") != "HttpApi":
                continue
            spec = event.get("Properties", {})
            named = (spec.get("Auth") or {}).get("Authorizer")
            authorizer = named if named is not None else _default_authorizer(template, spec)
            found.append(
                Route(
                    method=str(spec["Method"]).upper(),
                    path=str(spec["Path"]),
                    function=name,
                    code_uri=str(props.get("CodeUri", "")),
                    handler=str(props.get("Handler", "app.lambda_handler")),
                    authorized=authorizer not in (None, "NONE"),
                )
            )
    return found


def _default_authorizer(template: dict[str, Any], event: dict[str, Any]) -> str | None:
    """The ``DefaultAuthorizer`` of the API an ``HttpApi`` event belongs to, if any."""
    api_id = event.get("ApiId")
    if isinstance(api_id, dict) and "Ref" in api_id:
        api = template.get("Resources", {}).get(str(api_id["Ref"]), {})
        auth = (api.get("Properties") or {}).get("Auth") or {}
    else:
        auth = ((template.get("Globals") or {}).get("HttpApi") or {}).get("Auth") or {}
    default = auth.get("DefaultAuthorizer")
    return None if default is None else str(default)


#: What Lambda gives a function that sets neither its own value nor a global one.
_DEFAULT_TIMEOUT_SECONDS = 3
_DEFAULT_MEMORY_MB = 128


@dataclass(frozen=True)
class FunctionSpec:
    """One ``AWS::Serverless::Function``, with ``Globals.Function`` applied."""

    name: str
    code_uri: str
    handler: str
    timeout_seconds: int
    memory_mb: int
    #: The ``Type`` of each of its events (``HttpApi``, ``Schedule``, ``DynamoDB``...).
    event_types: tuple[str, ...]


def _int_setting(value: Any, default: int) -> int:
    # Only literal numbers apply locally; an intrinsic (a !Ref to a parameter) cannot be
    # resolved without a deployment, so the default stands in for it.
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def functions(template: dict[str, Any]) -> dict[str, FunctionSpec]:
    """Every ``AWS::Serverless::Function`` of ``template`` by its logical id."""
    defaults = (template.get("Globals") or {}).get("Function") or {}
    found: dict[str, FunctionSpec] = {}
    for name, resource in template.get("Resources", {}).items():
        if resource.get("Type") != "AWS::Serverless::Function":
            continue
        props = resource.get("Properties", {})
        events = props.get("Events") or {}
        found[name] = FunctionSpec(
            name=name,
            code_uri=str(props.get("CodeUri", "")),
            handler=str(props.get("Handler", "app.lambda_handler")),
            timeout_seconds=_int_setting(
                props.get("Timeout", defaults.get("Timeout")), _DEFAULT_TIMEOUT_SECONDS
            ),
            memory_mb=_int_setting(
                props.get("MemorySize", defaults.get("MemorySize")), _DEFAULT_MEMORY_MB
            ),
            event_types=tuple(str(event.get("Type", "")) for event in events.values()),
        )
    return found


def streaming_function(template: dict[str, Any]) -> FunctionSpec | None:
    """The function whose URL streams its answers (``FunctionUrlConfig.InvokeMode:
    RESPONSE_STREAM``), if the template has one."""
    specs = functions(template)
    for name, resource in template.get("Resources", {}).items():
        url = (resource.get("Properties") or {}).get("FunctionUrlConfig") or {}
        if name in specs and url.get("InvokeMode") == "RESPONSE_STREAM":
            return specs[name]
    return None


def scheduled_function(template: dict[str, Any]) -> FunctionSpec | None:
    """The function an EventBridge schedule invokes (the sweep), if the template has one."""
    for spec in functions(template).values():
        if {"Schedule", "ScheduleV2"} & set(spec.event_types):
            return spec
    return None


# --- parameters and conditions: what a deployment with given parameter values gets ---------


class ParameterError(ValueError):
    """A parameter value CloudFormation would refuse, or a parameter the template lacks."""


#: What ``!Ref AWS::NoValue`` resolves to: the property is left out.
NO_VALUE: Any = object()


def _check_parameter(name: str, spec: dict[str, Any], value: str) -> None:
    # The checks CloudFormation makes before it creates anything (AllowedPattern must match
    # the whole value).
    allowed = spec.get("AllowedValues")
    if allowed is not None and value not in {str(option) for option in allowed}:
        raise ParameterError(f"{name}={value!r} is not one of {[str(a) for a in allowed]}")
    if spec.get("Type") == "Number":
        try:
            number = float(value)
        except ValueError:
            raise ParameterError(f"{name}={value!r} is not a number") from None
        if "MinValue" in spec and number < float(spec["MinValue"]):
            raise ParameterError(f"{name}={value} is below its MinValue {spec['MinValue']}")
        if "MaxValue" in spec and number > float(spec["MaxValue"]):
            raise ParameterError(f"{name}={value} is above its MaxValue {spec['MaxValue']}")
        return
    if "MaxLength" in spec and len(value) > int(spec["MaxLength"]):
        raise ParameterError(f"{name} is {len(value)} characters, over its MaxLength")
    pattern = spec.get("AllowedPattern")
    if pattern is not None and re.fullmatch(pattern, value) is None:
        raise ParameterError(f"{name}={value!r} does not match {pattern}")


def parameter_values(template: dict[str, Any], overrides: dict[str, str]) -> dict[str, str]:
    """Each parameter's value: its override, else its default (parameters without either
    are left out); an unknown name or a value CloudFormation would refuse raises
    :class:`ParameterError`."""
    specs: dict[str, dict[str, Any]] = template.get("Parameters") or {}
    unknown = sorted(set(overrides) - set(specs))
    if unknown:
        raise ParameterError(f"the template has no parameter {', '.join(unknown)}")
    values: dict[str, str] = {}
    for name, spec in specs.items():
        if name in overrides:
            value = overrides[name]
        elif "Default" in spec:
            value = str(spec["Default"])
        else:
            continue
        _check_parameter(name, spec, value)
        values[name] = value
    return values


def condition(template: dict[str, Any], name: str, values: dict[str, str]) -> bool:
    """Whether the template's condition ``name`` holds under parameter ``values``."""
    return _truth(template, template["Conditions"][name], values)


def _truth(template: dict[str, Any], node: Any, values: dict[str, str]) -> bool:
    if isinstance(node, dict) and len(node) == 1:
        ((function, argument),) = node.items()
        if function == "Condition":
            return condition(template, argument, values)
        if function == "Fn::Equals":
            left, right = (resolve(template, side, values) for side in argument)
            return bool(_text(left) == _text(right))
        if function == "Fn::Not":
            return not _truth(template, argument[0], values)
        if function == "Fn::And":
            return all(_truth(template, part, values) for part in argument)
        if function == "Fn::Or":
            return any(_truth(template, part, values) for part in argument)
    raise ParameterError(f"cannot evaluate the condition {node!r}")


def _text(value: Any) -> Any:
    # Fn::Equals compares strings; a list parameter joined (HasBedrockModelIds).
    return ",".join(value) if isinstance(value, list) else str(value)


def resolve(template: dict[str, Any], value: Any, values: dict[str, str]) -> Any:
    """``value`` with its parameter references and ``Fn::If`` resolved under parameter
    ``values`` (which may name pseudo parameters too, ``AWS::Region`` say);
    :data:`NO_VALUE` for ``AWS::NoValue`` (left out of a list). Anything only a
    deployment knows (a resource's name or attribute, ``Fn::Sub``) is left as is."""
    if isinstance(value, list):
        return [
            item for item in (resolve(template, v, values) for v in value) if item is not NO_VALUE
        ]
    if not isinstance(value, dict):
        return value
    if set(value) == {"Ref"}:
        name = value["Ref"]
        if name == "AWS::NoValue":
            return NO_VALUE
        if name.startswith("AWS::") and name in values:
            # A pseudo parameter the caller names (``AWS::Region``: a deployment's Region).
            return values[name]
        specs = template.get("Parameters") or {}
        if name in specs:
            if name not in values:
                raise ParameterError(f"the parameter {name} has no value and no default")
            raw = values[name]
            return raw.split(",") if specs[name].get("Type") == "CommaDelimitedList" else raw
        return value
    if set(value) == {"Fn::If"}:
        name, when_true, when_false = value["Fn::If"]
        chosen = when_true if condition(template, name, values) else when_false
        return resolve(template, chosen, values)
    return {key: resolve(template, item, values) for key, item in value.items()}


def function_property(
    template: dict[str, Any], function: str, name: str, values: dict[str, str]
) -> Any:
    """The property ``name`` of ``function`` (``Globals.Function``'s when it sets none)
    resolved under parameter ``values``; :data:`NO_VALUE` when neither sets it."""
    defaults = (template.get("Globals") or {}).get("Function") or {}
    properties = template["Resources"][function].get("Properties") or {}
    if name in properties:
        return resolve(template, properties[name], values)
    if name in defaults:
        return resolve(template, defaults[name], values)
    return NO_VALUE
