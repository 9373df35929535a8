"""The turn and tool scenarios users hit, on every provider, not only the demo model.

A representative subset of ``test_turns.py`` and ``test_tool_turns.py``
(remembering earlier turns, separate conversations, approvals, rejections,
mixed calls, client tools, a restart between request and approval, a
provider failure) runs on ``demo``, ``demo-stateful``, ``openai-chat``,
``openai-responses`` and ``bedrock-converse``. The remote ones are real HTTP
fakes answering with the demo model in their own wire format
(:mod:`tests.support.wire_demo`), so the expected answers are the same on
every provider; every request they received is checked against its
provider's own schema. On the stateful providers every model call after the
first of a conversation must be ``continued``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any
from unittest import mock

import httpx
import pytest
from turnledger.api.schemas import (
    ApprovalRequest,
    FunctionCallOutput,
    Rejection,
    TurnRequest,
    TurnResponse,
)
from turnledger.core.exceptions import ProviderError
from turnledger.providers.factory import PROVIDERS
from turnledger.store.memory import MemoryConversationStore
from turnledger.tools import ToolRegistry, ToolRunner
from turnledger.turn.pipeline import Conversations

from tests.functional.fake_bedrock import bedrock_error
from tests.functional.fake_openai import error_reply
from tests.functional.http_sink import HttpSink
from tests.functional.provider_rigs import Rig
from tests.functional.test_tool_turns import lines, script_tools, tool_definitions, tool_line
from tests.support import edge
from tests.support.edge import Caller
from tests.support.factories import FakeClock

ANN = Caller(tenant="tenant-a", actor="ann")
BEN = Caller(tenant="tenant-a", actor="ben")


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        script_tools(server)
        yield server


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client() as client:
        yield client


@pytest.fixture(params=PROVIDERS)
def rig(request: pytest.FixtureRequest) -> Iterator[Rig]:
    with Rig.open(request.param) as opened:
        yield opened
        opened.validate_requests()


class Scenario:
    """One store, sink and clock; each :meth:`service` is a fresh "process"."""

    def __init__(self, rig: Rig, sink: HttpSink, http: httpx.Client, clock: FakeClock) -> None:
        self.rig = rig
        self.sink = sink
        self.http = http
        self.clock = clock
        self.store = MemoryConversationStore()

    def service(self, **settings: Any) -> Conversations:
        registry = ToolRegistry.from_json(json.dumps({"tools": tool_definitions(self.sink)}))
        return self.rig.service(
            self.store,
            self.clock,
            tools=registry,
            runner=ToolRunner(self.http, None),
            **settings,
        )

    def states(self, svc: Conversations, conversation: str = "conv-1") -> list[str]:
        """``provider_state`` of every model call of the conversation, in order."""
        page = edge.events(svc, ANN, conversation, after=0, limit=1000)
        return [
            e.payload["run"]["provider_state"] for e in page.events if e.kind == "assistant_message"
        ]

    def expected_states(self, calls: int) -> list[str]:
        """What :meth:`states` must be after ``calls`` model calls of one conversation."""
        later = "continued" if self.rig.stateful else "fresh"
        return ["fresh", *[later] * (calls - 1)]


@pytest.fixture
def scenario(rig: Rig, sink: HttpSink, http: httpx.Client, clock: FakeClock) -> Scenario:
    return Scenario(rig, sink, http, clock)


def turn(
    svc: Conversations, text: Any, conversation: str = "conv-1", **fields: Any
) -> TurnResponse:
    return edge.turn(svc, ANN, conversation, TurnRequest(input=text, **fields))


def decide(
    svc: Conversations,
    *,
    approve: list[str] | None = None,
    reject: list[str | Rejection] | None = None,
    who: Caller = ANN,
) -> TurnResponse:
    return edge.approve(
        svc, who, "conv-1", ApprovalRequest(approve=approve or [], reject=reject or [])
    )


def test_turn_four_remembers_turns_one_to_three(scenario: Scenario) -> None:
    svc = scenario.service()
    answers = [
        turn(svc, text).output_text
        for text in ("My name is Ann.", "I live in Oslo.", "What is my name?", "Again: my name?")
    ]
    assert answers == [
        "Noted (1 user messages so far).",
        "Noted (2 user messages so far).",
        "Your name is Ann.",
        "Noted (4 user messages so far).",
    ]
    assert scenario.states(svc) == scenario.expected_states(4)
    view = edge.get(svc, ANN, "conv-1")
    assert (view.turns, view.events) == (4, 8)


def test_interleaved_conversations_share_nothing(scenario: Scenario) -> None:
    svc = scenario.service()
    names = {f"conv-{i}": f"Name{i}" for i in range(4)}
    for conversation, name in names.items():
        turn(svc, f"My name is {name}.", conversation)
    for conversation in names:
        turn(svc, "Nice weather.", conversation)
    for conversation, name in names.items():
        assert turn(svc, "What is my name?", conversation).output_text == f"Your name is {name}."
        assert scenario.states(svc, conversation) == scenario.expected_states(3)


def test_approve_all_runs_each_call_once_and_the_model_gets_every_result(
    scenario: Scenario,
) -> None:
    svc = scenario.service()
    turn(svc, "My name is Ann.")
    first = turn(
        svc, lines(tool_line("send_email", to="a@x.org"), tool_line("send_email", to="b@x"))
    )
    assert first.status == "awaiting_approval"
    ids = [p.id for p in first.pending_tool_calls]
    assert len(set(ids)) == 2
    assert [p.arguments for p in first.pending_tool_calls] == [{"to": "a@x.org"}, {"to": "b@x"}]
    assert scenario.sink.requests_for("/email") == []

    # Another process decides, later.
    scenario.clock.advance(90)
    done = decide(scenario.service(), approve=ids)
    assert (done.status, done.turn) == ("complete", 2)
    assert done.output_text == 'Tool results: send_email: {"sent":true}; send_email: {"sent":true}'
    sent = scenario.sink.requests_for("/email")
    assert sorted(r.json()["call_id"] for r in sent) == sorted(ids)
    assert len({r.idempotency_key for r in sent}) == 2
    assert turn(svc, "What is my name?").output_text == "Your name is Ann."
    assert scenario.states(svc) == scenario.expected_states(4)


def test_reject_tells_the_model_why_and_mixed_calls_run_once(scenario: Scenario) -> None:
    svc = scenario.service()
    first = turn(
        svc,
        lines(
            tool_line("send_email", to="a@x"),
            tool_line("get_weather", city="Oslo"),
            tool_line("send_email", to="b@x"),
        ),
    )
    assert first.status == "awaiting_approval"
    email_a, email_b = (p.id for p in first.pending_tool_calls)
    assert len(scenario.sink.requests_for("/weather")) == 1
    done = decide(svc, approve=[email_b], reject=[Rejection(id=email_a, reason="wrong recipient")])
    assert done.status == "complete"
    assert done.output_text == (
        "Tool results: send_email: tool call send_email was not run: rejected by ann: "
        'wrong recipient; get_weather: {"temp":21}; send_email: {"sent":true}'
    )
    assert [r.json()["arguments"] for r in scenario.sink.requests_for("/email")] == [{"to": "b@x"}]
    assert len(scenario.sink.requests_for("/weather")) == 1
    assert scenario.states(svc) == scenario.expected_states(2)


def test_client_tools_wait_for_the_callers_output(scenario: Scenario) -> None:
    svc = scenario.service()
    first = turn(svc, tool_line("lookup_user", user_id="u1"))
    assert first.status == "awaiting_client_tools"
    [pending] = first.pending_tool_calls
    assert (pending.name, pending.requires) == ("lookup_user", "client")
    output = FunctionCallOutput(type="function_call_output", call_id=pending.id, output="Ada")
    done = turn(svc, [output])
    assert (done.status, done.turn, done.output_text) == (
        "complete",
        1,
        "Tool results: lookup_user: Ada",
    )
    assert scenario.sink.requests == []
    assert scenario.states(svc) == scenario.expected_states(2)


def test_a_provider_failure_is_recorded_and_the_next_turn_recovers(scenario: Scenario) -> None:
    rig = scenario.rig
    svc = scenario.service()
    turn(svc, "My name is Ann.")
    if rig.name == "bedrock-converse":
        rig.bedrock.script(bedrock_error(400, "ValidationException", "bad request"))
    elif rig.name.startswith("openai"):
        rig.openai.script(error_reply(400, "bad request"))
    down = ProviderError("the model is down", details={"attempts": 1})
    in_process = rig.name in ("demo", "demo-stateful")
    with (
        mock.patch.object(rig.provider(), "complete", side_effect=down)
        if in_process
        else nullcontext(),
        pytest.raises(ProviderError),
    ):
        turn(svc, "This is lost.")
    view = edge.get(svc, ANN, "conv-1")
    assert (view.turns, view.failed_turns) == (1, 1)
    reply = turn(svc, "What is my name?")
    assert (reply.output_text, reply.turn) == ("Your name is Ann.", 2)
    assert scenario.states(svc) == scenario.expected_states(2)
