"""Each function's environment under the largest values its parameters allow stays within
Lambda's 4 KB (issue 47, point 10): a deploy whose environment is larger fails.

The largest value of a parameter is what CloudFormation would accept: its longest
``AllowedValues``, its ``MaxLength``, the digits of its ``MaxValue``. A resource's name or
ARN is bounded by what its service allows (``RESOURCE_BOUNDS``). The size is measured as
Lambda's API carries the variables, a JSON object (names, values, quotes and separators).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from turnledger_local.template import functions, load_template

#: Lambda's limit on the combined size of a function's environment variables.
LIMIT_BYTES = 4 * 1024
#: A Number parameter without MaxValue: int64 has 19 digits, and a sign.
NUMBER_DIGITS = 20
PARTITION, REGION, ACCOUNT = "aws-us-gov", "ap-southeast-5x", "123456789012"
URL_SUFFIX = "amazonaws.com.cn"
#: The longest name or ARN each kind of resource's Ref or Fn::GetAtt gives (AWS's limits).
RESOURCE_BOUNDS = {
    # CloudFormation names a table "<stack name>-<logical id>-<13 characters>" (a stack's
    # name has at most 128): ConversationsTable's, the longer.
    "AWS::DynamoDB::Table": 128 + len("-ConversationsTable-") + 13,
    "AWS::S3::Bucket": 63,
    "AWS::Lambda::Function": 64,
    "AWS::Serverless::Function": 64,
    "AWS::IAM::Role": len(f"arn:{PARTITION}:iam::{ACCOUNT}:role/") + 64,
    # NotificationsBus is named "<stack name>-approvals".
    "AWS::Events::EventBus": 128 + len("-approvals"),
    # CloudFormation names a secret "<logical id>-<12 characters>"; its ARN adds 7.
    "AWS::SecretsManager::Secret": len(f"arn:{PARTITION}:secretsmanager:{REGION}:{ACCOUNT}:secret:")
    + 64
    + 13
    + 7,
    "AWS::KMS::Key": len(f"arn:{PARTITION}:kms:{REGION}:{ACCOUNT}:key/") + 36,
    "AWS::Serverless::HttpApi": 10,
}


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return load_template()


def largest_parameter(template: dict[str, Any], name: str) -> str:
    spec = template["Parameters"][name]
    if "AllowedValues" in spec:
        return max((str(value) for value in spec["AllowedValues"]), key=len)
    if spec["Type"] == "Number":
        return "9" * (len(str(spec["MaxValue"])) if "MaxValue" in spec else NUMBER_DIGITS)
    assert "MaxLength" in spec, f"{name} reaches an environment with no bound on its length"
    return "x" * int(spec["MaxLength"])


def largest(template: dict[str, Any], value: Any) -> str:
    """The longest text ``value`` can be deployed as."""
    if isinstance(value, str | int | float):
        return str(value)
    ((function, argument),) = value.items()
    if function == "Ref":
        if argument == "AWS::NoValue":
            return ""
        if argument in template["Parameters"]:
            return largest_parameter(template, argument)
        return "x" * RESOURCE_BOUNDS[template["Resources"][argument]["Type"]]
    if function == "Fn::GetAtt":
        resource = argument.split(".")[0] if isinstance(argument, str) else argument[0]
        return "x" * RESOURCE_BOUNDS[template["Resources"][resource]["Type"]]
    if function == "Fn::If":
        return max((largest(template, branch) for branch in argument[1:]), key=len)
    if function == "Fn::Sub":
        text = argument
        pseudo = {"AWS::Region": REGION, "AWS::URLSuffix": URL_SUFFIX, "AWS::Partition": PARTITION}
        for name, known in pseudo.items():
            text = text.replace("${" + name + "}", known)
        while "${" in text:
            start = text.index("${")
            end = text.index("}", start)
            reference = text[start + 2 : end]
            text = text[:start] + largest(template, {"Ref": reference}) + text[end + 1 :]
        return text
    raise AssertionError(f"no bound for {value!r}")


def largest_environment(template: dict[str, Any], function: str) -> dict[str, str]:
    variables = {
        **template["Globals"]["Function"]["Environment"]["Variables"],
        **(template["Resources"][function]["Properties"].get("Environment") or {}).get(
            "Variables", {}
        ),
    }
    return {name: largest(template, value) for name, value in variables.items()}


def size(variables: dict[str, str]) -> int:
    return len(json.dumps(variables, separators=(",", ":")).encode())


@pytest.mark.parametrize("function", sorted(functions(load_template())))
def test_the_environment_under_the_largest_parameters_fits_lambdas_4_kb(
    template: dict[str, Any], function: str
) -> None:
    variables = largest_environment(template, function)
    assert size(variables) <= LIMIT_BYTES, (
        f"{function}: {size(variables)} bytes; largest: "
        f"{sorted(variables, key=lambda name: -len(variables[name]))[:5]}"
    )


def test_the_measure_fails_an_environment_over_the_limit(template: dict[str, Any]) -> None:
    """The measure can fail: the turn function given every JSON map at twice its bound."""
    variables = largest_environment(template, "TurnFunction")
    grown = {
        name: value * 2 if name.startswith("TENANT_") else value
        for name, value in variables.items()
    }
    assert size(grown) > LIMIT_BYTES
