"""Clients, tables and buckets for any endpoint (moto in-process, moto server, DynamoDB Local).

Tables are built from ``template.yaml``'s ``ConversationsTable``, so tests and
the deployed table cannot drift.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config
from turnledger.core.config import Settings
from turnledger_local.template import load_template, table_definition, ttl_attribute

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_s3 import S3Client

TABLE_RESOURCE = "ConversationsTable"
KEYS_RESOURCE = "KeysTable"
REGION = "us-east-1"

#: Local engines answer fast or not at all; fail a test instead of hanging it.
_CONFIG = Config(
    connect_timeout=5,
    read_timeout=60,
    retries={"max_attempts": 3, "mode": "standard"},
    max_pool_connections=32,
)


@dataclass(frozen=True)
class AwsClients:
    """The two clients a conversation store needs."""

    dynamodb: DynamoDBClient
    s3: S3Client


def aws_clients(endpoint: str | None = None, *, s3_endpoint: str | None = None) -> AwsClients:
    """Clients with the fake test credentials.

    Args:
        endpoint: where both services answer (``None``: AWS's own endpoints,
            which ``moto.mock_aws`` intercepts in-process).
        s3_endpoint: S3 somewhere else than ``endpoint`` (DynamoDB Local has no S3).
    """
    dynamodb = boto3.client(
        "dynamodb",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=_CONFIG,
    )
    s3 = boto3.client(
        "s3",
        endpoint_url=s3_endpoint or endpoint,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=_CONFIG,
    )
    return AwsClients(dynamodb=dynamodb, s3=s3)


def unique_name(prefix: str) -> str:
    """A table or bucket name no other test uses (lowercase: valid for both)."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def create_conversations_table(client: DynamoDBClient, name: str | None = None) -> str:
    """Create the conversations table as ``template.yaml`` defines it; return its name."""
    template = load_template()
    table_name = name or unique_name("conversations")
    client.create_table(**table_definition(template, TABLE_RESOURCE, table_name))
    client.get_waiter("table_exists").wait(
        TableName=table_name, WaiterConfig={"Delay": 1, "MaxAttempts": 30}
    )
    attribute = ttl_attribute(template, TABLE_RESOURCE)
    if attribute:
        client.update_time_to_live(
            TableName=table_name,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": attribute},
        )
    return table_name


def create_bucket(client: S3Client, name: str | None = None) -> str:
    """Create a bucket for offloaded payloads; return its name."""
    bucket = name or unique_name("artifacts")
    client.create_bucket(Bucket=bucket)
    return bucket


def create_keys_table(client: DynamoDBClient, name: str | None = None) -> str:
    """Create the keys table (wrapped data keys) as ``template.yaml`` defines it."""
    table_name = name or unique_name("keys")
    client.create_table(**table_definition(load_template(), KEYS_RESOURCE, table_name))
    client.get_waiter("table_exists").wait(
        TableName=table_name, WaiterConfig={"Delay": 1, "MaxAttempts": 30}
    )
    return table_name


def settings_on(clients: AwsClients, **changes: Any) -> Settings:
    """Default settings (and ``changes``) naming a new conversations table and bucket made
    through ``clients``."""
    return Settings(
        table_name=create_conversations_table(clients.dynamodb),
        bucket_name=create_bucket(clients.s3),
        **changes,
    )
