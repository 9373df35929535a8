"""The OpenAI face as the OpenAI Agents SDK uses it, by default: stateless runs that resend
the whole history, tools the request declares (run by the client, with or without the SDK's
``needs_approval``), ``OpenAIConversationsSession``, and streamed runs; and the raw
``openai`` client's streamed events. Through the local runner, checked on the ledger's own
events (``/v1``)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from agents import (
    Agent,
    OpenAIConversationsSession,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI, OpenAI
from turnledger_local.runner import LocalConfig, LocalRunner
from turnledger_local.template import PROJECT_ROOT

from tests.http.conftest import ANN, store_of

TOKEN = "local:acme:ann"


@pytest.fixture(autouse=True)
def _no_tracing() -> None:
    set_tracing_disabled(True)  # the SDK would export traces to OpenAI


@pytest.fixture
def runner_config(runner_config: LocalConfig) -> LocalConfig:
    """The sample registry: ``send_email`` needs approval, ``lookup_user`` is a client tool;
    ``lookup_order`` and ``refund`` below are the request's own."""
    return dataclasses.replace(
        runner_config,
        tools_file=PROJECT_ROOT / "events/local-tools.json",
        project_root=PROJECT_ROOT,
        # Every piece the demo model streams is a draft chunk of its own.
        env={**runner_config.env, "DRAFT_FLUSH_MS": "0"},
    )


@pytest.fixture
def client(served: LocalRunner) -> Iterator[OpenAI]:
    with OpenAI(base_url=f"{served.url}/openai/v1", api_key=TOKEN, max_retries=0) as c:
        yield c


def _model(served: LocalRunner) -> OpenAIResponsesModel:
    client = AsyncOpenAI(base_url=f"{served.url}/openai/v1", api_key=TOKEN, max_retries=0)
    return OpenAIResponsesModel(model="demo-1", openai_client=client)


def events_of(http: httpx.Client, conversation_id: str) -> list[dict[str, Any]]:
    page = http.get(f"/v1/conversations/{conversation_id}/events", headers=ANN)
    assert page.status_code == 200, page.text
    events: list[dict[str, Any]] = page.json()["events"]
    return events


def kinds_of(http: httpx.Client, conversation_id: str) -> list[str]:
    return [event["kind"] for event in events_of(http, conversation_id)]


def conversation_of(response_id: str | None) -> str:
    assert response_id is not None and response_id.startswith("resp_")
    return response_id.split("_", 2)[2]


@function_tool
def lookup_order(order_id: str) -> str:
    """Look an order up (runs in the test: the client's tool)."""
    return f"order {order_id} shipped"


@function_tool(needs_approval=True)
def refund(order_id: str) -> str:
    """Refund an order; the SDK asks the user first."""
    return f"refunded {order_id}"


def test_a_stateless_run_with_a_client_tool(served: LocalRunner, http: httpx.Client) -> None:
    """The SDK's default: the second model call resends [user, function_call, output]; it
    continues the first response's conversation, each item stored once."""
    agent = Agent(name="a", model=_model(served), tools=[lookup_order])
    result = Runner.run_sync(agent, '/tool lookup_order {"order_id": "A7"}')
    assert result.final_output == "Tool results: lookup_order: order A7 shipped"
    conversations = {conversation_of(r.response_id) for r in result.raw_responses}
    assert len(conversations) == 1
    events = events_of(http, conversations.pop())
    assert [e["kind"] for e in events] == [
        "user_message",
        "assistant_message",
        "tool_call_requested",
        "tool_result",
        "assistant_message",
    ]
    assert events[2]["payload"]["requires"] == "client"  # declared by the request only


def _run_approval(served: LocalRunner, approve: bool) -> tuple[Any, str]:
    agent = Agent(name="a", model=_model(served), tools=[refund])
    paused = Runner.run_sync(agent, '/tool refund {"order_id": "B9"}')
    assert [item.raw_item.name for item in paused.interruptions] == ["refund"]  # type: ignore[union-attr]
    state = paused.to_state()
    for item in paused.interruptions:
        if approve:
            state.approve(item)
        else:
            state.reject(item, rejection_message="no refunds today")
    done = Runner.run_sync(agent, state)
    responses = [*paused.raw_responses, *done.raw_responses]
    conversations = {conversation_of(r.response_id) for r in responses}
    assert len(conversations) == 1
    return done, conversations.pop()


def test_needs_approval_approved(served: LocalRunner, http: httpx.Client) -> None:
    done, conversation_id = _run_approval(served, approve=True)
    assert done.final_output == "Tool results: refund: refunded B9"
    assert kinds_of(http, conversation_id).count("tool_result") == 1


def test_needs_approval_rejected(served: LocalRunner, http: httpx.Client) -> None:
    done, conversation_id = _run_approval(served, approve=False)
    assert done.final_output == "Tool results: refund: no refunds today"
    events = events_of(http, conversation_id)
    results = [e["payload"]["output"] for e in events if e["kind"] == "tool_result"]
    assert results == ["no refunds today"]  # the client's answer, not an approval here
    assert "approval_resolved" not in [e["kind"] for e in events]


def test_a_ten_call_stateless_loop_stores_each_item_once(
    client: OpenAI, http: httpx.Client
) -> None:
    tools: list[Any] = [{"type": "function", "name": "tick", "parameters": {}, "strict": False}]
    history: list[Any] = [{"role": "user", "content": "/tool tick {}"}]
    conversations = set()
    users, outputs = 1, 0
    for call in range(10):
        response = client.responses.create(model="demo-1", input=history, tools=tools)
        conversations.add(response.conversation.id)  # type: ignore[union-attr]
        history += [item.model_dump(exclude_none=True) for item in response.output]
        calls = [item for item in response.output if item.type == "function_call"]
        if calls:
            history.append(
                {"type": "function_call_output", "call_id": calls[0].call_id, "output": str(call)}
            )
            outputs += 1
        else:
            history.append({"role": "user", "content": "/tool tick {}"})
            users += 1
    assert len(conversations) == 1
    kinds = kinds_of(http, conversations.pop())
    # The last user message (and the last output) was never sent.
    assert kinds.count("user_message") == users - (0 if calls else 1)
    assert kinds.count("tool_result") == outputs - (1 if calls else 0)
    assert kinds.count("assistant_message") == 10


def test_an_unmatched_history_starts_a_new_conversation(client: OpenAI, http: httpx.Client) -> None:
    history: list[Any] = [
        {"role": "user", "content": "My name is Zed."},
        {"role": "assistant", "content": "Hello Zed."},
        {"role": "user", "content": "What is my name?"},
    ]
    first = client.responses.create(model="demo-1", input=history)
    assert first.output_text == "Your name is Zed."
    conversation_id = first.conversation.id  # type: ignore[union-attr]
    events = events_of(http, conversation_id)
    assert [e["kind"] for e in events] == ["user_message", "assistant_message"] * 2
    given = events[1]["payload"]
    assert given["source"] == "client" and given["run"] is None  # never this model's output
    assert events[3]["payload"]["source"] == "model" and events[3]["payload"]["run"]

    # The same history continued: the conversation it repeats.
    history += [item.model_dump(exclude_none=True) for item in first.output]
    again = client.responses.create(
        model="demo-1", input=[*history, {"role": "user", "content": "Hi"}]
    )
    assert again.conversation.id == conversation_id  # type: ignore[union-attr]
    # Not the conversation's transcript (an edited answer): another conversation.
    edited = [*history[:-1], {"role": "assistant", "content": "Your name is Ann."}]
    other = client.responses.create(
        model="demo-1", input=[*edited, {"role": "user", "content": "Hi"}]
    )
    assert other.conversation.id != conversation_id  # type: ignore[union-attr]
    # An older response of it (not its newest): a new conversation too (no branches yet).
    older = client.responses.create(
        model="demo-1", input=[*history, {"role": "user", "content": "Yo"}]
    )
    assert older.conversation.id not in {conversation_id, other.conversation.id}  # type: ignore[union-attr]
    assert kinds_of(http, conversation_id).count("user_message") == 3


def test_store_false_keeps_nothing(client: OpenAI, http: httpx.Client) -> None:
    response = client.responses.create(model="demo-1", input="My name is Nil.", store=False)
    assert response.output_text == "Noted (1 user messages so far)."
    conversation_id = conversation_of(response.id)
    assert http.get(f"/v1/conversations/{conversation_id}", headers=ANN).status_code == 404


def test_a_conversations_session_over_two_runs(served: LocalRunner) -> None:
    async def scenario() -> tuple[Any, list[Any], list[Any]]:
        client = AsyncOpenAI(base_url=f"{served.url}/openai/v1", api_key=TOKEN, max_retries=0)
        agent = Agent(name="a", model=OpenAIResponsesModel(model="demo-1", openai_client=client))
        session = OpenAIConversationsSession(openai_client=client)
        assert await session.get_items() == []  # created, empty
        await Runner.run(agent, "My name is Ada.", session=session)
        second = await Runner.run(agent, "What is my name?", session=session)
        items = await session.get_items()
        await session.clear_session()
        return second, items, await session.get_items()

    second, items, cleared = asyncio.run(scenario())
    assert second.final_output == "Your name is Ada."
    said = [(item["role"], item["content"][0]["text"]) for item in items]
    assert said == [
        ("user", "My name is Ada."),
        ("assistant", "Noted (1 user messages so far)."),
        ("user", "What is my name?"),
        ("assistant", "Your name is Ada."),
    ]
    assert cleared == []


def test_a_conversations_session_over_three_runs_stores_each_message_once(
    served: LocalRunner, http: httpx.Client
) -> None:
    """Each run resends the session's items (ids of the session's conversation, whose latest
    item the SDK added itself): it continues the previous run's conversation, so the tenant
    holds the session and one conversation of responses, each message once in each."""
    said = ["My name is Ada.", "What is my name?", "Thanks."]

    async def scenario() -> tuple[str, set[str]]:
        client = AsyncOpenAI(base_url=f"{served.url}/openai/v1", api_key=TOKEN, max_retries=0)
        agent = Agent(name="a", model=OpenAIResponsesModel(model="demo-1", openai_client=client))
        session = OpenAIConversationsSession(openai_client=client)
        answered: set[str] = set()
        for text in said:
            result = await Runner.run(agent, text, session=session)
            answered |= {conversation_of(r.response_id) for r in result.raw_responses}
        return session.session_id, answered

    session_id, answered = asyncio.run(scenario())
    assert len(answered) == 1 and session_id not in answered
    stored = {key.conversation_id for key in store_of(served).of_tenant("acme")}
    assert stored == {session_id, *answered}
    for conversation_id in stored:
        events = events_of(http, conversation_id)
        users = [e["payload"]["content"] for e in events if e["kind"] == "user_message"]
        assert users == said
        assert [e["kind"] for e in events].count("assistant_message") == 3


def test_a_stateless_loop_without_item_ids_stores_each_item_once(
    client: OpenAI, http: httpx.Client
) -> None:
    """A client that strips item ids is matched by content all the same."""
    tools: list[Any] = [{"type": "function", "name": "tick", "parameters": {}, "strict": False}]
    history: list[Any] = [{"role": "user", "content": "My name is Ida."}]
    conversations = set()
    for call in range(4):
        response = client.responses.create(model="demo-1", input=history, tools=tools)
        conversations.add(response.conversation.id)  # type: ignore[union-attr]
        output = [item.model_dump(exclude_none=True) for item in response.output]
        history += [{k: v for k, v in item.items() if k != "id"} for item in output]
        calls = [item for item in response.output if item.type == "function_call"]
        if calls:
            history.append(
                {"type": "function_call_output", "call_id": calls[0].call_id, "output": "ok"}
            )
        else:
            history.append({"role": "user", "content": "/tool tick {}" if call < 2 else "Hi"})
    assert len(conversations) == 1
    events = events_of(http, conversations.pop())
    kinds = [e["kind"] for e in events]
    assert [e["payload"]["content"] for e in events if e["kind"] == "user_message"] == [
        "My name is Ida.",
        "/tool tick {}",
        "Hi",
    ]
    assert kinds.count("assistant_message") == 4
    assert kinds.count("tool_result") == 1


def test_run_streamed_yields_text_deltas(served: LocalRunner, http: httpx.Client) -> None:
    """The deltas are the turn's draft chunks, as the native stream route reads them."""

    async def scenario() -> tuple[list[str], Any, str]:
        agent = Agent(name="a", model=_model(served))
        streamed = Runner.run_streamed(agent, "echo: streamed word by word")
        deltas = [
            event.data.delta
            async for event in streamed.stream_events()
            if event.type == "raw_response_event"
            and event.data.type == "response.output_text.delta"
        ]
        return deltas, streamed.final_output, streamed.raw_responses[-1].response_id or ""

    deltas, final, response_id = asyncio.run(scenario())
    assert final == "streamed word by word"
    assert deltas == ["streamed", " word", " by", " word"]
    native = http.get(
        f"/v1/conversations/{conversation_of(response_id)}/turns/1/stream", headers=ANN
    )
    assert [chunk["text"] for chunk in native.json()["chunks"]] == deltas


def test_raw_stream_events_in_order(client: OpenAI) -> None:
    with client.responses.create(model="demo-1", input="echo: a b", stream=True) as stream:
        events = list(stream)
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].response.output_text == "a b"  # type: ignore[union-attr]

    tools: list[Any] = [{"type": "function", "name": "tick", "parameters": {}}]
    with client.responses.create(
        model="demo-1", input="/tool tick {}", tools=tools, stream=True
    ) as stream:
        kinds = [e.type for e in stream]
    assert kinds[2:-1] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]


def test_items_of_a_conversation(client: OpenAI, http: httpx.Client) -> None:
    """Created with items; items appended without a model call; read one; delete refused."""
    conversation = client.conversations.create(
        items=[{"type": "message", "role": "user", "content": "My name is Kim."}],
        metadata={"topic": "names"},
    )
    assert conversation.metadata == {"topic": "names"}
    added = client.conversations.items.create(
        conversation.id,
        items=[
            {"type": "message", "role": "assistant", "content": "Hi Kim."},
            {"type": "function_call", "call_id": "c1", "name": "tick", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "tock"},
        ],
    )
    assert [item.type for item in added.data] == [
        "message",
        "function_call",
        "function_call_output",
    ]
    assert kinds_of(http, conversation.id) == ["user_message", "assistant_message", "tool_result"]
    listed = client.conversations.items.list(conversation.id, order="asc", limit=2)
    assert [item.type for item in listed.data] == ["message", "message"] and listed.has_more
    later = client.conversations.items.list(conversation.id, order="asc", after=listed.data[-1].id)
    assert [item.type for item in later.data] == ["function_call", "function_call_output"]
    one = client.conversations.items.retrieve(added.data[0].id, conversation_id=conversation.id)
    assert one.type == "message" and one.content[0].text == "Hi Kim."  # type: ignore[union-attr]
    import openai

    with pytest.raises(openai.BadRequestError) as refused:
        client.conversations.items.delete(added.data[0].id, conversation_id=conversation.id)
    assert refused.value.body["code"] == "append_only"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.retrieve("msg_99_nope", conversation_id=conversation.id)
    answered = client.responses.create(
        model="demo-1", input="What is my name?", conversation=conversation.id
    )
    assert answered.output_text == "Your name is Kim."


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/openai/v1/nope", 404),
        ("PATCH", "/openai/v1/conversations/conv_x", 405),
        ("PUT", "/openai/v1/responses", 405),
    ],
)
def test_routing_errors_have_openai_s_shape(
    http: httpx.Client, method: str, path: str, status: int
) -> None:
    answer = http.request(method, path, headers=ANN)
    assert answer.status_code == status
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == {404: "not_found", 405: "method_not_allowed"}[status]
