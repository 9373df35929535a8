"""Long turns in process (issue 13): accepting, the worker's guards, stale runs.

The HTTP tests (tests/http/test_http_streaming.py) drive the whole path through the
local runner; these pin the edges that are hard to reach there.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from turnledger import drafts, longturns
from turnledger.config import Settings
from turnledger.exceptions import ServiceUnavailable
from turnledger.longturns import AsyncTurnsUnavailable, TurnNotFound, prefers_async
from turnledger.models import ConversationKey
from turnledger.pipeline import Caller, Conversations
from turnledger.providers.demo import DemoProvider
from turnledger.api.schemas import TurnRequest
from turnledger.store.memory import MemoryConversationStore

from tests.support.factories import FakeClock

ANN = Caller(tenant="tenant-a", actor="ann")
KEY = ConversationKey(tenant="tenant-a", conversation_id="c1")


def service(clock: FakeClock, **settings: Any) -> Conversations:
    return Conversations(
        store=MemoryConversationStore(),
        provider=DemoProvider(),
        settings=replace(
            Settings(), **{"ttl_seconds": 3600, "turn_worker_function": "worker", **settings}
        ),
        clock=clock.now,
    )


class Invocations:
    """Records worker payloads instead of starting a worker."""

    def __init__(self) -> None:
        self.payloads: list[dict[str, Any]] = []

    def __call__(self, payload: dict[str, Any]) -> None:
        self.payloads.append(payload)


def test_prefer_header_is_parsed_as_rfc_7240_says() -> None:
    assert prefers_async("respond-async")
    assert prefers_async("return=minimal, respond-async; wait=10")
    assert prefers_async("RESPOND-ASYNC")
    assert not prefers_async(None)
    assert not prefers_async("respond-asynchronously, return=representation")


def test_without_a_worker_async_is_refused_and_nothing_is_stored(clock: FakeClock) -> None:
    conversations = service(clock, turn_worker_function=None)
    with pytest.raises(AsyncTurnsUnavailable) as caught:
        longturns.accept(conversations, ANN, "c1", "turn", TurnRequest(input="hi"), Invocations())
    assert caught.value.status == 501
    assert drafts.read_state(conversations.store, KEY, 1) is None


def test_a_worker_that_cannot_be_started_leaves_the_draft_interrupted(clock: FakeClock) -> None:
    conversations = service(clock)

    def refuse(payload: dict[str, Any]) -> None:
        raise RuntimeError("Lambda said no")

    with pytest.raises(ServiceUnavailable):
        longturns.accept(conversations, ANN, "c1", "turn", TurnRequest(input="hi"), refuse)
    state = drafts.read_state(conversations.store, KEY, 1)
    assert state is not None and state.status == "interrupted"
    assert state.reason == "worker_unavailable"
    assert conversations.store.get_head(KEY) is None  # nothing of the turn


def test_the_worker_runs_the_turn_once_and_a_retried_event_does_nothing(clock: FakeClock) -> None:
    conversations = service(clock)
    invoked = Invocations()
    accepted = longturns.accept(
        conversations, ANN, "c1", "turn", TurnRequest(input="echo: x y"), invoked
    )
    [payload] = invoked.payloads
    assert longturns.run_worker(conversations, payload)["status"] == "done"
    again = longturns.run_worker(conversations, payload)
    assert again == {"turn": accepted.turn, "status": "done", "skipped": True}
    kinds = [e.kind for e in conversations.events(ANN, "c1", after=0, limit=50).events]
    assert kinds == ["user_message", "assistant_message"]
    status, body = longturns.turn_view(conversations, ANN, "c1", 1)
    assert status == 200 and body["output_text"] == "x y"


def test_a_turn_taken_before_the_worker_ran_is_superseded_not_run_twice(
    clock: FakeClock,
) -> None:
    conversations = service(clock)
    invoked = Invocations()
    longturns.accept(conversations, ANN, "c1", "turn", TurnRequest(input="echo: late"), invoked)
    conversations.turn(ANN, "c1", TurnRequest(input="echo: first"))  # takes turn 1
    result = longturns.run_worker(conversations, invoked.payloads[0])
    assert result == {"turn": 1, "status": "interrupted", "reason": "turn_superseded"}
    events = conversations.events(ANN, "c1", after=0, limit=50).events
    assert [e.payload.get("content") for e in events] == ["echo: first", "first"]
    status, body = longturns.turn_view(conversations, ANN, "c1", 1)
    assert status == 409 and body["error"]["code"] == "turn_superseded"


def test_a_run_that_went_stale_reads_as_worker_lost(clock: FakeClock) -> None:
    conversations = service(clock)
    longturns.accept(conversations, ANN, "c1", "turn", TurnRequest(input="hi"), Invocations())
    page = longturns.stream_page(conversations, ANN, "c1", 1, after=0, wait=0)
    assert page.status == "in_progress" and not page.done
    clock.advance(longturns.STALE_AFTER_SECONDS + 1)
    page = longturns.stream_page(conversations, ANN, "c1", 1, after=0, wait=5)
    assert page.done and page.status == "interrupted" and page.reason == "worker_lost"
    status, body = longturns.turn_view(conversations, ANN, "c1", 1)
    assert status == 500 and body["error"]["details"]["draft_status"] == "interrupted"
    # The conversation is not blocked by it: a new long turn is accepted.
    again = longturns.accept(
        conversations, ANN, "c1", "turn", TurnRequest(input="hi"), Invocations()
    )
    assert again.turn == 1


def test_reads_of_turns_without_a_draft(clock: FakeClock) -> None:
    conversations = service(clock)
    conversations.turn(ANN, "c1", TurnRequest(input="hi"))
    with pytest.raises(TurnNotFound):
        longturns.turn_view(conversations, ANN, "c1", 1)
    with pytest.raises(TurnNotFound):
        longturns.stream_page(conversations, ANN, "c1", 2, after=0, wait=0)


def test_a_stray_event_is_refused(clock: FakeClock) -> None:
    with pytest.raises(ValueError):
        longturns.run_worker(service(clock), {"kind": "something else"})


def test_the_routes_own_sse_answer_parses_with_a_real_sse_client(clock: FakeClock) -> None:
    """Deployed (a buffering front door) the route answers SSE itself, whole: what
    ``sse_text`` writes must read back with an SSE client, ids and all."""
    import httpx
    from httpx_sse import EventSource

    conversations = service(clock, draft_flush_chars=1)
    invoked = Invocations()
    longturns.accept(conversations, ANN, "c1", "turn", TurnRequest(input="echo: a b"), invoked)
    longturns.run_worker(conversations, invoked.payloads[0])
    page = longturns.stream_page(conversations, ANN, "c1", 1, after=0, wait=0, gather=True)
    response = httpx.Response(
        200, headers={"content-type": "text/event-stream"}, text=longturns.sse_text(page)
    )
    events = list(EventSource(response).iter_sse())
    assert [(e.event, e.id) for e in events] == [("chunk", "1"), ("chunk", "2"), ("done", "2")]
    assert events[0].retry == 1000
    assert [e.json()["text"] for e in events[:2]] == ["a", " b"]
    assert events[2].json()["result"]["output_text"] == "a b"
    # Nothing new within the wait: only a comment (the client reconnects), no empty event.
    empty = longturns.StreamPage(
        conversation_id="c1", turn=1, next_after=2, done=False, status="in_progress"
    )
    quiet = httpx.Response(
        200, headers={"content-type": "text/event-stream"}, text=longturns.sse_text(empty)
    )
    assert [e.data for e in EventSource(quiet).iter_sse() if e.data] == []


def test_a_request_too_large_for_the_workers_event_is_refused_first(clock: FakeClock) -> None:
    from turnledger.exceptions import PayloadTooLarge

    conversations = service(clock)
    invoked = Invocations()
    big = TurnRequest(input="x" * (longturns.MAX_EVENT_BYTES + 1))
    with pytest.raises(PayloadTooLarge) as caught:
        longturns.accept(conversations, ANN, "c1", "turn", big, invoked)
    assert caught.value.details["limit"] == longturns.MAX_EVENT_BYTES
    assert invoked.payloads == [] and drafts.read_state(conversations.store, KEY, 1) is None


def test_what_a_turn_would_refuse_is_refused_before_202(clock: FakeClock) -> None:
    from turnledger.exceptions import BudgetExceeded, ConversationBusy, UnknownTool

    conversations = service(clock, conversation_token_budget=5)
    conversations.turn(ANN, "c1", TurnRequest(input="echo: spend the whole budget now"))
    with pytest.raises(BudgetExceeded):
        longturns.accept(conversations, ANN, "c1", "turn", TurnRequest(input="hi"), Invocations())
    with pytest.raises(UnknownTool):
        longturns.accept(
            conversations, ANN, "c2", "turn", TurnRequest(input="hi", tools=["nope"]), Invocations()
        )
    # A long turn of the conversation is running: a second one is busy, nothing started.
    invoked = Invocations()
    longturns.accept(conversations, ANN, "c3", "turn", TurnRequest(input="one"), invoked)
    with pytest.raises(ConversationBusy):
        longturns.accept(conversations, ANN, "c3", "turn", TurnRequest(input="two"), invoked)
    assert len(invoked.payloads) == 1
