"""Chat Completions on the OpenAI face, driven with the real ``openai`` SDK's
``chat.completions`` against the local runner: a stateless history answered from the
ledger (checked through ``/v1``), client tools, a gated registry call, streaming, JSON mode,
and the errors of what the face does not take."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from turnledger_local.runner import LocalConfig, LocalRunner
from turnledger_local.template import PROJECT_ROOT

from tests.http.conftest import ANN, all_events

HISTORY_TURNS = 20


@pytest.fixture
def runner_config(runner_config: LocalConfig) -> LocalConfig:
    """The sample tools: ``send_email`` needs approval, ``get_weather`` runs on its own."""
    return dataclasses.replace(runner_config, tools_file=PROJECT_ROOT / "events/local-tools.json")


@pytest.fixture
def client(served: LocalRunner) -> Iterator[OpenAI]:
    with OpenAI(base_url=f"{served.url}/openai/v1", api_key="local:acme:ann", max_retries=0) as c:
        yield c


def conversation_of(completion: Any) -> str:
    """The conversation a completion is stored in (the face's field beyond OpenAI's)."""
    extra = completion.model_extra or {}
    conversation_id: str = extra["conversation"]["id"]
    return conversation_id


def test_a_three_turn_history_is_answered_from_the_ledger(
    client: OpenAI, http: httpx.Client
) -> None:
    """Each request repeats the whole history; the face continues the one conversation
    whose transcript it repeats, and the answer comes from what the ledger holds."""
    messages: list[Any] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "My name is Ada."},
    ]
    first = client.chat.completions.create(model="demo-1", messages=messages)
    assert first.object == "chat.completion"
    assert first.choices[0].finish_reason == "stop"
    assert first.choices[0].message.content == "Noted (1 user messages so far)."
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "I live in Paris."},
    ]
    second = client.chat.completions.create(model="demo-1", messages=messages)
    messages += [
        {"role": "assistant", "content": second.choices[0].message.content},
        {"role": "user", "content": "What is my name?"},
    ]
    third = client.chat.completions.create(model="demo-1", messages=messages)
    assert third.choices[0].message.content == "Your name is Ada."
    conversation_id = conversation_of(first)
    assert conversation_of(second) == conversation_of(third) == conversation_id
    assert third.id == f"chatcmpl-3_{conversation_id}"
    assert third.usage is not None and third.usage.prompt_tokens > 0
    assert third.usage.prompt_tokens_details is not None
    assert third.usage.prompt_tokens_details.cached_tokens == 0
    assert third.usage.total_tokens == third.usage.prompt_tokens + third.usage.completion_tokens
    kinds = [e["kind"] for e in all_events(http, conversation_id)]
    assert kinds == ["user_message", "assistant_message"] * 3


def test_a_stateless_loop_stores_each_message_once(client: OpenAI, http: httpx.Client) -> None:
    """Twenty calls, each with the whole history: one conversation, each message once."""
    messages: list[Any] = []
    conversations = set()
    for number in range(HISTORY_TURNS):
        messages.append({"role": "user", "content": f"Message {number}."})
        answer = client.chat.completions.create(model="demo-1", messages=messages)
        conversations.add(conversation_of(answer))
        messages.append({"role": "assistant", "content": answer.choices[0].message.content})
    assert len(conversations) == 1
    events = all_events(http, conversations.pop())
    users = [e["payload"]["content"] for e in events if e["kind"] == "user_message"]
    assert users == [f"Message {n}." for n in range(HISTORY_TURNS)]
    assert [e["kind"] for e in events].count("assistant_message") == HISTORY_TURNS


def test_a_client_may_switch_between_responses_and_chat(client: OpenAI, http: httpx.Client) -> None:
    """The same chain: a history begun on the Responses face continues on Chat Completions."""
    started = client.responses.create(model="demo-1", input="My name is Lin.")
    answer = client.chat.completions.create(
        model="demo-1",
        messages=[
            {"role": "user", "content": "My name is Lin."},
            {"role": "assistant", "content": started.output_text},
            {"role": "user", "content": "What is my name?"},
        ],
    )
    assert answer.choices[0].message.content == "Your name is Lin."
    assert conversation_of(answer) == started.conversation.id  # type: ignore[union-attr]
    assert len(all_events(http, conversation_of(answer))) == 4


def test_store_false_keeps_nothing(client: OpenAI, http: httpx.Client) -> None:
    answer = client.chat.completions.create(
        model="demo-1",
        messages=[
            {"role": "user", "content": "My name is Kim."},
            {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": "What is my name?"},
        ],
        store=False,
    )
    assert answer.choices[0].message.content == "Your name is Kim."
    assert (answer.model_extra or {})["conversation"] is None
    conversation_id = answer.id.split("_", 1)[1]
    assert http.get(f"/v1/conversations/{conversation_id}", headers=ANN).status_code == 404


def test_a_client_tool_loop_runs_to_its_end(client: OpenAI, http: httpx.Client) -> None:
    """A function the registry lacks is the client's: ``tool_calls`` and
    ``finish_reason: "tool_calls"``; its result, as a ``tool`` message after the history,
    continues the turn."""
    tools: list[Any] = [
        {
            "type": "function",
            "function": {
                "name": "lookup_order",
                "description": "An order's status.",
                "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
            },
        }
    ]
    messages: list[Any] = [{"role": "user", "content": '/tool lookup_order {"id": "A1"}'}]
    asked = client.chat.completions.create(model="demo-1", messages=messages, tools=tools)
    choice = asked.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "lookup_order"
    assert json.loads(call.function.arguments) == {"id": "A1"}
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "shipped"},
    ]
    done = client.chat.completions.create(model="demo-1", messages=messages, tools=tools)
    assert done.choices[0].finish_reason == "stop"
    assert done.choices[0].message.content == "Tool results: lookup_order: shipped"
    assert conversation_of(done) == conversation_of(asked)
    kinds = [e["kind"] for e in all_events(http, conversation_of(done))]
    assert kinds.count("user_message") == 1 and kinds.count("tool_result") == 1


def test_a_registry_tool_runs_with_its_executor(client: OpenAI, http: httpx.Client) -> None:
    """A registry tool needing no approval runs here, never on the client."""
    answer = client.chat.completions.create(
        model="demo-1", messages=[{"role": "user", "content": '/tool get_weather {"city": "Oslo"}'}]
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    assert choice.message.content is not None and "get_weather" in choice.message.content
    kinds = [e["kind"] for e in all_events(http, conversation_of(answer))]
    assert "tool_result" in kinds


def test_a_gated_registry_call_waits_for_its_decision(
    client: OpenAI, http: httpx.Client, served: LocalRunner
) -> None:
    """A call that needs approval never runs on its own and is never shown as a
    ``tool_call``: ``409 approval_pending`` names it (the inbox holds it); the same request
    again answers the same, runs nothing; once decided, it is answered with the turn."""
    messages: list[Any] = [{"role": "user", "content": '/tool send_email {"to": "bo@x.io"}'}]
    with pytest.raises(openai.ConflictError) as raised:
        client.chat.completions.create(model="demo-1", messages=messages)
    error: dict[str, Any] = raised.value.body  # type: ignore[assignment]
    assert error["code"] == "approval_pending"
    [pending] = error["pending_tool_calls"]
    assert (pending["name"], pending["requires"]) == ("send_email", "approval")
    conversation_id = error["conversation_id"]
    inbox = http.get("/v1/approvals", headers=ANN).json()
    assert [c["id"] for c in inbox["items"]] == [pending["id"]]
    with pytest.raises(openai.ConflictError):
        client.chat.completions.create(model="demo-1", messages=messages)
    events = all_events(http, conversation_id)
    assert [e["kind"] for e in events].count("user_message") == 1
    assert "tool_result" not in [e["kind"] for e in events]

    decided = http.post(
        f"/v1/conversations/{conversation_id}/approvals",
        json={"approve": [pending["id"]]},
        headers=ANN,
    )
    assert decided.status_code == 200, decided.text
    answer = client.chat.completions.create(model="demo-1", messages=messages)
    assert conversation_of(answer) == conversation_id
    text = answer.choices[0].message.content
    assert text == decided.json()["output_text"] and "send_email" in text
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "Thanks."}]
    after = client.chat.completions.create(model="demo-1", messages=messages)
    assert conversation_of(after) == conversation_id
    kinds = [e["kind"] for e in all_events(http, conversation_id)]
    assert kinds.count("user_message") == 2 and kinds.count("tool_result") == 1


def test_stream_with_usage(client: OpenAI, http: httpx.Client) -> None:
    """``chat.completion.chunk`` events, the role first, the finish, then the usage."""
    stream = client.chat.completions.create(
        model="demo-1",
        messages=[{"role": "user", "content": "My name is Bo."}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert {chunk.object for chunk in chunks} == {"chat.completion.chunk"}
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Noted (1 user messages so far)."
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6  # the demo model counts words
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


def test_a_streamed_client_tool_call(client: OpenAI) -> None:
    stream = client.chat.completions.create(
        model="demo-1",
        messages=[{"role": "user", "content": '/tool lookup_order {"id": "B2"}'}],
        tools=[{"type": "function", "function": {"name": "lookup_order", "parameters": {}}}],
        stream=True,
    )
    chunks = list(stream)
    calls = [call for c in chunks for call in (c.choices[0].delta.tool_calls or [])]
    assert [(call.index, call.function.name) for call in calls] == [(0, "lookup_order")]  # type: ignore[union-attr]
    assert json.loads(calls[0].function.arguments or "") == {"id": "B2"}  # type: ignore[union-attr]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert all(c.usage is None for c in chunks)


def test_json_mode_and_json_schema(client: OpenAI) -> None:
    for response_format in (
        {"type": "json_object"},
        {
            "type": "json_schema",
            "json_schema": {
                "name": "answer",
                "schema": {"type": "object", "properties": {"answer": {"type": "string"}}},
                "strict": True,
            },
        },
    ):
        answer = client.chat.completions.create(
            model="demo-1",
            messages=[{"role": "user", "content": "echo: hello"}],
            response_format=response_format,  # type: ignore[arg-type]
        )
        assert json.loads(answer.choices[0].message.content or "") == {"answer": "hello"}


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"n": 2}, 400, "unsupported_value", "n"),
        ({"logprobs": True}, 400, "unsupported_parameter", "logprobs"),
        ({"frequency_penalty": 0.5}, 400, "unsupported_parameter", "frequency_penalty"),
        ({"tool_choice": "required"}, 400, "unsupported_value", "tool_choice"),
        ({"stream_options": {"include_usage": True}}, 400, "unsupported_value", "stream_options"),
        (
            {"messages": [{"role": "user", "content": "Hi", "audio": {"id": "a"}}]},
            400,
            "unsupported_parameter",
            "messages.0.audio",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "x"}}],
                    }
                ]
            },
            400,
            "unsupported_value",
            "messages.0.content.0.type",
        ),
    ],
)
def test_what_the_face_does_not_take_is_a_clear_400(
    http: httpx.Client, body: dict[str, Any], status: int, code: str, param: str
) -> None:
    """Refused by name, in OpenAI's error shape, before anything is stored."""
    sent = {"model": "demo-1", "messages": [{"role": "user", "content": "Hi"}], **body}
    answer = http.post("/openai/v1/chat/completions", json=sent, headers=ANN)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["param"], error["type"]) == (code, param, "invalid_request_error")
    assert http.get("/v1/approvals", headers=ANN).json()["items"] == []


def test_a_401_is_in_openai_s_shape(served: LocalRunner) -> None:
    with pytest.raises(openai.AuthenticationError) as raised:
        OpenAI(
            base_url=f"{served.url}/openai/v1", api_key="nope", max_retries=0
        ).chat.completions.create(model="demo-1", messages=[{"role": "user", "content": "Hi"}])
    assert raised.value.body["type"] == "authentication_error"  # type: ignore[index]


def test_a_gated_call_with_store_false_says_nothing_waits(
    client: OpenAI, http: httpx.Client
) -> None:
    """``store: false`` keeps nothing, so a call needing approval cannot wait for one:
    ``409`` naming ``store``, the call never ran, and no conversation is left."""
    with pytest.raises(openai.ConflictError) as raised:
        client.chat.completions.create(
            model="demo-1",
            messages=[{"role": "user", "content": '/tool send_email {"to": "bo@x.io"}'}],
            store=False,
        )
    error: dict[str, Any] = raised.value.body  # type: ignore[assignment]
    assert (error["code"], error["param"]) == ("approval_pending", "store")
    assert [call["name"] for call in error["pending_tool_calls"]] == ["send_email"]
    assert http.get("/v1/approvals", headers=ANN).json()["items"] == []
