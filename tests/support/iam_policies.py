"""The template's IAM policies as deployed, and the recorded AWS calls evaluated against them.

:func:`deployed` translates ``template.yaml`` with ``aws-sam-translator`` (policy templates
such as ``AWSSecretsManagerGetSecretValuePolicy`` become their statements), for one set of
parameter values, and resolves what CloudFormation would (``Ref``, ``Fn::GetAtt``,
``Fn::Sub``, ``Fn::If`` and the conditions, ``Fn::Join``, ``Fn::Split``) to concrete ARNs
in a fixed account and Region: each role's policies, as :class:`Deployment`.

:func:`requests_of` turns one recorded call (:mod:`tests.support.aws_calls`) into the IAM
requests it makes under that deployment: the action, the resource's ARN and the condition
keys its policies test (``dynamodb:LeadingKeys``, ``s3:prefix``, ``kms:ViaService``, the
encryption context, request tags, ``bedrock:InferenceProfileArn``), including the calls a
service makes on the caller's behalf (S3's and Secrets Manager's KMS calls under a customer
key; the foundation models behind an inference profile). :func:`simulate` evaluates them
with ``@cloud-copilot/iam-simulate`` (``tests/support/iam_simulate.mjs``).
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from turnledger_local.template import PROJECT_ROOT, load_template

from tests.support.aws_calls import Call

ACCOUNT = "123456789012"
REGION = "us-east-1"
PARTITION = "aws"
STACK = "turnledger"
#: The scenario's clock.
START = datetime(2099, 1, 15, 12, 0, tzinfo=UTC)
#: The role the recording runner's functions assume per tenant (moto does not check it).
TEST_TENANT_ROLE = f"arn:aws:iam::{ACCOUNT}:role/TenantAccessRole"
#: Where ``make .tools/iam-simulate`` installs the simulator.
SIMULATOR_MODULES = PROJECT_ROOT / ".tools" / "iam-simulate" / "node_modules"
SIMULATOR = Path(__file__).with_name("iam_simulate.mjs")

#: A Bedrock model id and the same model reached through the US inference profile.
FOUNDATION_MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"
PROFILE_MODEL = f"us.{FOUNDATION_MODEL}"
#: The Regions each geography's cross-Region inference profiles route to (Bedrock's
#: documentation; a few of each is enough to find a Region-bound grant).
PROFILE_REGIONS = {
    "us": ("us-east-1", "us-east-2", "us-west-2"),
    "eu": ("eu-central-1", "eu-west-1", "eu-west-3"),
    "apac": ("ap-northeast-1", "ap-southeast-1", "ap-southeast-2"),
    "global": ("us-east-1", "eu-west-1", "ap-northeast-1"),
}

#: Every optional parameter that adds a policy, each with the value it is set to; the
#: test runs under every combination of set and unset (``""``).
OPTIONAL: dict[str, str | list[str]] = {
    "KmsKeyArn": f"arn:aws:kms:{REGION}:{ACCOUNT}:key/0e1f2a3b-customer-key",
    "ToolsParameterName": "/turnledger/tools",
    "RedactionParameterName": "/turnledger/redaction",
    "OpenAIApiKeySecretArn": f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:openai-AbCdEf",
    "BedrockModelIds": [FOUNDATION_MODEL, PROFILE_MODEL],
}
#: Parameters every deployment under test sets.
FIXED: dict[str, str | list[str]] = {
    "JwtIssuer": "https://issuer.example.com",
    "JwtAudience": ["client"],
    "NotifySecretArn": f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:notify-AbCdEf",
}


def combinations() -> list[dict[str, str | list[str]]]:
    """Every combination of the optional parameters, set or unset."""
    found = []
    for chosen in itertools.product((False, True), repeat=len(OPTIONAL)):
        values: dict[str, str | list[str]] = {
            name: (value if on else ([""] if isinstance(value, list) else ""))
            for (name, value), on in zip(OPTIONAL.items(), chosen, strict=True)
        }
        found.append(values)
    return found


def label(values: dict[str, str | list[str]]) -> str:
    """A short name of a combination: the optional parameters it sets."""
    on = [name for name, value in values.items() if value not in ("", [""])]
    return "+".join(on) or "none"


# --- the translated template -----------------------------------------------------------


def translate(template: dict[str, Any], parameters: dict[str, Any]) -> dict[str, Any]:
    """``template`` as ``aws-sam-translator`` expands it (code locations made S3 URIs, as
    ``sam deploy`` makes them)."""
    import boto3
    from samtranslator.parser.parser import Parser
    from samtranslator.translator.translator import Translator

    fragment = copy.deepcopy(template)
    for resource in fragment["Resources"].values():
        props = resource.get("Properties") or {}
        for key in ("CodeUri", "ContentUri"):
            if key in props:
                props[key] = f"s3://artifacts/{resource['Type'].rsplit('::', 1)[-1]}.zip"
    values = {name: ",".join(v) if isinstance(v, list) else v for name, v in parameters.items()}
    values.update({"AWS::Region": REGION, "AWS::AccountId": ACCOUNT, "AWS::Partition": PARTITION})
    # No managed policy is named by name (the map is for those); the session gives the Region.
    translator = Translator(None, Parser(), boto_session=boto3.session.Session(region_name=REGION))
    translated: dict[str, Any] = translator.translate(
        fragment, parameter_values=values, get_managed_policy_map=dict
    )
    return translated


_TRANSLATIONS: dict[str, dict[str, Any]] = {}


def _translated(template: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """``translate``, once per template: what SAM makes of this template does not depend on
    the optional parameters (they reach the policies only through ``Ref`` and ``Fn::If``,
    which SAM leaves to CloudFormation; translated with all set and with none set, the
    templates are equal), so each deployment resolves the same translation."""
    key = json.dumps(template, sort_keys=True)
    if key not in _TRANSLATIONS:
        _TRANSLATIONS[key] = translate(template, values)
    return copy.deepcopy(_TRANSLATIONS[key])


@dataclass
class Deployment:
    """One translated, resolved deployment: its roles' policies and resources' ARNs."""

    parameters: dict[str, Any]
    resources: dict[str, dict[str, Any]]
    conditions: dict[str, bool]
    #: role logical id -> [(policy name, policy document)].
    policies: dict[str, list[tuple[str, dict[str, Any]]]] = field(default_factory=dict)
    #: (role logical id, policy name) -> what the policy is in template.yaml's words.
    names: dict[tuple[str, str], str] = field(default_factory=dict)

    def ref(self, name: str) -> Any:
        """What ``Ref`` of ``name`` gives."""
        pseudo = {
            "AWS::Region": REGION,
            "AWS::AccountId": ACCOUNT,
            "AWS::Partition": PARTITION,
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::StackName": STACK,
            "AWS::NoValue": _NO_VALUE,
        }
        if name in pseudo:
            return pseudo[name]
        if name in self.parameters:
            return self.parameters[name]
        kind = self.resources[name]["Type"]
        physical = f"{STACK}-{name}"
        if kind == "AWS::KMS::Key":
            return f"{name.lower()}-key-id"
        if kind == "AWS::S3::Bucket":
            return physical.lower()
        if kind in ("AWS::SecretsManager::Secret",):
            return self.attribute(name, "Arn")
        if kind == "AWS::SQS::Queue":
            return f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/{physical}"
        return physical

    def attribute(self, name: str, attribute: str) -> str:
        """What ``Fn::GetAtt`` of ``name.attribute`` gives."""
        kind = self.resources[name]["Type"]
        physical = f"{STACK}-{name}"
        arns = {
            "AWS::DynamoDB::Table": f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{physical}",
            "AWS::S3::Bucket": f"arn:aws:s3:::{physical.lower()}",
            "AWS::IAM::Role": f"arn:aws:iam::{ACCOUNT}:role/{physical}",
            "AWS::KMS::Key": f"arn:aws:kms:{REGION}:{ACCOUNT}:key/{name.lower()}-key-id",
            "AWS::Events::EventBus": f"arn:aws:events:{REGION}:{ACCOUNT}:event-bus/{physical}",
            "AWS::SecretsManager::Secret": (
                f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:{physical}-AbCdEf"
            ),
            "AWS::Lambda::Function": f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{physical}",
            "AWS::SQS::Queue": f"arn:aws:sqs:{REGION}:{ACCOUNT}:{physical}",
            "AWS::Logs::LogGroup": f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{physical}:*",
        }
        if attribute == "StreamArn":
            return f"{arns[kind]}/stream/2099-01-01T00:00:00.000"
        if attribute == "Arn" and kind in arns:
            return arns[kind]
        return f"{physical}.{attribute}"

    def resolve(self, value: Any) -> Any:
        """``value`` with CloudFormation's intrinsic functions applied."""
        if isinstance(value, list):
            items = [self.resolve(item) for item in value]
            return [item for item in items if item is not _NO_VALUE]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            [(key, arg)] = value.items()
            if key == "Ref":
                return self.ref(arg)
            if key == "Fn::GetAtt":
                name, attribute = arg if isinstance(arg, list) else arg.split(".", 1)
                return self.attribute(name, attribute)
            if key == "Fn::If":
                chosen = arg[1] if self.conditions[arg[0]] else arg[2]
                return self.resolve(chosen)
            if key == "Fn::Sub":
                text, extra = (arg, {}) if isinstance(arg, str) else (arg[0], arg[1])
                extra = {k: self.resolve(v) for k, v in extra.items()}

                def substitute(match: re.Match[str]) -> str:
                    name = match.group(1)
                    if name in extra:
                        return str(extra[name])
                    if "." in name and not name.startswith("AWS::"):
                        return self.attribute(*name.split(".", 1))
                    return str(self.ref(name))

                return re.sub(r"\$\{([^}!]+)\}", substitute, text)
            if key == "Fn::Join":
                separator, items = arg
                return self.resolve(separator).join(str(i) for i in self.resolve(items))
            if key == "Fn::Split":
                separator, text = arg
                return str(self.resolve(text)).split(self.resolve(separator))
            if key == "Fn::Select":
                index, items = arg
                return self.resolve(items)[int(self.resolve(index))]
        resolved = {k: self.resolve(v) for k, v in value.items()}
        return {k: v for k, v in resolved.items() if v is not _NO_VALUE}

    def condition(self, value: Any) -> bool:
        """A condition's value."""
        if isinstance(value, dict) and "Condition" in value:
            return self.conditions[value["Condition"]]
        [(key, arg)] = value.items()
        if key == "Fn::Equals":
            left, right = (self.resolve(a) for a in arg)
            left = ",".join(left) if isinstance(left, list) else left
            right = ",".join(right) if isinstance(right, list) else right
            return bool(str(left) == str(right))
        if key == "Fn::Not":
            return not self.condition(arg[0])
        if key == "Fn::And":
            return all(self.condition(a) for a in arg)
        if key == "Fn::Or":
            return any(self.condition(a) for a in arg)
        raise ValueError(f"unknown condition {value!r}")

    def role_arn(self, role: str) -> str:
        """The ARN of role ``role`` (a logical id)."""
        return self.attribute(role, "Arn")


_NO_VALUE = object()


def deployed(parameters: dict[str, Any], template: dict[str, Any] | None = None) -> Deployment:
    """The deployment of ``template`` (default: ``template.yaml``) with ``parameters``."""
    source = template if template is not None else load_template()
    values = {
        name: spec.get("Default", "")
        for name, spec in source.get("Parameters", {}).items()
        if "Default" in spec
    }
    values.update(FIXED)
    values.update(parameters)
    for name, spec in source.get("Parameters", {}).items():
        if spec.get("Type") == "CommaDelimitedList" and isinstance(values.get(name), str):
            values[name] = str(values[name]).split(",")
    translated = _translated(source, values)
    deployment = Deployment(values, translated["Resources"], {})
    for name, spec in translated.get("Conditions", {}).items():
        deployment.conditions[name] = False
        deployment.conditions[name] = deployment.condition(spec)
    for logical, resource in translated["Resources"].items():
        if resource.get("Condition") and not deployment.conditions[resource["Condition"]]:
            continue
        props = resource.get("Properties") or {}
        if resource["Type"] == "AWS::IAM::Role":
            for policy in deployment.resolve(props.get("Policies") or []):
                deployment.policies.setdefault(logical, []).append(
                    (policy["PolicyName"], policy["PolicyDocument"])
                )
        elif resource["Type"] == "AWS::IAM::Policy":
            document = deployment.resolve(props["PolicyDocument"])
            for role in props["Roles"]:
                deployment.policies.setdefault(role["Ref"], []).append(
                    (props["PolicyName"], document)
                )
    _name_sam_policies(source, deployment)
    return deployment


def _name_sam_policies(template: dict[str, Any], deployment: Deployment) -> None:
    """Name each policy SAM made of a function's ``Policies`` entry (``<Fn>RolePolicy<i>``)
    after the template's entry: its policy template and what it names."""
    for logical, resource in template["Resources"].items():
        if resource["Type"] != "AWS::Serverless::Function":
            continue
        for index, entry in enumerate(resource["Properties"].get("Policies") or []):
            inner = entry
            if isinstance(inner, dict) and "Fn::If" in inner:
                inner = inner["Fn::If"][1]
            if not isinstance(inner, dict):
                continue
            [(kind, argument)] = inner.items()
            if kind == "Statement":
                continue  # its statements carry their own Sids
            names = [v.get("Ref", "") for v in argument.values() if isinstance(v, dict)]
            deployment.names[(f"{logical}Role", f"{logical}RolePolicy{index}")] = (
                f"{kind}({', '.join(n for n in names if n)})"
            )


# --- recorded calls as IAM requests -----------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One IAM authorization a call needs."""

    function: str
    tenant: bool
    action: str
    resource: str
    context: tuple[tuple[str, Any], ...]
    session: str | None


def _hash_keys(deployment: Deployment) -> dict[tuple[str, str | None], str]:
    """(table, index or ``None``) -> its partition key attribute, in this deployment (an
    index may be conditional: ``TableIndexes``)."""
    found: dict[tuple[str, str | None], str] = {}
    for logical, resource in deployment.resources.items():
        if resource["Type"] != "AWS::DynamoDB::Table":
            continue
        props = deployment.resolve(resource["Properties"])
        [hash_key] = [k["AttributeName"] for k in props["KeySchema"] if k["KeyType"] == "HASH"]
        found[(logical, None)] = hash_key
        for index in props.get("GlobalSecondaryIndexes") or []:
            [key] = [k["AttributeName"] for k in index["KeySchema"] if k["KeyType"] == "HASH"]
            found[(logical, index["IndexName"])] = key
    return found


_SYMBOL = re.compile(r"^\{(\w+)\}$")


def _symbol(value: str) -> str:
    match = _SYMBOL.match(value)
    if match is None:
        raise ValueError(f"the code called an AWS resource the template does not name: {value}")
    return match.group(1)


def requests_of(call: Call, deployment: Deployment, template: dict[str, Any]) -> list[Request]:
    """The IAM requests ``call`` makes under ``deployment`` (``[]`` when the deployment
    configures nothing it would reach: the code makes it only when that is set)."""
    service, operation, params = call["service"], call["operation"], call["params"]
    kms_key = deployment.parameters.get("KmsKeyArn") or ""
    found: list[tuple[str, str, dict[str, Any]]] = []

    def arn_of(symbol: str) -> str | None:
        value = deployment.parameters.get(symbol)
        if symbol in deployment.parameters:
            return str(value) if value else None
        if symbol == "ContentKey":
            return kms_key or deployment.attribute("ContentKey", "Arn")
        return deployment.attribute(symbol, "Arn")

    if service == "dynamodb":
        keys = _hash_keys(deployment)
        ops = {"Put": "PutItem", "Update": "UpdateItem", "Delete": "DeleteItem"}
        ops["ConditionCheck"] = "ConditionCheckItem"
        items: list[tuple[str, str, str | None, list[str]]] = []
        if operation == "TransactWriteItems":
            for item in params["TransactItems"]:
                table = _symbol(item["TableName"])
                items.append(
                    (ops[item["operation"]], table, None, [item["Key"][keys[(table, None)]]])
                )
        elif operation == "BatchWriteItem":
            for name, entries in params["RequestItems"].items():
                table = _symbol(name)
                leading = sorted({entry[keys[(table, None)]] for entry in entries})
                items.append(("BatchWriteItem", table, None, leading))
        elif operation == "Query":
            table, index = _symbol(params["TableName"]), params.get("IndexName")
            attribute = keys[(table, index)]
            names = params.get("ExpressionAttributeNames", {})
            values = params.get("ExpressionAttributeValues", {})
            leading = []
            for left, right in re.findall(
                r"([#\w]+)\s*=\s*(:\w+)", params["KeyConditionExpression"]
            ):
                if names.get(left, left) == attribute:
                    leading.append(values[right])
            items.append(("Query", table, index, leading))
        else:
            table = _symbol(params["TableName"])
            items.append((operation, table, None, [params["Key"][keys[(table, None)]]]))
        for action, table, index, leading in items:
            resource = deployment.attribute(table, "Arn") + (f"/index/{index}" if index else "")
            found.append((f"dynamodb:{action}", resource, {"dynamodb:LeadingKeys": leading}))
    elif service == "s3":
        bucket = deployment.attribute(_symbol(params["Bucket"]), "Arn")
        via = {"kms:ViaService": f"s3.{REGION}.amazonaws.com", "kms:CallerAccount": ACCOUNT}
        via["kms:EncryptionContext:aws:s3:arn"] = bucket  # S3 Bucket Keys: the bucket's ARN
        via["kms:EncryptionContextKeys"] = ["aws:s3:arn"]
        if operation == "ListObjectsV2":
            found.append(("s3:ListBucket", bucket, {"s3:prefix": params.get("Prefix", "")}))
        elif operation == "DeleteObjects":
            for key in params["Keys"]:
                found.append(("s3:DeleteObject", f"{bucket}/{key}", {}))
        else:
            action = {
                "GetObject": "s3:GetObject",
                "HeadObject": "s3:GetObject",
                "PutObject": "s3:PutObject",
                "CreateMultipartUpload": "s3:PutObject",
                "UploadPart": "s3:PutObject",
                "CompleteMultipartUpload": "s3:PutObject",
                "AbortMultipartUpload": "s3:AbortMultipartUpload",
                "DeleteObject": "s3:DeleteObject",
            }[operation]
            found.append((action, f"{bucket}/{params['Key']}", {}))
            # Under SSE-KMS, S3 uses the bucket's key as the caller (AWS's S3 guide,
            # "Using server-side encryption with AWS KMS keys": the caller needs these).
            if kms_key and action == "s3:PutObject":
                found.append(("kms:GenerateDataKey", kms_key, via))
            if kms_key and (action == "s3:GetObject" or operation == "CompleteMultipartUpload"):
                found.append(("kms:Decrypt", kms_key, via))
    elif service == "kms":
        key = arn_of(_symbol(params["KeyId"]))
        context: dict[str, Any] = {"kms:CallerAccount": ACCOUNT}
        encryption = params.get("EncryptionContext") or {}
        if encryption:
            context["kms:EncryptionContextKeys"] = sorted(encryption)
            context.update({f"kms:EncryptionContext:{k}": v for k, v in encryption.items()})
        if operation == "ScheduleKeyDeletion":
            context["aws:ResourceTag/turnledger:tenant-key"] = "true"
        assert key is not None
        found.append((f"kms:{operation}", key, context))
    elif service == "sts":
        role = deployment.attribute(_symbol(params["RoleArn"]), "Arn")
        tags = {f"aws:RequestTag/{k}": v for k, v in params.get("RequestTags", {}).items()}
        tags["aws:TagKeys"] = params.get("TagKeys", [])
        found.append(("sts:AssumeRole", role, tags))
        if params.get("TagKeys"):
            found.append(("sts:TagSession", role, tags))
    elif service == "secretsmanager":
        symbol = _symbol(params["SecretId"])
        secret = arn_of(symbol) if symbol in deployment.parameters else deployment.ref(symbol)
        if secret is None:
            return []
        found.append(("secretsmanager:GetSecretValue", secret, {}))
        if kms_key and symbol == "CallbackSigningSecret":
            via = {"kms:ViaService": f"secretsmanager.{REGION}.amazonaws.com"}
            found.append(("kms:Decrypt", kms_key, {**via, "kms:CallerAccount": ACCOUNT}))
    elif service == "ssm":
        name = deployment.parameters.get(_symbol(params["Name"])) or ""
        if not name:
            return []
        found.append(("ssm:GetParameter", f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter{name}", {}))
    elif service == "events":
        for bus in params["EventBusNames"]:
            found.append(("events:PutEvents", deployment.attribute(_symbol(bus), "Arn"), {}))
    elif service == "lambda":
        function = deployment.attribute(_symbol(params["FunctionName"]), "Arn")
        found.append(("lambda:InvokeFunction", function, {}))
    elif service == "bedrock-runtime":
        model = params["modelId"]
        if model not in (deployment.parameters.get("BedrockModelIds") or []):
            return []
        action = {"Converse": "bedrock:InvokeModel"}.get(
            operation, "bedrock:InvokeModelWithResponseStream"
        )
        geography, _, base = model.partition(".")
        if geography in PROFILE_REGIONS:
            profile = f"arn:aws:bedrock:{REGION}:{ACCOUNT}:inference-profile/{model}"
            found.append((action, profile, {}))
            for region in PROFILE_REGIONS[geography]:
                foundation = f"arn:aws:bedrock:{region}::foundation-model/{base}"
                found.append((action, foundation, {"bedrock:InferenceProfileArn": profile}))
        else:
            found.append((action, f"arn:aws:bedrock:{REGION}::foundation-model/{model}", {}))
    else:
        raise ValueError(f"no IAM mapping for {service}:{operation}")
    session = call["session_policy"]
    if session is not None:
        bucket_name = deployment.ref("ArtifactsBucket")
        session = session.replace("{ArtifactsBucket}", bucket_name)
    function = call["function"] or "?"
    return [
        Request(
            function=function,
            tenant=session is not None,
            action=action,
            resource=resource,
            context=tuple(
                sorted((k, v if not isinstance(v, list) else tuple(v)) for k, v in context.items())
            ),
            session=session,
        )
        for action, resource, context in found
    ]


def sample(requests: list[Request], per_kind: int = 2) -> list[Request]:
    """At most ``per_kind`` requests of each kind: the same function, session, action,
    resource (an object's down to its tenant's prefix) and condition keys. The record holds
    hundreds of calls that differ only by a conversation's key; a policy that treats one of
    a kind differently from another would have to name conversations, which none does."""
    kept: dict[tuple[Any, ...], list[Request]] = {}
    for request in requests:
        resource = request.resource
        if request.action.startswith("s3:") and resource.count("/") > 2:
            resource = "/".join(resource.split("/")[:3])
        kind = (
            request.function,
            request.tenant,
            request.action,
            resource,
            tuple(name for name, _ in request.context),
        )
        group = kept.setdefault(kind, [])
        if len(group) < per_kind:
            group.append(request)
    return [request for group in kept.values() for request in group]


def _simulation(request: Request, deployment: Deployment) -> dict[str, Any]:
    """The simulator's input for ``request``: the caller's policies (the function's role, or
    the tenant role with the session's policy) and the resource's own policy where its
    service asks one (the tenant role's trust policy; a KMS key's policy, which lets the
    account's IAM policies use the key, as template.yaml's ContentKey and docs/DEPLOY.md's
    customer key do)."""
    tenant_role = "TenantAccessRole"
    role = tenant_role if request.tenant else f"{request.function}Role"
    principal = (
        f"arn:aws:sts::{ACCOUNT}:assumed-role/{deployment.ref(tenant_role)}/tl-tenant"
        if request.tenant
        else deployment.role_arn(role)
    )
    identity = [
        {"name": name, "policy": document} for name, document in deployment.policies.get(role, [])
    ]
    context = {k: list(v) if isinstance(v, tuple) else v for k, v in request.context}
    resource_policy = None
    if request.action.startswith("sts:"):
        trust = deployment.resources[tenant_role]["Properties"]["AssumeRolePolicyDocument"]
        resource_policy = deployment.resolve(trust)
    elif request.action.startswith("kms:"):
        key_policy = template_key_policy(deployment)
        resource_policy = key_policy
    return {
        "principal": principal,
        "action": request.action,
        "resource": request.resource,
        "account": ACCOUNT,
        "context": {"aws:SecureTransport": "true", **context},
        "identity": identity,
        "session": json.loads(request.session) if request.session else None,
        "resourcePolicy": resource_policy,
    }


def template_key_policy(deployment: Deployment) -> dict[str, Any]:
    """The content key's policy in the template (a customer key is assumed to allow as much)."""
    return dict(deployment.resolve(deployment.resources["ContentKey"]["Properties"]["KeyPolicy"]))


def simulate(batches: list[tuple[list[Request], Deployment]]) -> list[list[dict[str, Any]]]:
    """Each request's answer from iam-simulate (``result``, ``allowedBy``, ``errors``), for
    each batch of requests under its deployment (one run of the simulator for all)."""
    if not (SIMULATOR_MODULES / "@cloud-copilot" / "iam-simulate").is_dir():
        raise RuntimeError(
            f"@cloud-copilot/iam-simulate is not in {SIMULATOR_MODULES}: make .tools/iam-simulate"
        )
    flat = [_simulation(r, deployment) for requests, deployment in batches for r in requests]
    done = subprocess.run(
        ["node", str(SIMULATOR)],
        input=json.dumps(flat),
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "IAM_SIMULATE_MODULES": str(SIMULATOR_MODULES)},
        timeout=600,
    )
    answers: list[dict[str, Any]] = json.loads(done.stdout)
    split: list[list[dict[str, Any]]] = []
    for requests, _ in batches:
        split.append(answers[: len(requests)])
        answers = answers[len(requests) :]
    return split


def statement_name(deployment: Deployment, request: Request, allowed_by: str) -> str:
    """``policy/Sid`` of an allowing statement, SAM's generated policy names told as the
    template's entry they come from."""
    policy, _, sid = allowed_by.partition("/")
    role = "TenantAccessRole" if request.tenant else f"{request.function}Role"
    described = deployment.names.get((role, policy))
    return f"{described}/{sid}" if described else f"{policy}/{sid}"
