"""A record of the AWS calls the functions make, for the permissions test.

:func:`record` is a local runner worker hook (``LocalConfig.worker_hook``): it runs
once in the process every execution environment is forked from and patches botocore
at the class level, so clients built before it (the runtime's, built at init) record
too. Each call a function's code makes (``BaseClient._make_api_call``) and each URL
it presigns (``RequestSigner.generate_presigned_url``) is appended to the JSON-lines
file named by :data:`RECORD_FILE` in the functions' environment, one :class:`Call`
a line:

* ``function``: the template's function whose invocation made it (the Lambda context's
  ``function_name``, which the runner gives each environment's events);
* ``session_policy``: where the call was signed with credentials of a tenant session
  (an ``AssumeRole`` this process made), the inline session policy that session was
  assumed with; ``None`` on the function's own role;
* ``service``, ``operation``, ``presigned``, and ``params``: the request's identifying
  fields only (names, keys, prefixes, key ids, encryption context keys), never content.

What each call is in IAM's terms (actions, resources, condition keys) is worked out by
the evaluation (:mod:`tests.support.iam_policies`), not here.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any, TypedDict
from urllib.parse import unquote, urlsplit

from botocore.client import BaseClient
from botocore.signers import RequestSigner

#: The functions' environment variable naming the record's file.
RECORD_FILE = "TURNLEDGER_TEST_AWS_CALLS"

#: Request fields kept as they are (identifiers, no content).
_KEPT = (
    "TableName",
    "IndexName",
    "Bucket",
    "Key",
    "Prefix",
    "KeyId",
    "SecretId",
    "Name",
    "FunctionName",
    "InvocationType",
    "RoleArn",
    "modelId",
    "KeyConditionExpression",
    "ExpressionAttributeNames",
)


#: The functions' settings naming a resource -> the template's name of it (a resource's
#: logical id, or the parameter that names it): a recorded name is the template's.
SYMBOLS = {
    "TABLE_NAME": "ConversationsTable",
    "KEYS_TABLE_NAME": "KeysTable",
    "BUCKET_NAME": "ArtifactsBucket",
    "CONTENT_KMS_KEY_ID": "ContentKey",
    "TENANT_ROLE_ARN": "TenantAccessRole",
    "CALLBACK_SECRET_ARN": "CallbackSigningSecret",
    "OPENAI_API_KEY_SECRET": "OpenAIApiKeySecretArn",
    "NOTIFY_SECRET_ARN": "NotifySecretArn",
    "TOOLS_PARAMETER": "ToolsParameterName",
    "REDACTION_PARAMETER": "RedactionParameterName",
    "NOTIFICATIONS_BUS": "NotificationsBus",
    "TURN_WORKER_FUNCTION": "TurnWorkerFunction",
}


def _symbolic(value: Any, symbols: dict[str, str]) -> Any:
    """``value`` with every string (and mapping key) naming a resource replaced by its
    template name, written ``{Name}``."""
    if isinstance(value, str):
        return "{" + symbols[value] + "}" if value in symbols else value
    if isinstance(value, list):
        return [_symbolic(item, symbols) for item in value]
    if isinstance(value, dict):
        return {_symbolic(k, symbols): _symbolic(v, symbols) for k, v in value.items()}
    return value


class Call(TypedDict):
    """One recorded call (a line of the record)."""

    function: str | None
    session_policy: str | None
    service: str
    operation: str
    presigned: bool
    params: dict[str, Any]


#: The function of this environment (an environment serves one function).
_function: list[str | None] = [None]
#: Access key id of each tenant session assumed in this process -> its session policy.
_sessions: dict[str, str] = {}
_lock = threading.Lock()


def _strings(value: Any) -> list[str]:
    """The string values of DynamoDB attribute values (``{"S": ...}``), in order."""
    found: list[str] = []
    if isinstance(value, dict):
        if set(value) == {"S"} and isinstance(value["S"], str):
            return [value["S"]]
        for item in value.values():
            found += _strings(item)
    elif isinstance(value, list):
        for item in value:
            found += _strings(item)
    return found


def _key_of(item: Any) -> dict[str, str]:
    """The string attributes of a key or an item that can be a table's key (``pk``/``sk``
    of conversations, ``name`` of wrapped keys): what ``dynamodb:LeadingKeys`` sees."""
    if not isinstance(item, dict):
        return {}
    return {
        name: value["S"]
        for name, value in item.items()
        if name in {"pk", "sk", "name"} and isinstance(value, dict) and "S" in value
    }


def extract(service: str, operation: str, params: dict[str, Any]) -> dict[str, Any]:
    """The identifying fields of a request to ``service``'s ``operation``."""
    kept: dict[str, Any] = {name: params[name] for name in _KEPT if name in params}
    if service == "dynamodb":
        if "Key" in params:
            kept["Key"] = _key_of(params["Key"])
        if "Item" in params:
            kept["Key"] = _key_of(params["Item"])
        if "ExpressionAttributeValues" in params and "KeyConditionExpression" in params:
            kept["ExpressionAttributeValues"] = {
                name: _strings(value)[0] if _strings(value) else None
                for name, value in params["ExpressionAttributeValues"].items()
            }
        if "RequestItems" in params:
            kept["RequestItems"] = {
                table: [
                    _key_of(
                        (request.get("PutRequest") or {}).get("Item")
                        or (request.get("DeleteRequest") or {}).get("Key")
                        or request
                    )
                    for request in (
                        requests if isinstance(requests, list) else requests.get("Keys", [])
                    )
                ]
                for table, requests in params["RequestItems"].items()
            }
        if "TransactItems" in params:
            kept["TransactItems"] = [
                {
                    "operation": kind,
                    "TableName": body["TableName"],
                    "Key": _key_of(body.get("Key") or body.get("Item")),
                }
                for item in params["TransactItems"]
                for kind, body in item.items()
            ]
    elif service == "s3" and "Delete" in params:
        kept["Keys"] = [entry["Key"] for entry in params["Delete"].get("Objects", [])]
    elif service == "kms" and "EncryptionContext" in params:
        kept["EncryptionContext"] = dict(params["EncryptionContext"])
    elif service == "sts" and "Tags" in params:
        kept["TagKeys"] = [tag["Key"] for tag in params["Tags"]]
        kept["RequestTags"] = {tag["Key"]: tag["Value"] for tag in params["Tags"]}
    elif service == "events" and "Entries" in params:
        kept["EventBusNames"] = sorted(
            {entry.get("EventBusName", "") for entry in params["Entries"]}
        )
    return kept


def _symbols() -> dict[str, str]:
    return {os.environ[name]: symbol for name, symbol in SYMBOLS.items() if os.environ.get(name)}


def _write(call: Call) -> None:
    path = os.environ.get(RECORD_FILE)
    if not path:
        return
    line = (json.dumps(call, sort_keys=True) + "\n").encode()
    # One write of an O_APPEND file per call: the environments' lines never interleave.
    handle = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(handle, line)
    finally:
        os.close(handle)


def _access_key(signer: RequestSigner) -> str | None:
    credentials = getattr(signer, "_credentials", None)
    if credentials is None:
        return None
    return str(credentials.get_frozen_credentials().access_key)


def _note(client: Any, operation: str, params: dict[str, Any], *, presigned: bool) -> None:
    service = client.meta.service_model.service_name
    key = _access_key(client._request_signer)
    with _lock:
        policy = _sessions.get(key) if key is not None else None
    bucket = os.environ.get("BUCKET_NAME")
    if policy is not None and bucket:
        # The session policy names the bucket inside its ARNs.
        policy = policy.replace(bucket, "{ArtifactsBucket}")
    _write(
        Call(
            function=_function[0],
            session_policy=policy,
            service=service,
            operation=operation,
            presigned=presigned,
            params=_symbolic(extract(service, operation, params), _symbols()),
        )
    )


def record() -> None:
    """The worker hook: record every AWS call of the functions (see the module docstring)."""
    from turnledger_local.gateway import LambdaContext

    make_api_call = BaseClient._make_api_call
    presign = RequestSigner.generate_presigned_url
    post_init = LambdaContext.__post_init__

    def recorded_call(self: Any, operation_name: str, api_params: dict[str, Any]) -> Any:
        _note(self, operation_name, api_params, presigned=False)
        answer = make_api_call(self, operation_name, api_params)
        if operation_name == "AssumeRole" and "Policy" in api_params:
            with _lock:
                _sessions[answer["Credentials"]["AccessKeyId"]] = api_params["Policy"]
        return answer

    def recorded_presign(
        self: RequestSigner, request_dict: dict[str, Any], operation_name: str, **kwargs: Any
    ) -> Any:
        bucket = os.environ.get("BUCKET_NAME", "")
        parts = urlsplit(request_dict["url"])
        path = unquote(parts.path).lstrip("/")
        key = path.removeprefix(f"{bucket}/") if path.startswith(f"{bucket}/") else path
        access = _access_key(self)
        with _lock:
            policy = _sessions.get(access) if access is not None else None
        if policy is not None and bucket:
            policy = policy.replace(bucket, "{ArtifactsBucket}")
        _write(
            Call(
                function=_function[0],
                session_policy=policy,
                service=self._service_id.hyphenize(),
                operation=operation_name,
                presigned=True,
                params=_symbolic({"Bucket": bucket, "Key": key}, _symbols()),
            )
        )
        return presign(self, request_dict, operation_name, **kwargs)

    def named(self: Any) -> None:
        _function[0] = self.function_name
        post_init(self)

    BaseClient._make_api_call = recorded_call  # type: ignore[method-assign]
    RequestSigner.generate_presigned_url = recorded_presign  # type: ignore[method-assign]
    LambdaContext.__post_init__ = named  # type: ignore[method-assign]


def read(path: str | os.PathLike[str]) -> list[Call]:
    """The calls of a record file."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
