"""Storage for the local runner: moto's in-process server, or endpoints the caller names.

Whichever endpoints serve, :func:`provision` creates what the template
declares and is missing: the conversations table (key schema and indexes read
from ``template.yaml``, TTL enabled) and the bucket.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import boto3
from botocore.exceptions import ClientError
from moto.server import ThreadedMotoServer

from .template import table_definition, ttl_attribute

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_kms import KMSClient
    from mypy_boto3_s3 import S3Client

#: Logical id of the table in ``template.yaml``.
CONVERSATIONS_TABLE = "ConversationsTable"
#: Logical id of the table of wrapped content keys (turnledger/store/keyring.py).
KEYS_TABLE = "KeysTable"
#: The alias of the embedded storage's content key (moto's KMS).
CONTENT_KEY_ALIAS = "alias/turnledger-content"


@dataclass(frozen=True)
class StorageNames:
    """Physical names of the table and the bucket."""

    table: str
    bucket: str


class EmbeddedStorage:
    """moto's DynamoDB and S3 server, in this process, on a free loopback port.

    moto keeps its state per process: two servers in one process share tables.
    """

    def __init__(self) -> None:
        self._server: ThreadedMotoServer | None = None
        self._url: str | None = None

    def start(self) -> str:
        """Start the server; returns its endpoint URL (DynamoDB and S3 alike)."""
        if self._url is not None:
            return self._url
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        self._server = server
        self._url = f"http://{host}:{port}"
        return self._url

    def stop(self) -> None:
        """Stop the server; the state it held is gone with it for this runner."""
        if self._server is not None:
            self._server.stop()
        self._server = None
        self._url = None


def _session(region: str, credentials: Mapping[str, str] | None) -> boto3.Session:
    given = credentials or {}
    return boto3.Session(
        region_name=region,
        aws_access_key_id=given.get("aws_access_key_id"),
        aws_secret_access_key=given.get("aws_secret_access_key"),
        aws_session_token=given.get("aws_session_token"),
    )


def _ensure_table(
    client: DynamoDBClient, template: dict[str, Any], resource: str, name: str
) -> bool:
    try:
        client.create_table(**table_definition(template, resource, name))
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ResourceInUseException":
            return False
        raise
    client.get_waiter("table_exists").wait(
        TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60}
    )
    attribute = ttl_attribute(template, resource)
    if attribute is not None:
        client.update_time_to_live(
            TableName=name,
            TimeToLiveSpecification={"AttributeName": attribute, "Enabled": True},
        )
    return True


def _ensure_bucket(client: S3Client, name: str, region: str) -> bool:
    try:
        client.head_bucket(Bucket=name)
        return False
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in {"404", "NoSuchBucket", "NotFound"}:
            raise
    if region == "us-east-1":
        client.create_bucket(Bucket=name)
    else:
        client.create_bucket(
            Bucket=name,
            CreateBucketConfiguration={"LocationConstraint": region},  # type: ignore[typeddict-item]
        )
    return True


def provision(
    template: dict[str, Any],
    names: StorageNames,
    *,
    dynamodb_endpoint: str,
    s3_endpoint: str,
    region: str,
    credentials: Mapping[str, str] | None = None,
) -> list[str]:
    """Create the table and the bucket if they do not exist yet.

    Args:
        template: the parsed ``template.yaml``.
        names: physical names to create them under.
        dynamodb_endpoint: DynamoDB endpoint URL.
        s3_endpoint: S3 endpoint URL.
        region: the region clients sign for.
        credentials: ``aws_access_key_id``, ``aws_secret_access_key`` and
            ``aws_session_token`` to sign with (default: the usual credential chain).

    Returns:
        The names of what was created (empty when everything existed).

    Raises:
        botocore.exceptions.ClientError: an endpoint refused a call.
    """
    created: list[str] = []
    session = _session(region, credentials)
    dynamodb: DynamoDBClient = session.client("dynamodb", endpoint_url=dynamodb_endpoint)
    if _ensure_table(dynamodb, template, CONVERSATIONS_TABLE, names.table):
        created.append(names.table)
    s3: S3Client = session.client("s3", endpoint_url=s3_endpoint)
    if _ensure_bucket(s3, names.bucket, region):
        created.append(names.bucket)
    return created


def provision_keys(
    template: dict[str, Any],
    table: str,
    *,
    endpoint: str,
    region: str,
    credentials: Mapping[str, str] | None = None,
) -> str:
    """Create the keys table and the content key on the embedded server (moto's DynamoDB
    and KMS), if missing: content is sealed as deployed (issue 24).

    Returns:
        The content key's id (for ``CONTENT_KMS_KEY_ID``).
    """
    session = _session(region, credentials)
    dynamodb: DynamoDBClient = session.client("dynamodb", endpoint_url=endpoint)
    _ensure_table(dynamodb, template, KEYS_TABLE, table)
    kms: KMSClient = session.client("kms", endpoint_url=endpoint)
    try:
        return kms.describe_key(KeyId=CONTENT_KEY_ALIAS)["KeyMetadata"]["KeyId"]
    except kms.exceptions.NotFoundException:
        key_id = kms.create_key(Description="turnledger local content key")["KeyMetadata"]["KeyId"]
        kms.create_alias(AliasName=CONTENT_KEY_ALIAS, TargetKeyId=key_id)
        return key_id
