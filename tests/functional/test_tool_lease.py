"""The tool-run lease and what a crashed run becomes (issue: reliability).

A request that dies while it runs tools leaves the head ``running_tools`` with
its lease: until the lease expires every other request is ``conversation_busy``
(with ``retry_after_seconds``) and GET shows ``running_tools``; after it, GET
shows ``interrupted`` and the next request resumes the run from the log. An
idempotent tool runs again under the same key; a tool registered with
``"idempotent": false`` never runs again by itself: its call waits for a human
(``outcome_unknown``), who approves (run again) or rejects (recorded as failed).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
from turnledger.api.errors import error_body
from turnledger.api.schemas import ApprovalRequest, Rejection, TurnRequest
from turnledger.core.config import Settings
from turnledger.core.exceptions import ApprovalPending, ConversationBusy
from turnledger.core.models import ConversationKey
from turnledger.store.base import ConversationStore
from turnledger.tools import ToolInvocation, ToolOutcome, ToolRegistry, ToolRunner
from turnledger.turn.pipeline import Conversations

from tests.functional.http_sink import HttpSink, Reply
from tests.support import edge
from tests.support.edge import Caller
from tests.support.factories import FakeClock
from tests.support.providers import Recording

ANN = Caller(tenant="tenant-a", actor="ann")


class Died(BaseException):
    """The process ended (nothing catches it as an ``Exception``)."""


class DyingRunner(ToolRunner):
    """Sends the calls, then the process dies before it records a result."""

    def run(self, invocations: list[ToolInvocation]) -> list[ToolOutcome]:
        super().run(invocations)
        raise Died()


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink(dedupe=True) as server:
        server.respond("/charge", Reply(body={"charged": 10}))
        server.respond("/lookup", Reply(body={"found": True}))
        yield server


def tools(sink: HttpSink) -> ToolRegistry:
    return ToolRegistry.from_json(
        json.dumps(
            {
                "tools": [
                    {
                        "name": "charge_card",
                        "parameters": {"type": "object"},
                        "idempotent": False,
                        "executor": {"type": "http", "url": sink.url("/charge")},
                    },
                    {
                        "name": "lookup",
                        "parameters": {"type": "object"},
                        "executor": {"type": "http", "url": sink.url("/lookup")},
                    },
                ]
            }
        )
    )


def service(
    store: ConversationStore,
    clock: FakeClock,
    sink: HttpSink,
    runner: ToolRunner,
    **settings: Any,
) -> Conversations:
    return Conversations(
        store=store,
        provider=Recording(),
        settings=replace(Settings(), **settings),
        tools=tools(sink),
        runner=runner,
        clock=clock.now,
    )


def crash_while_running(
    store: ConversationStore, clock: FakeClock, sink: HttpSink, client: httpx.Client, text: str
) -> None:
    with pytest.raises(Died):
        edge.turn(
            service(store, clock, sink, DyingRunner(client, None)),
            ANN,
            "c1",
            TurnRequest(input=text),
        )


def test_a_live_lease_refuses_everyone_else_and_an_expired_one_is_interrupted(
    store: ConversationStore, clock: FakeClock, sink: HttpSink
) -> None:
    with httpx.Client() as client:
        crash_while_running(store, clock, sink, client, '/tool lookup {"q": "x"}')
        svc = service(store, clock, sink, ToolRunner(client, None))
        assert edge.get(svc, ANN, "c1").status == "running_tools"
        with pytest.raises(ConversationBusy) as busy:
            edge.turn(svc, ANN, "c1", TurnRequest(input="hello"))
        wait = busy.value.retry_after
        assert wait is not None and wait >= 1
        with pytest.raises(ConversationBusy):
            edge.approve(svc, ANN, "c1", ApprovalRequest(approve=["call_1"]))
        assert (
            edge.events(svc, ANN, "c1", after=0, limit=100).events[-1].kind == "tool_call_requested"
        )

        clock.advance(wait)
        assert edge.get(svc, ANN, "c1").status == "interrupted"
        # The next request resumes the run: the idempotent tool again, under its key.
        reply = edge.turn(svc, ANN, "c1", TurnRequest(input="hello"))
        assert reply.status == "complete"
        lookups = sink.requests_for("/lookup")
        assert len(lookups) == 2 and len({r.idempotency_key for r in lookups}) == 1
        assert len(sink.side_effects("/lookup")) == 1
        kinds = [e.kind for e in edge.events(svc, ANN, "c1", after=0, limit=100).events]
        assert kinds.count("tool_result") == 1
        assert edge.get(svc, ANN, "c1").status == "complete"


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_a_tool_that_ignores_keys_is_never_rerun_by_itself_after_a_crash(
    store: ConversationStore, clock: FakeClock, sink: HttpSink, decision: str
) -> None:
    with httpx.Client() as client:
        crash_while_running(store, clock, sink, client, '/tool charge_card {"amount": 10}')
        assert len(sink.requests_for("/charge")) == 1
        svc = service(store, clock, sink, ToolRunner(client, None))
        with pytest.raises(ConversationBusy) as busy:
            edge.get(svc, ANN, "c1") and edge.turn(svc, ANN, "c1", TurnRequest(input="done?"))
        clock.advance(busy.value.retry_after or 0)

        with pytest.raises(ApprovalPending) as asked:
            edge.turn(svc, ANN, "c1", TurnRequest(input="done?"))
        [pending] = error_body(asked.value)["error"]["details"]["pending_tool_calls"]
        assert pending["id"] == "call_1" and pending["requires"] == "approval"
        assert "may have run" in pending["reason"]
        assert len(sink.requests_for("/charge")) == 1, "never run again by itself"
        head = edge.get(svc, ANN, "c1")
        assert head.status == "awaiting_approval"
        assert [p.reason is not None for p in head.pending_tool_calls] == [True]

        if decision == "approve":
            reply = edge.approve(svc, ANN, "c1", ApprovalRequest(approve=["call_1"]))
            assert len(sink.requests_for("/charge")) == 2
            assert reply.output_text == 'Tool results: charge_card: {"charged":10}'
        else:
            reply = edge.approve(
                svc, ANN, "c1", ApprovalRequest(reject=[Rejection(id="call_1", reason="charged")])
            )
            assert len(sink.requests_for("/charge")) == 1
            assert reply.output_text is not None and "was not run" in reply.output_text
        assert reply.status == "complete"
        kinds = [e.kind for e in edge.events(svc, ANN, "c1", after=0, limit=100).events]
        assert kinds.count("approval_requested") == 1
        assert kinds.count("approval_resolved") == 1
        assert kinds.count("tool_result") == 1


def test_a_model_failure_after_tools_ran_releases_the_lease(
    store: ConversationStore, clock: FakeClock, sink: HttpSink
) -> None:
    """Results of tools that acted are kept with the ``turn_failed``; nothing runs any
    more, so the next request resumes at once instead of waiting out the lease."""
    from turnledger.core.exceptions import ProviderError
    from turnledger.providers.base import ModelReply, ModelRequest

    class FailsAfterTools(Recording):
        def complete(self, request: ModelRequest) -> ModelReply:
            if request.messages[-1].role == "tool":
                raise ProviderError("down after the tools", details={"attempts": 3})
            return super().complete(request)

    with httpx.Client() as client:
        failing = Conversations(
            store=store,
            provider=FailsAfterTools(),
            settings=replace(Settings()),
            tools=tools(sink),
            runner=ToolRunner(client, None),
            clock=clock.now,
        )
        with pytest.raises(ProviderError):
            edge.turn(failing, ANN, "c1", TurnRequest(input='/tool lookup {"q": "x"}'))
        svc = service(store, clock, sink, ToolRunner(client, None))
        assert edge.get(svc, ANN, "c1").status == "interrupted"
        reply = edge.turn(svc, ANN, "c1", TurnRequest(input="and now?"))
        assert reply.status == "complete"
        assert len(sink.requests_for("/lookup")) == 1
        kinds = [e.kind for e in edge.events(svc, ANN, "c1", after=0, limit=100).events]
        assert kinds.count("tool_result") == 1 and kinds.count("turn_failed") == 1


# --- more calls in one reply than the runner runs at once (issue 18, failure 4) -----------

#: Calls the runner runs at the same time in these tests, and the calls of one reply.
LIMIT = 2
CALLS = 5  # three rounds: 2 + 2 + 1
#: The slow tool's timeout: a round lasts this long at most (when nothing overruns).
TIMEOUT = 120
#: Model work after the tools: one attempt of 10 s, no retries (no backoff).
QUICK_MODEL = replace(Settings(), provider_timeout_seconds=10, provider_max_retries=0)


def slow_tools(sink: HttpSink) -> ToolRegistry:
    sink.respond("/slow", Reply(echo=True))
    return ToolRegistry.from_json(
        json.dumps(
            {
                "tools": [
                    {
                        "name": "slow",
                        "parameters": {"type": "object"},
                        "executor": {
                            "type": "http",
                            "url": sink.url("/slow"),
                            "timeout_seconds": TIMEOUT,
                        },
                    }
                ]
            }
        )
    )


class Rounds(ToolRunner):
    """The real runner, on a fake clock: it runs the calls it is given ``max_workers``
    at a time and moves the clock by ``round_seconds`` for every round (each round lasts
    as long as its slowest call). ``during`` is called in the round that holds the call
    ``during_call`` (after its time passed, before its calls are sent), or in the first
    round when ``during_call`` is ``None``."""

    def __init__(
        self,
        client: httpx.Client,
        clock: FakeClock,
        *,
        round_seconds: float,
        during: Callable[[], None],
        during_call: str | None,
    ) -> None:
        super().__init__(client, None, max_workers=LIMIT)
        self.clock = clock
        self.round_seconds = round_seconds
        self.during = during
        self.during_call = during_call
        self.rounds = 0

    def run(self, invocations: list[ToolInvocation]) -> list[ToolOutcome]:
        outcomes: list[ToolOutcome] = []
        for start in range(0, len(invocations), self.max_workers):
            batch = invocations[start : start + self.max_workers]
            self.rounds += 1
            self.clock.advance(self.round_seconds)
            ids = {i.call.id for i in batch}
            if (self.during_call in ids) if self.during_call else self.rounds == 1:
                self.during()
            outcomes.extend(super().run(batch))
        return outcomes


def many_calls() -> str:
    return "\n".join(f'/tool slow {{"n": {n}}}' for n in range(1, CALLS + 1))


def runs_per_call(sink: HttpSink) -> dict[int, int]:
    counts: dict[int, int] = {}
    for request in sink.requests_for("/slow"):
        n = request.json()["arguments"]["n"]
        counts[n] = counts.get(n, 0) + 1
    return counts


def lease_service(
    store: ConversationStore, clock: FakeClock, sink: HttpSink, runner: ToolRunner
) -> Conversations:
    return Conversations(
        store=store,
        provider=Recording(),
        settings=QUICK_MODEL,
        tools=slow_tools(sink),
        runner=runner,
        clock=clock.now,
    )


@pytest.mark.parametrize(
    ("round_seconds", "why"),
    [
        (TIMEOUT, "each round as long as the tool's timeout: the lease counts every round"),
        # An HTTP timeout bounds each read, not the whole call: a round may overrun.
        # The first lease then lapses during the last round; its renewal does not.
        (TIMEOUT + 15, "each round overruns the timeout: the renewal keeps the lease live"),
    ],
)
def test_a_request_during_the_last_round_of_many_calls_is_busy_and_each_tool_runs_once(
    store: ConversationStore, clock: FakeClock, sink: HttpSink, round_seconds: float, why: str
) -> None:
    """The old lease (one timeout, the model call, 5 s) lapsed after the first round when
    one reply asked for more calls than run at once; a request then resumed the live run
    and every call ran twice."""
    seen: list[BaseException | str] = []
    with httpx.Client() as client:
        other = lease_service(store, clock, sink, ToolRunner(client, None, max_workers=LIMIT))

        def meanwhile() -> None:
            assert edge.get(other, ANN, "c1").status == "running_tools", why
            try:
                edge.turn(other, ANN, "c1", TurnRequest(input="hello?"))
            except ConversationBusy as busy:
                seen.append(busy)
            else:
                seen.append("went through")

        runner = Rounds(
            client,
            clock,
            round_seconds=round_seconds,
            during=meanwhile,
            during_call=f"call_{CALLS}",
        )
        reply = edge.turn(
            lease_service(store, clock, sink, runner), ANN, "c1", TurnRequest(input=many_calls())
        )
    assert len(seen) == 1 and isinstance(seen[0], ConversationBusy), (why, seen)
    assert (seen[0].retry_after or 0) >= 1
    assert runner.rounds == 3
    assert runs_per_call(sink) == {n: 1 for n in range(1, CALLS + 1)}, why
    assert reply.status == "complete"
    assert reply.output_text is not None and reply.output_text.count("slow: ") == CALLS
    events = edge.events(other, ANN, "c1", after=0, limit=100).events
    assert [e.kind for e in events].count("tool_result") == CALLS
    assert "hello?" not in json.dumps([e.model_dump(mode="json") for e in events])


def test_a_holder_that_lost_its_lease_stops_before_its_next_round(
    store: ConversationStore, clock: FakeClock, sink: HttpSink
) -> None:
    """A run that outlived its lease (the process stalled) and was taken over by another
    request runs nothing more: its renewal before the next round fails."""
    with httpx.Client() as client:
        other = lease_service(store, clock, sink, ToolRunner(client, None, max_workers=LIMIT))
        taken: list[str | None] = []

        def stall_and_lose_the_lease() -> None:
            clock.advance(3600)
            assert edge.get(other, ANN, "c1").status == "interrupted"
            taken.append(edge.turn(other, ANN, "c1", TurnRequest(input="still there?")).status)

        runner = Rounds(
            client, clock, round_seconds=1, during=stall_and_lose_the_lease, during_call=None
        )
        with pytest.raises(ConversationBusy):
            edge.turn(
                lease_service(store, clock, sink, runner),
                ANN,
                "c1",
                TurnRequest(input=many_calls()),
            )
    assert taken == ["complete"]
    assert runner.rounds == 1, "no round after the lease was lost"
    # The first round ran twice (the unavoidable cost of a lapsed lease, under the same
    # keys); every later call ran once, by the request that took the run over.
    assert runs_per_call(sink) == {1: 2, 2: 2, 3: 1, 4: 1, 5: 1}
    kinds = [e.kind for e in edge.events(other, ANN, "c1", after=0, limit=100).events]
    assert kinds.count("tool_result") == CALLS
    assert edge.get(other, ANN, "c1").status == "complete"


def test_a_cancel_during_a_round_is_taken_in_by_the_renewal_and_stops_the_turn(
    store: ConversationStore, clock: FakeClock, sink: HttpSink
) -> None:
    """A cancel written on the head between two renewals is not a lost lease: the holder
    keeps it, runs the round it started, and stops the turn at the step boundary."""
    with httpx.Client() as client:
        other = lease_service(store, clock, sink, ToolRunner(client, None, max_workers=LIMIT))
        answers: list[str] = []

        def cancel() -> None:
            answers.append(edge.cancel(other, ANN, "c1", reason="enough").status)

        runner = Rounds(client, clock, round_seconds=TIMEOUT, during=cancel, during_call="call_3")
        reply = edge.turn(
            lease_service(store, clock, sink, runner), ANN, "c1", TurnRequest(input=many_calls())
        )
    assert answers == ["running_tools"]
    assert reply.status == "complete" and reply.status_reason == "cancelled"
    assert runs_per_call(sink) == {n: 1 for n in range(1, CALLS + 1)}
    kinds = [e.kind for e in edge.events(other, ANN, "c1", after=0, limit=100).events]
    assert kinds.count("tool_result") == CALLS and kinds.count("turn_interrupted") == 1
    head = edge.get(other, ANN, "c1")
    assert head.status == "complete"


def test_the_lease_never_outlives_the_function_by_more_than_its_margin(
    store: ConversationStore, clock: FakeClock, sink: HttpSink
) -> None:
    """Within a request with 20 s left, the lease ends at most 20 s + the margin away,
    although the calls and the model may take longer: the function cannot."""
    from turnledger.core.deadline import request_deadline
    from turnledger.turn.execution import LEASE_MARGIN_SECONDS

    leases: list[float] = []
    with httpx.Client() as client:

        def look() -> None:
            head = store.get_head(ConversationKey(tenant=ANN.tenant, conversation_id="c1"))
            assert head is not None and head.lease is not None
            leases.append((head.lease.expires_at - clock.now()).total_seconds())

        runner = Rounds(client, clock, round_seconds=0, during=look, during_call=None)
        with request_deadline(20.0):
            reply = edge.turn(
                lease_service(store, clock, sink, runner),
                ANN,
                "c1",
                TurnRequest(input=many_calls()),
            )
    assert reply.status == "complete"
    [lease] = leases
    assert 20 - 5 + LEASE_MARGIN_SECONDS < lease <= 20 + LEASE_MARGIN_SECONDS


def test_a_cancel_taken_in_while_a_request_resumes_a_crashed_run_stops_that_turn(
    store: ConversationStore, clock: FakeClock, sink: HttpSink
) -> None:
    """The request that resumes a crashed run (before its own input) keeps a cancel its
    renewal took in: the old turn stops, then the request's own turn goes on."""
    with httpx.Client() as client:
        with pytest.raises(Died):
            edge.turn(
                lease_service(store, clock, sink, DyingRunner(client, None, max_workers=LIMIT)),
                ANN,
                "c1",
                TurnRequest(input=many_calls()),
            )
        other = lease_service(store, clock, sink, ToolRunner(client, None, max_workers=LIMIT))
        clock.advance(3600)
        assert edge.get(other, ANN, "c1").status == "interrupted"
        answers: list[str] = []

        def cancel() -> None:
            answers.append(edge.cancel(other, ANN, "c1", reason="enough").status)

        runner = Rounds(client, clock, round_seconds=TIMEOUT, during=cancel, during_call="call_3")
        reply = edge.turn(
            lease_service(store, clock, sink, runner), ANN, "c1", TurnRequest(input="hello")
        )
    assert answers == ["running_tools"]
    assert reply.status == "complete" and reply.output_text == "Noted (2 user messages so far)."
    events = edge.events(other, ANN, "c1", after=0, limit=100).events
    kinds = [e.kind for e in events]
    assert kinds.count("tool_result") == CALLS and kinds.count("turn_interrupted") == 1
    assert kinds.index("turn_interrupted") < kinds.index("user_message", 1)
    # The first round ran in the crashed request and again on resume; the rest once.
    assert runs_per_call(sink) == {1: 2, 2: 2, 3: 1, 4: 1, 5: 1}


def test_recording_a_closed_wait_under_a_live_lease_is_busy(
    store: ConversationStore, clock: FakeClock, sink: HttpSink
) -> None:
    """``expire_waits`` (the sweep's waits pass) on a conversation whose run holds the lease
    is ``ConversationBusy``, not "nothing due": the pass keeps its cursor and retries it."""
    key = ConversationKey(tenant=ANN.tenant, conversation_id="c1")
    asks = TurnRequest(
        input='/tool charge_card {}\n/tool lookup {"q": "x"}', require_approval=["charge_card"]
    )
    with httpx.Client() as client:
        dying = service(store, clock, sink, DyingRunner(client, None), approval_ttl_seconds=5)
        with pytest.raises(Died):
            edge.turn(dying, ANN, "c1", asks)
        svc = service(store, clock, sink, ToolRunner(client, None), approval_ttl_seconds=5)
        view = edge.get(svc, ANN, "c1")
        assert view.status == "running_tools"
        assert [c.name for c in view.pending_tool_calls if c.requires == "approval"] == [
            "charge_card"
        ]
        clock.advance(10)  # the approval's window closed; the crashed run's lease lives on
        with pytest.raises(ConversationBusy):
            svc.expire_waits(key)
