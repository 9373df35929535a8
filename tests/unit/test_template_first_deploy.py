"""What a first ``sam deploy`` meets that no linter sees (issue 47, points 9 to 15): the
customer key's policy, the Region, an upgrade across new indexes, a key of another account,
the open routes' OpenAPI. Each on the template as CloudFormation receives it, translated
offline (``tests/support/sam.py``), and on docs/DEPLOY.md where the operator must act.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import pytest
from turnledger_local.template import (
    NO_VALUE,
    PROJECT_ROOT,
    load_template,
    parameter_values,
    resolve,
)

from tests.support.sam import REQUIRED_PARAMETERS, of_type, translate

DEPLOY_MD = PROJECT_ROOT / "docs" / "DEPLOY.md"
CUSTOMER_KEY = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
#: What CloudWatch Logs needs of a key that encrypts a log group (its developer guide).
LOGS_KEY_ACTIONS = {
    "kms:Encrypt*",
    "kms:Decrypt*",
    "kms:ReEncrypt*",
    "kms:GenerateDataKey*",
    "kms:Describe*",
}
LOGS_CONTEXT_KEY = "kms:EncryptionContext:aws:logs:arn"


@pytest.fixture(scope="module")
def translated() -> dict[str, Any]:
    return translate()


def _values(translated: dict[str, Any], **overrides: str) -> dict[str, str]:
    return parameter_values(translated, {**REQUIRED_PARAMETERS, **overrides})


def _deploy_md() -> str:
    return DEPLOY_MD.read_text(encoding="utf-8")


# --- point 9: a customer key must let CloudWatch Logs use it --------------------------------


def _lets_logs_use(statement: dict[str, Any]) -> bool:
    principal = statement.get("Principal") or {}
    service = principal.get("Service") if isinstance(principal, dict) else None
    actions = statement.get("Action")
    actions = {actions} if isinstance(actions, str) else set(actions or ())
    condition = (statement.get("Condition") or {}).get("ArnLike") or {}
    return (
        statement.get("Effect") == "Allow"
        and isinstance(service, str)
        and re.fullmatch(r"logs\.[^.]+\.amazonaws\.com", service) is not None
        and actions >= LOGS_KEY_ACTIONS
        and str(condition.get(LOGS_CONTEXT_KEY, "")).endswith(":log-group:*")
    )


@pytest.mark.parametrize(("key", "expected"), [("", NO_VALUE), (CUSTOMER_KEY, CUSTOMER_KEY)])
def test_every_log_group_is_encrypted_by_the_customer_key_or_by_logs_own(
    translated: dict[str, Any], key: str, expected: Any
) -> None:
    """Never by a key the stack creates without a statement for CloudWatch Logs: the log
    group's creation would fail on the first deploy."""
    values = _values(translated, KmsKeyArn=key)
    groups = of_type(translated, "AWS::Logs::LogGroup")
    assert len(groups) == 8
    for name, group in groups.items():
        assert resolve(translated, group["Properties"].get("KmsKeyId"), values) == expected, name


def test_a_key_the_stack_creates_for_a_log_group_lets_cloudwatch_logs_use_it(
    translated: dict[str, Any],
) -> None:
    """ContentKey wraps tenant keys and encrypts no log group; should one ever name a key of
    the stack, that key's policy must carry the statement DEPLOY.md gives operators."""
    created = of_type(translated, "AWS::KMS::Key")
    assert set(created) == {"ContentKey"}
    for key in ("", CUSTOMER_KEY):
        values = _values(translated, KmsKeyArn=key)
        for group in of_type(translated, "AWS::Logs::LogGroup").values():
            named = resolve(translated, group["Properties"].get("KmsKeyId"), values)
            if named is NO_VALUE:
                continue
            named = json.dumps(named)
            for name, resource in created.items():
                if name in named:
                    statements = resource["Properties"]["KeyPolicy"]["Statement"]
                    assert any(_lets_logs_use(s) for s in statements), name


def test_deploy_md_gives_the_key_policy_statement_cloudwatch_logs_needs() -> None:
    """Issue 47, point 9: the operator's key policy, as DEPLOY.md gives it to copy."""
    section = _deploy_md().split("## Customer key (`KmsKeyArn`)", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```json\n(.*?)```", section, flags=re.DOTALL)
    statement = json.loads(block)
    assert _lets_logs_use(statement)
    assert statement["Principal"] == {"Service": "logs.<region>.amazonaws.com"}
    assert statement["Condition"]["ArnLike"][LOGS_CONTEXT_KEY] == (
        "arn:aws:logs:<region>:<account>:log-group:*"
    )


@pytest.mark.parametrize("parameter", ["KmsKeyArn", "AlarmTopicArn"])
def test_deploy_md_lists_the_first_deploy_parameters(parameter: str) -> None:
    assert parameter in load_template()["Parameters"]
    rows = [line for line in _deploy_md().splitlines() if line.startswith(f"| `{parameter}`")]
    assert len(rows) == 1, parameter


# --- point 11: SnapStart is not offered in every Region -------------------------------------

#: The API functions: SnapStart applies to their published versions.
SNAPSTARTED = {"TurnFunction", "ApproveFunction", "ReadFunction", "ClearFunction"}


def _snapstarted(translated: dict[str, Any], region: str, **overrides: str) -> set[str]:
    values = {**_values(translated, **overrides), "AWS::Region": region}
    return {
        name
        for name, function in of_type(translated, "AWS::Lambda::Function").items()
        if resolve(translated, function["Properties"].get("SnapStart"), values)
        not in (NO_VALUE, None, {"ApplyOn": "None"})
    }


@pytest.mark.parametrize(
    "region",
    [
        "ap-southeast-6",  # Asia Pacific (New Zealand)
        "ap-east-2",  # Asia Pacific (Taipei)
        "mx-central-1",  # Mexico (Central)
        "eu-west-9",  # a Region opened after this template
    ],
)
def test_the_default_asks_no_snapstart_where_the_region_may_not_offer_it(
    translated: dict[str, Any], region: str
) -> None:
    """Issue 47, point 11: Lambda refuses SnapStart where it is not offered, and the
    stack's create fails; the default must deploy there, without a snapshot."""
    assert _snapstarted(translated, region) == set()
    # Asked for, it is asked for: the operator's choice, documented in DEPLOY.md.
    assert _snapstarted(translated, region, SnapStart="PublishedVersions") == SNAPSTARTED


@pytest.mark.parametrize("region", ["us-east-1", "eu-central-1", "ap-northeast-1"])
def test_the_default_snapstarts_the_api_functions_where_the_region_offers_it(
    translated: dict[str, Any], region: str
) -> None:
    assert _snapstarted(translated, region) == SNAPSTARTED
    assert _snapstarted(translated, region, SnapStart="None") == set()


# --- point 12: one new index per update -----------------------------------------------------

#: The conversations table's indexes before the approval inbox (issue 47: a stack deployed
#: then must gain by-inbox and by-wait).
INDEXES_BEFORE_THE_INBOX = {"by-expiry", "by-tenant"}


def _table(translated: dict[str, Any], **overrides: str) -> dict[str, Any]:
    properties = translated["Resources"]["ConversationsTable"]["Properties"]
    resolved: dict[str, Any] = resolve(translated, properties, _values(translated, **overrides))
    return resolved


def _indexes(translated: dict[str, Any], **overrides: str) -> set[str]:
    return {
        index["IndexName"]
        for index in _table(translated, **overrides).get("GlobalSecondaryIndexes", [])
    }


@pytest.mark.parametrize("indexes", ["all", "without-by-wait"])
def test_every_attribute_definition_is_a_key_of_the_table_or_an_index(
    translated: dict[str, Any], indexes: str
) -> None:
    """DynamoDB refuses an attribute definition that no key schema uses."""
    table = _table(translated, TableIndexes=indexes)
    keys = {key["AttributeName"] for key in table["KeySchema"]} | {
        key["AttributeName"]
        for index in table.get("GlobalSecondaryIndexes", [])
        for key in index["KeySchema"]
    }
    assert {a["AttributeName"] for a in table["AttributeDefinitions"]} == keys


def test_a_stack_from_before_the_new_indexes_upgrades_one_index_per_update(
    translated: dict[str, Any],
) -> None:
    """Issue 47, point 12: CloudFormation (DynamoDB) creates one global secondary index per
    table update; DEPLOY.md's two steps each add one, and end at the default."""
    assert len(_indexes(translated) - INDEXES_BEFORE_THE_INBOX) == 2
    steps = [INDEXES_BEFORE_THE_INBOX]
    steps += [_indexes(translated, TableIndexes=value) for value in ("without-by-wait", "all")]
    for before, after in itertools.pairwise(steps):
        assert before <= after and len(after - before) == 1, (before, after)
    assert steps[-1] == _indexes(translated) == {"by-expiry", "by-tenant", "by-inbox", "by-wait"}
    assert "TableIndexes=without-by-wait" in _deploy_md()


# --- point 15: the open routes in the OpenAPI body API Gateway imports -----------------------

#: The routes without the JWT authorizer (tests/unit/test_template.py: why each is open).
OPEN_ROUTES = {
    ("post", "/v1/callbacks/{token}"),
    ("get", "/v1/openapi.json"),
    ("get", "/approvals"),
}


def test_the_imported_body_opens_exactly_the_open_routes_and_guards_the_rest(
    translated: dict[str, Any],
) -> None:
    """What FailOnWarnings judges: the body SAM writes. Every route names the JWT authorizer,
    which the body defines, but for the three open ones, which name no security at all (not
    SAM's built-in NONE, a scheme the body would not define: DEPLOY.md, "The open routes and
    FailOnWarnings")."""
    (api,) = of_type(translated, "AWS::ApiGatewayV2::Api").values()
    assert api["Properties"]["FailOnWarnings"] is True
    body = api["Properties"]["Body"]
    assert set(body["components"]["securitySchemes"]) == {"JwtAuthorizer"}
    assert "security" not in body  # no API-wide default an open route would inherit
    found: dict[tuple[str, str], Any] = {
        (method, path): operation.get("security")
        for path, operations in body["paths"].items()
        for method, operation in operations.items()
    }
    assert {route for route, security in found.items() if security is None} == OPEN_ROUTES
    guarded = {route: security for route, security in found.items() if route not in OPEN_ROUTES}
    assert guarded and all(s == [{"JwtAuthorizer": []}] for s in guarded.values()), guarded
