"""Long turns in process (issue 13): accepting, the worker's guards, stale runs.

The HTTP tests (tests/http/test_http_streaming.py) drive the whole path through the
local runner; these pin the edges that are hard to reach there.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest
from turnledger.api.schemas import TurnRequest
from turnledger.api.streaming import StreamPage, prefers_async, sse_text
from turnledger.core.config import Settings
from turnledger.core.exceptions import ConversationBusy, ProviderError, ServiceUnavailable
from turnledger.core.models import ConversationKey
from turnledger.providers.base import ModelReply, ModelRequest, TextSink
from turnledger.providers.demo import DemoProvider
from turnledger.store import keys
from turnledger.store.codec import SideItem
from turnledger.store.memory import MemoryConversationStore
from turnledger.turn import drafts, longturns, turn_reads
from turnledger.turn.commands import TurnCommand
from turnledger.turn.longturns import AsyncTurnsUnavailable
from turnledger.turn.pipeline import Conversations
from turnledger.turn.turn_reads import TurnNotFound

from tests.support import edge
from tests.support.edge import Caller
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
        edge.accept(conversations, ANN, "c1", TurnRequest(input="hi"), Invocations())
    assert caught.value.status == 501
    assert drafts.read_state(conversations.store, KEY, 1) is None


def test_a_worker_that_cannot_be_started_leaves_the_draft_interrupted(clock: FakeClock) -> None:
    conversations = service(clock)

    def refuse(payload: dict[str, Any]) -> None:
        raise RuntimeError("Lambda said no")

    with pytest.raises(ServiceUnavailable):
        edge.accept(conversations, ANN, "c1", TurnRequest(input="hi"), refuse)
    state = drafts.read_state(conversations.store, KEY, 1)
    assert state is not None and state.status == "interrupted"
    assert state.reason == "worker_unavailable"
    assert conversations.store.get_head(KEY) is None  # nothing of the turn


def test_the_worker_runs_the_turn_once_and_a_retried_event_does_nothing(clock: FakeClock) -> None:
    conversations = service(clock)
    invoked = Invocations()
    accepted = edge.accept(conversations, ANN, "c1", TurnRequest(input="echo: x y"), invoked)
    [payload] = invoked.payloads
    assert edge.run_worker(conversations, payload)["status"] == "done"
    again = edge.run_worker(conversations, payload)
    assert again == {"turn": accepted, "status": "done", "skipped": True}
    kinds = [e.kind for e in edge.events(conversations, ANN, "c1", after=0, limit=50).events]
    assert kinds == ["user_message", "assistant_message"]
    status, body = edge.turn_view(conversations, ANN, "c1", 1)
    assert status == 200 and body["output_text"] == "x y"


def test_a_turn_taken_before_the_worker_ran_is_superseded_not_run_twice(
    clock: FakeClock,
) -> None:
    conversations = service(clock)
    invoked = Invocations()
    edge.accept(conversations, ANN, "c1", TurnRequest(input="echo: late"), invoked)
    edge.turn(conversations, ANN, "c1", TurnRequest(input="echo: first"))  # takes turn 1
    result = edge.run_worker(conversations, invoked.payloads[0])
    assert result == {"turn": 1, "status": "interrupted", "reason": "turn_superseded"}
    events = edge.events(conversations, ANN, "c1", after=0, limit=50).events
    assert [e.payload.get("content") for e in events] == ["echo: first", "first"]
    status, body = edge.turn_view(conversations, ANN, "c1", 1)
    assert status == 409 and body["error"]["code"] == "turn_superseded"


def test_a_run_that_went_stale_reads_as_worker_lost(clock: FakeClock) -> None:
    conversations = service(clock)
    edge.accept(conversations, ANN, "c1", TurnRequest(input="hi"), Invocations())
    page = edge.stream_page(conversations, ANN, "c1", 1, after=0, wait=0)
    assert page.status == "in_progress" and not page.done
    clock.advance(turn_reads.STALE_AFTER_SECONDS + 1)
    page = edge.stream_page(conversations, ANN, "c1", 1, after=0, wait=5)
    assert page.done and page.status == "interrupted" and page.reason == "worker_lost"
    status, body = edge.turn_view(conversations, ANN, "c1", 1)
    assert status == 500 and body["error"]["details"]["draft_status"] == "interrupted"
    # The conversation is not blocked by it: a new long turn is accepted.
    again = edge.accept(conversations, ANN, "c1", TurnRequest(input="hi"), Invocations())
    assert again == 1


def test_reads_of_turns_without_a_draft(clock: FakeClock) -> None:
    """A turn run with no draft reads back from the log; its stream reads as done, no
    chunks, its result the answer (a quick synchronous turn writes no draft either); a
    turn the log does not hold has neither."""
    conversations = service(clock)
    answer = edge.turn(conversations, ANN, "c1", TurnRequest(input="hi"))
    assert edge.turn_view(conversations, ANN, "c1", 1) == (200, answer.model_dump(mode="json"))
    with pytest.raises(TurnNotFound):
        edge.turn_view(conversations, ANN, "c1", 2)
    stream = edge.stream_page(conversations, ANN, "c1", 1, after=0, wait=0)
    assert (stream.done, stream.status, stream.chunks) == (True, "done", [])
    assert stream.result == answer.model_dump(mode="json")
    with pytest.raises(TurnNotFound):
        edge.stream_page(conversations, ANN, "c1", 2, after=0, wait=0)


def test_a_stray_event_is_refused(clock: FakeClock) -> None:
    with pytest.raises(ValueError):
        edge.run_worker(service(clock), {"kind": "something else"})


def test_the_routes_own_sse_answer_parses_with_a_real_sse_client(clock: FakeClock) -> None:
    """Deployed (a buffering front door) the route answers SSE itself, whole: what
    ``sse_text`` writes must read back with an SSE client, ids and all."""
    import httpx
    from httpx_sse import EventSource

    conversations = service(clock, draft_flush_chars=1)
    invoked = Invocations()
    edge.accept(conversations, ANN, "c1", TurnRequest(input="echo: a b"), invoked)
    edge.run_worker(conversations, invoked.payloads[0])
    page = edge.stream_page(conversations, ANN, "c1", 1, after=0, wait=0, gather=True)
    response = httpx.Response(
        200, headers={"content-type": "text/event-stream"}, text=sse_text(page)
    )
    events = list(EventSource(response).iter_sse())
    assert [(e.event, e.id) for e in events] == [("chunk", "1"), ("chunk", "2"), ("done", "2")]
    assert events[0].retry == 1000
    assert [e.json()["text"] for e in events[:2]] == ["a", " b"]
    assert events[2].json()["result"]["output_text"] == "a b"
    # Nothing new within the wait: only a comment (the client reconnects), no empty event.
    empty = StreamPage(conversation_id="c1", turn=1, next_after=2, done=False, status="in_progress")
    quiet = httpx.Response(200, headers={"content-type": "text/event-stream"}, text=sse_text(empty))
    assert [e.data for e in EventSource(quiet).iter_sse() if e.data] == []


def test_a_request_too_large_for_the_workers_event_is_refused_first(clock: FakeClock) -> None:
    from turnledger.core.exceptions import PayloadTooLarge

    conversations = service(clock)
    invoked = Invocations()
    big = TurnRequest(input="x" * (longturns.MAX_EVENT_BYTES + 1))
    with pytest.raises(PayloadTooLarge) as caught:
        edge.accept(conversations, ANN, "c1", big, invoked)
    assert caught.value.details["limit"] == longturns.MAX_EVENT_BYTES
    assert invoked.payloads == [] and drafts.read_state(conversations.store, KEY, 1) is None


def test_what_a_turn_would_refuse_is_refused_before_202(clock: FakeClock) -> None:
    from turnledger.core.exceptions import BudgetExceeded, ConversationBusy, UnknownTool

    conversations = service(clock, conversation_token_budget=5)
    edge.turn(conversations, ANN, "c1", TurnRequest(input="echo: spend the whole budget now"))
    with pytest.raises(BudgetExceeded):
        edge.accept(conversations, ANN, "c1", TurnRequest(input="hi"), Invocations())
    with pytest.raises(UnknownTool):
        edge.accept(
            conversations, ANN, "c2", TurnRequest(input="hi", tools=["nope"]), Invocations()
        )
    # A long turn of the conversation is running: a second one is busy, nothing started.
    invoked = Invocations()
    edge.accept(conversations, ANN, "c3", TurnRequest(input="one"), invoked)
    with pytest.raises(ConversationBusy):
        edge.accept(conversations, ANN, "c3", TurnRequest(input="two"), invoked)
    assert len(invoked.payloads) == 1


def test_an_input_over_the_context_budget_alone_is_refused_before_202(clock: FakeClock) -> None:
    from turnledger.core.exceptions import ContextLengthExceeded

    conversations = service(clock, context_max_tokens=10)
    invoked = Invocations()
    with pytest.raises(ContextLengthExceeded) as caught:
        edge.accept(conversations, ANN, "c1", TurnRequest(input="word " * 11), invoked)
    assert caught.value.details == {"limit": 10, "tokens": 11, "model": "demo-1"}
    assert invoked.payloads == [] and drafts.read_state(conversations.store, KEY, 1) is None


def test_a_draft_whose_end_was_lost_never_blocks_its_conversation(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A synchronous turn commits, then fails to write its draft's end (a store fault):
    the answer stands, the turn reads back from the log, and the next request on the
    same turn number is not refused as busy."""
    conversations = service(clock)
    key = ConversationKey(tenant=ANN.tenant, conversation_id="c1")

    def lost(self: drafts.DraftWriter, result: dict[str, Any] | None) -> None:
        raise ServiceUnavailable("the store did not answer")

    begin = drafts.DraftWriter.begin

    def begin_then_wait(self: drafts.DraftWriter, *args: Any, **kwargs: Any) -> None:
        begin(self, *args, **kwargs)
        clock.advance(1)  # the model takes a second: the commit comes after the begin

    with monkeypatch.context() as patched:
        patched.setattr(drafts.DraftWriter, "finish", lost)
        patched.setattr(drafts.DraftWriter, "begin", begin_then_wait)
        result, _ = longturns.run_drafted(
            conversations,
            key,
            ANN.actor,
            TurnCommand(messages=["hi"]),
            answer=None,
            read_back=False,
        )
    assert result.output_text == "Noted (1 user messages so far)."
    assert drafts.read_state(conversations.store, key, 1).status == "in_progress"  # type: ignore[union-attr]
    status, body = edge.turn_view(conversations, ANN, "c1", 1)
    assert (status, body["output_text"]) == (200, "Noted (1 user messages so far).")
    # A request on turn 1 again (the model answers the transcript as it stands): its
    # draft is begun again, not refused as running.
    again, _ = longturns.run_drafted(
        conversations, key, ANN.actor, TurnCommand(messages=[]), answer=None, read_back=False
    )
    assert again.turn == 1


def test_a_quick_synchronous_turn_writes_no_draft(clock: FakeClock) -> None:
    """A synchronous turn (``POST .../turns``) that ends before ``SYNC_DRAFT_AFTER_MS``
    writes no draft item at all (its commit is its only write), and still reads back
    from the log; a failed one writes its draft, interrupted, so readers learn the error."""
    conversations = service(clock)
    for text in ("hi", "again"):
        result = longturns.run_synchronously(
            conversations, KEY, ANN.actor, TurnCommand(messages=[text])
        )
        assert result.status == "complete"
    store = conversations.store
    assert isinstance(store, MemoryConversationStore)
    partition = store.items[keys.partition_key(KEY)]
    assert [sk for sk in partition if sk.startswith(drafts.DRAFT_PREFIX)] == []
    status, body = edge.turn_view(conversations, ANN, "c1", 2)
    assert (status, body["output_text"]) == (200, "Noted (2 user messages so far).")

    failing = service(clock, sync_draft_after_ms=60_000)
    failing.provider = _Failing()
    with pytest.raises(ProviderError):
        longturns.run_synchronously(failing, KEY, ANN.actor, TurnCommand(messages=["hi"]))
    state = drafts.read_state(failing.store, KEY, 1)
    assert state is not None and (state.status, state.reason) == ("interrupted", "provider_error")


def test_a_synchronous_turn_that_runs_on_begins_its_draft(clock: FakeClock) -> None:
    """Once a synchronous turn has run ``SYNC_DRAFT_AFTER_MS``, its draft is begun while
    it runs: a reader follows it (``in_progress``), a second turn request is refused busy
    at once, and the draft ends done."""
    conversations = service(clock, sync_draft_after_ms=20)
    seen: list[object] = []

    class _Slow(DemoProvider):
        def stream(self, request: ModelRequest, on_text: TextSink) -> ModelReply:
            waited = 0.0
            while (state := drafts.read_state(conversations.store, KEY, 1)) is None:
                assert waited < 10, "the draft never began"
                time.sleep(0.01)
                waited += 0.01
            seen.append(state.status)
            with pytest.raises(ConversationBusy):
                longturns.run_synchronously(
                    conversations, KEY, "ben", TurnCommand(messages=["me too"])
                )
            return super().stream(request, on_text)

    conversations.provider = _Slow()
    result = longturns.run_synchronously(
        conversations, KEY, ANN.actor, TurnCommand(messages=["hi"])
    )
    assert result.status == "complete"
    assert seen == ["in_progress"]
    assert drafts.read_state(conversations.store, KEY, 1).status == "done"  # type: ignore[union-attr]


class _Failing(DemoProvider):
    """A model that fails at once."""

    def stream(self, request: ModelRequest, on_text: TextSink) -> ModelReply:
        raise ProviderError("the model is down")

    def complete(self, request: ModelRequest) -> ModelReply:
        raise ProviderError("the model is down")


def _state_reads(store: MemoryConversationStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The sort keys of the draft states ``store`` is asked for from now on."""
    asked: list[str] = []
    get = store.get_side_item

    def counted(key: ConversationKey, sort_key: str) -> Any:
        if sort_key.endswith("#~"):
            asked.append(sort_key)
        return get(key, sort_key)

    monkeypatch.setattr(store, "get_side_item", counted)
    return asked


def test_the_busy_check_reads_the_draft_only_when_the_run_flag_names_its_turn(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A synchronous turn's busy check comes from its own load: the run flag, read with the
    head, names the turn whose draft began last, so a turn the flag does not name reads no
    draft state (one read per turn: its load). Once a long turn's draft began (here an
    accepted one, not yet run), the next turn's flag names it: the state is read, and the
    request refused busy at once."""
    conversations = service(clock)
    store = conversations.store
    assert isinstance(store, MemoryConversationStore)
    asked = _state_reads(store, monkeypatch)
    for text in ("hi", "again"):
        longturns.run_synchronously(conversations, KEY, ANN.actor, TurnCommand(messages=[text]))
    assert asked == []
    loaded = store.load(KEY, conversations.budget)
    assert loaded.run_read and loaded.run is None

    edge.accept(conversations, ANN, "c1", TurnRequest(input="long"), Invocations())
    loaded = store.load(KEY, conversations.budget)
    assert loaded.run is not None and loaded.run.turn == 3
    asked.clear()
    with pytest.raises(ConversationBusy) as busy:
        longturns.run_synchronously(conversations, KEY, "ben", TurnCommand(messages=["me too"]))
    assert busy.value.details == {"turn": 3, "retry_after_seconds": 1}
    assert asked[-1:] == [drafts.state_key(3)]
    head = store.get_head(KEY)
    assert head is not None and head.turn == 2  # nothing of it stored


def test_a_run_whose_busy_check_read_no_state_still_numbers_on_and_drops_an_old_cancel(
    clock: FakeClock,
) -> None:
    """A draft left by code older than the run flag (its state, no flag) and a cancel flag
    its run never saw: a new run of that turn reads no state up front (no flag names it),
    so its draft reads the earlier state as it begins: it numbers on after the earlier
    run's chunks and removes the stale cancel instead of obeying it."""
    conversations = service(clock, sync_draft_after_ms=0)
    store = conversations.store
    assert isinstance(store, MemoryConversationStore)
    old = drafts.DraftWriter(store=store, key=KEY, turn=1, expires_at=None, now=clock.now)
    old.begin()
    old.add("an earlier run's words")
    old.flush(check_cancel=False)
    old.interrupt("provider_error", None)
    # A cancel flag its run never saw (the run ended first): a stray one.
    store.put_side_item(KEY, SideItem(drafts.cancel_key(1), {drafts.A_CANCELLED_BY: "ann"}))
    del store.items[keys.partition_key(KEY)][keys.RUN_FLAG_SK]
    assert store.load(KEY, conversations.budget).run is None

    result = longturns.run_synchronously(
        conversations, KEY, ANN.actor, TurnCommand(messages=["echo: fresh"])
    )
    assert result.status == "complete"
    state = drafts.read_state(store, KEY, 1)
    assert state is not None and state.status == "done" and state.next_seq >= 2
    assert store.get_side_item(KEY, drafts.cancel_key(1)) is None
