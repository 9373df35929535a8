"""Tenant-scoped AWS credentials: what serves one tenant's request can reach only its data.

Deployed, the API functions do not read or write the table and the bucket with
their own role. For each tenant they assume ``TENANT_ROLE_ARN`` (the template's
``TenantAccessRole``) with a ``tenant`` session tag and an inline session
policy naming that tenant's key prefixes, and build the DynamoDB and S3 clients
(and the store over them) from the credentials STS returns. The effective
permissions are the intersection of the role's policy (item-level actions on
conversation partitions ``T#*`` and objects under ``t/*``; no ``Scan``, no
index, no bucket configuration) and the session policy (this tenant's
partitions ``T#<tenant>#C#*`` and objects ``t/<tenant>/*``), so a bug that
builds another tenant's key is refused by DynamoDB and S3 themselves.

Why a session policy and not only ``${aws:PrincipalTag/tenant}`` in the role:
keys hold the tenant percent-encoded (:mod:`.keys`: ``a:b`` is
``T#a%3Ab#C#...``), and a session tag value cannot contain ``%`` or ``,``. A
tag-based pattern could only name tenants made of ``A-Z a-z 0-9 . _ -``; the
session policy names every tenant's exact prefix. The tag still rides on the
session (the trust policy requires it) so CloudTrail attributes each call.

Credentials are cached per tenant until :data:`REFRESH_MARGIN_SECONDS` before
they expire; the cache is thread-safe (the local runner and tests share one
process between threads) and bounded.

When STS fails, the request answers ``503 service_unavailable``, never 500:
throttling, STS errors and an unreachable endpoint with ``Retry-After`` of
:data:`STS_RETRY_AFTER_SECONDS` (``details.reason`` ``tenant_credentials_unavailable``);
a refusal (access denied, a policy STS rejects: the deployment's role or trust
policy is wrong, which no retry by the caller fixes soon) with ``Retry-After`` of
:data:`STS_REFUSED_RETRY_AFTER_SECONDS` and ``details.reason``
``tenant_credentials_refused``, logged as an error for whoever runs the service.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from ..core.aws import AwsSession
from ..core.exceptions import ServiceUnavailable
from . import keys


class STSClient(Protocol):
    """The one STS call this module makes (a botocore ``sts`` client)."""

    def assume_role(self, **kwargs: Any) -> Any:
        """``sts:AssumeRole``."""


#: Item-level DynamoDB actions a tenant's requests use. ``TransactWriteItems`` is not an
#: IAM action: each of its items is authorized as Put/Update/Delete/ConditionCheckItem.
TENANT_DYNAMODB_ACTIONS = (
    "dynamodb:GetItem",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
    "dynamodb:ConditionCheckItem",
    "dynamodb:BatchWriteItem",
    "dynamodb:Query",
)
#: Object actions on the tenant's prefix (``DeleteObjects`` is authorized as DeleteObject).
TENANT_S3_OBJECT_ACTIONS = ("s3:GetObject", "s3:PutObject", "s3:DeleteObject")
#: What S3 asks of the caller under a customer key (SSE-KMS): a put, a get.
TENANT_S3_KMS_ACTIONS = ("kms:GenerateDataKey", "kms:Decrypt")
#: The session tag naming the tenant (required by the role's trust policy).
TENANT_TAG = "tenant"
#: Credentials are renewed this long before they expire: a request never starts on
#: credentials that could lapse in the middle of it (a turn lasts at most 29 s).
REFRESH_MARGIN_SECONDS = 300
#: Session length asked of STS (the role's MaxSessionDuration is one hour).
SESSION_SECONDS = 3600
#: Tenants whose credentials and clients one process keeps (least recently used go).
MAX_TENANTS = 256

#: ``Retry-After`` when STS throttles, fails or cannot be reached.
STS_RETRY_AFTER_SECONDS = 1
#: ``Retry-After`` when STS refuses the role (a deployment error, not a passing one).
STS_REFUSED_RETRY_AFTER_SECONDS = 60
#: STS error codes of a passing condition (botocore's own retries were spent on them).
STS_TRANSIENT_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "InternalFailure",
        "InternalError",
        "IDPCommunicationError",
    }
)

_SESSION_NAME_UNSAFE = re.compile(r"[^\w+=,.@-]")


def session_name(tenant: str) -> str:
    """A ``RoleSessionName`` for ``tenant``: readable, unique, and valid for any tenant.

    STS allows 2-64 of ``[\\w+=,.@-]``; tenants may hold ``:`` and be 128 long. The
    readable part is cut and cleaned; the hash keeps two tenants apart.
    """
    digest = hashlib.sha256(tenant.encode()).hexdigest()[:16]
    readable = _SESSION_NAME_UNSAFE.sub("_", tenant)[:40]
    return f"tl-{readable}-{digest}"


def tag_value(tenant: str) -> str:
    """The ``tenant`` session tag's value: tag values allow every tenant character but
    ``,``, written ``/`` (never in a tenant), so the value still names one tenant."""
    return tenant.replace(",", "/")


def session_policy(tenant: str, *, bucket: str) -> str:
    """The inline session policy that narrows the role to ``tenant``'s keys.

    The role's policy names the table and the bucket; this one names the tenant's
    prefixes (the ``#`` and ``/`` after the tenant keep ``a`` from matching ``ab``).
    ``Null: false`` refuses any request without leading keys, which
    ``ForAllValues`` alone would let through.

    With a customer key on the bucket (SSE-KMS, the template's ``KmsKeyArn``) S3 uses the
    key as the caller: a put needs ``kms:GenerateDataKey`` and a get ``kms:Decrypt``, which
    the session must grant as well as the role. Its last statement grants them only
    through S3 (``kms:ViaService``); the role's policy names the key.
    """
    prefix = keys.tenant_partition_prefix(tenant)
    objects = keys.tenant_blob_prefix(tenant)
    document = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": list(TENANT_DYNAMODB_ACTIONS),
                "Resource": "*",
                "Condition": {
                    "ForAllValues:StringLike": {"dynamodb:LeadingKeys": [f"{prefix}*"]},
                    "Null": {"dynamodb:LeadingKeys": "false"},
                },
            },
            {
                "Effect": "Allow",
                "Action": list(TENANT_S3_OBJECT_ACTIONS),
                "Resource": f"arn:*:s3:::{bucket}/{objects}*",
            },
            {
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": f"arn:*:s3:::{bucket}",
                "Condition": {"StringLike": {"s3:prefix": f"{objects}*"}},
            },
            {
                "Effect": "Allow",
                "Action": list(TENANT_S3_KMS_ACTIONS),
                "Resource": "*",
                "Condition": {"StringLike": {"kms:ViaService": "s3.*"}},
            },
        ],
    }
    return json.dumps(document, separators=(",", ":"))


@dataclass(frozen=True)
class TenantCredentials:
    """Temporary credentials of one tenant's session."""

    access_key_id: str
    secret_access_key: str
    session_token: str
    #: When they expire, in epoch seconds.
    expires_at: float

    def session(self) -> AwsSession:
        """An AWS session signing with these credentials."""
        return AwsSession(
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            aws_session_token=self.session_token,
        )


@dataclass
class _Entry[T]:
    credentials: TenantCredentials
    scope: T


class TenantAccess[T]:
    """Per-tenant credentials and what is built from them (clients, store), cached.

    ``build`` turns one tenant's credentials into the objects its requests use;
    it runs again whenever the credentials are renewed.
    """

    def __init__(
        self,
        sts: STSClient,
        role_arn: str,
        *,
        bucket: str,
        build: Callable[[str, TenantCredentials], T],
        clock: Callable[[], float] = time.time,
        max_tenants: int = MAX_TENANTS,
    ) -> None:
        self.sts = sts
        self.role_arn = role_arn
        self.bucket = bucket
        self._build = build
        self._clock = clock
        self._max_tenants = max_tenants
        self._entries: OrderedDict[str, _Entry[T]] = OrderedDict()
        self._lock = threading.Lock()
        # One lock per tenant: a slow AssumeRole for one tenant never holds up another's
        # requests, and concurrent first requests of one tenant assume the role once.
        self._tenant_locks: dict[str, threading.Lock] = {}

    def for_tenant(self, tenant: str) -> T:
        """What ``tenant``'s requests use, on credentials valid for a while yet."""
        entry = self._fresh(tenant)
        if entry is not None:
            return entry.scope
        with self._tenant_lock(tenant):
            entry = self._fresh(tenant)  # another thread may have renewed them meanwhile
            if entry is None:
                credentials = self._assume(tenant)
                entry = _Entry(credentials, self._build(tenant, credentials))
                with self._lock:
                    self._entries[tenant] = entry
                    self._entries.move_to_end(tenant)
                    while len(self._entries) > self._max_tenants:
                        evicted, _ = self._entries.popitem(last=False)
                        self._tenant_locks.pop(evicted, None)
            return entry.scope

    def credentials(self, tenant: str) -> TenantCredentials:
        """``tenant``'s current credentials (assumed first if needed)."""
        self.for_tenant(tenant)
        with self._lock:
            return self._entries[tenant].credentials

    def _fresh(self, tenant: str) -> _Entry[T] | None:
        with self._lock:
            entry = self._entries.get(tenant)
            if entry is None:
                return None
            if entry.credentials.expires_at - REFRESH_MARGIN_SECONDS <= self._clock():
                return None
            self._entries.move_to_end(tenant)
            return entry

    def _tenant_lock(self, tenant: str) -> threading.Lock:
        with self._lock:
            return self._tenant_locks.setdefault(tenant, threading.Lock())

    def _assume(self, tenant: str) -> TenantCredentials:
        """Assume the tenant role for ``tenant``.

        Raises:
            ServiceUnavailable: STS failed or refused (see the module docstring).
        """
        try:
            response: Any = self.sts.assume_role(
                RoleArn=self.role_arn,
                RoleSessionName=session_name(tenant),
                DurationSeconds=SESSION_SECONDS,
                Policy=session_policy(tenant, bucket=self.bucket),
                Tags=[{"Key": TENANT_TAG, "Value": tag_value(tenant)}],
            )
        except ClientError as exc:
            raise sts_failure(exc) from exc
        except BotoCoreError as exc:  # unreachable endpoint, timeouts, no credentials
            raise ServiceUnavailable(
                "the tenant's credentials could not be obtained; try again shortly",
                retry_after_seconds=STS_RETRY_AFTER_SECONDS,
                details={"reason": "tenant_credentials_unavailable", "error": type(exc).__name__},
            ) from exc
        found = response["Credentials"]
        expiration: datetime = found["Expiration"]
        return TenantCredentials(
            access_key_id=found["AccessKeyId"],
            secret_access_key=found["SecretAccessKey"],
            session_token=found["SessionToken"],
            expires_at=expiration.timestamp(),
        )


def sts_failure(exc: ClientError) -> ServiceUnavailable:
    """What a failed ``AssumeRole`` answers: see the module docstring."""
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    if code in STS_TRANSIENT_CODES or status >= 500:
        return ServiceUnavailable(
            "the tenant's credentials could not be obtained; try again shortly",
            retry_after_seconds=STS_RETRY_AFTER_SECONDS,
            details={"reason": "tenant_credentials_unavailable", "sts_code": code},
        )
    # Imported here: observability loads Powertools, which this module does not need.
    from ..core.observability import logger

    logger.error(
        "STS refused the tenant role: check TENANT_ROLE_ARN and its trust policy",
        extra={"sts_code": code, "sts_status": status},
    )
    return ServiceUnavailable(
        "the service cannot reach this tenant's data: its access role was refused "
        "(a deployment error; retrying soon will not help)",
        retry_after_seconds=STS_REFUSED_RETRY_AFTER_SECONDS,
        details={"reason": "tenant_credentials_refused", "sts_code": code},
    )
