"""Crash safety of a deferred tool call: the pipeline killed at every step boundary.

The scenario (the machinery of :mod:`tests.functional.test_crash_safety`): one turn
whose model calls ``run_report``, an ``http`` tool that answers ``202 {"task_id"}``
(deferred); then the job's callback settles it with ``continue: true`` and the model
answers. Killed just before or after any step, a new process retries what died
(the turn, then the callback, with the newest ``callback_url`` the tool received)
and the conversation ends complete: the job was started once (one side effect under
the call's recorded key), the call was deferred and settled once, and the model saw
one result.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import replace

import httpx
import pytest
from turnledger.api.schemas import CallbackRequest, TurnRequest
from turnledger.context.assembly import build_messages
from turnledger.core.config import Settings
from turnledger.core.exceptions import CallbackInvalid, InputPending
from turnledger.core.models import Event
from turnledger.providers.base import Message
from turnledger.providers.history import check_strict_history
from turnledger.store.base import ConversationStore
from turnledger.tools.registry import ToolRegistry
from turnledger.turn import callbacks
from turnledger.turn.pipeline import Conversations

from tests.functional.http_sink import HttpSink, Reply
from tests.functional.test_crash_safety import (
    InjectedProvider,
    InjectedRunner,
    Injector,
    Phase,
    Policy,
    SimulatedCrash,
    World,
    never,
)
from tests.functional.test_tool_turns import ANN, tool_line
from tests.support import edge
from tests.support.factories import FakeClock

CONVERSATION = "crash-deferred"
TURN = TurnRequest(input=tool_line("run_report", month="11"))
SETTLE = CallbackRequest.model_validate(
    {"status": "succeeded", "output": {"rows": 3}, "continue": True}
)
KEY = bytes(range(32))

#: The steps of the scenario when nothing fails, in order.
STEPS = [
    # the turn: the model calls the tool; intent (with the lease); the tool defers; recorded
    "model",
    "commit",
    "tools",
    "commit",
    # the callback: the settle and the model's answer, in one commit
    "model",
    "commit",
]


class DeferredWorld(World):
    """The crash suite's world, with a registry whose tool defers its calls."""

    def process(self, injector: Injector) -> Conversations:
        http = httpx.Client()
        self.clients.append(http)
        tool = {
            "name": "run_report",
            "parameters": {"type": "object"},
            "executor": {"type": "http", "url": self.sink.url("/report"), "deferred": True},
        }
        tools = ToolRegistry.from_json(json.dumps({"tools": [tool]}))
        return Conversations(
            store=self.store,
            provider=InjectedProvider(injector),
            settings=replace(Settings()),
            tools=tools,
            runner=InjectedRunner(http, injector),
            clock=self.clock.now,
        )


@pytest.fixture
def world(
    store: ConversationStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> Iterator[World]:
    monkeypatch.setenv("CALLBACK_KEY", KEY.hex())
    monkeypatch.setenv("PUBLIC_BASE_URL", "https://api.example.com")
    with HttpSink(dedupe=True) as sink:
        sink.respond("/report", Reply(status=202, body={"task_id": "job-7"}))
        world = DeferredWorld(store, sink, clock)
        yield world
        world.close()


def newest_claims(world: World) -> callbacks.CallbackClaims:
    """The claims of the newest callback_url the tool received (what the job holds)."""
    url = world.sink.requests_for("/report")[-1].json()["callback_url"]
    return callbacks.verify(KEY, url.rpartition("/")[2], now=world.clock.now())


def drive(world: World, stage: str, policy: Policy) -> tuple[str, Injector]:
    """One process: (re)send the request of ``stage`` and carry on as the client would."""
    injector = Injector(policy)
    try:
        with world.commits_counted(injector):
            process = world.process(injector)
            if stage == "turn":
                # InputPending: the first attempt got as far as the deferral.
                with suppress(InputPending):
                    reply = world.after_retry_after(
                        lambda: edge.turn(process, ANN, CONVERSATION, TURN)
                    )
                    assert reply.status == "awaiting_async_tools"
                stage = "callback"
            if stage == "callback":
                # CallbackInvalid: the first attempt settled the call before it died.
                with suppress(CallbackInvalid):
                    claims = newest_claims(world)
                    settled = world.after_retry_after(
                        lambda: edge.settle_callback(process, claims, SETTLE)
                    )
                    assert settled.continued and settled.status == "complete"
                stage = "done"
    except SimulatedCrash:
        pass
    return stage, injector


def assert_settled_exactly_once(world: World) -> None:
    svc = world.process(Injector(never))
    view = edge.get(svc, ANN, CONVERSATION)
    assert (view.status, view.pending_tool_calls, view.awaiting) == ("complete", [], [])
    page = edge.events(svc, ANN, CONVERSATION, after=0, limit=1000)
    events = [Event.model_validate(e.model_dump()) for e in page.events]
    assert Counter(e.kind.value for e in events) == {
        "user_message": 1,
        "assistant_message": 2,
        "tool_call_requested": 1,
        "tool_call_deferred": 1,
        "tool_call_settled": 1,
        "tool_result": 1,
    }
    answer = [e.payload["content"] for e in events if e.kind.value == "assistant_message"][-1]
    assert answer == 'Tool results: run_report: {"rows":3}'
    [key] = [e.payload["idempotency_key"] for e in events if e.kind.value == "tool_call_requested"]
    assert {r.idempotency_key for r in world.sink.requests_for("/report")} == {key}
    assert len(world.sink.side_effects("/report")) == 1
    check_strict_history([*build_messages(events), Message(role="user", content="next")])


def test_without_a_crash_the_deferred_scenario_has_the_expected_steps(world: World) -> None:
    stage, injector = drive(world, "turn", never)
    assert stage == "done"
    assert injector.steps == STEPS
    assert_settled_exactly_once(world)


@pytest.mark.parametrize("phase", ["before", "after"])
@pytest.mark.parametrize(
    "crash_at", range(len(STEPS)), ids=[f"{i}-{s}" for i, s in enumerate(STEPS)]
)
def test_a_crash_at_any_step_of_a_deferred_call_is_resumed(
    world: World, crash_at: int, phase: Phase
) -> None:
    stage, injector = drive(
        world, "turn", lambda index, _name, at: index == crash_at and at == phase
    )
    assert injector.crashed == f"{phase} step {crash_at} ({STEPS[crash_at]})"
    assert stage != "done"
    stage, _ = drive(world, stage, never)
    assert stage == "done"
    assert_settled_exactly_once(world)


def test_a_deferred_calls_callback_lives_an_hour_unless_its_tool_says(world: World) -> None:
    """Issue 22: the token (and the call's wait) lives 1 h by default, not the 24 h of
    the approval window; the tool's ``deferred_ttl_seconds`` still sets its own."""
    svc = world.process(Injector(never))
    with suppress(InputPending):
        edge.turn(svc, ANN, CONVERSATION, TURN)
    claims = newest_claims(world)
    assert claims.deadline - world.clock.now().timestamp() == callbacks.DEFAULT_DEFERRED_SECONDS
    assert callbacks.DEFAULT_DEFERRED_SECONDS == 3600
    [pending] = edge.get(svc, ANN, CONVERSATION).pending_tool_calls
    assert pending.expires_at is not None
    assert pending.expires_at.timestamp() == claims.deadline
