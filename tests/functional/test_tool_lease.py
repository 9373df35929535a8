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
from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest
from turnledger.api.errors import error_body
from turnledger.api.schemas import ApprovalRequest, Rejection, TurnRequest
from turnledger.config import Settings
from turnledger.exceptions import ApprovalPending, ConversationBusy
from turnledger.pipeline import Conversations
from turnledger.store.base import ConversationStore
from turnledger.tools import ToolInvocation, ToolOutcome, ToolRegistry, ToolRunner

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
    store: ConversationStore, clock: FakeClock, sink: HttpSink, runner: ToolRunner
) -> Conversations:
    return Conversations(
        store=store,
        provider=Recording(),
        settings=replace(Settings()),
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
    from turnledger.exceptions import ProviderError
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
