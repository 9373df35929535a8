"""Per-tenant credentials (turnledger.store.tenancy) on moto's STS, and the policies they carry.

moto does not enforce IAM: these tests check what the code asks of STS (role,
session name, tag, session policy), the cache (one AssumeRole per tenant, renewal
before expiry, two tenants never share clients) and, with an offline
``StringLike`` that follows IAM's rules, that a tenant's session policy matches its
own keys and no other tenant's. That DynamoDB and S3 refuse what the policies do
not allow is AWS's to enforce.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws
from turnledger.core.config import Settings
from turnledger.core.models import ConversationKey
from turnledger.runtime import Runtime, TenantScope
from turnledger.store import keys
from turnledger.store.dynamodb import DynamoDBConversationStore
from turnledger.store.tenancy import (
    REFRESH_MARGIN_SECONDS,
    TENANT_DYNAMODB_ACTIONS,
    TENANT_TAG,
    TenantAccess,
    TenantCredentials,
    session_name,
    session_policy,
    tag_value,
)

ROLE_NAME = "tenant-access"
BUCKET = "artifacts"
#: Tenants whose keys could be confused if a pattern lacked its separator or encoding.
TENANTS = ["a", "ab", "a:b", "a_b", "a,b", "a=b", "a@b+c", "A" * 128, ",:@+=" * 25]

#: STS's rules for a RoleSessionName and a session tag value (ASCII tenants here).
SESSION_NAME = re.compile(r"[\w+=,.@-]{2,64}")
TAG_VALUE = re.compile(r"[A-Za-z0-9 _.:/=+\-@]{0,256}")


def string_like(pattern: str, value: str) -> bool:
    """IAM's ``StringLike``: ``*`` any run of characters, ``?`` one, the rest literal."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, flags=re.DOTALL) is not None


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """moto's AWS with the tenant role; yields the role's ARN."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        iam = boto3.client("iam")
        role = iam.create_role(RoleName=ROLE_NAME, AssumeRolePolicyDocument="{}")
        yield role["Role"]["Arn"]


def recording_sts() -> tuple[Any, list[dict[str, Any]]]:
    """A real boto3 STS client (on moto) that records every AssumeRole's parameters."""
    sts = boto3.client("sts")
    calls: list[dict[str, Any]] = []

    def record(params: dict[str, Any], **_: Any) -> None:
        calls.append(dict(params))

    sts.meta.events.register("provide-client-params.sts.AssumeRole", record)
    return sts, calls


def build(tenant: str, credentials: TenantCredentials) -> tuple[str, Any]:
    return tenant, credentials.session().client("dynamodb")


def access_key(client: Any) -> str:
    key: str = client._request_signer._credentials.access_key
    return key


def test_one_assume_role_per_tenant_with_its_tag_session_name_and_policy(aws: str) -> None:
    sts, calls = recording_sts()
    access: TenantAccess[tuple[str, Any]] = TenantAccess(sts, aws, bucket=BUCKET, build=build)
    first = access.for_tenant("a:b")
    assert access.for_tenant("a:b") is first  # cached: no second AssumeRole
    [call] = calls
    assert call["RoleArn"] == aws
    assert call["Tags"] == [{"Key": TENANT_TAG, "Value": "a:b"}]
    assert call["RoleSessionName"] == session_name("a:b")
    assert call["Policy"] == session_policy("a:b", bucket=BUCKET)
    assert first[0] == "a:b"
    credentials = access.credentials("a:b")
    assert access_key(first[1]) == credentials.access_key_id
    process = boto3.session.Session().get_credentials()
    assert process is not None
    assert credentials.access_key_id != process.access_key  # not the process's credentials


def test_two_tenants_get_two_sessions_and_two_client_sets(aws: str) -> None:
    sts, calls = recording_sts()
    access: TenantAccess[tuple[str, Any]] = TenantAccess(sts, aws, bucket=BUCKET, build=build)
    one, other = access.for_tenant("a"), access.for_tenant("ab")
    assert one[1] is not other[1]
    assert access_key(one[1]) != access_key(other[1])
    assert [c["Tags"][0]["Value"] for c in calls] == ["a", "ab"]
    assert calls[0]["RoleSessionName"] != calls[1]["RoleSessionName"]


def test_credentials_are_renewed_shortly_before_they_expire(aws: str) -> None:
    sts, calls = recording_sts()
    clock = Clock()
    access: TenantAccess[tuple[str, Any]] = TenantAccess(
        sts, aws, bucket=BUCKET, build=build, clock=clock
    )
    first = access.for_tenant("acme")
    expires_at = access.credentials("acme").expires_at
    assert expires_at > clock.now + REFRESH_MARGIN_SECONDS
    clock.now = expires_at - REFRESH_MARGIN_SECONDS - 1
    assert access.for_tenant("acme") is first
    assert len(calls) == 1
    clock.now = expires_at - REFRESH_MARGIN_SECONDS + 1
    renewed = access.for_tenant("acme")
    assert renewed is not first
    assert len(calls) == 2
    assert access_key(renewed[1]) != access_key(first[1])


def test_the_cache_is_bounded(aws: str) -> None:
    sts, calls = recording_sts()
    access: TenantAccess[tuple[str, Any]] = TenantAccess(
        sts, aws, bucket=BUCKET, build=build, max_tenants=2
    )
    for tenant in ("a", "b", "a", "c", "a", "b"):
        access.for_tenant(tenant)
    # "a" stays (recently used); "b" was evicted by "c" and assumed again.
    assert [c["Tags"][0]["Value"] for c in calls] == ["a", "b", "c", "b"]


def test_concurrent_first_requests_of_a_tenant_assume_the_role_once() -> None:
    # moto is not thread-safe: a slow stand-in for STS counts the calls instead.
    calls: list[str] = []

    class SlowSTS:
        def assume_role(self, **kwargs: Any) -> Any:
            calls.append(kwargs["Tags"][0]["Value"])
            number = len(calls)
            time.sleep(0.05)
            expiration = time.time() + 3600
            from datetime import UTC, datetime

            return {
                "Credentials": {
                    "AccessKeyId": f"AK{number}",
                    "SecretAccessKey": "s",
                    "SessionToken": "t",
                    "Expiration": datetime.fromtimestamp(expiration, UTC),
                }
            }

    access: TenantAccess[str] = TenantAccess(
        SlowSTS(), "arn:aws:iam::1:role/r", bucket=BUCKET, build=lambda t, c: c.access_key_id
    )
    results: list[str] = []
    threads = [
        threading.Thread(target=lambda t=t: results.append(access.for_tenant(t)))
        for t in ["x"] * 8 + ["y"] * 8
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(calls) == ["x", "y"]
    assert len(set(results)) == 2


@pytest.mark.parametrize("tenant", TENANTS)
def test_session_name_and_tag_are_valid_for_any_tenant(tenant: str) -> None:
    assert SESSION_NAME.fullmatch(session_name(tenant))
    assert TAG_VALUE.fullmatch(tag_value(tenant))


def test_session_names_and_tags_tell_tenants_apart() -> None:
    assert len({session_name(t) for t in TENANTS}) == len(TENANTS)
    assert len({tag_value(t) for t in TENANTS}) == len(TENANTS)


@pytest.mark.parametrize("tenant", TENANTS)
def test_session_policy_matches_its_tenants_keys_and_no_others(tenant: str) -> None:
    text = session_policy(tenant, bucket="b" * 63)
    assert len(text) <= 2048  # STS's limit on an inline session policy
    items, objects, listing, _ = json.loads(text)["Statement"]
    assert tuple(items["Action"]) == TENANT_DYNAMODB_ACTIONS
    [pattern] = items["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
    assert items["Condition"]["Null"] == {"dynamodb:LeadingKeys": "false"}
    for other in TENANTS:
        key = ConversationKey(tenant=other, conversation_id="c1")
        own = other == tenant
        assert string_like(pattern, keys.partition_key(key)) is own, other
        obj = keys.blob_key(key, "g1", 1, "0" * 64, attempt="x")
        assert string_like(objects["Resource"], f"arn:aws:s3:::{'b' * 63}/{obj}") is own, other
        prefix = keys.blob_prefix(key)
        assert string_like(listing["Condition"]["StringLike"]["s3:prefix"], prefix) is own, other
    assert not string_like(pattern, "#SWEEP")
    assert listing["Action"] == "s3:ListBucket"


def test_session_policy_lets_s3_use_the_buckets_customer_key() -> None:
    """Issue 47, point 3: with KmsKeyArn the bucket is SSE-KMS, and S3 uses the key as the
    tenant's session: a session policy without KMS actions refuses every offloaded payload
    and export. Only through S3; the role's policy names the key."""
    statements = json.loads(session_policy("acme", bucket=BUCKET))["Statement"]
    [key] = [s for s in statements if any(str(a).startswith("kms:") for a in s["Action"])]
    assert sorted(key["Action"]) == ["kms:Decrypt", "kms:GenerateDataKey"]
    assert key["Condition"] == {"StringLike": {"kms:ViaService": "s3.*"}}
    assert string_like(
        key["Condition"]["StringLike"]["kms:ViaService"], "s3.us-east-1.amazonaws.com"
    )
    assert not string_like(key["Condition"]["StringLike"]["kms:ViaService"], "dynamodb.x")


def test_runtime_serves_each_tenant_on_its_own_credentials(aws: str) -> None:
    settings = Settings(table_name="t", bucket_name=BUCKET, tenant_role_arn=aws)
    runtime = Runtime.from_settings(settings)
    assert runtime.tenants is not None
    one, other = runtime.conversations_for("a"), runtime.conversations_for("b")
    assert one is runtime.conversations_for("a")
    assert one is not other and runtime.conversations not in (one, other)
    for tenant, service in (("a", one), ("b", other)):
        store = service.store
        assert isinstance(store, DynamoDBConversationStore)
        expected = runtime.tenants.credentials(tenant).access_key_id
        assert access_key(store.client) == expected
        assert access_key(runtime.dynamodb_for(tenant)) == expected
        scope: TenantScope = runtime.tenants.for_tenant(tenant)
        assert scope.store is store
    # The process's own service (sweep, erasure) keeps the process's credentials.
    process = boto3.session.Session().get_credentials()
    assert process is not None
    assert access_key(runtime.dynamodb) == process.access_key
    assert process.access_key not in {
        runtime.tenants.credentials(t).access_key_id for t in ("a", "b")
    }


def test_without_a_tenant_role_every_tenant_uses_the_process_credentials(aws: str) -> None:
    runtime = Runtime.from_settings(Settings(table_name="t", bucket_name=BUCKET))
    assert runtime.tenants is None
    assert runtime.conversations_for("a") is runtime.conversations
    assert runtime.dynamodb_for("a") is runtime.dynamodb


def test_tenant_clients_send_over_the_process_connections_with_their_own_credentials(
    aws: str,
) -> None:
    """A tenant's DynamoDB client signs with the tenant's credentials but sends over the
    process's connection pool: a tenant's first request opens no connection of its own
    when the process already holds one, and closing the runtime (before a SnapStart
    snapshot) closes the tenants' connections too."""
    settings = Settings(table_name="t", bucket_name=BUCKET, tenant_role_arn=aws)
    runtime = Runtime.from_settings(settings)
    assert runtime.tenants is not None
    pool = runtime.dynamodb._endpoint.http_session
    one, other = runtime.dynamodb_for("a"), runtime.dynamodb_for("b")
    assert one._endpoint.http_session is pool
    assert other._endpoint.http_session is pool
    keys_used = {access_key(one), access_key(other), access_key(runtime.dynamodb)}
    assert len(keys_used) == 3
