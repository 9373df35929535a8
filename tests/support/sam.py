"""``template.yaml`` as CloudFormation receives it: translated offline by ``aws-sam-translator``.

The SAM transform runs in CloudFormation, after every local check: what it generates
(versions, aliases, roles, the HTTP API's routes) is visible only in its output. This is
the same library ``sam validate`` and the CloudFormation transform run, given what
``sam package`` would have set: every local ``CodeUri``/``ContentUri`` becomes an S3
location whose key is the content's hash.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import boto3
from samtranslator.parser.parser import Parser
from samtranslator.translator.translator import Translator
from turnledger_local.template import load_template

REGION = "us-east-1"
BUCKET = "sam-package-bucket"
#: What a deploy must give: the parameters without a default.
REQUIRED_PARAMETERS = {
    "JwtIssuer": "https://cognito-idp.us-east-1.amazonaws.com/us-east-1_example",
    "JwtAudience": "client-id",
}


def packaged(
    template: Mapping[str, Any] | None = None, content_keys: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """``template`` (default: ``template.yaml``) as ``sam package`` leaves it.

    Each function's code and each layer's content lives at ``s3://BUCKET/<key>``; the key
    is ``content_keys[logical id]`` when given (``sam package`` names an upload by the hash
    of its content), else one fixed per resource.
    """
    found = copy.deepcopy(dict(template) if template is not None else load_template())
    keys = content_keys or {}
    for name, resource in found["Resources"].items():
        field = {
            "AWS::Serverless::Function": "CodeUri",
            "AWS::Serverless::LayerVersion": "ContentUri",
        }.get(resource["Type"])
        if field:
            resource["Properties"][field] = f"s3://{BUCKET}/{keys.get(name, name.lower())}"
    return found


def translate(
    template: Mapping[str, Any] | None = None, parameters: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The CloudFormation template the SAM transform makes of a packaged ``template``."""
    values: dict[str, Any] = {**REQUIRED_PARAMETERS, **(parameters or {})}
    translator = Translator(None, Parser(), boto_session=boto3.session.Session(region_name=REGION))
    translated: dict[str, Any] = translator.translate(
        copy.deepcopy(dict(template if template is not None else packaged())),
        parameter_values=values,
        # No managed policy is named by its short name: nothing to look up in IAM.
        get_managed_policy_map=dict,
    )
    return translated


def of_type(translated: Mapping[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    """The resources of ``kind`` in a translated template, by logical id."""
    return {
        name: resource
        for name, resource in translated["Resources"].items()
        if resource["Type"] == kind
    }


def published_versions(translated: Mapping[str, Any]) -> dict[str, str]:
    """Function logical id -> the logical id of the version its alias points at.

    SAM names a version ``<Function>Version<hash>``; a new name is a new version on
    deploy, the same name publishes nothing.
    """
    found: dict[str, str] = {}
    for alias in of_type(translated, "AWS::Lambda::Alias").values():
        properties = alias["Properties"]
        function = properties["FunctionName"]["Ref"]
        found[function] = properties["FunctionVersion"]["Fn::GetAtt"][0]
    return found
