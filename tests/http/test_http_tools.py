"""Tool calling over HTTP: turns, approvals, client tools, errors and idempotent retries.

One local runner per module serves the template's routes through the
functions' own handlers, on DynamoDB Local (the real engine: safe under
concurrent writes, unlike moto's server) with S3 on the embedded moto server.
Its ``http`` tools are served by an idempotent :class:`HttpSink`. Each test
uses its own conversation ids, and counts only its own tool requests.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from turnledger.tools import arguments_sha256
from turnledger_local.runner import LocalConfig, LocalRunner

from tests.functional.fake_openai import FakeOpenAI, text_reply, tool_call, tool_calls_reply
from tests.functional.http_sink import HttpSink, RecordedRequest
from tests.functional.test_tool_turns import lines, script_tools, tool_definitions, tool_line
from tests.http.conftest import on_ddb_local, on_openai_chat, tools_file
from tests.support.concurrency import all_at_once
from tests.support.worker_hooks import ARMED, BARRIER_DIR

pytestmark = pytest.mark.integration

ANN = {"Authorization": "Bearer local:acme:ann"}
BEN = {"Authorization": "Bearer local:acme:ben"}


@pytest.fixture(scope="module")
def sink() -> Iterator[HttpSink]:
    with HttpSink(dedupe=True) as server:
        script_tools(server)
        yield server


@pytest.fixture(scope="module")
def tools_config(
    sink: HttpSink, ddb_local_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> LocalConfig:
    """A runner on DynamoDB Local whose tool registry points at the sink."""
    registry = tools_file(tmp_path_factory.mktemp("registry"), tool_definitions(sink))
    return on_ddb_local(ddb_local_endpoint, tools_file=registry)


@pytest.fixture(scope="module")
def runner(tools_config: LocalConfig) -> Iterator[LocalRunner]:
    with LocalRunner(tools_config) as served:
        yield served


@pytest.fixture
def client(runner: LocalRunner) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=runner.url, headers=ANN, timeout=30) as http:
        yield http


@pytest.fixture
def conversation() -> str:
    return f"http-{uuid.uuid4().hex[:12]}"


def post_turn(client: httpx.Client, conversation: str, **body: Any) -> httpx.Response:
    return client.post(f"/v1/conversations/{conversation}/turns", json=body)


def post_approvals(
    client: httpx.Client, conversation: str, headers: dict[str, str] | None = None, **body: Any
) -> httpx.Response:
    return client.post(f"/v1/conversations/{conversation}/approvals", json=body, headers=headers)


def events(client: httpx.Client, conversation: str) -> list[dict[str, Any]]:
    response = client.get(f"/v1/conversations/{conversation}/events", params={"limit": 1000})
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()["events"]
    return found


def tool_requests(sink: HttpSink, path: str, conversation: str) -> list[RecordedRequest]:
    return [r for r in sink.requests_for(path) if r.json()["conversation_id"] == conversation]


def side_effects(sink: HttpSink, path: str, conversation: str) -> list[RecordedRequest]:
    return [r for r in sink.side_effects(path) if r.json()["conversation_id"] == conversation]


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"code", "message", "details"}
    return error


def test_approve_all_over_http(client: httpx.Client, sink: HttpSink, conversation: str) -> None:
    """Pause, GET shows the pending calls with expiry, approve, the tools run once, complete."""
    first = post_turn(
        client,
        conversation,
        input=lines(tool_line("send_email", to="a@x"), tool_line("send_email", to="b@x")),
    )
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["status"] == "awaiting_approval"
    assert [(p["id"], p["requires"]) for p in body["pending_tool_calls"]] == [
        ("call_1", "approval"),
        ("call_2", "approval"),
    ]
    view = client.get(f"/v1/conversations/{conversation}").json()
    assert view["status"] == "awaiting_approval"
    assert [p["id"] for p in view["pending_tool_calls"]] == ["call_1", "call_2"]
    assert all(p["expires_at"] for p in view["pending_tool_calls"])
    assert [p["expires_at"] for p in view["pending_tool_calls"]] == [
        p["expires_at"] for p in body["pending_tool_calls"]
    ]
    assert tool_requests(sink, "/email", conversation) == []

    done = post_approvals(client, conversation, approve=["call_1", "call_2"])
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "complete"
    assert done.json()["output_text"] == (
        'Tool results: send_email: {"sent":true}; send_email: {"sent":true}'
    )
    sent = tool_requests(sink, "/email", conversation)
    assert sorted(r.json()["arguments"]["to"] for r in sent) == ["a@x", "b@x"]
    assert all(r.idempotency_key for r in sent)

    log = events(client, conversation)
    resolved = [e for e in log if e["kind"] == "approval_resolved"]
    assert [(e["payload"]["approver"], e["actor"]) for e in resolved] == [("ann", "ann")] * 2
    requested = {
        e["payload"]["call_id"]: e["payload"] for e in log if e["kind"] == "tool_call_requested"
    }
    for event in resolved:
        call = requested[event["payload"]["call_id"]]
        assert event["payload"]["arguments_sha256"] == arguments_sha256(call["arguments"])
    assert {r.json()["call_id"]: r.idempotency_key for r in sent} == {
        call_id: call["idempotency_key"] for call_id, call in requested.items()
    }


def test_partial_decisions_and_a_turn_while_approval_pends(
    client: httpx.Client, sink: HttpSink, conversation: str
) -> None:
    """Partial approval keeps waiting; a turn meanwhile is 409 approval_pending listing the rest."""
    post_turn(
        client,
        conversation,
        input=lines(
            tool_line("send_email", to="a@x"),
            tool_line("get_weather", city="Oslo"),
            tool_line("send_email", to="b@x"),
        ),
    )
    # The call needing no approval ran at once.
    assert len(tool_requests(sink, "/weather", conversation)) == 1
    partial = post_approvals(client, conversation, approve=["call_1"])
    assert partial.status_code == 200, partial.text
    assert partial.json()["status"] == "awaiting_approval"
    assert [p["id"] for p in partial.json()["pending_tool_calls"]] == ["call_3"]

    error = error_of(post_turn(client, conversation, input="Hello?"), 409)
    assert error["code"] == "approval_pending"
    [listed] = error["details"]["pending_tool_calls"]
    assert (listed["id"], listed["name"], listed["arguments"], listed["requires"]) == (
        "call_3",
        "send_email",
        {"to": "b@x"},
        "approval",
    )
    assert listed["expires_at"]

    done = post_approvals(
        client, conversation, reject=[{"id": "call_3", "reason": "wrong recipient"}]
    )
    assert done.status_code == 200, done.text
    assert done.json()["output_text"] == (
        'Tool results: send_email: {"sent":true}; get_weather: {"temp":21}; '
        "send_email: tool call send_email was not run: rejected by ann: wrong recipient"
    )
    assert [r.json()["arguments"] for r in tool_requests(sink, "/email", conversation)] == [
        {"to": "a@x"}
    ]
    assert len(tool_requests(sink, "/weather", conversation)) == 1


def test_reject_all_over_http(client: httpx.Client, sink: HttpSink, conversation: str) -> None:
    """Plain ids reject too; nothing runs and the approver is the token's user."""
    post_turn(client, conversation, input=tool_line("send_email", to="a@x"))
    done = post_approvals(client, conversation, headers=BEN, reject=["call_1"])
    assert done.status_code == 200, done.text
    assert done.json()["output_text"] == (
        "Tool results: send_email: tool call send_email was not run: rejected by ben"
    )
    assert tool_requests(sink, "/email", conversation) == []
    [resolved] = [e for e in events(client, conversation) if e["kind"] == "approval_resolved"]
    assert resolved["payload"]["approver"] == "ben"
    assert resolved["payload"]["decision"] == "rejected"


def test_client_tools_over_http(client: httpx.Client, conversation: str) -> None:
    """A client tool pauses the turn; the caller's function_call_output continues it."""
    first = post_turn(client, conversation, input=tool_line("lookup_user", user_id="u1"))
    assert first.json()["status"] == "awaiting_client_tools"
    assert first.json()["pending_tool_calls"][0]["requires"] == "client"
    output = {"type": "function_call_output", "call_id": "call_1", "output": "Ada"}
    done = post_turn(client, conversation, input=[output])
    assert done.status_code == 200, done.text
    assert (done.json()["status"], done.json()["output_text"]) == (
        "complete",
        "Tool results: lookup_user: Ada",
    )
    error = error_of(post_turn(client, conversation, input=[output]), 422)
    assert error["code"] == "unknown_tool_call"


def test_tool_errors_over_http(client: httpx.Client, sink: HttpSink, conversation: str) -> None:
    """unknown_tool_call, unknown_tool, not_awaiting_approval, and 404 for no conversation."""
    error = error_of(post_approvals(client, conversation, approve=["call_1"]), 404)
    assert error["code"] == "conversation_not_found"

    error = error_of(post_turn(client, conversation, input="hi", tools=["teleport"]), 422)
    assert (error["code"], error["details"]["unknown"]) == ("unknown_tool", ["teleport"])
    error = error_of(post_turn(client, conversation, input="hi", require_approval=["nope"]), 422)
    assert error["code"] == "unknown_tool"

    post_turn(client, conversation, input="Hello.")
    error = error_of(post_approvals(client, conversation, approve=["call_1"]), 409)
    assert error["code"] == "not_awaiting_approval"

    post_turn(client, conversation, input=tool_line("send_email", to="a@x"))
    error = error_of(post_approvals(client, conversation, approve=["call_1", "call_7"]), 422)
    assert error["code"] == "unknown_tool_call"
    assert (error["details"]["unknown"], error["details"]["pending"]) == (["call_7"], ["call_1"])
    error = error_of(post_approvals(client, conversation), 422)
    assert error["code"] == "validation_error"
    assert tool_requests(sink, "/email", conversation) == []


def test_call_level_approval_over_http(
    client: httpx.Client, sink: HttpSink, conversation: str
) -> None:
    """``require_approval`` on the turn pauses a tool the registry would run at once."""
    reply = post_turn(
        client,
        conversation,
        input=tool_line("get_weather", city="Oslo"),
        require_approval=["get_weather"],
    )
    assert reply.json()["status"] == "awaiting_approval"
    assert tool_requests(sink, "/weather", conversation) == []
    assert post_approvals(client, conversation, approve=["call_1"]).json()["status"] == "complete"
    assert len(tool_requests(sink, "/weather", conversation)) == 1


def test_idempotent_turn_retries(client: httpx.Client, sink: HttpSink, conversation: str) -> None:
    """Same key and body: the first answer again, nothing runs twice; another body: 422."""
    body = {"input": tool_line("get_weather", city="Oslo")}
    key = {"Idempotency-Key": f"turn-{uuid.uuid4().hex}"}
    url = f"/v1/conversations/{conversation}/turns"
    first = client.post(url, json=body, headers=key)
    assert first.status_code == 200, first.text
    again = client.post(url, json=body, headers=key)
    assert again.status_code == 200, again.text
    assert again.json() == first.json()
    assert len(tool_requests(sink, "/weather", conversation)) == 1
    view = client.get(f"/v1/conversations/{conversation}").json()
    assert (view["turns"], view["events"]) == (1, 5)

    error = error_of(client.post(url, json={"input": "something else"}, headers=key), 422)
    assert error["code"] == "idempotency_key_reused"
    # Without a key, the same body is a new turn.
    assert client.post(url, json=body).json()["turn"] == 2


def test_idempotent_approval_retries(
    client: httpx.Client, sink: HttpSink, conversation: str
) -> None:
    """A retried approval answers the turn again (not 409) and the tool ran once."""
    post_turn(client, conversation, input=tool_line("send_email", to="a@x"))
    key = {"Idempotency-Key": f"approve-{uuid.uuid4().hex}"}
    first = post_approvals(client, conversation, headers=key, approve=["call_1"])
    assert first.status_code == 200, first.text
    again = post_approvals(client, conversation, headers=key, approve=["call_1"])
    assert again.status_code == 200, again.text
    assert again.json() == first.json()
    assert len(tool_requests(sink, "/email", conversation)) == 1

    error = error_of(post_approvals(client, conversation, headers=key, reject=["call_1"]), 422)
    assert error["code"] == "idempotency_key_reused"
    # Without the key the repeat is what it is: nothing awaits approval any more.
    error = error_of(post_approvals(client, conversation, approve=["call_1"]), 409)
    assert error["code"] == "not_awaiting_approval"


def test_two_approvers_racing_over_http(
    tools_config: LocalConfig, sink: HttpSink, conversation: str, tmp_path: Path
) -> None:
    """Both read the pending call before either commits: one 200, one 409, the tool runs once.

    The approvals run in two worker processes; a hook makes each load wait until both
    have loaded (tests/support/worker_hooks.py). Without synchronous drafts: with them, the
    second approval is refused at its draft, before it loads, and the commit never races
    (the next test).
    """
    config = replace(
        tools_config,
        worker_hook="tests.support.worker_hooks:two_loads_meet",
        env={BARRIER_DIR: str(tmp_path), "SYNC_TURN_DRAFTS": "false"},
    )
    with LocalRunner(config) as runner:
        with httpx.Client(base_url=runner.url, headers=ANN, timeout=30) as http:
            post_turn(http, conversation, input=tool_line("send_email", to="a@x"))
        (tmp_path / ARMED).touch()
        approvers = [("ann", ANN), ("ben", BEN)]

        def approve(index: int) -> httpx.Response:
            with httpx.Client(base_url=runner.url, headers=approvers[index][1], timeout=30) as http:
                return post_approvals(http, conversation, approve=["call_1"])

        answers = {
            approvers[index][0]: answer
            for index, answer in enumerate(all_at_once(len(approvers), approve))
        }
        (tmp_path / ARMED).unlink()
        assert runner.pool_sizes()["ApproveFunction"] == 2
        statuses = sorted(response.status_code for response in answers.values())
        assert statuses == [200, 409], {name: r.text for name, r in answers.items()}
        [busy] = [r for r in answers.values() if r.status_code == 409]
        assert busy.json()["error"]["code"] == "conversation_busy"
        assert len(side_effects(sink, "/email", conversation)) == 1
        assert len(tool_requests(sink, "/email", conversation)) == 1
        [winner] = [name for name, r in answers.items() if r.status_code == 200]
        with httpx.Client(base_url=runner.url, headers=ANN, timeout=30) as http:
            [resolved] = [e for e in events(http, conversation) if e["kind"] == "approval_resolved"]
        assert resolved["payload"]["approver"] == winner


def test_two_approvers_racing_through_drafts(
    tools_config: LocalConfig, sink: HttpSink, conversation: str
) -> None:
    """As deployed (synchronous drafts on): two approvals at once, one 200 and one 409 (its
    draft refused while the other runs, or nothing left to decide), the tool runs once."""
    with LocalRunner(tools_config) as runner:
        with httpx.Client(base_url=runner.url, headers=ANN, timeout=30) as http:
            post_turn(http, conversation, input=tool_line("send_email", to="a@x"))
        approvers = [ANN, BEN]

        def approve(index: int) -> httpx.Response:
            with httpx.Client(base_url=runner.url, headers=approvers[index], timeout=30) as http:
                return post_approvals(http, conversation, approve=["call_1"])

        answers = all_at_once(len(approvers), approve)
        statuses = sorted(response.status_code for response in answers)
        assert statuses == [200, 409], [r.text for r in answers]
        [refused] = [r for r in answers if r.status_code == 409]
        assert refused.json()["error"]["code"] in {"conversation_busy", "not_awaiting_approval"}
        assert len(tool_requests(sink, "/email", conversation)) == 1


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
def openai_client(tools_config: LocalConfig, fake_openai: FakeOpenAI) -> Iterator[httpx.Client]:
    """A runner like ``runner`` on the openai-chat provider, talking to a fake OpenAI server."""
    config = on_openai_chat(tools_config, fake_openai, PROVIDER_MAX_RETRIES="0")
    with (
        LocalRunner(config) as served,
        httpx.Client(base_url=served.url, headers=ANN, timeout=30) as http,
    ):
        yield http


def test_openai_chat_history_across_an_approval_turn(
    openai_client: httpx.Client, sink: HttpSink, conversation: str, fake_openai: FakeOpenAI
) -> None:
    """Tools, tool_calls and role: tool messages in the Chat Completions shapes, in order."""
    fake, client = fake_openai, openai_client
    fake.script(
        tool_calls_reply(
            tool_call("call_mail", "send_email", json.dumps({"to": "a@x"})),
            tool_call("call_sky", "get_weather", json.dumps({"city": "Oslo"})),
        ),
        text_reply("Sent, and it is 21 degrees."),
    )
    first = post_turn(client, conversation, input="Mail a@x and tell me the weather in Oslo.")
    assert first.status_code == 200, first.text
    assert first.json()["status"] == "awaiting_approval"
    assert [p["id"] for p in first.json()["pending_tool_calls"]] == ["call_mail"]
    done = post_approvals(client, conversation, approve=["call_mail"])
    assert done.status_code == 200, done.text
    assert done.json()["output_text"] == "Sent, and it is 21 degrees."

    asked, answered = (request.json() for request in fake.requests)
    assert asked["model"] == "gpt-test"
    assert [t["type"] for t in asked["tools"]] == ["function"] * 4
    weather = next(t["function"] for t in asked["tools"] if t["function"]["name"] == "get_weather")
    assert weather["parameters"]["required"] == ["city"]
    assert asked["messages"] == [
        {"role": "user", "content": "Mail a@x and tell me the weather in Oslo."}
    ]
    user, assistant, *results = answered["messages"]
    assert user == asked["messages"][0]
    assert assistant["role"] == "assistant"
    assert [
        (c["id"], c["type"], c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in assistant["tool_calls"]
    ] == [
        ("call_mail", "function", "send_email", {"to": "a@x"}),
        ("call_sky", "function", "get_weather", {"city": "Oslo"}),
    ]
    # One result per call, in the calls' order, though the weather ran first.
    assert results == [
        {"role": "tool", "tool_call_id": "call_mail", "content": '{"sent":true}'},
        {"role": "tool", "tool_call_id": "call_sky", "content": '{"temp":21}'},
    ]
    assert len(tool_requests(sink, "/email", conversation)) == 1
    assert len(tool_requests(sink, "/weather", conversation)) == 1
