"""Provider state as a cache, through the turn pipeline (API.md *Provider state*).

``demo-stateful`` in process and ``openai-responses`` against the fake
Responses API over real HTTP: a turn over a usable cursor is ``continued``
(``previous_response_id`` plus only the new items), a cursor whose state is
gone is ``fallback`` in the same request and the turn succeeds, and any
mismatch (model, system prompt, tool set, redaction, a summary since, age) is
``fresh``. The cursor is saved only with a successful answer. Clear, tenant
erasure and the sweep delete the state they know of, best effort.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
from turnledger.api.schemas import EventView, TurnRequest, TurnResponse
from turnledger.context.redaction import RedactionRule, Redactor
from turnledger.core.config import Settings
from turnledger.core.exceptions import ProviderError
from turnledger.core.models import ConversationKey, Head, ProviderCursor
from turnledger.ops.sweep import Sweeper
from turnledger.providers.base import Message, ModelReply, ModelRequest
from turnledger.providers.demo_stateful import RESPONSE_ID, DemoStatefulProvider
from turnledger.providers.openai_responses import OpenAIResponsesProvider
from turnledger.store.base import ConversationStore
from turnledger.store.keyring import Keyring, LocalMasterKey, MemoryKeyItems
from turnledger.store.memory import MemoryConversationStore
from turnledger.tools import ToolRegistry, ToolRunner
from turnledger.turn.pipeline import Conversations

from tests.functional.fake_openai import RESPONSES_PATH, FakeOpenAI, error_reply
from tests.functional.http_sink import HttpSink, Reply
from tests.support import edge
from tests.support.edge import Caller
from tests.support.factories import FakeClock
from tests.support.provider_schemas import validate_responses_request
from tests.support.wire_demo import responses_demo

ANN = Caller(tenant="tenant-a", actor="ann")


class Stateful(DemoStatefulProvider):
    """``demo-stateful``, recording each request; ``failures`` makes the next calls fail."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[ModelRequest] = []
        self.failures = 0

    def complete(self, request: ModelRequest) -> ModelReply:
        self.requests.append(request)
        if self.failures:
            self.failures -= 1
            raise ProviderError("the model is down", details={"attempts": 1})
        return super().complete(request)


def service(
    store: ConversationStore,
    clock: FakeClock,
    provider: DemoStatefulProvider | OpenAIResponsesProvider,
    **options: Any,
) -> Conversations:
    settings = {k: v for k, v in options.items() if k not in ("tools", "redactor", "runner")}
    return Conversations(
        store=store,
        provider=provider,
        settings=replace(Settings(provider=provider.name), **settings),
        tools=options.get("tools"),
        runner=options.get("runner"),
        redactor=options.get("redactor"),
        clock=clock.now,
    )


def say(svc: Conversations, text: str, conversation: str = "conv-1", **fields: Any) -> TurnResponse:
    return edge.turn(svc, ANN, conversation, TurnRequest(input=text, **fields))


def head_of(store: ConversationStore, conversation: str = "conv-1") -> Head:
    head = store.get_head(ConversationKey(tenant=ANN.tenant, conversation_id=conversation))
    assert head is not None
    return head


def cursor_of(store: ConversationStore, conversation: str = "conv-1") -> ProviderCursor:
    cursor = head_of(store, conversation).provider_cursor
    assert cursor is not None
    return cursor


def events(svc: Conversations, conversation: str = "conv-1") -> list[EventView]:
    page = edge.events(svc, ANN, conversation, after=0, limit=1000)
    assert page.next_after is None
    return page.events


def last_run(svc: Conversations, conversation: str = "conv-1") -> dict[str, Any]:
    """The run record of the newest ``assistant_message``."""
    answers = [e for e in events(svc, conversation) if e.kind == "assistant_message"]
    run: dict[str, Any] = answers[-1].payload["run"]
    return run


def sent(request: ModelRequest) -> list[Message]:
    """The messages a request actually sent: only the new ones over a continuation."""
    if request.continuation is None:
        return request.messages
    return request.messages[request.continuation.new_from :]


def texts(messages: list[Message]) -> list[tuple[str, str | None]]:
    return [(m.role, m.content) for m in messages]


# --- demo-stateful through the pipeline ---------------------------------------------------


def test_demo_stateful_continues_falls_back_and_keeps_the_cursor_on_the_head(
    store: ConversationStore, clock: FakeClock
) -> None:
    """Turn 1 fresh, turn 2 continued over the cursor with only its new message, the
    head's cursor names what made it; lost state falls back and the answer is right."""
    provider = Stateful()
    svc = service(store, clock, provider, system_prompt="Be brief.")

    first = say(svc, "My name is Ann.")
    assert (first.context.provider_state, first.context.messages_sent) == ("fresh", 2)
    assert provider.requests[0].continuation is None and provider.requests[0].store is True
    cursor = cursor_of(store)
    assert cursor == ProviderCursor(
        provider="demo-stateful",
        api="responses",
        model="demo-1",
        response_id=cursor.response_id,
        created_at=clock.now(),
        tenant="tenant-a",
        context_sha256=cursor.context_sha256,
        sequence=2,
        conversation_id="conv-1",  # its owner: only its own purge deletes the response
    )
    assert RESPONSE_ID.fullmatch(cursor.response_id)
    assert len(cursor.context_sha256) == 64 and int(cursor.context_sha256, 16) >= 0
    assert provider.state.get(cursor.response_id) is not None
    run = last_run(svc)
    assert (run["provider_state"], run["response_id"]) == ("fresh", cursor.response_id)

    clock.advance(30)
    second = say(svc, "I live in Oslo.")
    assert second.output_text == "Noted (2 user messages so far)."
    assert (second.context.provider_state, second.context.messages_sent) == ("continued", 1)
    request = provider.requests[-1]
    assert request.continuation is not None
    assert request.continuation.previous_response_id == cursor.response_id
    assert texts(sent(request)) == [("user", "I live in Oslo.")]
    # The whole context is still in the request, for a fallback.
    assert texts(request.messages)[0] == ("system", "Be brief.")
    moved = cursor_of(store)
    assert (moved.sequence, moved.created_at) == (4, clock.now())
    assert moved.response_id != cursor.response_id
    assert moved.context_sha256 == cursor.context_sha256
    run = last_run(svc)
    assert (run["provider_state"], run["response_id"], run["messages_sent"]) == (
        "continued",
        moved.response_id,
        1,
    )

    assert provider.forget() == 2
    third = say(svc, "What is my name?")
    assert third.output_text == "Your name is Ann."
    assert (third.context.provider_state, third.context.messages_sent) == ("fallback", 6)
    assert last_run(svc)["provider_state"] == "fallback"
    after_fallback = cursor_of(store)
    assert after_fallback.sequence == 6
    assert provider.state.get(after_fallback.response_id) is not None

    fourth = say(svc, "And again: what is my name?")
    assert (fourth.output_text, fourth.context.provider_state) == ("Your name is Ann.", "continued")
    assert provider.requests[-1].continuation is not None
    assert provider.requests[-1].continuation.previous_response_id == after_fallback.response_id


def test_a_provider_without_state_keeps_no_cursor(clock: FakeClock) -> None:
    store = MemoryConversationStore()
    svc = Conversations(store=store, provider=_plain_demo(), settings=Settings(), clock=clock.now)
    say(svc, "My name is Ann.")
    reply = say(svc, "What is my name?")
    assert (reply.output_text, reply.context.provider_state) == ("Your name is Ann.", "fresh")
    assert head_of(store).provider_cursor is None
    assert last_run(svc)["response_id"] is None


def _plain_demo() -> Any:
    from turnledger.providers.demo import DemoProvider

    return DemoProvider()


CLIENT_TOOLS = ToolRegistry.from_json(
    json.dumps(
        {
            "tools": [
                {"name": "lookup_user", "executor": {"type": "client"}},
                {"name": "lookup_order", "executor": {"type": "client"}},
            ]
        }
    )
)


def _redaction(version: str) -> Redactor:
    return Redactor(version=version, rules=[RedactionRule(name="pin", pattern=r"\b\d{4}\b")])


@pytest.mark.parametrize("change", ["model", "system_prompt", "tools", "redaction", "retention"])
def test_any_mismatch_is_fresh_and_the_next_turn_continues_again(
    clock: FakeClock, change: str
) -> None:
    """A cursor made with another model, system prompt, tool set or redaction version, or
    older than the retention, is not used; the fresh answer's cursor is used next."""
    store = MemoryConversationStore()
    provider = Stateful()
    redaction = {"rules": _redaction("v1")}
    base: dict[str, Any] = {
        "tools": CLIENT_TOOLS,
        "redactor": lambda: redaction["rules"],
        "provider_state_retention_seconds": 600,
        "ttl_seconds": 0,
        "allowed_models": ("demo-2",),
    }
    svc = service(store, clock, provider, **base)
    say(svc, "My name is Ann.")
    assert say(svc, "I live in Oslo.").context.provider_state == "continued"
    before = cursor_of(store)

    fields: dict[str, Any] = {}
    if change == "model":
        fields["model"] = "demo-2"
    elif change == "system_prompt":
        svc = service(store, clock, provider, **base, system_prompt="Answer in French.")
    elif change == "tools":
        fields["tools"] = ["lookup_user"]
    elif change == "redaction":
        redaction["rules"] = _redaction("v2")
    elif change == "retention":
        clock.advance(601)

    reply = say(svc, "What is my name?", **fields)
    assert reply.output_text == "Your name is Ann."
    assert reply.context.provider_state == "fresh"
    assert provider.requests[-1].continuation is None
    assert reply.context.messages_sent == len(provider.requests[-1].messages)
    made = cursor_of(store)
    assert made.response_id != before.response_id
    if change in ("system_prompt", "tools", "redaction"):
        assert made.context_sha256 != before.context_sha256
    if change == "model":
        assert made.model == "demo-2"

    again = say(svc, "Still there?", **fields)
    assert again.context.provider_state == "continued"
    assert provider.requests[-1].continuation is not None
    assert provider.requests[-1].continuation.previous_response_id == made.response_id


def test_a_summary_since_the_cursor_makes_the_turn_fresh(clock: FakeClock) -> None:
    """A turn that compacts sends the summary whole (fresh); the next one continues over it."""
    store = MemoryConversationStore()
    provider = Stateful()
    svc = service(store, clock, provider, context_max_tokens=300)
    filler = " ".join(["word"] * 20)
    say(svc, "My name is Ann.")
    states: list[tuple[bool, str]] = []
    for index in range(20):
        count = len(events(svc))
        reply = say(svc, f"Message {index}: {filler}")
        new = events(svc)[count:]
        compacted = any(e.kind == "context_compacted" for e in new)
        states.append((compacted, reply.context.provider_state))
        if compacted:
            summary = next(e for e in new if e.kind == "context_compacted")
            assert summary.sequence < cursor_of(store).sequence
    assert any(compacted for compacted, _ in states), "the budget never forced a summary"
    for compacted, state in states:
        assert state == ("fresh" if compacted else "continued"), states
    reply = say(svc, "What is my name?")
    assert reply.output_text == "Your name is Ann."
    assert reply.context.summary_through is not None


def test_the_cursor_moves_only_with_a_successful_answer(
    store: ConversationStore, clock: FakeClock
) -> None:
    """A failed model call leaves the cursor; the next turn continues from it, or falls
    back cleanly when the state is gone meanwhile."""
    provider = Stateful()
    svc = service(store, clock, provider)
    say(svc, "My name is Ann.")
    say(svc, "I live in Oslo.")
    before = head_of(store)

    provider.failures = 1
    with pytest.raises(ProviderError):
        say(svc, "This call fails.")
    after = head_of(store)
    assert after.provider_cursor == before.provider_cursor
    assert after.failed_turns == 1
    assert [e.kind for e in events(svc)][-1] == "turn_failed"

    reply = say(svc, "What is my name?")
    assert (reply.output_text, reply.context.provider_state) == ("Your name is Ann.", "continued")
    request = provider.requests[-1]
    assert before.provider_cursor is not None and request.continuation is not None
    assert request.continuation.previous_response_id == before.provider_cursor.response_id
    # The failed turn's input never reached the model, and is not sent now.
    assert texts(sent(request)) == [("user", "What is my name?")]

    provider.failures = 1
    with pytest.raises(ProviderError):
        say(svc, "Fails again.")
    provider.forget()
    reply = say(svc, "What is my name?")
    assert (reply.output_text, reply.context.provider_state) == ("Your name is Ann.", "fallback")
    assert "Fails again." not in [m.content for m in provider.requests[-1].messages]


# --- openai-responses against the fake Responses API ----------------------------------------


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        server.default = responses_demo(server)
        yield server


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        server.respond("/weather", Reply(body={"temp": 21}))
        yield server


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client() as client:
        yield client


def responses_provider(fake: FakeOpenAI, **options: Any) -> OpenAIResponsesProvider:
    return OpenAIResponsesProvider(
        base_url=fake.base_url,
        api_key=lambda: "sk-test",
        max_retries=2,
        sleep=lambda _seconds: None,
        **options,
    )


def weather_tool(sink: HttpSink) -> dict[str, Any]:
    """``get_weather``: an HTTP tool that ``sink`` answers at ``/weather``."""
    return {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
        "executor": {"type": "http", "url": sink.url("/weather")},
    }


def weather_tools(sink: HttpSink) -> ToolRegistry:
    return ToolRegistry.from_json(json.dumps({"tools": [weather_tool(sink)]}))


def posted(fake: FakeOpenAI) -> list[dict[str, Any]]:
    """Every ``POST /responses`` body, each checked against the openai package's types."""
    bodies = [r.json() for r in fake.requests if r.method == "POST" and r.path == RESPONSES_PATH]
    for body in bodies:
        validate_responses_request(body)
    return bodies


def test_openai_responses_continues_over_http_and_falls_back_in_the_same_request(
    store: ConversationStore, clock: FakeClock, fake: FakeOpenAI
) -> None:
    svc = service(store, clock, responses_provider(fake), model="gpt-test", system_prompt="Hi.")
    first = say(svc, "My name is Ann.")
    assert first.context.provider_state == "fresh"
    cursor = cursor_of(store)
    assert (cursor.provider, cursor.api, cursor.model, cursor.response_id) == (
        "openai-responses",
        "responses",
        "gpt-test",
        "resp_fake_1",
    )
    second = say(svc, "I live in Oslo.")
    assert (second.output_text, second.context.provider_state) == (
        "Noted (2 user messages so far).",
        "continued",
    )
    bodies = posted(fake)
    assert bodies[1] == {
        "model": "gpt-test",
        "previous_response_id": "resp_fake_1",
        "input": [{"type": "message", "role": "user", "content": "I live in Oslo."}],
        "instructions": "Hi.",
        "store": True,
    }
    assert last_run(svc)["response_id"] == cursor_of(store).response_id == "resp_fake_2"

    fake.lose_responses()
    third = say(svc, "What is my name?")
    assert (third.output_text, third.context.provider_state) == ("Your name is Ann.", "fallback")
    assert third.context.messages_sent == 6
    refused, resent = posted(fake)[2:]
    assert refused["previous_response_id"] == "resp_fake_2"
    assert "previous_response_id" not in resent
    assert [item["content"] for item in resent["input"]] == [
        "My name is Ann.",
        "Noted (1 user messages so far).",
        "I live in Oslo.",
        "Noted (2 user messages so far).",
        "What is my name?",
    ]
    assert len(posted(fake)) == 4  # the fallback is one more request, in the same turn
    assert cursor_of(store).response_id == "resp_fake_3"


def test_openai_responses_tool_calls_keep_the_providers_call_ids_across_a_continuation(
    clock: FakeClock, fake: FakeOpenAI, sink: HttpSink, http: httpx.Client
) -> None:
    store = MemoryConversationStore()
    svc = service(
        store,
        clock,
        responses_provider(fake),
        model="gpt-test",
        tools=weather_tools(sink),
        runner=ToolRunner(http, None),
    )
    say(svc, "My name is Ann.")
    done = say(svc, '/tool get_weather {"city": "Oslo"}')
    assert done.output_text == 'Tool results: get_weather: {"temp":21}'
    assert done.context.provider_state == "continued"
    # The provider's id travelled: the log, the tool's request, and back to the provider.
    [requested] = [e for e in events(svc) if e.kind == "tool_call_requested"]
    assert requested.payload["call_id"] == "fc_2_1"
    assert sink.requests_for("/weather")[0].json()["call_id"] == "fc_2_1"
    bodies = posted(fake)
    assert bodies[2]["previous_response_id"] == "resp_fake_2"
    assert bodies[2]["input"] == [
        {"type": "function_call_output", "call_id": "fc_2_1", "output": '{"temp":21}'}
    ]
    assert "tools" in bodies[2] and bodies[2]["tools"][0]["name"] == "get_weather"

    reply = say(svc, "What is my name?")
    assert (reply.output_text, reply.context.provider_state) == ("Your name is Ann.", "continued")
    seen = fake.contexts[-1]
    assert [i["type"] for i in seen] == [
        "message",
        "message",
        "message",
        "function_call",
        "function_call_output",
        "message",
        "message",
    ]

    fake.lose_responses()
    reply = say(svc, "What is my name?")
    assert (reply.output_text, reply.context.provider_state) == ("Your name is Ann.", "fallback")
    whole = posted(fake)[-1]["input"]
    assert [i for i in whole if i["type"] == "function_call"] == [
        {
            "type": "function_call",
            "call_id": "fc_2_1",
            "name": "get_weather",
            "arguments": '{"city": "Oslo"}',
        }
    ]
    assert [i for i in whole if i["type"] == "function_call_output"] == [
        {"type": "function_call_output", "call_id": "fc_2_1", "output": '{"temp":21}'}
    ]
    assert len(sink.requests_for("/weather")) == 1


def test_openai_responses_with_store_off_never_continues(
    clock: FakeClock, fake: FakeOpenAI
) -> None:
    store = MemoryConversationStore()
    svc = service(store, clock, responses_provider(fake, store=False), model="gpt-test")
    say(svc, "My name is Ann.")
    reply = say(svc, "What is my name?")
    assert (reply.output_text, reply.context.provider_state) == ("Your name is Ann.", "fresh")
    assert head_of(store).provider_cursor is None
    assert all(body["store"] is False for body in posted(fake))
    assert fake.stored == {}
    assert edge.clear(svc, ANN, "conv-1").provider_responses == []
    assert [r for r in fake.requests if r.method == "DELETE"] == []


def deletes(fake: FakeOpenAI) -> list[str]:
    return [
        r.path.removeprefix(RESPONSES_PATH + "/") for r in fake.requests if r.method == "DELETE"
    ]


def test_clear_deletes_the_stored_response_and_never_fails_on_the_provider(
    store: ConversationStore, clock: FakeClock, fake: FakeOpenAI
) -> None:
    svc = service(store, clock, responses_provider(fake), model="gpt-test")
    say(svc, "My name is Ann.", "a")
    say(svc, "My name is Bea.", "b")
    report = edge.clear(svc, ANN, "a")
    assert report.provider_responses == [("openai-responses", "resp_fake_1")]
    assert deletes(fake) == ["resp_fake_1"]
    assert "resp_fake_1" not in fake.stored

    fake.script_deletes(*[error_reply(500, "delete is down")] * 3)
    report = edge.clear(svc, ANN, "b")  # never raises, the conversation is gone all the same
    assert report.conversations == 1
    assert deletes(fake) == ["resp_fake_1", "resp_fake_2", "resp_fake_2", "resp_fake_2"]
    assert say(svc, "What is my name?", "b").output_text == "I don't know your name yet."
    assert say(svc, "What is my name?", "b").context.provider_state == "continued"


def test_erasure_and_the_sweep_report_the_provider_state_they_deleted(
    clock: FakeClock, fake: FakeOpenAI
) -> None:
    store = MemoryConversationStore()
    svc = service(store, clock, responses_provider(fake), model="gpt-test", ttl_seconds=60)
    for index in range(3):
        say(svc, f"My name is N{index}.", f"conv-{index}")
    other = Caller(tenant="tenant-b", actor="bob")
    edge.turn(svc, other, "kept", TurnRequest(input="Hello."))
    kept = fake.stored.keys() - {"resp_fake_1", "resp_fake_2", "resp_fake_3"}

    sweeper = Sweeper(store, clock=clock.now, forget=svc.forget_provider_state)
    erased = sweeper.erase(ANN.tenant)
    assert (erased.conversations_removed, erased.provider_state_deleted) == (3, 3)
    assert sorted(deletes(fake)) == ["resp_fake_1", "resp_fake_2", "resp_fake_3"]
    assert fake.stored.keys() == kept

    clock.advance(2 * 3600)
    swept = sweeper.expired()
    assert (swept.conversations_removed, swept.provider_state_deleted) == (1, 1)
    assert fake.stored == {}
    # Nothing left to delete: a second run deletes (and reports) nothing.
    assert sweeper.expired().provider_state_deleted == 0


def test_tenant_erasure_deletes_every_stored_response_though_it_destroys_keys_first(
    clock: FakeClock, fake: FakeOpenAI
) -> None:
    """With content sealed, tenant erasure destroys the tenant's key before it deletes
    anything, so the run records that name the stored responses no longer open: the
    responses are found all the same (each turn item's head state names its provider
    cursor in clear), every one is deleted, and ``provider_state_deleted`` counts them."""
    store = MemoryConversationStore(keyring=Keyring(LocalMasterKey(), MemoryKeyItems()))
    svc = service(store, clock, responses_provider(fake), model="gpt-test")
    for conversation in ("conv-1", "conv-2"):
        say(svc, "My name is Ann.", conversation)
        assert say(svc, "What is my name?", conversation).context.provider_state == "continued"
    stored = set(fake.stored)
    assert len(stored) == 4

    sweeper = Sweeper(store, clock=clock.now, forget=svc.forget_provider_state)
    erased = sweeper.erase(ANN.tenant)

    assert (erased.conversations_removed, erased.provider_state_deleted) == (2, 4)
    assert sorted(deletes(fake)) == sorted(stored)
    assert fake.stored == {}
