"""MCP servers as tools over HTTP: a real server of the ``mcp`` package on loopback (a
read-only ``read_file`` and a ``delete_file``, :mod:`tests.support.mcp_servers`), reached
by the local runner over Streamable HTTP.

The server logs every call it sees to a file; each test counts only the calls of its
own paths (``/<conversation>``).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from turnledger.core.models import ConversationKey
from turnledger.turn.mcp_listings import LISTING_PREFIX
from turnledger_local.runner import LocalRunner

from tests.functional.test_tool_turns import tool_line
from tests.http.conftest import store_of
from tests.support.concurrency import all_at_once
from tests.support.mcp_loopback import ANN, Loopback, McpProcess, loopback

pytestmark = pytest.mark.integration

BEN = {"Authorization": "Bearer local:acme:ben"}


@pytest.fixture(scope="module")
def served(ddb_local_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loopback]:
    """The files server and a runner that reaches it, shared by the module's tests."""
    with loopback(ddb_local_endpoint, tmp_path_factory.mktemp("mcp-calls")) as started:
        yield started


@pytest.fixture(scope="module")
def mcp_server(served: Loopback) -> McpProcess:
    return served.server


@pytest.fixture(scope="module")
def runner(served: Loopback) -> LocalRunner:
    return served.runner


@pytest.fixture
def client(runner: LocalRunner) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=runner.url, headers=ANN, timeout=60) as http:
        yield http


@pytest.fixture
def conversation() -> str:
    return f"mcp-{uuid.uuid4().hex[:12]}"


def post_turn(client: httpx.Client, conversation: str, text: str) -> httpx.Response:
    return client.post(f"/v1/conversations/{conversation}/turns", json={"input": text})


def approve(client: httpx.Client, conversation: str, call_id: str) -> httpx.Response:
    return client.post(f"/v1/conversations/{conversation}/approvals", json={"approve": [call_id]})


def events(client: httpx.Client, conversation: str) -> list[dict[str, Any]]:
    response = client.get(f"/v1/conversations/{conversation}/events", params={"limit": 1000})
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()["events"]
    return found


def test_read_file_runs_at_once_and_delete_file_waits_for_one_approval(
    runner: LocalRunner, client: httpx.Client, mcp_server: McpProcess, conversation: str
) -> None:
    path = f"/{conversation}"
    read = post_turn(client, conversation, tool_line("mcp__files__read_file", path=path))
    assert read.status_code == 200, read.text
    assert read.json()["status"] == "complete"
    assert f"contents of {path}" in read.json()["output_text"]
    [seen] = mcp_server.calls(path)
    assert seen["tool"] == "read_file"
    requested = [e for e in events(client, conversation) if e["kind"] == "tool_call_requested"]
    assert seen["meta"]["turnledger/call_id"] == requested[0]["payload"]["call_id"]

    delete = post_turn(client, conversation, tool_line("mcp__files__delete_file", path=path))
    assert delete.status_code == 200, delete.text
    body = delete.json()
    assert body["status"] == "awaiting_approval"
    [pending] = body["pending_tool_calls"]
    assert pending["name"] == "mcp__files__delete_file"
    assert [c["tool"] for c in mcp_server.calls(path)] == ["read_file"]  # nothing deleted yet

    done = approve(client, conversation, pending["id"])
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "complete"
    assert f"deleted {path}" in done.json()["output_text"]
    assert [c["tool"] for c in mcp_server.calls(path)] == ["read_file", "delete_file"]
    asked = [e for e in events(client, conversation) if e["kind"] == "approval_requested"]
    assert len(asked[-1]["payload"]["definition_sha256"]) == 64

    # The listing the calls were made under is a record of the conversation, once.
    store = store_of(runner)
    key = ConversationKey(tenant="acme", conversation_id=conversation)
    recorded = store.query_side_items(key, lower=LISTING_PREFIX, upper=LISTING_PREFIX + "~")
    [listing] = recorded
    assert listing.sort_key == f"{LISTING_PREFIX}files#{listing.attributes['sha256']}"
    stored = json.loads(listing.attributes["listing"])
    assert {t["name"] for t in stored["tools"]} == {"read_file", "delete_file"}
    assert listing.attributes["server_url"] == mcp_server.url


def test_approved_twice_in_parallel_the_server_sees_one_call(
    runner: LocalRunner, client: httpx.Client, mcp_server: McpProcess, conversation: str
) -> None:
    path = f"/{conversation}"
    waiting = post_turn(client, conversation, tool_line("mcp__files__delete_file", path=path))
    assert waiting.json()["status"] == "awaiting_approval", waiting.text
    [pending] = waiting.json()["pending_tool_calls"]
    approvers = [ANN, BEN]

    def decide(index: int) -> httpx.Response:
        with httpx.Client(base_url=runner.url, headers=approvers[index], timeout=60) as http:
            return approve(http, conversation, pending["id"])

    answers = all_at_once(2, decide)
    statuses = sorted(a.status_code for a in answers)
    assert statuses[0] == 200 and statuses[1] in (200, 409), [a.text for a in answers]
    assert [c["tool"] for c in mcp_server.calls(path)] == ["delete_file"]


def test_an_unregistered_tool_name_is_refused_and_reaches_no_server(
    client: httpx.Client, mcp_server: McpProcess, conversation: str
) -> None:
    answer = client.post(
        f"/v1/conversations/{conversation}/turns",
        json={"input": "hi", "tools": ["mcp__other__delete_file"]},
    )
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == "unknown_tool"


def test_a_changed_definition_invalidates_the_waiting_approval(
    ddb_local_endpoint: str, tmp_path: Path, conversation: str
) -> None:
    """The server restarts with another ``delete_file`` schema while a call waits: the
    approval is invalidated (recorded), deciding it is ``409 tool_definition_changed``,
    and the server sees no call."""
    with loopback(ddb_local_endpoint, tmp_path) as served:
        server, http = served.server, served.http
        path = f"/{conversation}"
        waiting = post_turn(http, conversation, tool_line("mcp__files__delete_file", path=path))
        assert waiting.json()["status"] == "awaiting_approval", waiting.text
        [pending] = waiting.json()["pending_tool_calls"]
        server.stop()
        server.start(changed=True)

        refused = approve(http, conversation, pending["id"])
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["code"] == "tool_definition_changed"
        [changed] = error["details"]["calls"]
        assert changed["id"] == pending["id"]
        assert changed["approved_definition_sha256"] != changed["current_definition_sha256"]
        assert server.calls(path) == []

        log = events(http, conversation)
        [resolved] = [e for e in log if e["kind"] == "approval_resolved"]
        assert resolved["payload"]["decision"] == "rejected"
        assert resolved["payload"]["reason"] == "invalidated: tool definition changed"
        again = approve(http, conversation, pending["id"])
        assert again.status_code == 409, again.text
        assert again.json()["error"]["code"] == "tool_definition_changed"  # it stays so
        assert server.calls(path) == []


def test_a_refresh_that_records_a_changed_listing_invalidates_the_waiting_approval(
    ddb_local_endpoint: str, tmp_path: Path, conversation: str
) -> None:
    """The server restarts with another ``delete_file`` schema while a call waits; the
    next message of the conversation refreshes the listing (its age is 0): the approval
    is invalidated (an event), the new listing is recorded, the conversation and the
    inbox no longer offer the call, the turn goes on, and deciding the call stays ``409
    tool_definition_changed``."""
    with loopback(ddb_local_endpoint, tmp_path, entry={"max_list_age_seconds": 0}) as served:
        server, runner, http = served.server, served.runner, served.http
        path = f"/{conversation}"
        waiting = post_turn(http, conversation, tool_line("mcp__files__delete_file", path=path))
        assert waiting.json()["status"] == "awaiting_approval", waiting.text
        [pending] = waiting.json()["pending_tool_calls"]
        server.stop()
        server.start(changed=True)

        went_on = post_turn(http, conversation, "never mind")
        assert went_on.status_code == 200, went_on.text
        assert went_on.json()["status"] == "complete"

        log = events(http, conversation)
        [resolved] = [e for e in log if e["kind"] == "approval_resolved"]
        assert resolved["payload"]["call_id"] == pending["id"]
        assert resolved["payload"]["reason"] == "invalidated: tool definition changed"
        [result] = [e for e in log if e["kind"] == "tool_result"]
        assert result["payload"]["is_error"] is True
        shown = http.get(f"/v1/conversations/{conversation}")
        assert shown.status_code == 200, shown.text
        assert shown.json()["pending_tool_calls"] == []
        offered = http.get("/v1/approvals", params={"conversation_id": conversation})
        assert offered.status_code == 200, offered.text
        assert offered.json()["items"] == []

        refused = approve(http, conversation, pending["id"])
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["code"] == "tool_definition_changed"
        [changed] = error["details"]["calls"]
        assert changed["id"] == pending["id"]
        assert changed["approved_definition_sha256"] != changed["current_definition_sha256"]
        assert server.calls(path) == []

        store = store_of(runner)
        key = ConversationKey(tenant="acme", conversation_id=conversation)
        recorded = store.query_side_items(key, lower=LISTING_PREFIX, upper=LISTING_PREFIX + "~")
        assert len(recorded) == 2  # the listing the call was asked under, and the new one


@pytest.fixture
def asking(ddb_local_endpoint: str, tmp_path: Path) -> Iterator[tuple[McpProcess, httpx.Client]]:
    """The asking server (tools that elicit) on loopback, registered as ``asking`` with no
    approval, and a client of a runner that reaches it."""
    with loopback(
        ddb_local_endpoint,
        tmp_path,
        asking=True,
        entry={"server_label": "asking", "require_approval": "never"},
    ) as started:
        yield started.server, started.http


def answer(http: httpx.Client, conversation: str, call_id: str, given: Any) -> httpx.Response:
    output = given if isinstance(given, str) else json.dumps(given)
    return http.post(
        f"/v1/conversations/{conversation}/approvals",
        json={"outputs": [{"id": call_id, "output": output}]},
    )


def test_a_server_that_asks_for_input_mid_call_waits_in_the_inbox_for_the_answer(
    asking: tuple[McpProcess, httpx.Client], conversation: str
) -> None:
    """``delete_file`` asks for the file's name mid-call (a 2026-07-28 elicitation): the
    call is an inbox item of kind ``input`` with the server's message and schema; an
    answer the schema refuses is ``422`` and the item stays; a valid one sends the call
    again with the answer, the server finishes, and the model reads its output."""
    server, http = asking
    path = f"/{conversation}"
    waiting = post_turn(http, conversation, tool_line("mcp__asking__delete_file", path=path))
    assert waiting.status_code == 200, waiting.text
    body = waiting.json()
    assert (body["status"], body["awaiting"]) == ("awaiting_hitl", ["input"])
    [pending] = body["pending_tool_calls"]
    asked = f"Type the name of {path} to delete it"
    assert (pending["requires"], pending["message"]) == ("input", asked)
    assert pending["requested_schema"]["required"] == ["name"]
    assert server.calls(path) == []  # the tool body has not run: it waits for the name

    def inbox() -> list[dict[str, Any]]:
        listed = http.get("/v1/approvals", params={"conversation_id": conversation})
        assert listed.status_code == 200, listed.text
        items: list[dict[str, Any]] = listed.json()["items"]
        return items

    [item] = inbox()
    assert (item["kind"], item["id"], item["tool"]) == ("input", pending["id"], pending["name"])
    assert item["message"] == asked
    assert item["requested_schema"] == pending["requested_schema"]

    for wrong in (
        {"action": "accept", "content": {"nom": conversation}},
        {"action": "accept", "content": {"name": 7}},
        {"action": "accept"},
        {"action": "maybe"},
        "the name",
    ):
        refused = answer(http, conversation, pending["id"], wrong)
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["code"] == "validation_error"
        assert [e["id"] for e in error["details"]["errors"]] == [pending["id"]]
    assert inbox() == [item]
    assert server.calls(path) == []

    done = answer(
        http, conversation, pending["id"], {"action": "accept", "content": {"name": conversation}}
    )
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "complete"
    assert f"deleted {path}" in done.json()["output_text"]  # the model read the output
    [seen] = server.calls(path)
    assert seen["arguments"] == {"path": path, "action": "accept", "name": conversation}
    assert inbox() == []
    log = events(http, conversation)
    [requested] = [e for e in log if e["kind"] == "tool_input_requested"]
    assert requested["payload"]["message"] == asked and requested["payload"]["round"] == 1
    [provided] = [e for e in log if e["kind"] == "tool_input_provided"]
    assert provided["payload"]["call_id"] == pending["id"]
    [result] = [e for e in log if e["kind"] == "tool_result"]
    assert (result["payload"]["output"], result["payload"]["is_error"]) == (
        f"deleted {path}",
        False,
    )
    told = http.get("/_local/notifications").json()["notifications"]
    assert [
        (n["detail-type"], n["detail"]["kind"])
        for n in told
        if n["detail"]["conversation_id"] == conversation
    ] == [("input.requested", "input"), ("input.provided", "input")]


def test_a_server_may_ask_again_and_a_person_may_decline(
    asking: tuple[McpProcess, httpx.Client], conversation: str
) -> None:
    """A name that is not the file's makes ``delete_file`` ask a second question (another
    round, a new inbox item); declining it is sent to the server as ``decline``, which
    then does not delete."""
    server, http = asking
    path = f"/{conversation}"
    waiting = post_turn(http, conversation, tool_line("mcp__asking__delete_file", path=path))
    [pending] = waiting.json()["pending_tool_calls"]
    again = answer(
        http, conversation, pending["id"], {"action": "accept", "content": {"name": "x"}}
    )
    assert again.status_code == 200, again.text
    assert again.json()["status"] == "awaiting_hitl"
    [second] = again.json()["pending_tool_calls"]
    assert second["id"] == pending["id"]
    assert second["message"] == f"'x' is not the name of {path}: delete it anyway?"
    listed = http.get("/v1/approvals", params={"conversation_id": conversation}).json()["items"]
    assert [i["message"] for i in listed] == [second["message"]]
    assert server.calls(path) == []

    done = answer(http, conversation, pending["id"], {"action": "decline"})
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "complete"
    [seen] = server.calls(path)
    assert seen["arguments"] == {"path": path, "action": "accept", "name": "x", "sure": False}
    [result] = [e for e in events(http, conversation) if e["kind"] == "tool_result"]
    assert result["payload"]["output"] == "not deleted ('x' is not its name)"
    rounds = [
        e["payload"]["round"]
        for e in events(http, conversation)
        if e["kind"] == "tool_input_requested"
    ]
    assert rounds == [1, 2]


def test_on_the_openai_face_a_servers_question_is_a_function_call_answered_by_its_output(
    asking: tuple[McpProcess, httpx.Client], conversation: str
) -> None:
    """The Responses API has no item for a server's question: the waiting call is a
    ``function_call`` and its ``function_call_output`` carries the answer, checked as on
    the approvals route (``422`` in OpenAI's error shape when the schema refuses it)."""
    import openai
    from openai import OpenAI

    server, http = asking
    path = f"/{conversation}"
    tools = [{"type": "mcp", "server_label": "asking", "server_url": server.url}]
    with OpenAI(
        base_url=f"{str(http.base_url).rstrip('/')}/openai/v1",
        api_key="local:acme:ann",
        max_retries=0,
    ) as client:
        paused = client.responses.create(
            model="demo-1",
            input=tool_line("mcp__asking__delete_file", path=path),
            tools=tools,  # type: ignore[list-item]
        )
        [asked] = [item for item in paused.output if item.type == "function_call"]
        assert asked.name == "mcp__asking__delete_file"

        def reply(given: dict[str, Any]) -> Any:
            return client.responses.create(
                model="demo-1",
                previous_response_id=paused.id,
                input=[
                    {
                        "type": "function_call_output",
                        "call_id": asked.call_id,
                        "output": json.dumps(given),
                    }
                ],
                tools=tools,  # type: ignore[arg-type]
            )

        with pytest.raises(openai.UnprocessableEntityError) as refused:
            reply({"action": "accept", "content": {}})
        error = refused.value.body
        assert (error["type"], error["code"]) == ("invalid_request_error", "validation_error")
        assert server.calls(path) == []
        done = reply({"action": "accept", "content": {"name": conversation}})
    [call] = [item for item in done.output if item.type == "mcp_call"]
    assert (call.name, call.output) == ("delete_file", f"deleted {path}")
    [seen] = server.calls(path)
    assert seen["arguments"]["name"] == conversation


# --- the OpenAI face ------------------------------------------------------------------


@pytest.fixture
def openai_client(runner: LocalRunner) -> Iterator[Any]:
    from openai import OpenAI

    with OpenAI(
        base_url=f"{runner.url}/openai/v1", api_key="local:acme:ann", max_retries=0
    ) as client:
        yield client


def mcp_tool(server: McpProcess, **overrides: Any) -> dict[str, Any]:
    return {
        "type": "mcp",
        "server_label": "files",
        "server_url": server.url,
        "require_approval": {"never": {"read_only": True}},
        **overrides,
    }


def test_the_openai_sdk_gets_the_listing_the_request_and_the_call(
    openai_client: Any, mcp_server: McpProcess, conversation: str
) -> None:
    path = f"/{conversation}"
    paused = openai_client.responses.create(
        model="demo-1",
        input=tool_line("mcp__files__delete_file", path=path),
        tools=[mcp_tool(mcp_server)],
    )
    kinds = [item.type for item in paused.output]
    assert kinds == ["mcp_list_tools", "mcp_approval_request"], kinds
    listed = paused.output[0]
    assert listed.server_label == "files"
    assert {t.name for t in listed.tools} == {"read_file", "delete_file"}
    request = paused.output[1]
    assert request.id.startswith("mcpr_")
    assert (request.server_label, request.name) == ("files", "delete_file")
    assert json.loads(request.arguments) == {"path": path}
    assert mcp_server.calls(path) == []

    done = openai_client.responses.create(
        model="demo-1",
        previous_response_id=paused.id,
        input=[
            {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}
        ],
        tools=[mcp_tool(mcp_server)],
    )
    [call] = [item for item in done.output if item.type == "mcp_call"]
    assert (call.server_label, call.name, call.status) == ("files", "delete_file", "completed")
    assert call.output == f"deleted {path}"
    assert call.approval_request_id == request.id
    assert [c["tool"] for c in mcp_server.calls(path)] == ["delete_file"]


def test_a_read_only_call_runs_within_the_response(
    openai_client: Any, mcp_server: McpProcess, conversation: str
) -> None:
    path = f"/{conversation}"
    answered = openai_client.responses.create(
        model="demo-1",
        input=tool_line("mcp__files__read_file", path=path),
        tools=[mcp_tool(mcp_server, allowed_tools=["read_file"])],
    )
    [listed] = [item for item in answered.output if item.type == "mcp_list_tools"]
    assert [t.name for t in listed.tools] == ["read_file", "delete_file"]
    [call] = [item for item in answered.output if item.type == "mcp_call"]
    assert call.output == f"contents of {path}" and call.approval_request_id is None


def test_a_request_can_only_add_approvals(
    openai_client: Any, mcp_server: McpProcess, conversation: str
) -> None:
    path = f"/{conversation}"
    paused = openai_client.responses.create(
        model="demo-1",
        input=tool_line("mcp__files__read_file", path=path),
        tools=[mcp_tool(mcp_server, require_approval="always")],
    )
    assert [item.type for item in paused.output][-1] == "mcp_approval_request"
    assert mcp_server.calls(path) == []
    waived = openai_client.responses.create(
        model="demo-1",
        input=tool_line("mcp__files__delete_file", path=path),
        tools=[mcp_tool(mcp_server, require_approval="never")],
    )
    assert [item.type for item in waived.output][-1] == "mcp_approval_request"
    assert mcp_server.calls(path) == []


@pytest.mark.parametrize(
    ("change", "param", "code"),
    [
        ({"server_url": "http://127.0.0.1:1/mcp"}, "tools.0.server_url", "invalid_request"),
        ({"server_label": "elsewhere"}, "tools.0.server_label", "invalid_request"),
        ({"headers": {"Authorization": "x"}}, "tools.0.headers", "unsupported_parameter"),
        ({"server_description": "x"}, "tools.0.server_description", "unsupported_parameter"),
        ({"require_approval": "sometimes"}, "tools.0.require_approval", "invalid_request"),
    ],
)
def test_a_server_the_registry_lacks_or_a_field_the_face_lacks_is_400(
    openai_client: Any,
    mcp_server: McpProcess,
    conversation: str,
    change: dict[str, Any],
    param: str,
    code: str,
) -> None:
    import openai

    path = f"/{conversation}"
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.responses.create(
            model="demo-1",
            input=tool_line("mcp__files__delete_file", path=path),
            tools=[{**mcp_tool(mcp_server), **change}],
        )
    error = caught.value.body
    assert (error["param"], error["code"]) == (param, code), error
    assert mcp_server.calls(path) == []


def test_hosted_mcp_tool_of_the_agents_sdk_with_on_approval_request(
    runner: LocalRunner, mcp_server: McpProcess, conversation: str
) -> None:
    from agents import Agent, HostedMCPTool, Runner
    from agents.models.openai_responses import OpenAIResponsesModel
    from agents.tracing import set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    path = f"/{conversation}"
    asked: list[Any] = []

    def on_approval_request(request: Any) -> Any:
        asked.append(request.data)
        return {"approve": True}

    model = OpenAIResponsesModel(
        model="demo-1",
        openai_client=AsyncOpenAI(
            base_url=f"{runner.url}/openai/v1", api_key="local:acme:ann", max_retries=0
        ),
    )
    tool = HostedMCPTool(
        tool_config=mcp_tool(mcp_server),  # type: ignore[arg-type]
        on_approval_request=on_approval_request,
    )
    agent = Agent(name="files", model=model, tools=[tool])
    result = Runner.run_sync(agent, tool_line("mcp__files__delete_file", path=path))
    assert [r.name for r in asked] == ["delete_file"]
    assert [c["tool"] for c in mcp_server.calls(path)] == ["delete_file"]
    assert f"deleted {path}" in result.final_output


def test_continuing_past_an_unanswered_approval_request_is_400(
    openai_client: Any, mcp_server: McpProcess, conversation: str
) -> None:
    import openai

    path = f"/{conversation}"
    paused = openai_client.responses.create(
        model="demo-1",
        input=tool_line("mcp__files__delete_file", path=path),
        tools=[mcp_tool(mcp_server)],
    )
    [request] = [item for item in paused.output if item.type == "mcp_approval_request"]
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.responses.create(
            model="demo-1", previous_response_id=paused.id, input="never mind"
        )
    error = caught.value.body
    assert error["type"] == "invalid_request_error" and error["param"] == "input"
    assert request.id in error["message"]
    assert mcp_server.calls(path) == []


def test_streamed_mcp_items_have_their_events(
    openai_client: Any, mcp_server: McpProcess, conversation: str
) -> None:
    path = f"/{conversation}"
    with openai_client.responses.stream(
        model="demo-1",
        input=tool_line("mcp__files__read_file", path=path),
        tools=[mcp_tool(mcp_server)],
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    mcp_kinds = [k for k in kinds if "mcp" in k]
    assert mcp_kinds == [
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.mcp_call.in_progress",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.mcp_call.completed",
    ]
    [call] = [item for item in final.output if item.type == "mcp_call"]
    assert call.output == f"contents of {path}"


def test_a_decision_under_an_expired_listing_reads_the_server_once(
    ddb_local_endpoint: str, tmp_path: Path, conversation: str
) -> None:
    """The kept listing is older than its age (``max_list_age_seconds: 3``) when the call
    is decided: the decision's refresh (that invalidates what changed) and its check of
    the definitions share one ``tools/list`` (as they do in a process that kept none)."""
    with loopback(ddb_local_endpoint, tmp_path, entry={"max_list_age_seconds": 3}) as served:
        server, http = served.server, served.http
        path = f"/{conversation}"
        waiting = post_turn(http, conversation, tool_line("mcp__files__delete_file", path=path))
        [pending] = waiting.json()["pending_tool_calls"]
        time.sleep(3.2)  # the kept listing expires
        before = server.listings()
        rejected = http.post(
            f"/v1/conversations/{conversation}/approvals",
            json={"reject": [{"id": pending["id"], "reason": "not now"}]},
        )
        assert rejected.status_code == 200, rejected.text
        assert server.listings() - before == 1
        assert server.calls(path) == []


def test_a_server_that_is_down_blocks_approving_not_rejecting(
    ddb_local_endpoint: str, tmp_path: Path, conversation: str
) -> None:
    """Approving needs the server's current definition (``502`` while it is down, nothing
    decided); rejecting needs no server."""
    with loopback(ddb_local_endpoint, tmp_path) as served:
        server, http = served.server, served.http
        path = f"/{conversation}"
        waiting = post_turn(http, conversation, tool_line("mcp__files__delete_file", path=path))
        [pending] = waiting.json()["pending_tool_calls"]
        server.stop()
        refused = approve(http, conversation, pending["id"])
        assert refused.status_code == 502, refused.text
        assert refused.json()["error"]["code"] == "tool_server_unavailable"
        assert http.get(f"/v1/conversations/{conversation}").json()["status"] == (
            "awaiting_approval"
        )
        rejected = http.post(
            f"/v1/conversations/{conversation}/approvals",
            json={"reject": [{"id": pending["id"], "reason": "not now"}]},
        )
        assert rejected.status_code == 200, rejected.text
        assert rejected.json()["status"] == "complete"
        assert server.calls(path) == []
