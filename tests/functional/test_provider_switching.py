"""Moving a conversation between models and providers, and strict histories on each.

One fixed transcript (a user fact, a tool call and its result) is continued
on ``openai-chat``, then ``openai-responses``, then ``bedrock-converse``, and
back, through the pipeline, each provider a real HTTP fake answering with the
demo model in its own wire format. Every request is checked against its
provider's own request schema (the ``openai`` package's types, botocore's
service model) and for another vendor's keys.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from turnledger.api.schemas import FunctionCallOutput, InputMessage, TurnRequest, TurnResponse
from turnledger.core.exceptions import UnknownProvider
from turnledger.core.models import ConversationKey
from turnledger.providers.call_ids import BEDROCK_CALL_ID
from turnledger.providers.factory import PROVIDERS
from turnledger.store.memory import MemoryConversationStore
from turnledger.tools import ToolRegistry, ToolRunner
from turnledger.turn.pipeline import Conversations

from tests.functional.http_sink import HttpSink, Reply
from tests.functional.provider_rigs import MODELS, STATEFUL, Rig
from tests.functional.test_provider_state import weather_tool
from tests.support import edge
from tests.support.edge import Caller
from tests.support.factories import FakeClock

ANN = Caller(tenant="tenant-a", actor="ann")
BEDROCK_MODEL = MODELS["bedrock-converse"]


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        server.respond("/weather", Reply(body={"temp": 21}))
        yield server


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client() as client:
        yield client


def registry(sink: HttpSink) -> ToolRegistry:
    return ToolRegistry.from_json(
        json.dumps(
            {
                "tools": [
                    weather_tool(sink),
                    {
                        "name": "lookup_user",
                        "parameters": {
                            "type": "object",
                            "properties": {"user_id": {"type": "string"}},
                        },
                        "executor": {"type": "client"},
                    },
                ]
            }
        )
    )


def say(svc: Conversations, text: Any, **fields: Any) -> TurnResponse:
    return edge.turn(svc, ANN, "conv-1", TurnRequest(input=text, **fields))


def runs(svc: Conversations) -> list[dict[str, Any]]:
    page = edge.events(svc, ANN, "conv-1", after=0, limit=1000)
    return [e.payload["run"] for e in page.events if e.kind == "assistant_message"]


def test_one_transcript_continued_on_chat_then_responses_then_bedrock_and_back(
    clock: FakeClock, sink: HttpSink, http: httpx.Client
) -> None:
    store = MemoryConversationStore()
    with Rig.open("openai-chat") as rig:
        svc = rig.service(store, clock, tools=registry(sink), runner=ToolRunner(http, None))

        # The fixed transcript, on openai-chat: a user fact, a tool call and its result.
        assert say(svc, "Hi, my name is Ann.").output_text == "Noted (1 user messages so far)."
        tool = say(svc, '/tool get_weather {"city": "Oslo"}')
        assert tool.output_text == 'Tool results: get_weather: {"temp":21}'
        call_id = "call.chat.2.1"  # the chat server's id, kept in the log as it came
        assert sink.requests_for("/weather")[0].json()["call_id"] == call_id

        # openai-responses: no cursor of its own yet, so the whole log, fresh.
        on_responses = say(svc, "What is my name?", provider="openai-responses")
        assert (on_responses.output_text, on_responses.context.provider_state) == (
            "Your name is Ann.",
            "fresh",
        )
        [fresh] = rig.responses_bodies()
        assert "previous_response_id" not in fresh
        assert [i for i in fresh["input"] if i["type"] != "message"] == [
            {
                "type": "function_call",
                "call_id": call_id,
                "name": "get_weather",
                "arguments": '{"city": "Oslo"}',
            },
            {"type": "function_call_output", "call_id": call_id, "output": '{"temp":21}'},
        ]

        # bedrock-converse, another model: the same log in Converse's shapes, ids re-mapped.
        on_bedrock = say(svc, "What is my name?", provider="bedrock-converse", model=BEDROCK_MODEL)
        assert (on_bedrock.output_text, on_bedrock.context.provider_state) == (
            "Your name is Ann.",
            "fresh",
        )
        [converse] = rig.converse_params()
        assert converse["modelId"] == BEDROCK_MODEL
        uses = [b["toolUse"] for m in converse["messages"] for b in m["content"] if "toolUse" in b]
        results = [
            b["toolResult"] for m in converse["messages"] for b in m["content"] if "toolResult" in b
        ]
        assert [(u["name"], u["input"]) for u in uses] == [("get_weather", {"city": "Oslo"})]
        assert uses[0]["toolUseId"] != call_id and BEDROCK_CALL_ID.fullmatch(uses[0]["toolUseId"])
        assert [r["toolUseId"] for r in results] == [uses[0]["toolUseId"]]
        assert results[0]["content"] == [{"text": '{"temp":21}'}]

        # Back on openai-responses: its cursor is a faithful prefix of the log, so only
        # what happened since (the Bedrock turn and the new message) is sent.
        back = say(svc, "How many messages now?", provider="openai-responses")
        assert (back.output_text, back.context.provider_state) == (
            "Noted (5 user messages so far).",
            "continued",
        )
        continued = rig.responses_bodies()[-1]
        assert continued["previous_response_id"] == "resp_fake_1"
        assert [(i["role"], i["content"]) for i in continued["input"]] == [
            ("user", "What is my name?"),
            ("assistant", "Your name is Ann."),
            ("user", "How many messages now?"),
        ]

        # And openai-chat again: the whole log, ids as the chat server made them.
        last = say(svc, "What is my name?")
        assert last.output_text == "Your name is Ann."
        chat = rig.chat_bodies()[-1]
        assert [m["role"] for m in chat["messages"]] == [
            "user",
            "assistant",
            "user",
            "assistant",
            "tool",
            "assistant",
            "user",
            "assistant",
            "user",
            "assistant",
            "user",
            "assistant",
            "user",
        ]
        assert chat["messages"][3]["tool_calls"][0]["id"] == call_id
        assert chat["messages"][4]["tool_call_id"] == call_id

        assert [(r["provider"], r["model"], r["provider_state"]) for r in runs(svc)] == [
            ("openai-chat", "gpt-test", "fresh"),
            ("openai-chat", "gpt-test", "fresh"),
            ("openai-chat", "gpt-test", "fresh"),
            ("openai-responses", "gpt-test", "fresh"),
            ("bedrock-converse", BEDROCK_MODEL, "fresh"),
            ("openai-responses", "gpt-test", "continued"),
            ("openai-chat", "gpt-test", "fresh"),
        ]
        assert rig.validate_requests() == 7

        # The cursor was made by a provider that is not the deployment's default: clearing
        # still deletes its stored response, through that provider.
        report = edge.clear(svc, ANN, "conv-1")
        # Every response of the chain goes: the cursor's and those the run records name.
        assert sorted(report.provider_responses) == [
            ("openai-responses", "resp_fake_1"),
            ("openai-responses", "resp_fake_2"),
        ]
        deleted = [r.path for r in rig.openai.requests if r.method == "DELETE"]
        assert sorted(deleted) == ["/v1/responses/resp_fake_1", "/v1/responses/resp_fake_2"]


def test_a_provider_the_deployment_does_not_allow_is_unknown_provider(
    clock: FakeClock,
) -> None:
    store = MemoryConversationStore()
    with Rig.open("openai-chat", providers=("openai-responses",)) as rig:
        svc = rig.service(store, clock)
        for name in ("bedrock-converse", "no-such-provider"):
            with pytest.raises(UnknownProvider) as refused:
                say(svc, "Hello.", provider=name)
            assert (refused.value.status, refused.value.code) == (422, "unknown_provider")
            assert refused.value.details == {
                "provider": name,
                "allowed": ["openai-chat", "openai-responses"],
            }
        key = ConversationKey(tenant=ANN.tenant, conversation_id="conv-1")
        assert store.get_head(key) is None  # nothing of a refused turn is stored
        assert rig.openai.requests == [] and rig.bedrock.requests == []
        assert say(svc, "Hello.", provider="openai-responses").status == "complete"


# --- strict histories on every provider ---------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
def test_two_user_messages_in_one_input_are_one_normal_turn(
    clock: FakeClock, provider: str
) -> None:
    store = MemoryConversationStore()
    with Rig.open(provider) as rig:
        svc = rig.service(store, clock)
        reply = say(
            svc,
            [
                InputMessage(type="message", role="user", content="My name is Ann."),
                InputMessage(type="message", role="user", content="What is my name?"),
            ],
        )
        assert (reply.status, reply.turn, reply.output_text) == (
            "complete",
            1,
            "Your name is Ann.",
        )
        kinds = [e.kind for e in edge.events(svc, ANN, "conv-1", after=0, limit=10).events]
        assert kinds == ["user_message", "user_message", "assistant_message"]
        merged = "My name is Ann.\n\nWhat is my name?"
        if provider == "openai-chat":
            assert rig.chat_bodies()[0]["messages"] == [{"role": "user", "content": merged}]
        if provider == "openai-responses":
            assert rig.responses_bodies()[0]["input"] == [
                {"type": "message", "role": "user", "content": merged}
            ]
        if provider == "bedrock-converse":
            assert rig.converse_params()[0]["messages"] == [
                {"role": "user", "content": [{"text": merged}]}
            ]
        # The next turn over it is a normal turn too (continued where the provider keeps state).
        again = say(svc, "What is my name?")
        assert again.output_text == "Your name is Ann."
        assert again.context.provider_state == ("continued" if provider in STATEFUL else "fresh")
        rig.validate_requests()


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_client_tool_result_then_a_user_message_in_one_input(
    clock: FakeClock, sink: HttpSink, provider: str
) -> None:
    store = MemoryConversationStore()
    with Rig.open(provider) as rig:
        svc = rig.service(store, clock, tools=registry(sink))
        say(svc, "My name is Ann.")
        waiting = say(svc, '/tool lookup_user {"user_id": "u1"}')
        assert waiting.status == "awaiting_client_tools"
        [pending] = waiting.pending_tool_calls
        assert pending.name == "lookup_user" and pending.requires == "client"
        reply = say(
            svc,
            [
                FunctionCallOutput(type="function_call_output", call_id=pending.id, output="Ada"),
                InputMessage(type="message", role="user", content="What is my name?"),
            ],
        )
        assert (reply.status, reply.turn, reply.output_text) == (
            "complete",
            3,
            "Your name is Ann.",
        )
        assert reply.context.provider_state == ("continued" if provider in STATEFUL else "fresh")
        if provider == "openai-responses":
            assert rig.responses_bodies()[-1]["input"] == [
                {"type": "function_call_output", "call_id": pending.id, "output": "Ada"},
                {"type": "message", "role": "user", "content": "What is my name?"},
            ]
        if provider == "bedrock-converse":
            last = rig.converse_params()[-1]["messages"][-1]
            assert last["role"] == "user"
            assert [next(iter(block)) for block in last["content"]] == ["toolResult", "text"]
        if provider == "openai-chat":
            tail = rig.chat_bodies()[-1]["messages"][-2:]
            assert tail == [
                {"role": "tool", "tool_call_id": pending.id, "content": "Ada"},
                {"role": "user", "content": "What is my name?"},
            ]
        if provider in ("openai-chat", "openai-responses", "bedrock-converse"):
            assert re.fullmatch(r"(fc_|call\.chat\.|tooluse)\S+", pending.id)
        rig.validate_requests()
