"""Structural facts of ``template.yaml`` that the code and the contract depend on.

``sam validate --lint`` checks that the template is well formed; these tests
check that it is the template this code needs: the contract's routes on the
right functions, the table the store writes, the settings the functions read,
least privilege, and sample events that match the routes.
"""

from __future__ import annotations

import copy
import json
import re
import tomllib
from typing import Any

import pytest
from turnledger.core import observability
from turnledger.core.config import Settings
from turnledger.store import codec, keys
from turnledger.store.dynamodb import EXPIRY_INDEX, TENANT_INDEX
from turnledger.store.inbox import A_INBOX, A_INBOX_SORT, INBOX_INDEX, inbox_partition
from turnledger.store.indexes import CURSOR_PK, WAIT_INDEX
from turnledger.store.tenancy import TENANT_DYNAMODB_ACTIONS, TENANT_S3_OBJECT_ACTIONS, TENANT_TAG
from turnledger_local.template import (
    PROJECT_ROOT,
    functions,
    load_template,
    routes,
    scheduled_function,
    table_definition,
    ttl_attribute,
)

from bench.coldstart import NO_VALUE, resolve

EVENTS_DIR = PROJECT_ROOT / "events"

#: API.md's route table, plus the tenant-wide erasure route, by the function serving each.
CONTRACT_ROUTES = {
    ("POST", "/v1/conversations/{id}/turns", "TurnFunction"),
    ("POST", "/v1/conversations/{id}/approvals", "ApproveFunction"),
    ("GET", "/v1/conversations/{id}", "ReadFunction"),
    ("GET", "/v1/conversations/{id}/events", "ReadFunction"),
    ("GET", "/v1/conversations/{id}/export", "ReadFunction"),
    ("POST", "/v1/conversations/{id}/import", "TurnFunction"),
    ("POST", "/v1/conversations/{id}/fork", "TurnFunction"),
    ("POST", "/v1/conversations/{id}/compact", "TurnFunction"),
    ("POST", "/v1/conversations/{id}/pins", "TurnFunction"),
    ("GET", "/v1/conversations/{id}/pins", "TurnFunction"),
    ("DELETE", "/v1/conversations/{id}/pins/{pin_id}", "TurnFunction"),
    ("POST", "/v1/memories/pins", "TurnFunction"),
    ("GET", "/v1/memories/pins", "TurnFunction"),
    ("DELETE", "/v1/memories/pins/{pin_id}", "TurnFunction"),
    ("GET", "/v1/conversations/{id}/state", "ReadFunction"),
    ("GET", "/v1/conversations/{id}/forks", "ReadFunction"),
    ("GET", "/v1/conversations/{id}/turns/{turn}/context", "ReadFunction"),
    ("POST", "/v1/conversations/{id}/replays", "TurnFunction"),
    ("GET", "/v1/conversations/{id}/replays/{replay_id}", "ReadFunction"),
    ("POST", "/openai/v1/responses", "TurnFunction"),
    ("POST", "/openai/v1/chat/completions", "TurnFunction"),
    ("POST", "/openai/v1/conversations", "TurnFunction"),
    ("GET", "/openai/v1/conversations/{id}", "ReadFunction"),
    ("GET", "/openai/v1/conversations/{id}/items", "ReadFunction"),
    ("DELETE", "/openai/v1/conversations/{id}", "ClearFunction"),
    ("POST", "/openai/v1/conversations/{id}/items", "TurnFunction"),
    ("GET", "/openai/v1/conversations/{id}/items/{item}", "ReadFunction"),
    ("DELETE", "/openai/v1/conversations/{id}/items/{item}", "ClearFunction"),
    *(
        (m, "/openai/v1/{proxy+}", "ReadFunction")
        for m in ("GET", "POST", "PUT", "PATCH", "DELETE")
    ),
    ("GET", "/v1/openapi.json", "ReadFunction"),
    ("DELETE", "/v1/conversations/{id}", "ClearFunction"),
    ("DELETE", "/v1/conversations", "ClearFunction"),
    ("POST", "/v1/conversations/{id}/cancel", "ApproveFunction"),
    ("POST", "/v1/callbacks/{token}", "ApproveFunction"),
    ("GET", "/v1/approvals", "ReadFunction"),
    ("GET", "/approvals", "ReadFunction"),
    ("GET", "/v1/conversations/{id}/turns", "ReadFunction"),
    ("GET", "/v1/conversations/{id}/turns/{turn}", "ReadFunction"),
    ("GET", "/v1/conversations/{id}/turns/{turn}/stream", "ReadFunction"),
    ("GET", "/v1/memories", "ReadFunction"),
    ("POST", "/v1/memories", "TurnFunction"),
    ("PATCH", "/v1/memories/{id}", "TurnFunction"),
    ("DELETE", "/v1/memories/{id}", "ClearFunction"),
    ("DELETE", "/v1/memories", "ClearFunction"),
    ("GET", "/v1/data-policy", "TurnFunction"),
    ("PUT", "/v1/data-policy", "TurnFunction"),
}

#: What the functions read from their environment (see ``turnledger.core.config``).
FUNCTION_ENVIRONMENT = {
    "TABLE_NAME",
    "BUCKET_NAME",
    "KEYS_TABLE_NAME",
    "CONTENT_KMS_KEY_ID",
    "TENANT_KMS_KEY_IDS",
    "TTL_SECONDS",
    "TENANT_CLAIM",
    "PROVIDER",
    "MODEL",
    "OPENAI_BASE_URL",
    "OPENAI_API_KEY_SECRET",
    "TOOLS_PARAMETER",
    "OFFLOAD_THRESHOLD_BYTES",
    "MAX_INPUT_BYTES",
    "APPROVAL_TTL_SECONDS",
    "MAX_TOOL_STEPS",
    "POWERTOOLS_LOG_LEVEL",
    "LOG_LEVEL",
    "NOTIFICATIONS_BUS",
    "NOTIFY_INCLUDE_ARGUMENTS",
    "NOTIFY_SECRET_ARN",
}


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return load_template()


def resource(template: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = template["Resources"][name]
    return found


def props(template: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = resource(template, name)["Properties"]
    return found


def policy_names(template: dict[str, Any], function: str) -> list[str]:
    """Policy template names of ``function``, conditional ones included."""
    names: list[str] = []
    for policy in props(template, function).get("Policies") or []:
        if "Fn::If" in policy:
            _, when_set, when_unset = policy["Fn::If"]
            assert when_unset == {"Ref": "AWS::NoValue"}
            policy = when_set
        names.extend(policy if isinstance(policy, dict) else [policy])
    return names


def load_event(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((EVENTS_DIR / name).read_text(encoding="utf-8"))
    return loaded


# --- functions and routes ------------------------------------------------------------------


def test_routes_are_the_contracts(template: dict[str, Any]) -> None:
    found = {(route.method, route.path, route.function) for route in routes(template)}
    assert found == CONTRACT_ROUTES


def test_routes_go_through_the_one_http_api(template: dict[str, Any]) -> None:
    for spec in functions(template).values():
        for event in props(template, spec.name).get("Events", {}).values():
            if event["Type"] == "HttpApi":
                assert event["Properties"]["ApiId"] == {"Ref": "HttpApi"}


def test_only_the_openapi_document_the_approval_page_and_callbacks_are_open(
    template: dict[str, Any],
) -> None:
    # A callback's signed token is its credential (turnledger.turn.callbacks); the approval page
    # is static: it calls the JSON routes with the token its user pastes.
    open_routes = {route.route_key for route in routes(template) if not route.authorized}
    assert open_routes == {"GET /v1/openapi.json", "POST /v1/callbacks/{token}", "GET /approvals"}


def test_callback_signing_key_is_a_generated_secret(template: dict[str, Any]) -> None:
    secret = template["Resources"]["CallbackSigningSecret"]
    assert secret["Type"] == "AWS::SecretsManager::Secret"
    assert secret["Properties"]["GenerateSecretString"]["PasswordLength"] >= 32
    for name in ("TurnFunction", "ApproveFunction", "TurnWorkerFunction"):
        variables = props(template, name)["Environment"]["Variables"]
        assert variables["CALLBACK_SECRET_ARN"] == {"Ref": "CallbackSigningSecret"}
        assert "PUBLIC_BASE_URL" in variables
        policies = props(template, name)["Policies"]
        assert {
            "AWSSecretsManagerGetSecretValuePolicy": {"SecretArn": {"Ref": "CallbackSigningSecret"}}
        } in policies


def test_the_jwt_authorizer_guards_every_route_but_the_open_ones(
    template: dict[str, Any],
) -> None:
    """No default authorizer (a route left out would then be open, and is caught here): each
    route names JwtAuthorizer, but the three whose credential is not a JWT, which name none."""
    auth = props(template, "HttpApi")["Auth"]
    assert "DefaultAuthorizer" not in auth
    open_routes = {
        ("POST", "/v1/callbacks/{token}"),
        ("GET", "/v1/openapi.json"),
        ("GET", "/approvals"),
    }
    named = {
        (str(event["Properties"]["Method"]).upper(), event["Properties"]["Path"]): event[
            "Properties"
        ].get("Auth")
        for name in functions(template)
        for event in (props(template, name).get("Events") or {}).values()
        if event["Type"] == "HttpApi"
    }
    assert {route for route, auth in named.items() if auth is None} == open_routes
    assert all(
        auth == {"Authorizer": "JwtAuthorizer"}
        for route, auth in named.items()
        if route not in open_routes
    )
    authorizer = auth["Authorizers"]["JwtAuthorizer"]
    assert authorizer["IdentitySource"] == "$request.header.Authorization"
    assert authorizer["JwtConfiguration"] == {
        "issuer": {"Ref": "JwtIssuer"},
        "audience": {"Ref": "JwtAudience"},
    }
    assert template["Parameters"]["JwtAudience"]["Type"] == "CommaDelimitedList"


def test_every_function_has_its_own_thin_handler(template: dict[str, Any]) -> None:
    specs = functions(template)
    assert set(specs) == {
        "TurnFunction",
        "ApproveFunction",
        "ReadFunction",
        "ClearFunction",
        "SweepFunction",
        "TurnWorkerFunction",
        "StreamFunction",
    }
    code_uris = [spec.code_uri for spec in specs.values()]
    assert len(set(code_uris)) == len(code_uris)
    for spec in specs.values():
        # The Lambda Web Adapter runs the streaming function's script, which serves its app.
        assert spec.handler == ("run.sh" if spec.name == "StreamFunction" else "app.lambda_handler")
        assert re.fullmatch(r"functions/[a-z]+/", spec.code_uri)
        source = (PROJECT_ROOT / spec.code_uri / "app.py").read_text(encoding="utf-8")
        assert "lambda_handler" in source


def test_globals_run_python_313_on_arm64_with_the_layer(template: dict[str, Any]) -> None:
    defaults = template["Globals"]["Function"]
    assert defaults["Runtime"] == "python3.13"
    assert defaults["Architectures"] == ["arm64"]
    assert defaults["Layers"][0] == {"Ref": "TurnledgerLayer"}
    # The other: the ADOT layer, with Observability on (test_the_observability_parameter...).
    assert [layer["Fn::If"][0] for layer in defaults["Layers"][1:]] == ["TelemetryOn"]


@pytest.mark.parametrize(
    ("tracing", "mode", "sdk_disabled"),
    [
        ("Invocations", "Active", "true"),
        ("Calls", "Active", "false"),
        ("Off", "PassThrough", "true"),
    ],
)
def test_the_tracing_parameter_sets_lambdas_tracing_and_the_x_ray_sdk(
    template: dict[str, Any], tracing: str, mode: str, sdk_disabled: str
) -> None:
    """Lambda traces every invocation unless ``Tracing=Off``; the X-Ray SDK (about 0.3 s of
    every init) is created only with ``Tracing=Calls`` (POWERTOOLS_TRACE_DISABLED)."""
    parameter = template["Parameters"]["Tracing"]
    assert parameter["Default"] == "Invocations"
    assert tracing in parameter["AllowedValues"]
    deployed = copy.deepcopy(template)
    deployed["Parameters"]["Tracing"]["Default"] = tracing
    defaults = deployed["Globals"]["Function"]
    assert resolve(defaults["Tracing"], deployed, "stack") == mode
    variables = defaults["Environment"]["Variables"]
    assert resolve(variables["POWERTOOLS_TRACE_DISABLED"], deployed, "stack") == sdk_disabled


@pytest.mark.parametrize(
    ("observability", "endpoint", "adot_layer"),
    [
        ("none", NO_VALUE, False),
        ("adot", "http://localhost:4318", True),
        ("otlp", "https://collector.example.com:4318", True),
    ],
)
def test_the_observability_parameter_sends_spans_and_turns_the_x_ray_sdk_off(
    template: dict[str, Any], observability: str, endpoint: str, adot_layer: bool
) -> None:
    """``Observability``: none adds nothing; adot the ADOT layer, spans to its collector
    extension; otlp the same layer, spans to ``OtlpEndpoint``. With either, the X-Ray SDK
    stays off even under ``Tracing=Calls``."""
    parameter = template["Parameters"]["Observability"]
    assert parameter["Default"] == "none"
    assert parameter["AllowedValues"] == ["none", "adot", "otlp"]
    deployed = copy.deepcopy(template)
    deployed["Parameters"]["Observability"]["Default"] = observability
    deployed["Parameters"]["OtlpEndpoint"]["Default"] = "https://collector.example.com:4318"
    deployed["Parameters"]["Tracing"]["Default"] = "Calls"
    defaults = deployed["Globals"]["Function"]
    variables = defaults["Environment"]["Variables"]
    assert resolve(variables["TURNLEDGER_OTLP_ENDPOINT"], deployed, "stack") == endpoint
    layers = [resolve(layer, deployed, "stack") for layer in defaults["Layers"][1:]]
    adot = "arn:aws:lambda:us-east-1:901920570463:layer:aws-otel-python-arm64-ver-1-25-0:1"
    if adot_layer:
        # The ADOT layer's ARN (a Sub, not resolved here), unless one is given.
        deployed["Parameters"]["OpenTelemetryLayerArn"]["Default"] = adot
        layers = [resolve(layer, deployed, "stack") for layer in defaults["Layers"][1:]]
        assert layers == [adot]
    else:
        assert layers == [NO_VALUE]
    tracer_off = resolve(variables["POWERTOOLS_TRACE_DISABLED"], deployed, "stack")
    assert tracer_off == ("false" if observability == "none" else "true")


def test_api_functions_end_before_the_http_api_gives_up(template: dict[str, Any]) -> None:
    """An HTTP API integration times out after 30 s; a turn running longer is lost."""
    api_functions = {route.function for route in routes(template)}
    for name in api_functions:
        assert functions(template)[name].timeout_seconds < 30


def test_layer_is_built_for_the_functions_runtime(template: dict[str, Any]) -> None:
    layer = resource(template, "TurnledgerLayer")
    assert layer["Type"] == "AWS::Serverless::LayerVersion"
    assert layer["Properties"]["ContentUri"] == "layers/turnledger/"
    # Built by layers/turnledger/Makefile: the arm64 wheels and every module's bytecode.
    assert layer["Metadata"] == {"BuildMethod": "makefile", "BuildArchitecture": "arm64"}
    makefile = (PROJECT_ROOT / "layers" / "turnledger" / "Makefile").read_text(encoding="utf-8")
    assert "\nbuild-TurnledgerLayer:" in makefile
    assert layer["Properties"]["CompatibleRuntimes"] == ["python3.13"]
    assert layer["Properties"]["CompatibleArchitectures"] == ["arm64"]


def _requirement_names(lines: list[str]) -> set[str]:
    names = set()
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(re.split(r"[\[<>=~! ;]", line, maxsplit=1)[0].lower())
    return names


def test_layer_requirements_are_the_packages_dependencies() -> None:
    requirements = (PROJECT_ROOT / "layers/turnledger/requirements.txt").read_text().splitlines()
    pyproject = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
    assert _requirement_names(requirements) == _requirement_names(
        pyproject["project"]["dependencies"]
    )


# --- environment ---------------------------------------------------------------------------


def _resolved_environment(template: dict[str, Any]) -> dict[str, str]:
    """The functions' environment with every parameter at its default."""
    parameters = template["Parameters"]
    resolved: dict[str, str] = {}
    for name, value in template["Globals"]["Function"]["Environment"]["Variables"].items():
        if isinstance(value, dict) and set(value) == {"Ref"} and value["Ref"] in parameters:
            resolved[name] = str(parameters[value["Ref"]]["Default"])
        elif isinstance(value, str):
            resolved[name] = value
        else:  # a resource reference: a physical name only a deployment knows
            resolved[name] = f"<{name}>"
    return resolved


def test_functions_get_every_setting_they_read(template: dict[str, Any]) -> None:
    variables = template["Globals"]["Function"]["Environment"]["Variables"]
    assert set(variables) >= FUNCTION_ENVIRONMENT
    assert variables["TABLE_NAME"] == {"Ref": "ConversationsTable"}
    assert variables["BUCKET_NAME"] == {"Ref": "ArtifactsBucket"}
    # Idempotency records live in the conversations table (api/idempotency.py).
    assert "IDEMPOTENCY_TABLE_NAME" not in variables
    # Left to the code's default (the environment's 4 KB are spent): the same name.
    assert "POWERTOOLS_SERVICE_NAME" not in variables
    assert observability.SERVICE == "turnledger"


#: The JSON maps, given only to the functions that use them (Lambda's 4 KB of environment).
#: The functions that run turns (the streaming function streams them).
TURN_RUNNERS = {"TurnFunction", "ApproveFunction", "TurnWorkerFunction", "StreamFunction"}
MAP_ENVIRONMENT = {
    "TENANT_TTL_SECONDS": TURN_RUNNERS,
    "TENANT_CONVERSATION_TOKEN_BUDGET": TURN_RUNNERS,
    "TENANT_TURN_TOKEN_BUDGET": TURN_RUNNERS,
    "MODELS": TURN_RUNNERS | {"ReadFunction"},
}


def test_json_maps_go_only_to_the_functions_that_use_them(template: dict[str, Any]) -> None:
    assert not set(MAP_ENVIRONMENT) & set(
        template["Globals"]["Function"]["Environment"]["Variables"]
    )
    for variable, users in MAP_ENVIRONMENT.items():
        given = {
            name
            for name in functions(template)
            if variable in (props(template, name).get("Environment") or {}).get("Variables", {})
        }
        assert given == users, variable


def test_parameter_defaults_are_the_settings_defaults(template: dict[str, Any]) -> None:
    """An operator who changes nothing gets what config.py documents (no empty overrides)."""
    settings = Settings.from_env(_resolved_environment(template))
    defaults = Settings()
    for name in (
        "ttl_seconds",
        "tenant_ttl_seconds",
        "tenant_claim",
        "approver_claim",
        "approver_scope",
        "approval_four_eyes",
        "provider",
        "model",
        "openai_base_url",
        "openai_api_key_secret",
        "tools_parameter",
        "offload_threshold_bytes",
        "max_input_bytes",
        "approval_ttl_seconds",
        "max_tool_steps",
        "memory_enabled",
        "memory_max_records",
        "memory_user_scope",
    ):
        assert getattr(settings, name) == getattr(defaults, name), name


def test_optional_parameters_default_to_off(template: dict[str, Any]) -> None:
    parameters = template["Parameters"]
    for name in ("OpenAIApiKeySecretArn", "ToolsParameterName", "ToolLambdaArnPattern"):
        assert parameters[name]["Default"] == ""
    assert parameters["SweepSchedule"]["Default"] == "rate(1 hour)"
    assert parameters["Provider"]["AllowedValues"] == [
        "demo",
        "openai-chat",
        "openai-responses",
        "bedrock-converse",
    ]
    assert parameters["BedrockModelIds"] == {
        "Type": "CommaDelimitedList",
        "Default": "",
        "Description": parameters["BedrockModelIds"]["Description"],
    }


# --- least privilege -----------------------------------------------------------------------


def test_only_the_functions_whose_code_reads_them_reach_secrets_and_parameters(
    template: dict[str, Any],
) -> None:
    """Least privilege, and enough (tests/http/test_http_permissions.py proves the second
    from the code): the model callers read keys, the tool registry and the redaction rules;
    the read function the parameters its context route rebuilds with; clear, erasure and
    the sweep the provider's key to delete stored responses; the sweep the notify key and
    the registry naming the webhooks it tells of expiries."""
    model_callers = TURN_RUNNERS
    for function in functions(template):
        names = policy_names(template, function)
        reads_secret = function in model_callers | {"SweepFunction", "ClearFunction"}
        reads_parameter = function in model_callers | {"ReadFunction", "SweepFunction"}
        assert ("AWSSecretsManagerGetSecretValuePolicy" in names) is reads_secret, function
        assert ("SSMParameterWithSlashPrefixReadPolicy" in names) is reads_parameter, function
    sweep_secrets = [
        policy["Fn::If"][1]["AWSSecretsManagerGetSecretValuePolicy"]["SecretArn"]
        for policy in props(template, "SweepFunction")["Policies"]
        if "Fn::If" in policy and "AWSSecretsManagerGetSecretValuePolicy" in policy["Fn::If"][1]
    ]
    assert sweep_secrets == [{"Ref": "NotifySecretArn"}, {"Ref": "OpenAIApiKeySecretArn"}]


def test_optional_permissions_exist_only_when_their_parameter_is_set(
    template: dict[str, Any],
) -> None:
    conditions = template["Conditions"]
    expected = {
        "HasOpenAIApiKeySecret": "OpenAIApiKeySecretArn",
        "HasToolsParameter": "ToolsParameterName",
        "HasToolLambdaArnPattern": "ToolLambdaArnPattern",
        "HasRedactionParameter": "RedactionParameterName",
        "HasNotifySecret": "NotifySecretArn",
    }
    for condition, parameter in expected.items():
        assert conditions[condition] == {"Fn::Not": [{"Fn::Equals": [{"Ref": parameter}, ""]}]}
    # A list parameter is "set" when its items joined are not empty.
    assert conditions["HasBedrockModelIds"] == {
        "Fn::Not": [{"Fn::Equals": [{"Fn::Join": ["", {"Ref": "BedrockModelIds"}]}, ""]}]
    }
    assert resource(template, "BedrockModelsPolicy")["Condition"] == "HasBedrockModelIds"
    conditional = [
        policy["Fn::If"]
        for policy in props(template, "TurnFunction")["Policies"]
        if "Fn::If" in policy
    ]
    assert {condition for condition, _, _ in conditional} == set(expected)
    invoke = next(
        when for condition, when, _ in conditional if condition == "HasToolLambdaArnPattern"
    )
    assert invoke["Statement"] == [
        {
            "Sid": "InvokeLambdaTools",
            "Effect": "Allow",
            "Action": "lambda:InvokeFunction",
            "Resource": {"Ref": "ToolLambdaArnPattern"},
        }
    ]


def _conditional_policies(template: dict[str, Any], function: str) -> dict[str, set[str]]:
    """Condition -> the parameters the ``function``'s conditional policy templates name."""
    found: dict[str, set[str]] = {}
    for policy in props(template, function).get("Policies") or []:
        if "Fn::If" not in policy:
            continue
        condition, when_set, _ = policy["Fn::If"]
        for argument in when_set.values():
            if isinstance(argument, dict):
                refs = {v["Ref"] for v in argument.values() if isinstance(v, dict) and "Ref" in v}
                found.setdefault(condition, set()).update(refs)
    return found


def test_the_context_route_may_read_the_tools_and_redaction_parameters(
    template: dict[str, Any],
) -> None:
    """Issue 47, point 4: GET .../turns/{n}/context (the read function) rebuilds what each
    model call was sent, with the tool registry and the redaction rules: without
    ssm:GetParameter on their parameters it answered 500 when either was set."""
    [route] = [r for r in routes(template) if r.path.endswith("/turns/{turn}/context")]
    conditional = _conditional_policies(template, route.function)
    assert "SSMParameterWithSlashPrefixReadPolicy" in policy_names(template, route.function)
    assert conditional["HasToolsParameter"] == {"ToolsParameterName"}
    assert conditional["HasRedactionParameter"] == {"RedactionParameterName"}


def test_what_deletes_stored_responses_may_read_the_providers_key(
    template: dict[str, Any],
) -> None:
    """Issue 47, points 6 and 7: clear and erasure (the clear function) and the sweep delete
    openai-responses' stored responses with the provider's key; the sweep tells expiries to
    the notify webhooks the tool registry names."""
    for function in ("ClearFunction", "SweepFunction"):
        conditional = _conditional_policies(template, function)
        assert conditional["HasOpenAIApiKeySecret"] == {"OpenAIApiKeySecretArn"}, function
    assert _conditional_policies(template, "SweepFunction")["HasToolsParameter"] == {
        "ToolsParameterName"
    }


def test_bedrock_may_invoke_only_the_configured_models_and_profiles(
    template: dict[str, Any],
) -> None:
    """Issue 47, point 8: an id may be a foundation model or a cross-Region inference
    profile (``us.``...), whose calls are authorized on the profile and on the model in
    each Region it routes to, allowed only through the configured profiles."""
    for function in functions(template):
        assert "HasBedrockModelIds" not in _conditional_policies(template, function), function
    policy = resource(template, "BedrockModelsPolicy")
    assert policy["Condition"] == "HasBedrockModelIds"
    assert {role["Ref"] for role in policy["Properties"]["Roles"]} == {
        f"{function}Role" for function in TURN_RUNNERS
    }
    models, through = policy["Properties"]["PolicyDocument"]["Statement"]
    # Every turn streams into its draft (ConverseStream is InvokeModelWithResponseStream).
    expected = ["bedrock:InvokeModel", "bedrock:InvokeModelWithResponseStream"]
    assert models["Action"] == expected == through["Action"]
    # Fn::Join takes no function as its delimiter: CloudFormation refuses a stack whose
    # delimiter is a Fn::Sub (cfn-lint's E1018), so the prefixes are literals.
    model = "arn:*:bedrock:*::foundation-model/"
    profile = "arn:*:bedrock:*:*:inference-profile/"

    def each(prefix: str) -> list[Any]:
        return [prefix, {"Fn::Join": ["," + prefix, {"Ref": "BedrockModelIds"}]}]

    assert models["Resource"] == {
        "Fn::Split": [",", {"Fn::Join": ["", [*each(model), "," + profile, each(profile)[1]]]}]
    }
    assert through["Resource"] == {"Fn::Sub": "arn:${AWS::Partition}:bedrock:*::foundation-model/*"}
    assert through["Condition"] == {
        "StringLike": {
            "bedrock:InferenceProfileArn": {"Fn::Split": [",", {"Fn::Join": ["", each(profile)]}]}
        }
    }
    for join in _joins(template):
        assert isinstance(join[0], str), f"a Fn::Join delimiter must be a literal: {join[0]}"


def _joins(node: Any) -> list[list[Any]]:
    """Every Fn::Join's arguments in a part of the template."""
    if isinstance(node, dict):
        found = [node["Fn::Join"]] if "Fn::Join" in node else []
        return found + [join for value in node.values() for join in _joins(value)]
    if isinstance(node, list):
        return [join for value in node for join in _joins(value)]
    return []


# --- tenant isolation ----------------------------------------------------------------------

#: The functions serving one tenant's requests: they reach data only through TenantAccessRole.
API_FUNCTIONS = ("TurnFunction", "ApproveFunction", "ReadFunction", "ClearFunction")
#: ... and the turn worker, which runs a tenant's long turns (issue 13).
TENANT_FUNCTIONS = (*API_FUNCTIONS, "TurnWorkerFunction", "StreamFunction")
#: SAM policy templates a function may use. DynamoDBCrudPolicy/DynamoDBReadPolicy grant Scan;
#: S3CrudPolicy/S3ReadPolicy grant bucket configuration (lifecycle, location).
ALLOWED_POLICY_TEMPLATES = {
    "AWSSecretsManagerGetSecretValuePolicy",
    "SSMParameterWithSlashPrefixReadPolicy",
    # Only the turn worker's function, by name (the turn and approval functions start it).
    "LambdaInvokePolicy",
}
#: Every data action any policy may allow.
ALLOWED_DATA_ACTIONS = (
    set(TENANT_DYNAMODB_ACTIONS) | set(TENANT_S3_OBJECT_ACTIONS) | {"s3:ListBucket"}
)


def string_like(pattern: str, value: str) -> bool:
    """IAM's ``StringLike``: ``*`` any run of characters, ``?`` one, the rest literal."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, flags=re.DOTALL) is not None


def statements_of(template: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every IAM statement of the template, with where it is: functions' inline
    statements (conditional ones included), roles' and managed policies' documents."""
    found: list[tuple[str, dict[str, Any]]] = []
    for name, res in template["Resources"].items():
        properties = res.get("Properties", {})
        if res["Type"] == "AWS::Serverless::Function":
            for policy in properties.get("Policies") or []:
                if "Fn::If" in policy:
                    policy = policy["Fn::If"][1]
                found.extend((name, st) for st in policy.get("Statement", []))
        elif res["Type"] == "AWS::IAM::Role":
            for policy in properties.get("Policies", []):
                found.extend((name, st) for st in policy["PolicyDocument"]["Statement"])
        elif res["Type"] in {"AWS::IAM::Policy", "AWS::S3::BucketPolicy"}:
            found.extend((name, st) for st in properties["PolicyDocument"]["Statement"])
    return found


def actions(statement: dict[str, Any]) -> list[str]:
    found = statement["Action"]
    return [found] if isinstance(found, str) else list(found)


def test_no_policy_template_grants_scan_or_bucket_configuration(
    template: dict[str, Any],
) -> None:
    for function in functions(template):
        templates = {name for name in policy_names(template, function) if name != "Statement"}
        assert templates <= ALLOWED_POLICY_TEMPLATES, function


def test_no_policy_allows_scan_wildcards_or_bucket_configuration(
    template: dict[str, Any],
) -> None:
    statements = statements_of(template)
    assert statements
    for where, statement in statements:
        if statement["Effect"] == "Deny":
            continue  # the bucket policy's deny of plain HTTP names s3:*, and only denies
        for action in actions(statement):
            service = action.split(":")[0]
            if service in {"dynamodb", "s3"}:
                assert action in ALLOWED_DATA_ACTIONS, (where, action)
            assert "*" not in action, (where, action)


def test_tenant_role_is_assumed_only_by_the_api_functions_with_a_tenant_tag(
    template: dict[str, Any],
) -> None:
    role = props(template, "TenantAccessRole")
    [trust] = role["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Effect"] == "Allow"
    assert sorted(trust["Principal"]["AWS"], key=str) == sorted(
        ({"Fn::GetAtt": f"{f}Role.Arn"} for f in TENANT_FUNCTIONS), key=str
    )
    assert sorted(actions(trust)) == ["sts:AssumeRole", "sts:TagSession"]
    condition = trust["Condition"]
    assert condition["Null"] == {f"aws:RequestTag/{TENANT_TAG}": "false"}
    assert condition["ForAllValues:StringEquals"] == {"aws:TagKeys": [TENANT_TAG]}
    assert role["MaxSessionDuration"] == 3600


def test_tenant_role_allows_item_actions_on_conversation_partitions_only(
    template: dict[str, Any],
) -> None:
    [policy] = props(template, "TenantAccessRole")["Policies"]
    by_sid = {st["Sid"]: st for st in policy["PolicyDocument"]["Statement"]}
    assert set(by_sid) == {
        "ConversationItems",
        "ConversationObjects",
        "ListConversationObjects",
        "ApprovalInbox",
    }
    items = by_sid["ConversationItems"]
    assert tuple(actions(items)) == TENANT_DYNAMODB_ACTIONS
    # The table only: no index (by-expiry and by-tenant list every tenant's heads).
    assert items["Resource"] == {"Fn::GetAtt": "ConversationsTable.Arn"}
    [pattern] = items["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
    assert items["Condition"]["Null"] == {"dynamodb:LeadingKeys": "false"}
    for tenant in ("a", "a:b", "x,y=z@q+r", "A" * 128):
        assert string_like(pattern, keys.tenant_partition_prefix(tenant) + "c1")
    assert not string_like(pattern, CURSOR_PK)
    # The inbox index only, queried only, under the same leading-keys condition: its
    # partition key is the tenant's prefix, which the session policy narrows to the caller.
    listing = by_sid["ApprovalInbox"]
    assert listing["Action"] == "dynamodb:Query"
    assert listing["Resource"] == {"Fn::Sub": f"${{ConversationsTable.Arn}}/index/{INBOX_INDEX}"}
    assert listing["Condition"] == items["Condition"]
    for tenant in ("a", "a:b", "x,y=z@q+r"):
        assert string_like(pattern, inbox_partition(tenant))
    objects = by_sid["ConversationObjects"]
    assert tuple(actions(objects)) == TENANT_S3_OBJECT_ACTIONS
    assert objects["Resource"] == {"Fn::Sub": "${ArtifactsBucket.Arn}/t/*"}
    assert keys.tenant_blob_prefix("a:b").startswith("t/")
    listing = by_sid["ListConversationObjects"]
    assert actions(listing) == ["s3:ListBucket"]
    assert listing["Resource"] == {"Fn::GetAtt": "ArtifactsBucket.Arn"}
    assert listing["Condition"] == {"StringLike": {"s3:prefix": "t/*"}}


def test_api_functions_reach_data_only_through_the_tenant_role(
    template: dict[str, Any],
) -> None:
    assume = props(template, "TenantAccessAssumePolicy")
    assert sorted(r["Ref"] for r in assume["Roles"]) == sorted(f"{f}Role" for f in TENANT_FUNCTIONS)
    [statement] = assume["PolicyDocument"]["Statement"]
    assert sorted(actions(statement)) == ["sts:AssumeRole", "sts:TagSession"]
    assert statement["Resource"] == {"Fn::GetAtt": "TenantAccessRole.Arn"}
    statements = statements_of(template)
    for function in TENANT_FUNCTIONS:
        assert resource(template, function)["DependsOn"] == "TenantAccessAssumePolicy"
        variables = props(template, function)["Environment"]["Variables"]
        assert variables["TENANT_ROLE_ARN"] == {"Fn::GetAtt": "TenantAccessRole.Arn"}
        data = [
            st
            for where, st in statements
            if where == function and any(a.split(":")[0] in {"dynamodb", "s3"} for a in actions(st))
        ]
        # Tenant erasure lists the tenant's conversations on its own role (keys only, from
        # the by-tenant index), and clears them through the tenant role (issue 22).
        if function == "ClearFunction":
            assert {st["Sid"] for st in data} == {"ListTenantConversations"}
        else:
            assert data == [], function
    # The read function's own policies read the context route's parameters only.
    assert set(policy_names(template, "ReadFunction")) == {"SSMParameterWithSlashPrefixReadPolicy"}


def test_system_functions_query_only_their_index(template: dict[str, Any]) -> None:
    expected = {"SweepFunction": [EXPIRY_INDEX, WAIT_INDEX], "ClearFunction": [TENANT_INDEX]}
    for function, indexes in expected.items():
        statements = {st["Sid"]: st for where, st in statements_of(template) if where == function}
        queries = [
            st
            for st in statements.values()
            if st["Resource"] != {"Fn::GetAtt": "ConversationsTable.Arn"}
            and any(a.startswith("dynamodb:") for a in actions(st))
        ]
        assert all(actions(query) == ["dynamodb:Query"] for query in queries)
        assert sorted(query["Resource"]["Fn::Sub"] for query in queries) == sorted(
            f"${{ConversationsTable.Arn}}/index/{index}" for index in indexes
        )


# --- storage -------------------------------------------------------------------------------


def test_table_is_the_one_the_store_writes(template: dict[str, Any]) -> None:
    definition = table_definition(template, "ConversationsTable", "t")
    assert definition["KeySchema"] == [
        {"AttributeName": codec.A_PK, "KeyType": "HASH"},
        {"AttributeName": codec.A_SK, "KeyType": "RANGE"},
    ]
    indexes = {index["IndexName"]: index for index in definition["GlobalSecondaryIndexes"]}
    assert set(indexes) == {EXPIRY_INDEX, TENANT_INDEX, INBOX_INDEX, WAIT_INDEX}
    assert [k["AttributeName"] for k in indexes[WAIT_INDEX]["KeySchema"]] == [
        codec.A_WAIT_BUCKET,
        codec.A_PK,
    ]
    listing = indexes.pop(INBOX_INDEX)
    assert [k["AttributeName"] for k in listing["KeySchema"]] == [A_INBOX, A_INBOX_SORT]
    # What a listing decodes (schema version and body), never the whole item.
    assert listing["Projection"] == {
        "ProjectionType": "INCLUDE",
        "NonKeyAttributes": [codec.A_SCHEMA, codec.A_BODY],
    }
    assert [k["AttributeName"] for k in indexes[EXPIRY_INDEX]["KeySchema"]] == [
        codec.A_EXPIRY_BUCKET,
        codec.A_PK,
    ]
    assert [k["AttributeName"] for k in indexes[TENANT_INDEX]["KeySchema"]] == [
        codec.A_TENANT,
        codec.A_PK,
    ]
    assert all(index["Projection"] == {"ProjectionType": "KEYS_ONLY"} for index in indexes.values())
    assert ttl_attribute(template, "ConversationsTable") == codec.A_EXPIRES == "expires_at"


def test_table_is_protected_and_streams_keys_only(template: dict[str, Any]) -> None:
    table = resource(template, "ConversationsTable")
    assert table["DeletionPolicy"] == table["UpdateReplacePolicy"] == "Retain"
    properties = table["Properties"]
    assert properties["BillingMode"] == "PAY_PER_REQUEST"
    assert properties["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert properties["SSESpecification"]["SSEEnabled"] is True
    assert properties["DeletionProtectionEnabled"] is True
    assert properties["StreamSpecification"] == {"StreamViewType": "KEYS_ONLY"}


def test_no_separate_idempotency_table(template: dict[str, Any]) -> None:
    """Idempotency records share the conversations' partitions, so a purge removes them."""
    assert "IdempotencyTable" not in template["Resources"]
    assert ttl_attribute(template, "ConversationsTable") == "expires_at"


def test_bucket_is_private_encrypted_and_retained(template: dict[str, Any]) -> None:
    bucket = resource(template, "ArtifactsBucket")
    # Retained once created; a failed first create (issue 47, point 5) leaves none behind.
    assert bucket["DeletionPolicy"] == "RetainExceptOnCreate"
    assert bucket["UpdateReplacePolicy"] == "Retain"
    properties = bucket["Properties"]
    assert properties["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    assert properties["OwnershipControls"] == {
        "Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]
    }
    encryption = properties["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]
    # SSE-S3, or SSE-KMS under the customer key when KmsKeyArn is set.
    assert encryption["ServerSideEncryptionByDefault"]["SSEAlgorithm"] == {
        "Fn::If": ["HasKmsKey", "aws:kms", "AES256"]
    }
    assert "VersioningConfiguration" not in properties  # a clear leaves no old version
    rules = {rule["Id"]: rule for rule in properties["LifecycleConfiguration"]["Rules"]}
    assert rules["AbortIncompleteUploads"]["AbortIncompleteMultipartUpload"] == {
        "DaysAfterInitiation": 1
    }


def test_bucket_refuses_plain_http(template: dict[str, Any]) -> None:
    policy = props(template, "ArtifactsBucketPolicy")
    assert policy["Bucket"] == {"Ref": "ArtifactsBucket"}
    [statement] = policy["PolicyDocument"]["Statement"]
    assert statement["Effect"] == "Deny"
    assert statement["Principal"] == "*"
    assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert {"Fn::Sub": "${ArtifactsBucket.Arn}/*"} in statement["Resource"]


def test_outputs_are_described(template: dict[str, Any]) -> None:
    outputs = template["Outputs"]
    assert {"ApiUrl", "TableName", "BucketName"} <= set(outputs)
    assert all(output.get("Description") for output in outputs.values())


# --- the sweep -----------------------------------------------------------------------------


def _matches(pattern: Any, value: Any) -> bool:
    """Lambda event filtering, for the exact-value patterns the template uses."""
    if isinstance(pattern, list):
        return value in pattern
    if not isinstance(pattern, dict) or not isinstance(value, dict):
        return False
    return all(key in value and _matches(sub, value[key]) for key, sub in pattern.items())


@pytest.fixture(scope="module")
def stream_filter(template: dict[str, Any]) -> dict[str, Any]:
    event = props(template, "SweepFunction")["Events"]["TtlDeletions"]
    assert event["Type"] == "DynamoDB"
    assert event["Properties"]["Stream"] == {"Fn::GetAtt": "ConversationsTable.StreamArn"}
    [only] = event["Properties"]["FilterCriteria"]["Filters"]
    pattern: dict[str, Any] = json.loads(only["Pattern"])
    return pattern


def test_sweep_runs_on_the_operators_schedule(template: dict[str, Any]) -> None:
    sweep = scheduled_function(template)
    assert sweep is not None and sweep.name == "SweepFunction"
    schedule = props(template, "SweepFunction")["Events"]["Schedule"]["Properties"]
    assert schedule["Schedule"] == {"Ref": "SweepSchedule"}


def test_stream_filter_passes_a_ttl_deletion_of_a_head(stream_filter: dict[str, Any]) -> None:
    [record] = load_event("sweep-ttl-stream.json")["Records"]
    assert _matches(stream_filter, record)


@pytest.mark.parametrize(
    "change",
    [
        {"userIdentity": None},
        {"eventName": "MODIFY"},
        {"keys": {"pk": {"S": "T#acme#C#user-123"}, "sk": {"S": "E#000000000001"}}},
        {"userIdentity": {"type": "Service", "principalId": "someone.else"}},
    ],
    ids=["user-delete", "modify", "event-item", "other-principal"],
)
def test_stream_filter_drops_everything_else(
    stream_filter: dict[str, Any], change: dict[str, Any]
) -> None:
    [record] = load_event("sweep-ttl-stream.json")["Records"]
    if "keys" in change:
        record["dynamodb"]["Keys"] = change.pop("keys")
    for key, value in change.items():
        if value is None:
            record.pop(key)
        else:
            record[key] = value
    assert not _matches(stream_filter, record)


# --- sample events -------------------------------------------------------------------------


API_EVENTS = [
    "turn.json",
    "approve.json",
    "get-conversation.json",
    "get-events.json",
    "export.json",
    "import.json",
    "fork.json",
    "get-forks.json",
    "openai-create-conversation.json",
    "openai-response.json",
    "openai-chat-completion.json",
    "openai-get-conversation.json",
    "openai-list-items.json",
    "openai-delete-conversation.json",
    "openai-add-items.json",
    "openai-get-item.json",
    "openai-delete-item.json",
    "openai-other-get.json",
    "openai-other-post.json",
    "openai-other-put.json",
    "openai-other-patch.json",
    "openai-other-delete.json",
    "clear.json",
    "erase-tenant.json",
    "openapi.json",
    "cancel.json",
    "callback.json",
    "list-approvals.json",
    "approvals-page.json",
    "get-turn.json",
    "get-turn-stream.json",
    "list-memories.json",
    "add-memory.json",
    "edit-memory.json",
    "delete-memory.json",
    "delete-memories.json",
    "get-data-policy.json",
    "put-data-policy.json",
    "list-turns.json",
    "get-turn-context.json",
    "start-replay.json",
    "get-replay.json",
    "compact.json",
    "add-pin.json",
    "list-pins.json",
    "remove-pin.json",
    "get-state.json",
    "add-user-pin.json",
    "list-user-pins.json",
    "remove-user-pin.json",
]


def test_every_route_has_a_sample_event(template: dict[str, Any]) -> None:
    sampled = {load_event(name)["routeKey"] for name in API_EVENTS}
    assert sampled == {route.route_key for route in routes(template)}


@pytest.mark.parametrize("name", API_EVENTS)
def test_sample_event_matches_its_route(template: dict[str, Any], name: str) -> None:
    event = load_event(name)
    by_key = {route.route_key: route for route in routes(template)}
    route = by_key[event["routeKey"]]
    assert event["version"] == "2.0"
    assert event["requestContext"]["routeKey"] == event["routeKey"]
    assert event["requestContext"]["http"]["method"] == route.method
    assert event["requestContext"]["http"]["path"] == event["rawPath"]
    pattern = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(route.path))
    pattern = re.sub(r"\\\{(\w+)\\\+\\\}", r"(?P<\1>.+)", pattern)
    match = re.fullmatch(pattern, event["rawPath"])
    assert match is not None
    assert event.get("pathParameters", {}) == match.groupdict()
    if route.authorized:
        claims = event["requestContext"]["authorizer"]["jwt"]["claims"]
        assert claims["tenant_id"] and claims["sub"]
    else:
        assert "authorizer" not in event["requestContext"]
    if "body" in event:
        # An import's body is NDJSON (an export): one JSON object a line.
        lines = event["body"].splitlines() if route.path.endswith("/import") else [event["body"]]
        assert lines and all(isinstance(json.loads(line), dict) for line in lines)
        assert event["isBase64Encoded"] is False


def test_sample_scheduled_event_is_an_eventbridge_schedule() -> None:
    event = load_event("sweep-schedule.json")
    assert event["source"] == "aws.events"
    assert event["detail-type"] == "Scheduled Event"


def test_approval_notifications_go_to_the_stacks_own_bus(template: dict[str, Any]) -> None:
    """The bus exists, every function is told its name, and exactly the functions that
    record requests, decisions and expiries (turn, approve, sweep) may put events on it,
    on it only."""
    assert resource(template, "NotificationsBus")["Type"] == "AWS::Events::EventBus"
    variables = template["Globals"]["Function"]["Environment"]["Variables"]
    assert variables["NOTIFICATIONS_BUS"] == {"Ref": "NotificationsBus"}
    assert variables["NOTIFY_INCLUDE_ARGUMENTS"] == {"Ref": "NotifyIncludeArguments"}
    assert template["Parameters"]["NotifyIncludeArguments"]["Default"] == "false"
    for function in functions(template):
        publishing = [
            statement
            for policy in props(template, function).get("Policies", [])
            if isinstance(policy, dict)
            for statement in policy.get("Statement", [])
            if "events:PutEvents" in actions(statement)
        ]
        if function in TURN_RUNNERS | {"SweepFunction"}:
            assert [s["Resource"] for s in publishing] == [
                {"Fn::GetAtt": "NotificationsBus.Arn"}
            ], function
        else:
            assert publishing == [], function


# --- content keys (issue 24) --------------------------------------------------------------


def test_keys_table_has_no_point_in_time_recovery_and_is_protected(
    template: dict[str, Any],
) -> None:
    """Erasure deletes keys so that backups of the conversations table stay ciphertext: the
    keys table must have no restorable copy, said beside it (checkov skip with its reason),
    and must not be lost by accident (that would make every conversation unreadable)."""
    table = resource(template, "KeysTable")
    properties = table["Properties"]
    assert "PointInTimeRecoverySpecification" not in properties
    [skip] = table["Metadata"]["checkov"]["skip"]
    assert skip["id"] == "CKV_AWS_28" and "erasure" in skip["comment"]
    assert table["DeletionPolicy"] == table["UpdateReplacePolicy"] == "Retain"
    assert properties["DeletionProtectionEnabled"] is True
    assert properties["SSESpecification"]["SSEEnabled"] is True
    # The layout DynamoDBKeyItems reads and writes: ``name``, and ``owner`` indexed.
    definition = table_definition(template, "KeysTable", "k")
    assert definition["KeySchema"] == [{"AttributeName": "name", "KeyType": "HASH"}]
    [index] = definition["GlobalSecondaryIndexes"]
    assert index["IndexName"] == "by-owner"
    assert index["KeySchema"][0] == {"AttributeName": "owner", "KeyType": "HASH"}


def test_functions_get_the_content_keys_and_only_erasure_deletes_a_kms_key(
    template: dict[str, Any],
) -> None:
    variables = template["Globals"]["Function"]["Environment"]["Variables"]
    assert variables["KEYS_TABLE_NAME"] == {"Ref": "KeysTable"}
    assert variables["CONTENT_KMS_KEY_ID"] == {
        "Fn::If": ["HasKmsKey", {"Ref": "KmsKeyArn"}, {"Fn::GetAtt": "ContentKey.Arn"}]
    }
    assert variables["TENANT_KMS_KEY_IDS"] == {"Ref": "TenantKmsKeyIds"}
    policy = props(template, "ContentKeysPolicy")
    functions = [
        name
        for name, res in template["Resources"].items()
        if res["Type"] == "AWS::Serverless::Function"
    ]
    assert sorted(r["Ref"] for r in policy["Roles"]) == sorted(f"{f}Role" for f in functions)
    kms = [st for st in policy["PolicyDocument"]["Statement"] if st["Sid"] == "TenantKeys"]
    assert [sorted(actions(st)) for st in kms] == [["kms:Decrypt", "kms:GenerateDataKey"]]
    # Only with the tenant's encryption context: no other data key of the account.
    assert kms[0]["Condition"]["ForAllValues:StringEquals"] == {
        "kms:EncryptionContextKeys": ["turnledger:tenant"]
    }
    deleting = [
        (where, st)
        for where, st in statements_of(template)
        if "kms:ScheduleKeyDeletion" in actions(st)
    ]
    assert [where for where, _ in deleting] == ["TenantKeyDeletionPolicy"]
    assert props(template, "TenantKeyDeletionPolicy")["Roles"] == [{"Ref": "ClearFunctionRole"}]
    assert deleting[0][1]["Condition"] == {
        "StringEquals": {"aws:ResourceTag/turnledger:tenant-key": "true"}
    }
    key = resource(template, "ContentKey")
    assert key["Condition"] == "NoKmsKey" and key["Properties"]["EnableKeyRotation"] is True


def test_the_local_runner_opens_exactly_the_routes_the_deployed_api_opens(
    template: dict[str, Any],
) -> None:
    """The runner reads the same template: a route is open locally only where SAM opens it
    (no authorizer named and no default one, or ``NONE``)."""
    assert {(r.method, r.path) for r in routes(template) if not r.authorized} == {
        ("POST", "/v1/callbacks/{token}"),
        ("GET", "/v1/openapi.json"),
        ("GET", "/approvals"),
    }

    def guarded(api_auth: dict[str, Any] | None, route_auth: str | None, *, ref: bool) -> bool:
        spec: dict[str, Any] = {"Method": "GET", "Path": "/x"}
        if ref:
            spec["ApiId"] = {"Ref": "Api"}
        if route_auth is not None:
            spec["Auth"] = {"Authorizer": route_auth}
        fn = {
            "Type": "AWS::Serverless::Function",
            "Properties": {"Events": {"E": {"Type": "HttpApi", "Properties": spec}}},
        }
        api = {"Type": "AWS::Serverless::HttpApi", "Properties": {"Auth": api_auth or {}}}
        globals_ = {} if ref else {"HttpApi": {"Auth": api_auth or {}}}
        [route] = routes({"Globals": globals_, "Resources": {"Fn": fn, "Api": api}})
        return route.authorized

    default = {"DefaultAuthorizer": "Jwt"}
    for ref in (True, False):
        assert guarded(None, None, ref=ref) is False
        assert guarded(default, None, ref=ref) is True
        assert guarded(default, "NONE", ref=ref) is False
        assert guarded(None, "Jwt", ref=ref) is True
