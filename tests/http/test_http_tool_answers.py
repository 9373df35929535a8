"""Tool answers that are no JSON the ledger can keep: the call's error result, never a ``500``.

A tool's answer crosses into the ledger from outside, as a request body does: it is
read with the strict parser (:mod:`turnledger.core.strict_json`). An answer holding a
lone surrogate (``"\\ud800"``, which no UTF-8 store can hold), nesting deeper than the
parser's limit, or a key twice, is refused there: the model reads a tool error saying
the answer was malformed, the turn completes, the tool was called exactly once, and
the next turn works. The same holds for the ``202`` body of a deferred tool.

One local runner (DynamoDB Local, a real :class:`HttpSink` for the tools) serves the
module; each test uses its own conversation and its own tool path.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from turnledger_local.runner import LocalRunner

from tests.functional.http_sink import HttpSink, RecordedRequest, Reply
from tests.functional.test_tool_turns import lines, tool_line
from tests.http.conftest import on_ddb_local, tools_file

pytestmark = pytest.mark.integration

ANN = {"Authorization": "Bearer local:acme:ann"}

#: Each malformed answer, by the path (and tool) that answers it.
ANSWERS: dict[str, bytes] = {
    "surrogate": b'{"x": "\\ud800"}',
    "surrogate_key": b'{"\\udfff": 1}',
    "deep": b"[" * 100_000,
    "deep_object": b'{"a":' * 100_000,
    "duplicate_key": b'{"x": 1, "x": 2}',
    "huge_number": b'{"x": ' + b"9" * 5000 + b"}",
    "not_utf8": b'{"x": "\xff"}',
}


def fetch_tool(name: str, sink: HttpSink) -> dict[str, Any]:
    """An ``http`` tool ``name`` served at ``/name`` of the sink; the ``job_`` ones are
    declared deferred (only those may answer ``202``)."""
    executor = {"type": "http", "url": sink.url(f"/{name}"), "timeout_seconds": 5}
    return {
        "name": name,
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        "executor": executor | ({"deferred": True} if name.startswith("job_") else {}),
    }


@pytest.fixture(scope="module")
def sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        for name, raw in ANSWERS.items():
            server.respond(f"/{name}", Reply(raw=raw))
            server.respond(f"/job_{name}", Reply(status=202, raw=raw))
        server.respond("/fine", Reply(body={"ok": True}))
        yield server


@pytest.fixture(scope="module")
def runner(
    sink: HttpSink, ddb_local_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalRunner]:
    names = [*ANSWERS, *(f"job_{name}" for name in ANSWERS), "fine"]
    tools = [fetch_tool(name, sink) for name in names]
    registry = tools_file(tmp_path_factory.mktemp("registry"), tools)
    with LocalRunner(on_ddb_local(ddb_local_endpoint, tools_file=registry)) as served:
        yield served


@pytest.fixture
def client(runner: LocalRunner) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=runner.url, headers=ANN, timeout=60) as http:
        yield http


@pytest.fixture
def conversation() -> str:
    return f"answers-{uuid.uuid4().hex[:12]}"


def post_turn(client: httpx.Client, conversation: str, text: str) -> httpx.Response:
    return client.post(f"/v1/conversations/{conversation}/turns", json={"input": text})


def calls_of(sink: HttpSink, path: str, conversation: str) -> list[RecordedRequest]:
    return [r for r in sink.requests_for(path) if r.json()["conversation_id"] == conversation]


def results_of(client: httpx.Client, conversation: str) -> list[dict[str, Any]]:
    response = client.get(f"/v1/conversations/{conversation}/events", params={"limit": 1000})
    assert response.status_code == 200, response.text
    return [e["payload"] for e in response.json()["events"] if e["kind"] == "tool_result"]


@pytest.mark.parametrize("name", list(ANSWERS))
def test_a_malformed_answer_is_the_calls_error(
    client: httpx.Client, sink: HttpSink, conversation: str, name: str
) -> None:
    """The turn completes with the tool's error, the tool ran once, the next turn works."""
    first = post_turn(client, conversation, tool_line(name, q="x"))
    assert first.status_code == 200, first.text
    assert first.json()["status"] == "complete"
    [result] = results_of(client, conversation)
    assert result["is_error"] is True
    assert result["output"].startswith(f"tool {name} returned malformed JSON: "), result
    # The model read the error as the call's result.
    assert first.json()["output_text"] == f"Tool results: {name}: {result['output']}"
    assert len(result["output"]) < 300
    assert len(calls_of(sink, f"/{name}", conversation)) == 1

    view = client.get(f"/v1/conversations/{conversation}")
    assert view.json()["status"] == "complete", view.text
    after = post_turn(client, conversation, lines(tool_line("fine", q="y")))
    assert after.status_code == 200, after.text
    assert after.json()["output_text"] == 'Tool results: fine: {"ok":true}'
    assert len(calls_of(sink, f"/{name}", conversation)) == 1


@pytest.mark.parametrize("name", list(ANSWERS))
def test_a_malformed_202_body_is_the_calls_error(
    client: httpx.Client, sink: HttpSink, conversation: str, name: str
) -> None:
    """A deferred tool's ``202`` body is read as strictly: no task id, the call's error."""
    tool = f"job_{name}"
    first = post_turn(client, conversation, tool_line(tool, q="x"))
    assert first.status_code == 200, first.text
    assert first.json()["status"] == "complete"
    [result] = results_of(client, conversation)
    assert result["is_error"] is True
    assert result["output"].startswith(f"tool {tool} answered 202 with malformed JSON: "), result
    assert len(calls_of(sink, f"/{tool}", conversation)) == 1
    after = post_turn(client, conversation, "And now?")
    assert after.status_code == 200, after.text
