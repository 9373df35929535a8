"""A failure nobody foresaw (a ``500``) leaves the conversation as it was, held by nobody.

The scenario of :mod:`tests.functional.test_crash_safety` (a turn with two calls that
need approval and one that runs at once, then one approval), but where that module
kills the process, here the request raises an ordinary exception just before or just
after step *k*: a bug, which the API answers ``500``. The process lives on, so the
request can let go of what it held.

Whatever *k*, after the ``500``:

* the events are those of the last commit that landed (before the request: none of
  it), and the head is that commit's, except that a lease it held is released (the
  head shows ``interrupted``, never ``running_tools`` until the lease runs out);
* the client's very next request is not refused (no ``409 conversation_busy``): it
  resumes the run and the conversation ends ``complete``, each call's side effect
  happened once, under its one idempotency key.

A tool that cannot deduplicate (``"idempotent": false``) that ran before the failure
is never run again by itself: its call becomes ``outcome_unknown``, as after a crash.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import pytest
from turnledger.core.config import Settings
from turnledger.core.exceptions import ApprovalPending, NotAwaitingApproval
from turnledger.core.models import ConversationKey, Head
from turnledger.store.base import ConversationStore
from turnledger.tools import ToolRegistry
from turnledger.turn.pipeline import Conversations

from tests.functional.http_sink import HttpSink
from tests.functional.test_crash_safety import (
    APPROVAL,
    AUTO_TURN,
    CONVERSATION,
    STEPS,
    TURN,
    InjectedProvider,
    InjectedRunner,
    Injector,
    Phase,
    Policy,
    World,
    assert_completed_exactly_once,
    never,
)
from tests.functional.test_tool_turns import ANN, script_tools, tool_definitions
from tests.support import edge
from tests.support.factories import FakeClock

KEY = ConversationKey(tenant=ANN.tenant, conversation_id=CONVERSATION)


class Unforeseen(RuntimeError):
    """A bug at a step boundary: an ordinary exception, which the API answers ``500``."""


@dataclass(frozen=True)
class Landed:
    """The conversation as the store holds it: the head and every event."""

    head: Head | None
    events: list[dict[str, Any]]


def landed(store: ConversationStore) -> Landed:
    head = store.get_head(KEY)
    if head is None:
        return Landed(None, [])
    events = store.read_events(KEY, head, after=0, limit=1000)
    return Landed(head, [e.model_dump(mode="json") for e in events])


@dataclass
class Failing(Injector):
    """Raises :class:`Unforeseen` where the policy says, and keeps what each commit
    that landed left in the store."""

    store: ConversationStore | None = None
    last: Landed | None = None
    commits: list[str] = field(default_factory=list)

    def step(self, name: str, action: Callable[[], Any]) -> Any:
        def acted() -> Any:
            result = action()
            if name in ("commit", "lease") and self.store is not None:
                self.last = landed(self.store)
            return result

        return super().step(name, acted)

    def _maybe_crash(self, index: int, name: str, phase: Phase) -> None:
        if self.policy(index, name, phase):
            self.crashed = f"{phase} step {index} ({name})"
            raise Unforeseen(self.crashed)


@pytest.fixture
def world(store: ConversationStore, clock: FakeClock) -> Iterator[World]:
    with HttpSink(dedupe=True) as sink:
        script_tools(sink)
        world = World(store, sink, clock)
        yield world
        world.close()


def fail_once(world: World, policy: Policy) -> tuple[str, Failing, Landed]:
    """Drive the scenario until a request fails; returns its stage, the injector and what
    the store held when that request began."""
    injector = Failing(policy, store=world.store)
    stage, before = "turn", landed(world.store)
    with suppress(Unforeseen), world.commits_counted(injector):
        process = world.process(injector)
        assert edge.turn(process, ANN, CONVERSATION, TURN).status == "awaiting_approval"
        stage, before = "approve", landed(world.store)
        assert edge.approve(process, ANN, CONVERSATION, APPROVAL).status == "complete"
        stage = "done"
    return stage, injector, before


def carry_on(world: World, stage: str) -> None:
    """The client sends the failed request again at once (no waiting), then carries on."""
    process = world.process(Injector(never))
    if stage == "turn":
        try:
            assert edge.turn(process, ANN, CONVERSATION, TURN).status == "awaiting_approval"
        except ApprovalPending as pending:
            assert [p.id for p in pending.pending] == ["call_1", "call_2"]
        stage = "approve"
    if stage == "approve":
        with suppress(NotAwaitingApproval):
            assert edge.approve(process, ANN, CONVERSATION, APPROVAL).status == "complete"


def assert_left_as_last_commit(after: Landed, last: Landed) -> None:
    """``after`` is ``last``, but for a lease ``last`` held: released, the run interrupted."""
    assert after.events == last.events
    if last.head is None or last.head.lease is None:
        assert after.head == last.head
        return
    assert after.head is not None and after.head.lease is None
    unchanged = {"version", "lease", "updated_at", "wait_deadline"}
    assert after.head.model_dump(exclude=unchanged) == last.head.model_dump(exclude=unchanged)
    assert after.head.version == last.head.version + 1


@pytest.mark.parametrize("phase", ["before", "after"])
@pytest.mark.parametrize(
    "fail_at", range(len(STEPS)), ids=[f"{i}-{s}" for i, s in enumerate(STEPS)]
)
def test_a_500_at_any_step_leaves_the_conversation_as_it_was_and_unheld(
    world: World, fail_at: int, phase: Phase
) -> None:
    stage, injector, before = fail_once(
        world, lambda index, _name, at: index == fail_at and at == phase
    )
    assert injector.crashed == f"{phase} step {fail_at} ({STEPS[fail_at]})"
    assert stage != "done"
    after = landed(world.store)
    assert_left_as_last_commit(after, injector.last or before)
    if after.head is not None:
        view = edge.get(world.process(Injector(never)), ANN, CONVERSATION)
        assert view.status != "running_tools"

    carry_on(world, stage)  # raises ConversationBusy if the failure left a live lease
    assert world.waits == []
    assert_completed_exactly_once(world)


def test_a_500_after_a_tool_that_cannot_deduplicate_ran_never_runs_it_again(
    world: World,
) -> None:
    """The call may have had its effect: the next request hands it to a person."""
    definitions = tool_definitions(world.sink)
    for definition in definitions:
        if definition["name"] == "get_weather":
            definition["idempotent"] = False
    registry = ToolRegistry.from_json(json.dumps({"tools": definitions}))

    def process(injector: Injector) -> Conversations:
        http = httpx.Client()
        world.clients.append(http)
        return Conversations(
            store=world.store,
            provider=InjectedProvider(injector),
            settings=replace(Settings()),
            tools=registry,
            runner=InjectedRunner(http, injector),
            clock=world.clock.now,
        )

    injector = Failing(lambda _index, name, at: name == "tools" and at == "after")
    with pytest.raises(Unforeseen), world.commits_counted(injector):
        edge.turn(process(injector), ANN, CONVERSATION, AUTO_TURN)
    assert len(world.sink.requests_for("/weather")) == 1

    reply = edge.turn(process(Injector(never)), ANN, CONVERSATION, AUTO_TURN)
    assert reply.status == "awaiting_approval"
    [pending] = reply.pending_tool_calls
    assert (pending.id, pending.requires) == ("call_1", "approval")
    assert pending.reason == "its request ended while it ran: it may have run already"
    assert len(world.sink.requests_for("/weather")) == 1
