"""What ``template.yaml`` holds against floods and scanners (issue 22, findings 5 and 7):
throttling on the HTTP API, reserved concurrency on every function (when
``ReservedConcurrency=on``: issue 47), the callback route's own limits."""

from __future__ import annotations

from typing import Any

import pytest
from turnledger.api.callback_gate import CALLBACK_ROUTE
from turnledger.turn import callbacks
from turnledger_local.template import (
    NO_VALUE,
    functions,
    load_template,
    parameter_values,
    resolve,
)

from tests.support.sam import of_type, translate

#: The functions behind the HTTP API's routes.
API_FUNCTIONS = ("TurnFunction", "ApproveFunction", "ReadFunction", "ClearFunction")
#: What an account has unless raised, and what Lambda keeps unreserved in it.
ACCOUNT_CONCURRENCY, UNRESERVED_MINIMUM = 1000, 100


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return load_template()


def parameter_default(template: dict[str, Any], value: Any) -> int:
    """The number ``value`` is, or the default of the parameter it names."""
    if isinstance(value, dict):
        return int(template["Parameters"][value["Ref"]]["Default"])
    return int(value)


def test_every_function_reserves_concurrency_from_its_parameter_only_when_on(
    template: dict[str, Any],
) -> None:
    """No hard-coded reservation: each is its own parameter's, behind ReservedConcurrency."""
    for name in functions(template):
        reserved = template["Resources"][name]["Properties"]["ReservedConcurrentExecutions"]
        condition, when_on, when_off = reserved["Fn::If"]
        assert condition == "ReservesConcurrency", name
        assert when_off == {"Ref": "AWS::NoValue"}, name
        parameter = template["Parameters"][when_on["Ref"]]
        # 0 would not mean "no reservation" but "never runs": off is the switch's.
        assert parameter["Type"] == "Number" and parameter["MinValue"] >= 1, name
    assert template["Conditions"]["ReservesConcurrency"] == {
        "Fn::Equals": [{"Ref": "ReservedConcurrency"}, "on"]
    }


@pytest.mark.parametrize(
    ("switch", "reserving"), [("off", set()), ("on", set(functions(load_template())))]
)
def test_the_switch_decides_whether_any_deployed_function_reserves(
    switch: str, reserving: set[str]
) -> None:
    """Issue 47, point 2: a new account's quota (10 or 50) refuses any reservation; with the
    switch off no function of the translated template reserves, on every one does."""
    translated = translate(parameters={"ReservedConcurrency": switch})
    values = parameter_values(translated, {"ReservedConcurrency": switch})
    found = {
        name
        for name, function in of_type(translated, "AWS::Lambda::Function").items()
        if resolve(translated, function["Properties"].get("ReservedConcurrentExecutions"), values)
        not in (None, NO_VALUE)
    }
    assert found == reserving


def test_reservations_are_off_by_default(template: dict[str, Any]) -> None:
    parameter = template["Parameters"]["ReservedConcurrency"]
    assert parameter["Default"] == "off"
    assert set(parameter["AllowedValues"]) == {"off", "on"}


def test_reservations_when_on_leave_the_account_its_unreserved_share(
    template: dict[str, Any],
) -> None:
    """Every function reserves some, and the defaults together fit a default account."""
    total = 0
    for name in functions(template):
        value = template["Resources"][name]["Properties"]["ReservedConcurrentExecutions"]
        total += parameter_default(template, value["Fn::If"][1])
    assert total <= ACCOUNT_CONCURRENCY - UNRESERVED_MINIMUM


def test_the_http_api_throttles_and_the_callback_route_more(template: dict[str, Any]) -> None:
    api = template["Resources"]["HttpApi"]["Properties"]
    default = api["DefaultRouteSettings"]
    rate = parameter_default(template, default["ThrottlingRateLimit"])
    burst = parameter_default(template, default["ThrottlingBurstLimit"])
    assert rate >= 1 and burst >= rate
    callback = api["RouteSettings"][CALLBACK_ROUTE]
    assert 1 <= parameter_default(template, callback["ThrottlingRateLimit"]) < rate
    assert 1 <= parameter_default(template, callback["ThrottlingBurstLimit"]) < burst


def test_the_callback_function_gets_the_callback_body_limit(template: dict[str, Any]) -> None:
    variables = template["Resources"]["ApproveFunction"]["Properties"]["Environment"]["Variables"]
    limit = parameter_default(template, variables["CALLBACK_MAX_INPUT_BYTES"])
    assert limit == callbacks.DEFAULT_MAX_INPUT_BYTES


# --- checkov: every check passes or is skipped with its reason ------------------------------


def checkov_skips(template: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (name, skip)
        for name, resource in template["Resources"].items()
        for skip in ((resource.get("Metadata") or {}).get("checkov") or {}).get("skip") or []
    ]


def test_every_checkov_skip_gives_its_reason(template: dict[str, Any]) -> None:
    """``make lint`` fails on a failed check; this fails on a skip without a reason."""
    skips = checkov_skips(template)
    assert skips, "no skips: then this test guards nothing, drop it"
    for name, skip in skips:
        assert set(skip) == {"id", "comment"}, (name, skip)
        assert str(skip["id"]).startswith("CKV_"), (name, skip)
        reason = str(skip["comment"]).strip()
        assert len(reason) >= 20 and "\n" not in reason, (name, skip)


def test_no_check_is_skipped_for_the_whole_template(template: dict[str, Any]) -> None:
    assert "checkov" not in (template.get("Metadata") or {})


def test_a_customer_key_reaches_everything_that_stores_data(template: dict[str, Any]) -> None:
    """With ``KmsKeyArn`` set: table, bucket, queues, secret, log groups and the functions'
    environment all use it, and the roles may use it through those services only."""
    key = {"Fn::If": ["HasKmsKey", {"Ref": "KmsKeyArn"}, {"Ref": "AWS::NoValue"}]}
    resources = template["Resources"]
    assert template["Globals"]["Function"]["KmsKeyArn"] == key
    table = resources["ConversationsTable"]["Properties"]["SSESpecification"]
    assert table["KMSMasterKeyId"] == key
    for name, resource in resources.items():
        kind, properties = resource["Type"], resource.get("Properties", {})
        if kind == "AWS::Logs::LogGroup":
            assert properties["KmsKeyId"] == key, name
        if kind == "AWS::SQS::Queue":
            assert properties["KmsMasterKeyId"] == key, name
        if kind == "AWS::SecretsManager::Secret":
            assert properties["KmsKeyId"] == key, name
    bucket = resources["ArtifactsBucket"]["Properties"]["BucketEncryption"]
    rule = bucket["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"]
    assert rule["KMSMasterKeyID"] == key
    policy = resources["CustomerKeyPolicy"]
    assert policy["Condition"] == "HasKmsKey"
    roles = {role["Ref"] for role in policy["Properties"]["Roles"]}
    assert roles == {f"{name}Role" for name in functions(template)} | {"TenantAccessRole"}


def test_the_table_cannot_be_deleted_by_accident(template: dict[str, Any]) -> None:
    table = template["Resources"]["ConversationsTable"]
    assert table["Properties"]["DeletionProtectionEnabled"] is True
    assert table["DeletionPolicy"] == table["UpdateReplacePolicy"] == "Retain"


def test_a_failed_first_create_leaves_no_key_or_bucket_behind(template: dict[str, Any]) -> None:
    """Issue 47, point 5: RetainExceptOnCreate deletes them on a failed first create. The
    tables stay Retain: their deletion protection would make that rollback fail."""
    for name in ("ContentKey", "ArtifactsBucket"):
        assert template["Resources"][name]["DeletionPolicy"] == "RetainExceptOnCreate", name
        assert template["Resources"][name]["UpdateReplacePolicy"] == "Retain", name
