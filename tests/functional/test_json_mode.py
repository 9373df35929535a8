"""JSON mode through the pipeline: ``"response_format"`` on a turn.

The answer is stored as a JSON value (``content_json``, ``content`` null),
returned as ``output_json``, and stringified only when it is sent back to a
model. A model answering something that is not JSON in JSON mode is the
provider's failure: ``502 provider_error``, recorded as ``turn_failed``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
from pydantic import TypeAdapter
from turnledger.api.schemas import TurnRequest, TurnResponse
from turnledger.core.config import Settings
from turnledger.core.exceptions import ProviderError
from turnledger.core.models import JsonObjectFormat, JsonSchemaFormat
from turnledger.providers.base import ModelReply, ModelRequest
from turnledger.providers.factory import PROVIDERS
from turnledger.store.base import ConversationStore
from turnledger.store.memory import MemoryConversationStore
from turnledger.tools import ToolRegistry, ToolRunner
from turnledger.turn.pipeline import Conversations

from tests.functional.http_sink import HttpSink, Reply
from tests.functional.provider_rigs import STATEFUL, Rig
from tests.support import edge
from tests.support.edge import Caller
from tests.support.factories import FakeClock
from tests.support.providers import Recording

ANN = Caller(tenant="tenant-a", actor="ann")
JSON_OBJECT = {"type": "json_object"}


_FORMAT: TypeAdapter[JsonObjectFormat | JsonSchemaFormat] = TypeAdapter(
    JsonObjectFormat | JsonSchemaFormat
)


def json_mode(value: dict[str, Any]) -> JsonObjectFormat | JsonSchemaFormat:
    return _FORMAT.validate_python(value)


def service(store: ConversationStore, clock: FakeClock, provider: Any, **settings: Any) -> Any:
    return Conversations(
        store=store,
        provider=provider,
        settings=replace(Settings(), **settings),
        clock=clock.now,
    )


def say(svc: Conversations, text: str, **fields: Any) -> TurnResponse:
    return edge.turn(svc, ANN, "conv-1", TurnRequest(input=text, **fields))


def answers(svc: Conversations) -> list[dict[str, Any]]:
    page = edge.events(svc, ANN, "conv-1", after=0, limit=1000)
    return [e.payload for e in page.events if e.kind == "assistant_message"]


def test_the_answer_is_stored_and_returned_as_json_and_sent_back_as_text(
    store: ConversationStore, clock: FakeClock
) -> None:
    provider = Recording()
    svc = service(store, clock, provider)
    reply = say(svc, "My name is Ann.", response_format=json_mode(JSON_OBJECT))
    assert reply.output_json == {"answer": "Noted (1 user messages so far)."}
    assert json.loads(reply.output_text or "") == reply.output_json
    assert provider.requests[0].response_format is not None
    [stored] = answers(svc)
    assert stored["content"] is None
    assert stored["content_json"] == {"answer": "Noted (1 user messages so far)."}

    plain = say(svc, "What is my name?")
    assert (plain.output_text, plain.output_json) == ("Your name is Ann.", None)
    assert provider.requests[-1].response_format is None
    sent = [(m.role, m.content) for m in provider.requests[-1].messages]
    assert sent == [
        ("user", "My name is Ann."),
        ("assistant", '{"answer": "Noted (1 user messages so far)."}'),
        ("user", "What is my name?"),
    ]
    assert answers(svc)[-1]["content"] == "Your name is Ann."
    assert answers(svc)[-1]["content_json"] is None


def test_a_json_schema_format_reaches_the_model_and_the_value_is_kept(clock: FakeClock) -> None:
    provider = Recording()
    svc = service(MemoryConversationStore(), clock, provider)
    schema = {
        "type": "json_schema",
        "json_schema": {
            "name": "reply",
            "schema": {"type": "object", "properties": {"answer": {"type": "string"}}},
        },
    }
    reply = say(svc, "echo: hi", response_format=json_mode(schema))
    assert reply.output_json == {"answer": "hi"}
    request_format = provider.requests[0].response_format
    assert request_format is not None and request_format.type == "json_schema"
    assert request_format.json_schema is not None
    assert request_format.json_schema["name"] == "reply"


class NotJson(Recording):
    """The demo model, ignoring JSON mode."""

    def complete(self, request: ModelRequest) -> ModelReply:
        return super().complete(request.model_copy(update={"response_format": None}))


def test_a_non_json_answer_in_json_mode_is_a_provider_error_recorded_as_turn_failed(
    store: ConversationStore, clock: FakeClock
) -> None:
    svc = service(store, clock, Recording())
    say(svc, "My name is Ann.")
    broken = service(store, clock, NotJson())
    with pytest.raises(ProviderError) as failed:
        say(broken, "Answer in JSON.", response_format=json_mode(JSON_OBJECT))
    assert (failed.value.status, failed.value.code) == (502, "provider_error")
    assert failed.value.details["reason"] == "invalid_json"
    page = edge.events(svc, ANN, "conv-1", after=0, limit=100).events
    assert [e.kind for e in page] == ["user_message", "assistant_message", "turn_failed"]
    assert page[-1].payload["code"] == "provider_error"
    view = edge.get(svc, ANN, "conv-1")
    assert (view.turns, view.failed_turns) == (1, 1)
    # The conversation goes on; the lost input never reached the log.
    assert say(svc, "What is my name?").output_text == "Your name is Ann."


class Malformed(Recording):
    """A model answering JSON that no store keeps, or that nests past the limit."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def complete(self, request: ModelRequest) -> ModelReply:
        return ModelReply(text=self.text)


@pytest.mark.parametrize(
    "text",
    ['{"x": "\\ud800"}', "[" * 100_000, '{"a": 1, "a": 2}'],
    ids=["surrogate", "deep", "twice"],
)
def test_a_json_answer_no_store_keeps_is_a_provider_error_never_a_crash(
    store: ConversationStore, clock: FakeClock, text: str
) -> None:
    broken = service(store, clock, Malformed(text))
    with pytest.raises(ProviderError) as failed:
        say(broken, "Answer in JSON.", response_format=json_mode(JSON_OBJECT))
    assert failed.value.details["reason"] == "invalid_json"
    assert say(service(store, clock, Recording()), "Hello.").status == "complete"


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        server.respond("/weather", Reply(body={"temp": 21}))
        yield server


@pytest.mark.parametrize("provider", PROVIDERS)
def test_json_mode_on_every_provider_with_a_tool_call_in_between(
    clock: FakeClock, sink: HttpSink, provider: str
) -> None:
    registry = ToolRegistry.from_json(
        json.dumps(
            {
                "tools": [
                    {
                        "name": "get_weather",
                        "parameters": {
                            "type": "object",
                            "properties": {"city": {"type": "string"}},
                        },
                        "executor": {"type": "http", "url": sink.url("/weather")},
                    }
                ]
            }
        )
    )
    store = MemoryConversationStore()
    with Rig.open(provider) as rig, httpx.Client() as http:
        svc = rig.service(store, clock, tools=registry, runner=ToolRunner(http, None))
        first = say(svc, "My name is Ann.", response_format=json_mode(JSON_OBJECT))
        assert first.output_json == {"answer": "Noted (1 user messages so far)."}
        tool = say(
            svc, '/tool get_weather {"city": "Oslo"}', response_format=json_mode(JSON_OBJECT)
        )
        assert tool.output_json == {"answer": 'Tool results: get_weather: {"temp":21}'}
        last = say(svc, "What is my name?", response_format=json_mode(JSON_OBJECT))
        assert last.output_json == {"answer": "Your name is Ann."}
        assert last.context.provider_state == ("continued" if provider in STATEFUL else "fresh")
        stored = [a for a in answers(svc) if not a["tool_calls"]]
        assert [a["content"] for a in stored] == [None, None, None]
        assert [a["content_json"]["answer"] for a in stored] == [
            "Noted (1 user messages so far).",
            'Tool results: get_weather: {"temp":21}',
            "Your name is Ann.",
        ]
        if provider == "openai-responses":
            body = rig.responses_bodies()[-1]
            assert body["text"] == {"format": {"type": "json_object"}}
        if provider == "openai-chat":
            body = rig.chat_bodies()[-1]
            assert body["response_format"] == {"type": "json_object"}
            assistant = [m for m in body["messages"] if m["role"] == "assistant"]
            assert assistant[0] == {
                "role": "assistant",
                "content": '{"answer": "Noted (1 user messages so far)."}',
            }
        if provider == "bedrock-converse":
            params = rig.converse_params()[-1]
            # JSON mode's answer tool, offered with the others: the model must call one.
            assert params["toolConfig"]["toolChoice"] == {"any": {}}
            offered = [t["toolSpec"]["name"] for t in params["toolConfig"]["tools"]]
            assert offered == ["get_weather", "json_answer"]
        rig.validate_requests()
