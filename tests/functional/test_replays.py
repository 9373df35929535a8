"""What each model call saw (``GET .../turns/{n}/context``) and replays against another model
(issue 23, the replay half), over every storage backend.

Conversations are driven through :class:`Conversations` with the demo model (or the
providers behind the fake OpenAI and Bedrock servers, :mod:`tests.functional.provider_rigs`),
with real ``http`` tools served by :class:`HttpSink`, so a test can prove that a replay
called no tool endpoint.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
from turnledger.api.replay_routes import turn_context_view
from turnledger.api.schemas import TurnRequest
from turnledger.context.assembly import SUMMARY_PREFIX, messages_sha256
from turnledger.context.memory import MEMORY_PREFIX
from turnledger.core.config import Settings
from turnledger.core.exceptions import ConversationNotFound, UnknownModel, UnknownProvider
from turnledger.core.models import ConversationKey
from turnledger.providers.base import ModelReply, ModelRequest, Provider
from turnledger.store.base import ConversationStore
from turnledger.tools import ToolRegistry, ToolRunner
from turnledger.turn import replays
from turnledger.turn.commands import TurnCommand
from turnledger.turn.contexts import turn_calls
from turnledger.turn.memories import MemoryControl
from turnledger.turn.pipeline import Conversations
from turnledger.turn.replay_records import (
    InvalidTurnRange,
    ReplayNotFound,
    ReplayRecord,
    ReplaySpec,
)
from turnledger.turn.replays import NO_RECORDED_OUTPUT
from turnledger.turn.turn_reads import TurnNotFound

from tests.functional.http_sink import HttpSink, Reply
from tests.functional.provider_rigs import MODELS, Rig
from tests.support import edge
from tests.support.edge import Caller
from tests.support.factories import FakeClock, raw_sort_keys
from tests.support.providers import Recording

ANN = Caller(tenant="tenant-a", actor="ann")
SYSTEM = "Be kind."


def tool_registry(sink: HttpSink) -> ToolRegistry:
    """Two ``http`` tools served by ``sink``."""
    tools = [
        {
            "name": name,
            "description": f"The {name} of a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            "executor": {"type": "http", "url": sink.url(f"/{name}")},
        }
        for name in ("weather", "population")
    ]
    return ToolRegistry.from_json(json.dumps({"tools": tools}))


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        server.respond("/weather", Reply(body={"temp": 21}))
        server.respond("/population", Reply(body={"people": 700000}))
        yield server


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client() as client:
        yield client


def service(
    store: ConversationStore,
    clock: FakeClock,
    sink: HttpSink,
    http: httpx.Client,
    provider: Provider | None = None,
    *,
    build: Callable[[str], Provider] | None = None,
    **settings: Any,
) -> Conversations:
    return Conversations(
        store=store,
        provider=provider or Recording(),
        settings=replace(Settings(), **{"system_prompt": SYSTEM, **settings}),
        tools=tool_registry(sink),
        runner=ToolRunner(http, None),
        clock=clock.now,
        providers=build,
    )


def tool_line(name: str, **arguments: Any) -> str:
    return f"/tool {name} {json.dumps(arguments)}"


def script(index: int) -> str:
    """Turn ``index``'s input: every third turn calls a tool (every sixth, two)."""
    if index % 6 == 0:
        return "\n".join(
            [tool_line("weather", city=f"c{index}"), tool_line("population", city="x")]
        )
    if index % 3 == 0:
        return tool_line("weather", city=f"c{index}")
    return f"message {index} says one two three four five six seven"


def converse(svc: Conversations, turns: int, conversation: str = "conv-1") -> None:
    for index in range(1, turns + 1):
        answer = edge.turn(svc, ANN, conversation, TurnRequest(input=script(index)))
        assert answer.status == "complete"


# --- the context route ------------------------------------------------------------------


def test_every_call_of_a_long_conversation_with_tools_rebuilds_to_its_recorded_hash(
    store: ConversationStore, clock: FakeClock, sink: HttpSink, http: httpx.Client
) -> None:
    """For every model call of a 40-turn conversation with tool calls and several
    compactions, the context rebuilt from the log is exactly what the model was sent,
    and its hash equals the run record's."""
    recording = Recording()
    svc = service(store, clock, sink, http, recording, context_max_tokens=150)
    converse(svc, 40)
    sent = [r for r in recording.requests if r.purpose == "turn"]
    assert sum(1 for r in recording.requests if r.purpose == "summary") >= 2
    rebuilt = []
    for number in range(1, 41):
        view = turn_context_view(svc, "conv-1", number, turn_calls(svc, ANN.key("conv-1"), number))
        assert view.all_match, number
        assert len(view.calls) == (2 if number % 3 == 0 else 1)
        rebuilt.extend(view.calls)
    assert len(rebuilt) == len(sent) == 53
    for call, request in zip(rebuilt, sent, strict=True):
        assert call.messages == request.messages
        assert call.sha256 == call.recorded_sha256 == messages_sha256(request.messages)
        assert call.system_prompt == SYSTEM and call.mismatch_causes == []
        assert {t.name for t in call.tools} == {"weather", "population"}
    assert any(c.summary is not None and c.summary.startswith(SUMMARY_PREFIX) for c in rebuilt)
    assert any(m.role == "tool" for c in rebuilt for m in c.messages)


def test_a_changed_system_prompt_is_reported_as_a_mismatch(
    memory_store: ConversationStore, clock: FakeClock, sink: HttpSink, http: httpx.Client
) -> None:
    """A context rebuilt under another system prompt than the one it was sent with is
    answered with both hashes and ``matches: false``, never hidden."""
    converse(service(memory_store, clock, sink, http), 2)
    changed = service(memory_store, clock, sink, http, system_prompt="Be terse.")
    view = turn_context_view(changed, "conv-1", 2, turn_calls(changed, ANN.key("conv-1"), 2))
    [call] = view.calls
    assert not view.all_match and not call.matches
    assert call.sha256 != call.recorded_sha256
    assert call.mismatch_causes == ["system_prompt_or_log_changed"]


def test_a_call_that_carried_memory_rebuilds_with_it_until_a_record_changes(
    store: ConversationStore, clock: FakeClock, sink: HttpSink, http: httpx.Client
) -> None:
    """A call whose context carried the user's memory block (here a trusted caller's named
    user, not the actor) rebuilds with the block read back from that user's records, to the
    recorded hash; once a record it carried is edited, the mismatch says so."""
    recording = Recording()
    svc = service(store, clock, sink, http, recording, memory_enabled=True)
    key = ANN.key("conv-1")
    for text in ("My name is Ada.", "What is my name?"):
        svc.turn(key, "ann", TurnCommand(messages=[text], memory_user="carol"))
        clock.advance(1)
    view = turn_context_view(svc, "conv-1", 2, turn_calls(svc, key, 2))
    [call] = view.calls
    [sent] = [r for r in recording.requests if r.purpose == "turn"][1:]
    assert call.messages == sent.messages
    assert call.messages[1].content == f"{MEMORY_PREFIX}\n- My name is Ada."
    assert view.all_match and call.mismatch_causes == []

    control = MemoryControl(store, clock.now, cap=10)
    [record] = control.page("tenant-a", "carol", after=None, limit=10).items
    control.edit("tenant-a", "carol", record.id, {"text": "My name is Bea."})
    view = turn_context_view(svc, "conv-1", 2, turn_calls(svc, key, 2))
    [call] = view.calls
    assert not view.all_match and call.mismatch_causes == ["memory_changed"]
    assert call.messages[1].content == f"{MEMORY_PREFIX}\n- My name is Bea."


def test_the_context_of_a_missing_turn_or_conversation_is_not_found(
    memory_store: ConversationStore, clock: FakeClock, sink: HttpSink, http: httpx.Client
) -> None:
    svc = service(memory_store, clock, sink, http)
    converse(svc, 1)
    with pytest.raises(TurnNotFound):
        turn_calls(svc, ANN.key("conv-1"), 2)
    with pytest.raises(ConversationNotFound):
        turn_calls(svc, ConversationKey(tenant="other", conversation_id="conv-1"), 1)


# --- replays ------------------------------------------------------------------------------


class Divergent(Recording):
    """A candidate that is the demo model, except that it asks the weather of Paris
    wherever the demo model would ask another city's."""

    name = "divergent"

    def complete(self, request: ModelRequest) -> ModelReply:
        reply = super().complete(request)
        calls = [
            call.model_copy(update={"arguments": {**call.arguments, "city": "Paris"}})
            if call.name == "weather"
            else call
            for call in reply.tool_calls
        ]
        return reply.model_copy(update={"tool_calls": calls})


def replaying(
    store: ConversationStore,
    clock: FakeClock,
    sink: HttpSink,
    http: httpx.Client,
    candidate: Provider,
    **settings: Any,
) -> Conversations:
    """The deployment, allowing ``candidate`` as a provider and any model."""
    return service(
        store,
        clock,
        sink,
        http,
        build=lambda name: candidate,
        providers=(candidate.name,),
        allowed_models=("*",),
        **settings,
    )


def untouched(svc: Conversations, conversation: str = "conv-1") -> tuple[Any, ...]:
    """What a replay must leave as it was: the head's version, counts, usage, cost,
    cursor and times, and every event."""
    key = ANN.key(conversation)
    head = svc.store.get_head(key)
    assert head is not None
    events = svc.store.read_events(key, head, after=0, limit=10_000)
    return (head.model_dump(), [e.model_dump() for e in events])


def replay(svc: Conversations, spec: ReplaySpec, conversation: str = "conv-1") -> ReplayRecord:
    """Start a replay and run it as the worker would; answer the record as read back."""
    key = ANN.key(conversation)
    started = replays.start(svc, key, spec)
    assert started.status == "running"
    assert replays.read(svc, key, started.id).status == "running"
    replays.run_event(svc, replays.worker_event(key, started.id))
    return replays.read(svc, key, started.id)


def test_a_pointwise_replay_sends_each_recorded_context_and_runs_no_tool(
    store: ConversationStore, clock: FakeClock, sink: HttpSink, http: httpx.Client
) -> None:
    """Each recorded call's exact context goes to the candidate (the demo model again:
    its answers equal the recorded ones); no tool endpoint is called, the conversation
    (head, version, events, usage) is left as it was, and the record reads back whole."""
    candidate = Recording()
    candidate.name = "demo-again"
    svc = replaying(store, clock, sink, http, candidate)
    converse(svc, 7)
    tool_requests = len(sink.requests)
    before = untouched(svc)
    record = replay(svc, ReplaySpec(provider="demo-again", model="demo-1"))
    assert sink.requests[tool_requests:] == []
    assert untouched(svc) == before
    assert record.status == "complete" and record.error is None
    assert (record.from_turn, record.to_turn, record.mode) == (1, 7, "pointwise")
    assert [(c.turn, c.call) for c in record.calls] == [
        (1, 1), (2, 1), (3, 1), (3, 2), (4, 1), (5, 1), (6, 1), (6, 2), (7, 1)
    ]  # fmt: skip
    contexts = turn_calls(svc, ANN.key("conv-1"), 6)
    assert [r.messages for r in candidate.requests[6:8]] == [c.messages for c in contexts]
    for call in record.calls:
        assert call.context_matches is True and call.similarity in (None, 1.0)
        assert call.candidate is not None and call.recorded is not None
        assert call.candidate.text == call.recorded.text
        assert all(match.match == "same" for match in call.tool_calls)
    summary = record.summary
    assert summary is not None
    assert (summary.calls, summary.tool_calls, summary.identical_tool_calls) == (9, 3, 3)
    assert summary.identical_tool_call_share == 1.0 and summary.text_similarity == 1.0
    assert summary.original.calls == summary.candidate.calls == 9
    assert summary.candidate.input_tokens == summary.original.input_tokens > 0


def test_a_pointwise_replay_of_a_turn_range_with_another_system_prompt(
    memory_store: ConversationStore, clock: FakeClock, sink: HttpSink, http: httpx.Client
) -> None:
    """Only the range's calls are replayed, and the candidate gets the system prompt the
    replay names instead of the deployment's."""
    candidate = Recording()
    candidate.name = "demo-again"
    svc = replaying(memory_store, clock, sink, http, candidate)
    converse(svc, 5)
    spec = ReplaySpec(
        provider="demo-again", model="demo-1", from_turn=2, to_turn=3, system_prompt="Be brief."
    )
    record = replay(svc, spec)
    assert [(c.turn, c.call) for c in record.calls] == [(2, 1), (3, 1), (3, 2)]
    assert all(r.messages[0].content == "Be brief." for r in candidate.requests)
    assert all(SYSTEM not in (m.content or "") for r in candidate.requests for m in r.messages)


def test_a_rollout_diverges_at_a_tool_call_and_gets_no_recorded_output_for_it(
    store: ConversationStore, clock: FakeClock, sink: HttpSink, http: httpx.Client
) -> None:
    """The candidate continues with its own answers: its weather call for another city
    has no recorded output and gets an error result saying so; its population call
    equals a recorded one and gets that call's recorded output; no tool runs."""
    svc = replaying(store, clock, sink, http, Divergent())
    converse(svc, 6)
    tool_requests = len(sink.requests)
    before = untouched(svc)
    record = replay(svc, ReplaySpec(provider="divergent", model="demo-1", mode="rollout"))
    assert sink.requests[tool_requests:] == []
    assert untouched(svc) == before
    assert record.status == "complete"
    by_place = {(c.turn, c.call): c for c in record.calls}
    assert sorted(by_place) == [(1, 1), (2, 1), (3, 1), (3, 2), (4, 1), (5, 1), (6, 1), (6, 2)]
    asked = by_place[(3, 1)]
    [match] = asked.tool_calls
    assert (match.match, match.arguments, match.candidate_arguments) == (
        "different",
        {"city": "c3"},
        {"city": "Paris"},
    )
    [given] = asked.tool_results
    assert (given.name, given.recorded, given.output) == ("weather", False, NO_RECORDED_OUTPUT)
    answer = by_place[(3, 2)]
    assert answer.candidate is not None and answer.recorded is not None
    assert answer.candidate.text == f"Tool results: weather: {NO_RECORDED_OUTPUT}"
    assert answer.recorded.text == 'Tool results: weather: {"temp":21}'
    assert answer.similarity is not None and answer.similarity < 1.0
    both = by_place[(6, 1)]
    assert [m.match for m in both.tool_calls] == ["different", "same"]
    assert [(g.name, g.recorded, g.output) for g in both.tool_results] == [
        ("weather", False, NO_RECORDED_OUTPUT),
        ("population", True, '{"people":700000}'),
    ]
    assert by_place[(4, 1)].input == script(4)
    summary = record.summary
    assert summary is not None
    assert (summary.tool_calls, summary.identical_tool_calls) == (3, 1)
    assert summary.identical_tool_call_share == 0.3333
    assert summary.text_similarity is not None and summary.text_similarity < 1.0


def test_replays_are_refused_for_a_provider_or_range_the_conversation_cannot_take(
    memory_store: ConversationStore, clock: FakeClock, sink: HttpSink, http: httpx.Client
) -> None:
    svc = service(memory_store, clock, sink, http)
    converse(svc, 2)
    key = ANN.key("conv-1")
    with pytest.raises(UnknownProvider):
        replays.start(svc, key, ReplaySpec(provider="openai-chat", model="demo-1"))
    with pytest.raises(UnknownModel):
        replays.start(svc, key, ReplaySpec(provider="demo", model="gpt-9"))
    with pytest.raises(InvalidTurnRange):
        replays.start(svc, key, ReplaySpec(provider="demo", model="demo-1", to_turn=3))
    with pytest.raises(InvalidTurnRange):
        replays.start(svc, key, ReplaySpec(provider="demo", model="demo-1", from_turn=2, to_turn=1))
    with pytest.raises(ConversationNotFound):
        replays.start(svc, ANN.key("conv-2"), ReplaySpec(provider="demo", model="demo-1"))
    with pytest.raises(ReplayNotFound):
        replays.read(svc, key, "rp_" + "0" * 24)


def test_a_replay_record_lives_and_dies_with_its_conversation(
    store: ConversationStore, clock: FakeClock, sink: HttpSink, http: httpx.Client
) -> None:
    """Replay records are items of the conversation's partition with its expiry: a
    clear deletes them, and a new conversation under the same id does not see them."""
    svc = service(store, clock, sink, http, ttl_seconds=3600)
    converse(svc, 2)
    key = ANN.key("conv-1")
    record = replay(svc, ReplaySpec(provider="demo", model="demo-1"))
    head = svc.store.get_head(key)
    assert head is not None and head.expires_at is not None
    stored = [sk for sk in raw_sort_keys(store, key) if sk.startswith(replays.RECORD_PREFIX)]
    assert len(stored) == 1 + len(record.calls)
    side = svc.store.get_side_item(key, stored[0])
    assert side is not None and side.expires_at == head.expires_at
    edge.clear(svc, ANN, "conv-1")
    assert not [sk for sk in raw_sort_keys(store, key) if sk.startswith(replays.RECORD_PREFIX)]
    converse(svc, 1)
    with pytest.raises(ReplayNotFound):
        replays.read(svc, key, record.id)


@pytest.mark.parametrize("candidate", ["openai-chat", "openai-responses", "bedrock-converse"])
def test_a_pointwise_replay_against_the_remote_providers_runs_no_tool(
    memory_store: ConversationStore,
    clock: FakeClock,
    sink: HttpSink,
    http: httpx.Client,
    candidate: str,
) -> None:
    """A conversation with tools, recorded with the demo model, replayed against the fake
    OpenAI and Bedrock servers (the demo model speaking their wire formats): every
    recorded call reaches the candidate over HTTP, the answers agree, nothing is kept
    provider-side, and the tool sink proves no tool endpoint was called."""
    with Rig.open("demo") as rig:
        svc = rig.service(
            memory_store,
            clock,
            tools=tool_registry(sink),
            runner=ToolRunner(http, None),
            system_prompt=SYSTEM,
        )
        converse(svc, 6)
        tool_requests = len(sink.requests)
        before = untouched(svc)
        record = replay(svc, ReplaySpec(provider=candidate, model=MODELS[candidate]))
        assert sink.requests[tool_requests:] == []
        assert untouched(svc) == before
        assert record.status == "complete" and len(record.calls) == 8
        sent = {
            "openai-chat": rig.chat_bodies,
            "openai-responses": rig.responses_bodies,
            "bedrock-converse": rig.converse_params,
        }[candidate]()
        assert len(sent) == 8 and rig.validate_requests() == 8
        if candidate == "openai-responses":
            assert all(body["store"] is False for body in sent)
        summary = record.summary
        assert summary is not None and summary.failed_calls == 0
        assert (summary.tool_calls, summary.identical_tool_calls) == (3, 3)
        assert summary.text_similarity == 1.0
        assert summary.candidate.calls == 8 and summary.candidate.input_tokens > 0


def test_a_replay_whose_worker_never_ended_reads_as_lost(
    memory_store: ConversationStore, clock: FakeClock, sink: HttpSink, http: httpx.Client
) -> None:
    """A replay still ``running`` after the worker's longest run (15 minutes) reads as
    ``failed`` with ``worker_lost``, and a late worker event runs nothing."""
    svc = service(memory_store, clock, sink, http, ttl_seconds=0)
    converse(svc, 1)
    key = ANN.key("conv-1")
    started = replays.start(svc, key, ReplaySpec(provider="demo", model="demo-1"))
    clock.advance(899)
    assert replays.read(svc, key, started.id).status == "running"
    clock.advance(2)
    lost = replays.read(svc, key, started.id)
    assert lost.status == "failed" and lost.error is not None
    assert lost.error.code == "worker_lost"
    replays.run_event(svc, replays.worker_event(key, started.id))
    assert replays.read(svc, key, started.id).calls == []


@pytest.mark.parametrize("candidate", ["openai-chat", "bedrock-converse"])
def test_a_rollout_against_the_remote_providers_diverges_at_a_tool_call(
    memory_store: ConversationStore,
    clock: FakeClock,
    sink: HttpSink,
    http: httpx.Client,
    candidate: str,
) -> None:
    """A conversation recorded with a model that asks the weather of Paris, rolled out
    against the fake OpenAI and Bedrock servers (the demo model, which asks for the city
    the user named): each weather call differs, gets no recorded output, and the rollout
    goes on from the candidate's own answers; the population call matches and gets its
    recorded output; no tool runs."""
    with Rig.open("demo") as rig:
        svc = Conversations(
            store=memory_store,
            provider=Divergent(),
            settings=replace(rig.settings, system_prompt=SYSTEM),
            tools=tool_registry(sink),
            runner=ToolRunner(http, None),
            clock=clock.now,
            providers=rig.build,
        )
        converse(svc, 6)
        tool_requests = len(sink.requests)
        before = untouched(svc)
        spec = ReplaySpec(provider=candidate, model=MODELS[candidate], mode="rollout")
        record = replay(svc, spec)
        assert sink.requests[tool_requests:] == []
        assert untouched(svc) == before
        assert record.status == "complete" and rig.validate_requests() == len(record.calls)
        by_place = {(c.turn, c.call): c for c in record.calls}
        asked = by_place[(3, 1)]
        [match] = asked.tool_calls
        assert (match.match, match.arguments, match.candidate_arguments) == (
            "different",
            {"city": "Paris"},
            {"city": "c3"},
        )
        [given] = asked.tool_results
        assert (given.recorded, given.output) == (False, NO_RECORDED_OUTPUT)
        answer = by_place[(3, 2)].candidate
        assert answer is not None and answer.text == f"Tool results: weather: {NO_RECORDED_OUTPUT}"
        both = by_place[(6, 1)]
        assert [m.match for m in both.tool_calls] == ["different", "same"]
        assert [g.recorded for g in both.tool_results] == [False, True]
        summary = record.summary
        assert summary is not None and summary.identical_tool_call_share == 0.3333
