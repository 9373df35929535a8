"""The API handler as Lambda invokes it (API Gateway's events, on moto): log context per
invocation, and path parameters as API Gateway decodes them."""

from __future__ import annotations

import base64
import copy
import io
import json
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import pytest
from turnledger.api import app
from turnledger.core.config import LAMBDA_SYNC_PAYLOAD_BYTES, Settings
from turnledger.core.observability import logger
from turnledger.runtime import Runtime, get_runtime

from tests.support.lambda_api import Invoke, api_handler


@pytest.fixture
def invoke(monkeypatch: pytest.MonkeyPatch) -> Iterator[Invoke]:
    """``invoke(event)``: the API's ``lambda_handler`` on moto, as Lambda calls it."""
    with api_handler(monkeypatch, "TurnFunction") as call:
        yield call


def request(
    template: dict[str, Any],
    *,
    request_id: str,
    tenant: str,
    raw_path: str | None = None,
    path_id: str | None = None,
) -> dict[str, Any]:
    """A copy of a sample event with another request id, tenant and path."""
    event = copy.deepcopy(template)
    event["headers"].pop("idempotency-key", None)
    context = event["requestContext"]
    context["requestId"] = request_id
    if "authorizer" in context:
        context["authorizer"]["jwt"]["claims"]["tenant_id"] = tenant
    if raw_path is not None:
        event["rawPath"] = context["http"]["path"] = raw_path
    if path_id is not None:
        event["pathParameters"] = {"id": path_id}
    return event


@pytest.fixture
def errors_logged() -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """``errors_logged()``: the ERROR lines the functions' logger wrote so far, parsed."""
    stream = io.StringIO()
    handler = logger.registered_handler
    previous = handler.setStream(stream)  # type: ignore[attr-defined]

    def lines() -> list[dict[str, Any]]:
        parsed = [json.loads(line) for line in stream.getvalue().splitlines() if line]
        return [line for line in parsed if line.get("level") == "ERROR"]

    yield lines
    handler.setStream(previous)  # type: ignore[attr-defined]


def test_log_keys_of_one_invocation_never_reach_the_next(
    invoke: Invoke,
    load_event: Callable[[str], dict[str, Any]],
    errors_logged: Callable[[], list[dict[str, Any]]],
) -> None:
    """A turn of acme's conversation, then a failing request that names no tenant: the
    failure's line carries its own correlation id and neither acme nor its conversation."""
    turn = request(load_event("turn"), request_id="req-turn", tenant="acme")
    assert invoke(turn)["statusCode"] == 200
    document = request(load_event("openapi"), request_id="req-doc", tenant="acme")
    with mock.patch.object(app, "get_openapi_json_schema", side_effect=RuntimeError("x")):
        assert invoke(document)["statusCode"] == 500

    [failure] = errors_logged()
    assert failure["message"] == "unexpected failure"
    assert failure["correlation_id"] == "req-doc"
    assert "tenant" not in failure and "conversation_id" not in failure


def test_every_routes_lines_carry_its_own_tenant_and_conversation(
    invoke: Invoke,
    load_event: Callable[[str], dict[str, Any]],
    errors_logged: Callable[[], list[dict[str, Any]]],
) -> None:
    """A read that fails names the reader's tenant and conversation, not the last turn's."""
    assert (
        invoke(request(load_event("turn"), request_id="req-1", tenant="acme"))["statusCode"] == 200
    )
    read = request(
        load_event("get-conversation"),
        request_id="req-2",
        tenant="globex",
        raw_path="/v1/conversations/other",
        path_id="other",
    )
    service = get_runtime().conversations
    with mock.patch.object(service, "get", side_effect=RuntimeError("storage on fire")):
        assert invoke(read)["statusCode"] == 500
    [failure] = errors_logged()
    assert (failure["correlation_id"], failure["tenant"], failure["conversation_id"]) == (
        "req-2",
        "globex",
        "other",
    )


def test_path_parameters_are_taken_decoded_as_api_gateway_sends_them(
    invoke: Invoke, load_event: Callable[[str], dict[str, Any]]
) -> None:
    """Deployed: rawPath keeps ``a%3Ab``, pathParameters hold ``a:b``; the id is ``a:b``."""
    turn = request(
        load_event("turn"),
        request_id="req-1",
        tenant="acme",
        raw_path="/v1/conversations/a%3Ab/turns",
        path_id="a:b",
    )
    answer = invoke(turn)
    assert answer["statusCode"] == 200, answer
    assert json.loads(answer["body"])["conversation_id"] == "a:b"
    head = request(
        load_event("get-conversation"),
        request_id="req-2",
        tenant="acme",
        raw_path="/v1/conversations/a:b",
        path_id="a:b",
    )
    assert json.loads(invoke(head)["body"])["turns"] == 1


def test_a_decoded_id_that_breaks_the_rule_is_400(
    invoke: Invoke, load_event: Callable[[str], dict[str, Any]]
) -> None:
    head = request(
        load_event("get-conversation"),
        request_id="req-1",
        tenant="acme",
        raw_path="/v1/conversations/a%2Fb",
        path_id="a/b",
    )
    answer = invoke(head)
    assert answer["statusCode"] == 400
    assert json.loads(answer["body"])["error"]["code"] == "invalid_conversation_id"


def test_a_body_lambda_could_not_carry_is_413_before_the_service(
    invoke: Invoke, load_event: Callable[[str], dict[str, Any]]
) -> None:
    """Lambda carries 6 MiB of event synchronously: a 6,000,000-byte body is refused with
    413 before any route or storage runs, and a body at the default limit, base64-encoded
    in its event (the HTTP API's form for non-text bodies), fits with room for the envelope."""
    limit = Settings().max_input_bytes
    big = request(load_event("turn"), request_id="req-big", tenant="acme")
    big["body"] = json.dumps({"input": "x" * 6_000_000})
    with mock.patch.object(Runtime, "conversations_for", side_effect=AssertionError("served")):
        answer = invoke(big)
    assert answer["statusCode"] == 413, answer["body"][:300]
    error = json.loads(answer["body"])["error"]
    assert error["code"] == "payload_too_large" and error["details"] == {"limit": limit}

    fitting = request(load_event("turn"), request_id="req-fit", tenant="acme")
    fitting["body"] = base64.b64encode(b"x" * limit).decode()
    fitting["isBase64Encoded"] = True
    envelope = len(json.dumps(fitting).encode()) - len(fitting["body"])
    assert len(json.dumps(fitting).encode()) + 64 * 1024 <= LAMBDA_SYNC_PAYLOAD_BYTES, envelope
