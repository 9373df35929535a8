"""The open callback route as Lambda invokes it: refused on its token and its own body
limit before the body is read (issue 22, finding 5)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from turnledger.turn import callbacks

from tests.support.lambda_api import Invoke, api_handler

KEY = bytes(range(32))


@pytest.fixture
def invoke(monkeypatch: pytest.MonkeyPatch) -> Iterator[Invoke]:
    """``invoke(event)``: the API's ``lambda_handler`` on moto, with a callback key."""
    monkeypatch.setenv("CALLBACK_KEY", KEY.hex())
    with api_handler(monkeypatch, "ApproveFunction") as call:
        yield call


class UnreadableBody(dict[str, Any]):
    """An event whose body fails the test if anything reads it."""

    def __getitem__(self, key: str) -> Any:
        if key == "body":
            pytest.fail("the body was read")
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        if key == "body":
            pytest.fail("the body was read")
        return super().get(key, default)


def callback_event(template: dict[str, Any], token: str, body: str) -> dict[str, Any]:
    event = copy.deepcopy(template)
    event["pathParameters"] = {"token": token}
    event["rawPath"] = event["requestContext"]["http"]["path"] = f"/v1/callbacks/{token}"
    event["body"] = body
    return event


def genuine_token() -> str:
    claims = callbacks.CallbackClaims(
        tenant="acme",
        conversation_id="cb-edge-1",
        created_at="2099-01-15T12:00:00+00:00",
        call_id="call_1",
        idempotency_key="a" * 32,
        deadline=4102444800,  # 2100-01-01
    )
    return callbacks.sign(KEY, claims)


def test_a_bad_token_is_refused_without_reading_a_large_body(
    invoke: Invoke, load_event: Callable[[str], dict[str, Any]]
) -> None:
    """5 MB of garbage under a forged token: 410, and the body is never touched."""
    event = callback_event(load_event("callback"), "forged-token", "x" * 5_000_000)
    answer = invoke(UnreadableBody(event))
    assert answer["statusCode"] == 410
    assert json.loads(answer["body"])["error"]["code"] == "callback_invalid"


def test_a_genuine_token_meets_the_callbacks_own_body_limit(
    invoke: Invoke, load_event: Callable[[str], dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over CALLBACK_MAX_INPUT_BYTES (far under the API's limit): 413 with that limit;
    under it the body reaches the route."""
    monkeypatch.setenv("CALLBACK_MAX_INPUT_BYTES", "1000")
    big = json.dumps({"status": "succeeded", "output": "y" * 2000})
    answer = invoke(callback_event(load_event("callback"), genuine_token(), big))
    assert answer["statusCode"] == 413
    assert json.loads(answer["body"])["error"]["details"] == {"limit": 1000}

    small = json.dumps({"status": "succeeded", "output": "ok"})
    answer = invoke(callback_event(load_event("callback"), genuine_token(), small))
    # The token is genuine but names no conversation of this table: refused by the settle.
    assert answer["statusCode"] == 410


def test_the_default_callback_limit_is_small() -> None:
    assert callbacks.max_input_bytes() == callbacks.DEFAULT_MAX_INPUT_BYTES == 256 * 1024
