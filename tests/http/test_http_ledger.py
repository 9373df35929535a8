"""The ledger over HTTP, as a user runs it: the local runner serving the real handlers.

Covers the README's curl session, reads, clear, expiry, tenant isolation,
offload, concurrency, and every row of API.md's error table that does not
involve tools (those are in test_http_tools.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from turnledger.core.models import SUPPORTED_SCHEMA_VERSIONS, ConversationKey
from turnledger.store import keys
from turnledger_local.clock import ClockFile
from turnledger_local.runner import LocalRunner

from tests.functional.fake_openai import FakeOpenAI, delayed, error_reply, text_reply
from tests.http.conftest import ANN, BOB, serve, store_of
from tests.support.concurrency import all_at_once
from tests.support.factories import corrupt

Turn = Callable[..., httpx.Response]


def error_of(response: httpx.Response) -> dict[str, Any]:
    """The contract's error object, after checking the body has exactly its shape."""
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["message"]
    error: dict[str, Any] = body["error"]
    return error


def test_readme_session_turn_three_answers_from_turns_one_and_two(turn: Turn) -> None:
    """The README's curl session: turn 3 answers "Your name is Ann." from turns 1-2."""
    first = turn("user-123", "My name is Ann.")
    assert first.status_code == 200
    assert first.json()["turn"] == 1
    assert (
        turn("user-123", "I like tea.").json()["output_text"] == "Noted (2 user messages so far)."
    )
    third = turn("user-123", "What is my name?").json()
    assert third == {
        "conversation_id": "user-123",
        "turn": 3,
        "status": "complete",
        "status_reason": None,
        "output_text": "Your name is Ann.",
        "output_json": None,
        "output": [{"type": "message", "role": "assistant", "content": "Your name is Ann."}],
        "pending_tool_calls": [],
        "awaiting": [],
        "usage": third["usage"],
        "context": {
            "messages_sent": 5,
            "provider_state": "fresh",
            "tokens_estimated": 23,
            "budget_tokens": 7168,
            "summary_through": None,
        },
    }
    # The demo model's estimate is its usage: whitespace-separated words of the context.
    assert third["usage"]["input_tokens"] == 23


def test_head_and_paginated_transcript(http: httpx.Client, turn: Turn) -> None:
    """GET shows the head; GET .../events pages the canonical events in sequence order."""
    for text in ["My name is Ann.", "One.", "Two."]:
        turn("conv", text)
    head = http.get("/v1/conversations/conv", headers=ANN).json()
    assert head["turns"] == 3 and head["events"] == 6 and head["status"] == "complete"
    assert head["expires_at"] is not None and head["ttl_seconds"] == 3600

    page = http.get("/v1/conversations/conv/events?after=0&limit=4", headers=ANN).json()
    assert [e["sequence"] for e in page["events"]] == [1, 2, 3, 4]
    assert page["next_after"] == 4
    event = page["events"][0]
    assert set(event) == {
        "event_id",
        "conversation_id",
        "sequence",
        "turn",
        "kind",
        "actor",
        "occurred_at",
        "payload",
        "schema_version",
        "imported",
    }
    assert event["imported"] is None  # made here, not imported
    assert (event["kind"], event["actor"], event["payload"]["content"]) == (
        "user_message",
        "ann",
        "My name is Ann.",
    )
    assert page["events"][1]["kind"] == "assistant_message"
    rest = http.get("/v1/conversations/conv/events?after=4&limit=100", headers=ANN).json()
    assert [e["sequence"] for e in rest["events"]] == [5, 6]
    assert rest["next_after"] is None


def test_clear_removes_one_conversation_at_once(http: httpx.Client, turn: Turn) -> None:
    """DELETE answers 204 (also when absent); the conversation is gone, its sibling is not."""
    turn("a", "My name is Ann.")
    turn("b", "My name is Bea.")
    assert http.delete("/v1/conversations/a", headers=ANN).status_code == 204
    assert http.delete("/v1/conversations/a", headers=ANN).status_code == 204
    assert (
        error_of(http.get("/v1/conversations/a", headers=ANN))["code"] == "conversation_not_found"
    )
    assert turn("b", "What is my name?").json()["output_text"] == "Your name is Bea."
    assert turn("a", "What is my name?").json()["output_text"] == "I don't know your name yet."


def test_another_tenants_conversation_is_not_found(http: httpx.Client, turn: Turn) -> None:
    """The same id under another tenant is a different, here missing, conversation (404)."""
    turn("shared", "My name is Ann.")
    response = http.get("/v1/conversations/shared", headers=BOB)
    assert response.status_code == 404
    assert error_of(response)["code"] == "conversation_not_found"
    assert turn("shared", "What is my name?", BOB).json()["output_text"] == (
        "I don't know your name yet."
    )


def test_idle_expiry_is_read_through(
    http: httpx.Client, turn: Turn, runner_clock: ClockFile
) -> None:
    """Past the TTL the conversation is 404 at once and the next turn starts fresh."""
    turn("idle", "My name is Ann.")
    runner_clock.advance(3599)
    assert http.get("/v1/conversations/idle", headers=ANN).status_code == 200
    runner_clock.advance(1)
    assert http.get("/v1/conversations/idle", headers=ANN).status_code == 404
    fresh = turn("idle", "What is my name?").json()
    assert (fresh["turn"], fresh["output_text"]) == (1, "I don't know your name yet.")


@pytest.mark.parametrize(
    "authorization",
    [None, "Basic YW5uOnB3", "Bearer someone-elses-token", "Bearer local:", "Bearer local"],
)
def test_requests_without_local_identity_are_unauthorized(
    http: httpx.Client, authorization: str | None
) -> None:
    """No or bad credentials: 401 unauthorized, in the error shape."""
    headers = {"Authorization": authorization} if authorization else {}
    response = http.post("/v1/conversations/c/turns", json={"input": "hi"}, headers=headers)
    assert response.status_code == 401
    assert error_of(response)["code"] == "unauthorized"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", "invalid_request"),
        (b"[1, 2]", "invalid_request"),
        (b'"a string"', "invalid_request"),
        (b"", "invalid_request"),
    ],
)
def test_body_that_is_not_a_json_object_is_invalid_request(
    http: httpx.Client, body: bytes, code: str
) -> None:
    """400 invalid_request when the body is not JSON, or not an object."""
    response = http.post(
        "/v1/conversations/c/turns",
        content=body,
        headers={**ANN, "content-type": "application/json"},
    )
    assert response.status_code == 400
    assert error_of(response)["code"] == code


@pytest.mark.parametrize(
    "conversation_id", ["-dash-first", "has%20space", "x" * 129, "semi;colon", "a%23b"]
)
def test_bad_conversation_ids_are_rejected(http: httpx.Client, conversation_id: str) -> None:
    """400 invalid_conversation_id for ids that break the rule, on every route."""
    for method, suffix, body in [
        ("POST", "/turns", {"input": "hi"}),
        ("GET", "", None),
        ("GET", "/events", None),
        ("DELETE", "", None),
    ]:
        response = http.request(
            method, f"/v1/conversations/{conversation_id}{suffix}", json=body, headers=ANN
        )
        assert response.status_code == 400, (method, suffix, response.text)
        assert error_of(response)["code"] == "invalid_conversation_id"


@pytest.mark.parametrize(
    "body",
    [
        {"inpt": "typo"},
        {"input": 42},
        {"input": []},
        {"input": [{"type": "message", "role": "system", "content": "x"}]},
        {"input": "hi", "metadata": {"n": 1}},
        {"input": "hi", "tools": "all"},
    ],
)
def test_schema_violations_are_validation_errors(http: httpx.Client, body: dict[str, Any]) -> None:
    """422 validation_error; details say where."""
    response = http.post("/v1/conversations/c/turns", json=body, headers=ANN)
    assert response.status_code == 422
    error = error_of(response)
    assert error["code"] == "validation_error"
    assert error["details"]["errors"] and all(e["loc"] for e in error["details"]["errors"])


def test_events_query_parameters_are_validated(http: httpx.Client, turn: Turn) -> None:
    """``after`` below 0 or ``limit`` outside 1..1000: 422 validation_error."""
    turn("c", "hi")
    for query in ["after=-1", "limit=0", "limit=1001", "after=x"]:
        response = http.get(f"/v1/conversations/c/events?{query}", headers=ANN)
        assert response.status_code == 422, query
        assert error_of(response)["code"] == "validation_error"


def test_unknown_tool_is_rejected(http: httpx.Client, turn: Turn) -> None:
    """422 unknown_tool when a turn names a tool that is not registered."""
    for body in [{"tools": ["nope"]}, {"require_approval": ["nope"]}]:
        response = turn("c", "hi", **body)
        assert response.status_code == 422
        assert error_of(response)["code"] == "unknown_tool"
    assert http.get("/v1/conversations/c", headers=ANN).status_code == 404


def test_input_over_the_limit_is_payload_too_large(runner_clock: ClockFile) -> None:
    """413 payload_too_large over the configured limit; nothing is stored."""
    with serve(runner_clock, env={"MAX_INPUT_BYTES": "2000"}) as http:
        response = http.post("/v1/conversations/big/turns", json={"input": "x" * 3000}, headers=ANN)
        assert response.status_code == 413
        assert error_of(response)["code"] == "payload_too_large"
        assert http.get("/v1/conversations/big", headers=ANN).status_code == 404


def test_large_message_round_trips_over_http(http: httpx.Client, turn: Turn) -> None:
    """A 600 KB message goes to S3 and comes back whole from the events route."""
    big = "My name is Ann. " + "y" * 600_000
    assert turn("big", big).status_code == 200
    assert turn("big", "What is my name?").json()["output_text"] == "Your name is Ann."
    page = http.get("/v1/conversations/big/events?limit=1", headers=ANN).json()
    assert page["events"][0]["payload"]["content"] == big


@pytest.mark.parametrize(
    ("damage", "code"),
    [({"d": "{broken"}, "corrupted_state"), ({"v": 7}, "unsupported_state_version")],
)
def test_damaged_state_is_409_and_delete_recovers(
    served: LocalRunner, http: httpx.Client, turn: Turn, damage: dict[str, Any], code: str
) -> None:
    """A damaged head answers 409 with its code on every route; DELETE recovers."""
    turn("hurt", "My name is Ann.")
    key = ConversationKey(tenant="acme", conversation_id="hurt")
    corrupt(store_of(served), key, keys.HEAD_SK, **damage)
    for response in [
        turn("hurt", "What is my name?"),
        http.get("/v1/conversations/hurt", headers=ANN),
        http.get("/v1/conversations/hurt/events", headers=ANN),
    ]:
        assert response.status_code == 409
        error = error_of(response)
        assert error["code"] == code
        if code == "unsupported_state_version":
            assert (error["details"]["found"], error["details"]["supported"]) == (
                7,
                SUPPORTED_SCHEMA_VERSIONS,
            )
    assert http.delete("/v1/conversations/hurt", headers=ANN).status_code == 204
    assert turn("hurt", "What is my name?").json()["output_text"] == "I don't know your name yet."


def test_provider_failures_are_502_and_504_and_leave_no_trace(runner_clock: ClockFile) -> None:
    """openai-chat failing: 502 provider_error / 504 provider_timeout; only the failures
    are stored (``turn_failed``), never the lost input."""
    with FakeOpenAI() as fake:
        env = {
            "OPENAI_BASE_URL": fake.base_url,
            "OPENAI_API_KEY": "sk-test",
            "PROVIDER_MAX_RETRIES": "0",
            "PROVIDER_TIMEOUT_SECONDS": "1",
        }
        with serve(runner_clock, provider="openai-chat", model="gpt-test", env=env) as http:
            fake.script(text_reply("Hello Ann."))
            ok = http.post("/v1/conversations/p/turns", json={"input": "Hi"}, headers=ANN)
            assert ok.json()["output_text"] == "Hello Ann."

            fake.script(error_reply(500, "upstream exploded"))
            failed = http.post("/v1/conversations/p/turns", json={"input": "lost"}, headers=ANN)
            assert failed.status_code == 502
            assert error_of(failed)["code"] == "provider_error"

            fake.script(delayed(text_reply("too late"), 5))
            slow = http.post("/v1/conversations/p/turns", json={"input": "lost"}, headers=ANN)
            assert slow.status_code == 504
            assert error_of(slow)["code"] == "provider_timeout"

            head = http.get("/v1/conversations/p", headers=ANN).json()
            assert (head["turns"], head["events"], head["failed_turns"]) == (1, 4, 2)
            events = http.get("/v1/conversations/p/events", headers=ANN).json()["events"]
            assert [e["kind"] for e in events[2:]] == ["turn_failed", "turn_failed"]
            assert [e["payload"]["code"] for e in events[2:]] == [
                "provider_error",
                "provider_timeout",
            ]
            sent = fake.requests[0].json()
            assert sent["model"] == "gpt-test"
            assert sent["messages"] == [{"role": "user", "content": "Hi"}]


def test_racing_turns_over_http_one_wins(ddb_http: httpx.Client) -> None:
    """Many turns at once on one conversation: each is 200 or 409 conversation_busy, and
    the transcript holds exactly the winners, whole."""
    ddb_http.post("/v1/conversations/race/turns", json={"input": "start"}, headers=ANN)

    def fire(index: int) -> httpx.Response:
        return ddb_http.post(
            "/v1/conversations/race/turns", json={"input": f"racer {index}"}, headers=ANN
        )

    results = all_at_once(6, fire)
    winners = [r for r in results if r.status_code == 200]
    losers = [r for r in results if r.status_code != 200]
    assert winners
    assert all(error_of(r)["code"] == "conversation_busy" for r in losers)
    events = ddb_http.get("/v1/conversations/race/events", headers=ANN).json()["events"]
    assert len(events) == 2 * (1 + len(winners))
    kinds = [e["kind"] for e in events]
    assert kinds == ["user_message", "assistant_message"] * (1 + len(winners))


def test_concurrent_conversations_over_http(ddb_http: httpx.Client) -> None:
    """Ten conversations in flight at once: all commit; none sees another's history."""

    def talk(index: int) -> str:
        path = f"/v1/conversations/talk-{index}/turns"
        first = ddb_http.post(path, json={"input": f"My name is N{index}."}, headers=ANN)
        assert first.status_code == 200, first.text
        reply = ddb_http.post(path, json={"input": "What is my name?"}, headers=ANN)
        assert reply.status_code == 200, reply.text
        answer: str = reply.json()["output_text"]
        return answer

    assert all_at_once(10, talk) == [f"Your name is N{i}." for i in range(10)]


def test_openapi_document_describes_every_route(http: httpx.Client) -> None:
    """GET /v1/openapi.json (no auth) is an OpenAPI 3 document of all routes."""
    response = http.get("/v1/openapi.json")
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"].startswith("3.")
    paths = document["paths"]
    assert set(paths) >= {
        "/v1/conversations/{conversation_id}/turns",
        "/v1/conversations/{conversation_id}/approvals",
        "/v1/conversations/{conversation_id}",
        "/v1/conversations/{conversation_id}/events",
        "/v1/conversations",
    }
    assert "delete" in paths["/v1/conversations/{conversation_id}"]
    schemas = document["components"]["schemas"]
    assert {"TurnRequest", "TurnResponse", "ApprovalRequest", "EventsPage"} <= set(schemas)
    # Every documented error answer has the contract's error shape, 422 included.
    for path, methods in paths.items():
        for method, operation in methods.items():
            for status, answer in operation["responses"].items():
                if int(status) >= 400:
                    ref = answer["content"]["application/json"]["schema"]["$ref"]
                    assert ref.endswith("/ErrorBody"), (method, path, status)
    turn_errors = set(paths["/v1/conversations/{conversation_id}/turns"]["post"]["responses"])
    assert turn_errors >= {"200", "400", "401", "409", "413", "422", "502", "504"}
    # A turn asked for with Accept: text/event-stream answers server-sent events (issue 43).
    answered = paths["/v1/conversations/{conversation_id}/turns"]["post"]["responses"]["200"]
    assert set(answered["content"]) == {"application/json", "text/event-stream"}


def test_unknown_route_is_404_in_the_error_shape(http: httpx.Client) -> None:
    """Paths that are no route answer the error shape too."""
    response = http.get("/v2/nothing", headers=ANN)
    assert response.status_code == 404
    assert error_of(response)["code"] == "not_found"
