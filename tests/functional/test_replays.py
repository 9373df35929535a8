"""What each model call saw (``GET .../turns/{n}/context``) and replays against another model
(issue 23, the replay half), over every storage backend.

Conversations are driven through :class:`Conversations` with the demo model (or the
providers behind the fake OpenAI and Bedrock servers, :mod:`tests.functional.provider_rigs`),
with real ``http`` tools served by :class:`HttpSink`, so a test can prove that a replay
called no tool endpoint.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
from turnledger.api.replay_routes import turn_context_view
from turnledger.api.schemas import TurnRequest
from turnledger.context.assembly import SUMMARY_PREFIX, messages_sha256
from turnledger.core.config import Settings
from turnledger.core.exceptions import ConversationNotFound
from turnledger.core.models import ConversationKey
from turnledger.providers.base import Provider
from turnledger.store.base import ConversationStore
from turnledger.tools import ToolRegistry, ToolRunner
from turnledger.turn.contexts import turn_calls
from turnledger.turn.longturns import TurnNotFound
from turnledger.turn.pipeline import Conversations

from tests.functional.http_sink import HttpSink, Reply
from tests.support import edge
from tests.support.edge import Caller
from tests.support.factories import FakeClock
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
    **settings: Any,
) -> Conversations:
    return Conversations(
        store=store,
        provider=provider or Recording(),
        settings=replace(Settings(), **{"system_prompt": SYSTEM, **settings}),
        tools=tool_registry(sink),
        runner=ToolRunner(http, None),
        clock=clock.now,
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


def test_the_context_of_a_missing_turn_or_conversation_is_not_found(
    memory_store: ConversationStore, clock: FakeClock, sink: HttpSink, http: httpx.Client
) -> None:
    svc = service(memory_store, clock, sink, http)
    converse(svc, 1)
    with pytest.raises(TurnNotFound):
        turn_calls(svc, ANN.key("conv-1"), 2)
    with pytest.raises(ConversationNotFound):
        turn_calls(svc, ConversationKey(tenant="other", conversation_id="conv-1"), 1)
