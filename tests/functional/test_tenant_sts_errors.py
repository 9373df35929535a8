"""STS failures when assuming a tenant's role answer 503, never 500 (botocore's Stubber).

Throttling, STS's own failures and an unreachable endpoint are passing conditions:
``503 service_unavailable`` with ``Retry-After: 1``. A refusal (access denied, a
policy STS rejects) is a deployment error: ``503 service_unavailable`` too, with
``details.reason`` ``tenant_credentials_refused`` and ``Retry-After: 60``, logged as an
error. Either way nothing is read or written, and a later success is served.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import EndpointConnectionError
from botocore.stub import Stubber
from moto import mock_aws
from turnledger.api import lambda_handler
from turnledger.core.exceptions import ServiceUnavailable
from turnledger.runtime import Runtime, set_runtime
from turnledger.store.tenancy import STS_REFUSED_RETRY_AFTER_SECONDS, TenantAccess
from turnledger_local.gateway import LambdaContext
from turnledger_local.template import PROJECT_ROOT

from tests.support.aws import aws_clients, settings_on

ROLE = "arn:aws:iam::123456789012:role/tenant-access"
EVENT = json.loads((PROJECT_ROOT / "events" / "get-conversation.json").read_text())


def _sts() -> Any:
    # One attempt: these tests are about what a failure answers, not botocore's retries.
    return boto3.client(
        "sts", region_name="us-east-1", config=Config(retries={"total_max_attempts": 1})
    )


def _credentials() -> dict[str, Any]:
    return {
        "Credentials": {
            "AccessKeyId": "ASIATENANTACME000000",
            "SecretAccessKey": "secret",
            "SessionToken": "token",
            "Expiration": datetime.now(UTC) + timedelta(hours=1),
        }
    }


@pytest.fixture
def stubbed(monkeypatch: pytest.MonkeyPatch) -> Iterator[Stubber]:
    """The API on moto, its tenant role assumed through a stubbed STS client."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        clients = aws_clients()
        settings = settings_on(clients, tenant_role_arn=ROLE)
        runtime = Runtime.from_settings(settings)
        assert isinstance(runtime.tenants, TenantAccess)
        sts = _sts()
        runtime.tenants.sts = sts
        set_runtime(runtime)
        try:
            with Stubber(sts) as stubber:
                yield stubber
        finally:
            set_runtime(None)


def _get() -> dict[str, Any]:
    context = LambdaContext(
        function_name="ReadFunction", memory_limit_in_mb=512, timeout_seconds=29
    )
    result: dict[str, Any] = lambda_handler(dict(EVENT), context)
    return result


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("Throttling", 400),
        ("RequestLimitExceeded", 400),
        ("ServiceUnavailable", 503),
        ("InternalFailure", 500),
    ],
)
def test_throttling_and_sts_failures_answer_503_with_retry_after(
    stubbed: Stubber, code: str, status: int
) -> None:
    stubbed.add_client_error("assume_role", code, "busy", status)

    answer = _get()

    assert answer["statusCode"] == 503
    assert answer["headers"]["Retry-After"] == "1"
    error = json.loads(answer["body"])["error"]
    assert error["code"] == "service_unavailable"
    assert error["details"]["reason"] == "tenant_credentials_unavailable"
    assert error["details"]["sts_code"] == code


@pytest.mark.parametrize(
    "code", ["AccessDenied", "MalformedPolicyDocument", "RegionDisabledException"]
)
def test_a_refused_role_answers_503_saying_so(stubbed: Stubber, code: str) -> None:
    stubbed.add_client_error("assume_role", code, "not authorized to perform sts:AssumeRole", 403)

    answer = _get()

    assert answer["statusCode"] == 503
    assert answer["headers"]["Retry-After"] == str(STS_REFUSED_RETRY_AFTER_SECONDS)
    error = json.loads(answer["body"])["error"]
    assert error["code"] == "service_unavailable"
    assert error["details"] == {
        "reason": "tenant_credentials_refused",
        "sts_code": code,
        "retry_after_seconds": STS_REFUSED_RETRY_AFTER_SECONDS,
    }
    assert "access role was refused" in error["message"]


def test_after_a_failure_the_next_request_assumes_the_role_again(stubbed: Stubber) -> None:
    stubbed.add_client_error("assume_role", "Throttling", "busy", 400)
    stubbed.add_response("assume_role", _credentials())

    assert _get()["statusCode"] == 503
    answer = _get()

    # The tenant's credentials were obtained: the request reached the store (moto, which
    # does not check keys), and the conversation does not exist.
    assert answer["statusCode"] == 404
    assert json.loads(answer["body"])["error"]["code"] == "conversation_not_found"
    stubbed.assert_no_pending_responses()


def test_an_unreachable_sts_is_service_unavailable() -> None:
    class Unreachable:
        def assume_role(self, **_: Any) -> Any:
            raise EndpointConnectionError(endpoint_url="https://sts.us-east-1.amazonaws.com")

    access: TenantAccess[str] = TenantAccess(
        Unreachable(), ROLE, bucket="b", build=lambda tenant, _: tenant
    )
    with pytest.raises(ServiceUnavailable) as caught:
        access.for_tenant("acme")
    assert caught.value.status == 503
    assert caught.value.retry_after == 1
    assert caught.value.details["reason"] == "tenant_credentials_unavailable"
    assert caught.value.details["error"] == "EndpointConnectionError"
