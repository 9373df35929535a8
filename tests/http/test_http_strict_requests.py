"""Bytes from outside, read strictly on every route (issue 39, items 7 and 12).

* A key twice in one object (``{"a": 1, "a": 2}``) is refused in every body, edited
  approval arguments included: ``400 invalid_request``, nothing stored.
* An import is read as strictly as a body: a lone surrogate in any field is a ``400``
  (never a ``500``), a ``tool_result`` whose call was never made, or a call id over
  the limit, a ``422``; nothing is stored.
* A callback token has one spelling: with ``=`` padding appended it is ``410``.
* A call id is at most 128 characters; a longer one is refused and never quoted back.

One local runner (DynamoDB Local, an :class:`HttpSink` for the tools) serves the module.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from turnledger.core.models import MAX_CALL_ID_CHARS
from turnledger_local.runner import LocalRunner

from tests.functional.http_sink import HttpSink, Reply
from tests.functional.test_tool_turns import tool_line
from tests.http.conftest import on_ddb_local, tools_file

pytestmark = pytest.mark.integration

ANN = {"Authorization": "Bearer local:acme:ann"}
NDJSON = {"Content-Type": "application/x-ndjson"}

#: A call id far over the limit: nothing of it may come back in an answer.
HUGE_ID = "c" * 1_000_000


@pytest.fixture(scope="module")
def sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        server.respond("/email", Reply(body={"sent": True}))
        server.respond("/report", Reply(status=202, body={"task_id": "job-1"}))
        yield server


@pytest.fixture(scope="module")
def runner(
    sink: HttpSink, ddb_local_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalRunner]:
    tools = [
        {
            "name": "send_email",
            "parameters": {"type": "object", "properties": {"to": {"type": "string"}}},
            "require_approval": True,
            "executor": {"type": "http", "url": sink.url("/email")},
        },
        {
            "name": "run_report",
            "parameters": {"type": "object"},
            "executor": {"type": "http", "url": sink.url("/report"), "deferred": True},
        },
        {"name": "lookup_user", "parameters": {"type": "object"}, "executor": {"type": "client"}},
    ]
    registry = tools_file(tmp_path_factory.mktemp("registry"), tools)
    with LocalRunner(on_ddb_local(ddb_local_endpoint, tools_file=registry)) as served:
        yield served


@pytest.fixture
def client(runner: LocalRunner) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=runner.url, headers=ANN, timeout=60) as http:
        yield http


@pytest.fixture
def conversation() -> str:
    return f"strict-{uuid.uuid4().hex[:12]}"


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text[:500]
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"code", "message", "details"}
    return error


def post_raw(client: httpx.Client, path: str, text: str) -> httpx.Response:
    return client.post(path, content=text.encode(), headers={"Content-Type": "application/json"})


def turn(client: httpx.Client, conversation: str, text: str) -> dict[str, Any]:
    answer = client.post(f"/v1/conversations/{conversation}/turns", json={"input": text})
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def events(client: httpx.Client, conversation: str) -> list[dict[str, Any]]:
    answer = client.get(f"/v1/conversations/{conversation}/events", params={"limit": 1000})
    assert answer.status_code == 200, answer.text
    found: list[dict[str, Any]] = answer.json()["events"]
    return found


# --- a key twice -----------------------------------------------------------------------------


def test_a_key_twice_is_refused_in_a_turn_body(client: httpx.Client, conversation: str) -> None:
    path = f"/v1/conversations/{conversation}/turns"
    for text in (
        '{"input": "a", "input": "b"}',
        '{"input": "hi", "metadata": {"k": "1", "k": "2"}}',
    ):
        error = error_of(post_raw(client, path, text), 400)
        assert error["code"] == "invalid_request"
        assert "appears twice in one object" in error["message"]
    assert client.get(f"/v1/conversations/{conversation}").status_code == 404
    face = post_raw(
        client, "/openai/v1/responses", '{"model": "demo-1", "input": "a", "input": "b"}'
    )
    assert face.status_code == 400, face.text
    assert "appears twice" in face.json()["error"]["message"]


def test_a_key_twice_is_refused_in_edited_approval_arguments(
    client: httpx.Client, sink: HttpSink, conversation: str
) -> None:
    assert turn(client, conversation, tool_line("send_email", to="a@x"))["status"] == (
        "awaiting_approval"
    )
    before = events(client, conversation)
    path = f"/v1/conversations/{conversation}/approvals"
    edited = '{"approve": [{"id": "call_1", "arguments": {"to": "b@x", "to": "evil@x"}}]}'
    error = error_of(post_raw(client, path, edited), 400)
    assert error["code"] == "invalid_request"
    assert error["message"] == "the key 'to' appears twice in one object"
    assert events(client, conversation) == before
    assert [r for r in sink.requests_for("/email") if conversation in r.body.decode()] == []


# --- imports -----------------------------------------------------------------------------------


def exported(client: httpx.Client, conversation: str) -> list[dict[str, Any]]:
    answer = client.get(f"/v1/conversations/{conversation}/export")
    assert answer.status_code == 200, answer.text
    return [json.loads(line) for line in answer.text.splitlines() if line]


def ndjson(lines: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(line) + "\n" for line in lines)


def import_of(client: httpx.Client, conversation: str, text: str) -> httpx.Response:
    return client.post(
        f"/v1/conversations/{conversation}/import", content=text.encode(), headers=NDJSON
    )


def test_an_import_holding_a_lone_surrogate_anywhere_is_a_400(
    client: httpx.Client, conversation: str
) -> None:
    turn(client, conversation, "Hello.")
    lines = exported(client, conversation)
    text = ndjson(lines)
    user = json.dumps(lines[1]["event"]["payload"]["content"])
    cases = {
        "content": text.replace(user, '"\\ud800"'),
        "actor": text.replace('"actor": "ann"', '"actor": "\\udfff"'),
        "a key": text.replace('"kind":', '"\\ud800": 1, "kind":', 1),
        "the head": text.replace('"conversation_id":', '"x\\udbff": 1, "conversation_id":', 1),
    }
    for case, body in cases.items():
        assert body != text, case
        copy = f"{conversation}-copy"
        error = error_of(import_of(client, copy, body), 400)
        assert error["code"] == "invalid_request", case
        assert "lone surrogate" in error["message"], case
        assert client.get(f"/v1/conversations/{copy}").status_code == 404, case


def test_an_import_with_a_key_twice_or_deep_nesting_is_a_400(
    client: httpx.Client, conversation: str
) -> None:
    turn(client, conversation, "Hello.")
    text = ndjson(exported(client, conversation))
    for body, reason in (
        (text.replace('"kind":', '"kind": "x", "kind":', 1), "appears twice"),
        (text + "[" * 100_000 + "\n", "nests deeper than"),
    ):
        error = error_of(import_of(client, f"{conversation}-copy", body), 400)
        assert reason in error["message"]


def test_an_import_of_a_result_no_call_asked_for_is_a_422(
    client: httpx.Client, conversation: str
) -> None:
    turn(client, conversation, "Hello.")
    lines = exported(client, conversation)
    head, user, answer = lines
    orphan = json.loads(json.dumps(answer))
    orphan["event"].update(
        event_id="ev_orphan",
        kind="tool_result",
        actor="tool:send_email",
        payload={"call_id": "call_9", "name": "send_email", "output": "sent", "is_error": False},
    )
    answer["event"]["sequence"] = 3
    head["events"] = 3
    error = error_of(
        import_of(client, f"{conversation}-copy", ndjson([head, user, orphan, answer])), 422
    )
    assert error["code"] == "validation_error"
    assert error["details"] == {
        "line": 3,
        "reason": "a tool_result of call 'call_9', which no call asked for",
    }
    assert client.get(f"/v1/conversations/{conversation}-copy").status_code == 404


def test_an_import_naming_a_call_id_over_the_limit_is_a_422(
    client: httpx.Client, conversation: str
) -> None:
    turn(client, conversation, tool_line("send_email", to="a@x"))
    assert (
        client.post(
            f"/v1/conversations/{conversation}/approvals", json={"approve": ["call_1"]}
        ).json()["status"]
        == "complete"
    )
    text = ndjson(exported(client, conversation))
    long_id = "c" * (MAX_CALL_ID_CHARS + 1)
    answer = import_of(client, f"{conversation}-copy", text.replace('"call_1"', f'"{long_id}"'))
    error = error_of(answer, 422)
    assert error["details"]["reason"] == "a call id is longer than 128 characters"
    assert long_id not in answer.text


# --- callback tokens ---------------------------------------------------------------------------


def test_a_callback_token_with_padding_appended_is_refused(
    client: httpx.Client, runner: LocalRunner, sink: HttpSink, conversation: str
) -> None:
    assert turn(client, conversation, tool_line("run_report"))["status"] == "awaiting_async_tools"
    [request] = [r for r in sink.requests_for("/report") if conversation in r.body.decode()]
    url: str = request.json()["callback_url"]
    before = events(client, conversation)
    with httpx.Client(timeout=30) as anonymous:
        for padding in ("=", "==", "===", "%3D%3D"):
            answer = anonymous.post(url + padding, json={"status": "succeeded", "output": "x"})
            assert error_of(answer, 410)["code"] == "callback_invalid", padding
        assert events(client, conversation) == before
        settled = anonymous.post(url, json={"status": "succeeded", "output": "done"})
    assert settled.status_code == 200, settled.text


# --- call ids ----------------------------------------------------------------------------------


def test_a_call_id_over_the_limit_is_refused_and_never_quoted_back(
    client: httpx.Client, conversation: str
) -> None:
    turn(client, conversation, "/tool lookup_user {}")
    native = {
        f"/v1/conversations/{conversation}/turns": {
            "input": [{"type": "function_call_output", "call_id": HUGE_ID, "output": "x"}]
        },
        f"/v1/conversations/{conversation}/approvals": {"approve": [HUGE_ID]},
    }
    for path, body in native.items():
        answer = client.post(path, json=body)
        error = error_of(answer, 422)
        assert error["code"] == "validation_error", path
        assert len(answer.content) < 2000, path
    face = client.post(
        "/openai/v1/responses",
        json={
            "model": "demo-1",
            "input": [{"type": "function_call_output", "call_id": HUGE_ID, "output": "x"}],
        },
    )
    assert face.status_code == 400, face.text[:500]
    assert len(face.content) < 2000
    # At the limit, an id is an id: not pending, and said so.
    at_limit = "c" * MAX_CALL_ID_CHARS
    answer = client.post(
        f"/v1/conversations/{conversation}/approvals", json={"approve": [at_limit]}
    )
    assert answer.status_code in (409, 422), answer.text
