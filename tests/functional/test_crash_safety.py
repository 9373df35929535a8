"""Crash safety of tool calls: the pipeline killed at every step boundary of an approval turn.

The scenario: one turn whose model asks for two ``send_email`` calls (approval
required) and one ``get_weather`` call (none), then one approval of both. Its
steps are the model calls, the commits and the tool runs. A test kills the
"process" (raises :class:`SimulatedCrash`, which no ``except Exception``
catches) just before or just after step *k*; a new process (a fresh
:class:`Conversations` over the same store) then does what a client does
next: it retries the request that died, and carries on.

A run that died while it held the conversation's lease is resumed only once the
lease expired: the client's retry is refused with ``conversation_busy`` and its
``Retry-After`` until then (the test's clock moves by that much, as a client
would wait).

Whatever *k*, against an idempotent tool endpoint (``HttpSink(dedupe=True)``):
each call's side effect was requested under one idempotency key only and
happened once, every call has exactly one recorded result, the conversation
ends ``complete``, and the rebuilt context is a history strict providers accept.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar
from unittest import mock

import httpx
import pytest
from turnledger.api.schemas import ApprovalRequest, TurnRequest
from turnledger.context.assembly import build_messages
from turnledger.core.config import Settings
from turnledger.core.exceptions import ApprovalPending, ConversationBusy, NotAwaitingApproval
from turnledger.core.models import Event
from turnledger.providers.base import Message, ModelReply, ModelRequest, Provider
from turnledger.providers.demo import DemoProvider
from turnledger.providers.history import check_strict_history
from turnledger.store.base import ConversationStore
from turnledger.tools import ToolInvocation, ToolOutcome, ToolRunner
from turnledger.turn.pipeline import Conversations

from tests.functional.http_sink import HttpSink
from tests.functional.test_tool_turns import ANN, lines, registry, script_tools, tool_line
from tests.support import edge
from tests.support.factories import FakeClock

T = TypeVar("T")

CONVERSATION = "crash-1"
TURN = TurnRequest(
    input=lines(
        tool_line("send_email", to="a@x"),
        tool_line("send_email", to="b@x"),
        tool_line("get_weather", city="Oslo"),
    )
)
APPROVAL = ApprovalRequest(approve=["call_1", "call_2"])

#: The steps of the scenario when nothing fails, in order.
STEPS = [
    # the turn: the model asks for the calls; intent; the auto call runs; results, paused
    "model",
    "commit",
    "tools",
    "commit",
    # the approval: decisions as intent; both calls run; the model answers; all committed
    "commit",
    "tools",
    "model",
    "commit",
]

Phase = Literal["before", "after"]
Policy = Callable[[int, str, Phase], bool]


class SimulatedCrash(BaseException):
    """The process died here: nothing after this point of the request happens."""


@dataclass
class Injector:
    """Counts the steps of one process and kills it where ``policy`` says."""

    policy: Policy
    steps: list[str] = field(default_factory=list)
    crashed: str | None = None

    def step(self, name: str, action: Callable[[], Any]) -> Any:
        index = len(self.steps)
        self.steps.append(name)
        self._maybe_crash(index, name, "before")
        result = action()
        self._maybe_crash(index, name, "after")
        return result

    def _maybe_crash(self, index: int, name: str, phase: Phase) -> None:
        if self.policy(index, name, phase):
            self.crashed = f"{phase} step {index} ({name})"
            raise SimulatedCrash(self.crashed)


def never(index: int, name: str, phase: Phase) -> bool:
    return False


class InjectedProvider(Provider):
    """The demo model, each call a step."""

    def __init__(self, injector: Injector) -> None:
        self.injector = injector
        self.demo = DemoProvider()

    def complete(self, request: ModelRequest) -> ModelReply:
        check_strict_history(request.messages)
        reply: ModelReply = self.injector.step("model", lambda: self.demo.complete(request))
        return reply


class InjectedRunner(ToolRunner):
    """The real runner, each run a step."""

    def __init__(self, http: httpx.Client, injector: Injector) -> None:
        super().__init__(http, None)
        self.injector = injector

    def run(self, invocations: list[ToolInvocation]) -> list[ToolOutcome]:
        outcomes: list[ToolOutcome] = self.injector.step(
            "tools", lambda: super(InjectedRunner, self).run(invocations)
        )
        return outcomes


class World:
    """One store and one tool endpoint; processes come and go over them."""

    def __init__(self, store: ConversationStore, sink: HttpSink, clock: FakeClock) -> None:
        self.store = store
        self.sink = sink
        self.clock = clock
        self.waits: list[int] = []
        self.clients: list[httpx.Client] = []

    def after_retry_after(self, request: Callable[[], T]) -> T:
        """Send ``request``; when told the conversation is busy, wait as told and resend."""
        try:
            return request()
        except ConversationBusy as busy:
            assert busy.retry_after is not None and busy.retry_after > 0
            self.waits.append(busy.retry_after)
            self.clock.advance(busy.retry_after)
            return request()

    def process(self, injector: Injector) -> Conversations:
        """A new process: its own provider, runner and HTTP client, the same storage."""
        http = httpx.Client()
        self.clients.append(http)
        return Conversations(
            store=self.store,
            provider=InjectedProvider(injector),
            settings=replace(Settings()),
            # A tool's answer is never what these tests judge: a generous bound, so a
            # loaded machine's slow loopback never turns a call into a timeout error.
            tools=registry(self.sink, timeout_seconds=5),
            runner=InjectedRunner(http, injector),
            clock=self.clock.now,
        )

    @contextmanager
    def commits_counted(self, injector: Injector) -> Iterator[None]:
        """Make every commit of the store a step of ``injector`` while inside.

        A commit that stores no event only takes the lease of a resumed run: it is the
        step ``lease``, so a policy that kills at each process's first ``commit`` still
        lets every process make progress (a death right after a lease is a death before
        the tools ran, with a lease that others wait out).
        """
        original = self.store.commit

        def commit(*args: Any, **kwargs: Any) -> Any:
            name = "commit" if kwargs.get("events") else "lease"
            return injector.step(name, lambda: original(*args, **kwargs))

        with mock.patch.object(self.store, "commit", side_effect=commit):
            yield

    def close(self) -> None:
        for client in self.clients:
            client.close()


@pytest.fixture
def world(store: ConversationStore, clock: FakeClock) -> Iterator[World]:
    with HttpSink(dedupe=True) as sink:
        script_tools(sink)
        world = World(store, sink, clock)
        yield world
        world.close()


def live(world: World, policy: Policy) -> tuple[str, Injector]:
    """Drive the scenario in one process until it ends or dies; returns where it got to."""
    injector = Injector(policy)
    stage = "turn"
    try:
        with world.commits_counted(injector):
            process = world.process(injector)
            reply = edge.turn(process, ANN, CONVERSATION, TURN)
            assert reply.status == "awaiting_approval"
            stage = "approve"
            assert edge.approve(process, ANN, CONVERSATION, APPROVAL).status == "complete"
            stage = "done"
    except SimulatedCrash:
        pass
    return stage, injector


def resume(world: World, stage: str, policy: Policy = never) -> tuple[str, Injector]:
    """A new process retries the request that died, then carries on as the client would."""
    injector = Injector(policy)
    try:
        with world.commits_counted(injector):
            process = world.process(injector)
            if stage == "turn":
                try:
                    reply = world.after_retry_after(
                        lambda: edge.turn(process, ANN, CONVERSATION, TURN)
                    )
                    assert reply.status == "awaiting_approval"
                except ApprovalPending as pending:
                    # The first attempt got as far as the pause: the retry is told so.
                    listed = [p.id for p in pending.pending]
                    assert listed == ["call_1", "call_2"]
                stage = "approve"
            if stage == "approve":
                # NotAwaitingApproval: the first attempt committed everything before it died.
                with suppress(NotAwaitingApproval):
                    reply = world.after_retry_after(
                        lambda: edge.approve(process, ANN, CONVERSATION, APPROVAL)
                    )
                    assert reply.status == "complete"
                stage = "done"
    except SimulatedCrash:
        pass
    return stage, injector


def assert_completed_exactly_once(world: World) -> None:
    """The end state every crash must lead to."""
    svc = world.process(Injector(never))
    view = edge.get(svc, ANN, CONVERSATION)
    assert (view.status, view.pending_tool_calls) == ("complete", [])
    page = edge.events(svc, ANN, CONVERSATION, after=0, limit=1000)
    events = [Event.model_validate(e.model_dump()) for e in page.events]
    kinds = Counter(e.kind.value for e in events)
    assert kinds == {
        "user_message": 1,
        "assistant_message": 2,
        "tool_call_requested": 3,
        "approval_requested": 2,
        "approval_resolved": 2,
        "tool_result": 3,
    }
    results = Counter(e.payload["call_id"] for e in events if e.kind.value == "tool_result")
    assert results == {"call_1": 1, "call_2": 1, "call_3": 1}
    assert all(not e.payload["is_error"] for e in events if e.kind.value == "tool_result")
    answer = [e.payload["content"] for e in events if e.kind.value == "assistant_message"][-1]
    assert answer == (
        'Tool results: send_email: {"sent":true}; send_email: {"sent":true}; '
        'get_weather: {"temp":21}'
    )

    keys = {
        e.payload["call_id"]: e.payload["idempotency_key"]
        for e in events
        if e.kind.value == "tool_call_requested"
    }
    for path, calls in [("/email", {"call_1", "call_2"}), ("/weather", {"call_3"})]:
        requests = world.sink.requests_for(path)
        by_call: dict[str, set[str | None]] = {}
        for request in requests:
            by_call.setdefault(request.json()["call_id"], set()).add(request.idempotency_key)
        # Each call was requested (maybe more than once) under its recorded key only...
        assert by_call == {call: {keys[call]} for call in calls}
        # ...and the tool honoured that key: one side effect per call.
        effects = Counter(r.json()["call_id"] for r in world.sink.side_effects(path))
        assert effects == dict.fromkeys(calls, 1)

    messages = build_messages(events)
    check_strict_history([*messages, Message(role="user", content="next")])


def test_without_a_crash_the_scenario_has_the_expected_steps(world: World) -> None:
    """The step list the crash tests walk through is the one the pipeline really takes."""
    stage, injector = live(world, never)
    assert stage == "done"
    assert injector.steps == STEPS
    assert_completed_exactly_once(world)
    # Without a crash nothing is requested twice.
    assert len(world.sink.requests) == 3


@pytest.mark.parametrize("phase", ["before", "after"])
@pytest.mark.parametrize(
    "crash_at", range(len(STEPS)), ids=[f"{i}-{s}" for i, s in enumerate(STEPS)]
)
def test_a_crash_at_any_step_is_resumed_with_the_same_keys(
    world: World, crash_at: int, phase: Phase
) -> None:
    """Killed just before or after step ``crash_at``, the next process completes the turn once."""
    stage, injector = live(world, lambda index, _name, at: index == crash_at and at == phase)
    assert injector.crashed == f"{phase} step {crash_at} ({STEPS[crash_at]})"
    assert stage != "done"
    stage, _ = resume(world, stage)
    assert stage == "done"
    assert_completed_exactly_once(world)


def test_a_crash_in_every_process_still_ends_complete(world: World) -> None:
    """Each process dies right after its first durable commit; retries still converge."""

    def after_first_commit(policy_state: list[int]) -> Policy:
        def policy(index: int, name: str, phase: Phase) -> bool:
            if name == "commit" and phase == "after" and not policy_state:
                policy_state.append(index)
                return True
            return False

        return policy

    stage, injector = live(world, after_first_commit([]))
    deaths = 1 if injector.crashed else 0
    for _ in range(10):
        if stage == "done":
            break
        stage, injector = resume(world, stage, after_first_commit([]))
        deaths += 1 if injector.crashed else 0
    assert stage == "done"
    assert deaths >= 3  # the turn's two commits and the approval's: each died once at least
    assert_completed_exactly_once(world)


# --- a retried request is recognised (issue 18, failure 1) ----------------------------------

#: A turn whose tool needs no approval: model, commit (intent), tools, model, commit.
AUTO_TURN = TurnRequest(input=tool_line("get_weather", city="Oslo"))


def died_after_its_tool(world: World, request: TurnRequest, key: str | None) -> None:
    """The request's process dies right after the tool ran, before its result is stored."""
    injector = Injector(lambda _index, name, phase: name == "tools" and phase == "after")
    with suppress(SimulatedCrash), world.commits_counted(injector):
        edge.turn(world.process(injector), ANN, CONVERSATION, request, idempotency_key=key)
    assert injector.crashed is not None


def user_messages(world: World) -> list[str]:
    page = edge.events(world.process(Injector(never)), ANN, CONVERSATION, after=0, limit=1000)
    return [e.payload["content"] for e in page.events if e.kind == "user_message"]


@pytest.mark.parametrize("key", [None, "key-1"])
def test_a_retried_request_answers_the_turn_it_began_and_never_begins_another(
    world: World, key: str | None
) -> None:
    died_after_its_tool(world, AUTO_TURN, key)
    process = world.process(Injector(never))
    reply = world.after_retry_after(
        lambda: edge.turn(process, ANN, CONVERSATION, AUTO_TURN, idempotency_key=key)
    )
    assert (reply.status, reply.turn) == ("complete", 1)
    assert reply.output_text == 'Tool results: get_weather: {"temp":21}'
    assert user_messages(world) == [AUTO_TURN.input]
    requests = world.sink.requests_for("/weather")
    assert len(requests) == 2  # the dead run's call and its resumption
    assert len({r.idempotency_key for r in requests}) == 1


@pytest.mark.parametrize(
    ("retry", "key"),
    [
        (TurnRequest(input="what now?"), None),  # another body
        (AUTO_TURN, "key-2"),  # the same body under another key: another request
        (AUTO_TURN.model_copy(update={"metadata": {"n": "2"}}), None),
    ],
    ids=["another-body", "another-key", "other-metadata"],
)
def test_another_request_finishes_the_interrupted_turn_then_begins_its_own(
    world: World, retry: TurnRequest, key: str | None
) -> None:
    died_after_its_tool(world, AUTO_TURN, "key-1")
    process = world.process(Injector(never))
    reply = world.after_retry_after(
        lambda: edge.turn(process, ANN, CONVERSATION, retry, idempotency_key=key)
    )
    assert (reply.status, reply.turn) == ("complete", 2)
    assert user_messages(world) == [AUTO_TURN.input, retry.input]
