"""Drafts (issue 13): batched chunks in the conversation's partition, cancel, and a turn
streamed into a draft through the pipeline, on every storage backend."""

from __future__ import annotations

from dataclasses import replace

import pytest
from turnledger.api.schemas import TurnRequest
from turnledger.core.config import Settings
from turnledger.core.exceptions import ProviderError
from turnledger.core.models import ConversationKey
from turnledger.providers.base import ModelReply, ModelRequest, TextSink
from turnledger.providers.demo import DemoProvider
from turnledger.store.base import ConversationStore
from turnledger.turn import drafts
from turnledger.turn.drafts import DraftWriter, TurnCancelled
from turnledger.turn.longturns import DraftedRun
from turnledger.turn.pipeline import Conversations

from tests.support import edge
from tests.support.edge import Caller
from tests.support.factories import FakeClock

ANN = Caller(tenant="tenant-a", actor="ann")


class Ticks:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def writer(store: ConversationStore, clock: FakeClock, turn: int = 1, **kw: object) -> DraftWriter:
    key = ConversationKey(tenant="tenant-a", conversation_id="c1")
    return DraftWriter(
        store=store,
        key=key,
        turn=turn,
        expires_at=int(clock.now().timestamp()) + 3600,
        now=clock.now,
        **kw,  # type: ignore[arg-type]
    )


def test_chunks_are_batched_by_size_and_time(store: ConversationStore, clock: FakeClock) -> None:
    ticks = Ticks()
    w = writer(store, clock, flush_ms=250, flush_chars=10, monotonic=ticks)
    w.begin()
    for word in ["ab", "cd", "ef"]:
        w.add(word)  # 6 characters, no time passed: nothing stored yet
    assert drafts.read(store, w.key, 1).chunks == []
    w.add("ghij")  # 10 characters: stored as one chunk
    ticks.now = 0.1
    w.add("k")
    ticks.now = 0.3  # 250 ms since the last chunk: stored
    w.add("l")
    read = drafts.read(store, w.key, 1)
    assert [(c.seq, c.text) for c in read.chunks] == [(1, "abcdefghij"), (2, "kl")]
    assert read.state is not None and read.state.status == "in_progress"
    w.add("m")
    w.finish({"output_text": "abcdefghijklm"})
    read = drafts.read(store, w.key, 1, after=1)
    assert [(c.seq, c.text) for c in read.chunks] == [(2, "kl"), (3, "m")]
    assert read.state is not None and read.state.done and read.state.next_seq == 4
    assert read.state.result == {"output_text": "abcdefghijklm"}


def test_cancel_is_seen_at_the_next_chunk(store: ConversationStore, clock: FakeClock) -> None:
    w = writer(store, clock, flush_chars=1)
    w.begin()
    w.add("a")
    assert drafts.request_cancel(store, w.key, 1, now=clock.now(), ttl_seconds=60) is True
    with pytest.raises(TurnCancelled):
        w.add("b")
    w.interrupt("turn_cancelled", None)
    state = drafts.read_state(store, w.key, 1)
    assert state is not None and state.status == "interrupted" and state.reason == "turn_cancelled"
    # Over: a second cancel changes nothing, and a new run of the turn starts clean.
    assert drafts.request_cancel(store, w.key, 1, now=clock.now(), ttl_seconds=60) is False
    again = writer(store, clock, flush_chars=1)
    again.begin()
    again.add("c")  # no stale cancel flag
    assert again.next_seq == 4  # numbering goes on after the earlier run's chunks


def _service(store: ConversationStore, clock: FakeClock, provider: object) -> Conversations:
    return Conversations(
        store=store,
        provider=provider,  # type: ignore[arg-type]
        settings=replace(Settings(), ttl_seconds=3600),
        clock=clock.now,
    )


def test_a_streamed_turn_commits_the_whole_answer_and_no_draft_in_events(
    store: ConversationStore, clock: FakeClock
) -> None:
    service = _service(store, clock, DemoProvider())
    key = ConversationKey(tenant="tenant-a", conversation_id="c1")
    w = writer(store, clock, flush_chars=1)
    w.begin()
    sink = DraftedRun(service, key, w)
    answer = edge.turn(service, ANN, "c1", TurnRequest(input="echo: one two three"), sink=sink)
    w.finish(answer.model_dump(mode="json"))
    read = drafts.read(store, key, 1)
    assert [c.text for c in read.chunks] == ["one", " two", " three"]
    events = edge.events(service, ANN, "c1", after=0, limit=100).events
    assert [e.kind for e in events] == ["user_message", "assistant_message"]
    assert events[1].payload["content"] == "one two three"
    # The next turn's context has the committed answer only: the draft is invisible.
    assert edge.turn(service, ANN, "c1", TurnRequest(input="hello")).output_text == (
        "Noted (2 user messages so far)."
    )


class FailsMidStream(DemoProvider):
    """Streams two words, then the provider fails."""

    def stream(self, request: ModelRequest, on_text: TextSink) -> ModelReply:
        on_text("half")
        on_text(" an")
        raise ProviderError("the connection dropped", details={"provider_message": "reset"})


def test_a_failure_mid_stream_leaves_the_draft_and_turn_failed_only(
    store: ConversationStore, clock: FakeClock
) -> None:
    service = _service(store, clock, FailsMidStream())
    key = ConversationKey(tenant="tenant-a", conversation_id="c1")
    w = writer(store, clock, flush_chars=1)
    w.begin()
    with pytest.raises(ProviderError) as caught:
        sink = DraftedRun(service, key, w)
        edge.turn(service, ANN, "c1", TurnRequest(input="echo: never whole"), sink=sink)
    w.interrupt(caught.value.code, caught.value.to_body())
    read = drafts.read(store, key, 1)
    assert "".join(c.text for c in read.chunks) == "half an"
    assert read.state is not None and read.state.status == "interrupted"
    assert read.state.reason == "provider_error"
    kinds = [e.kind for e in edge.events(service, ANN, "c1", after=0, limit=100).events]
    assert kinds == ["turn_failed"]  # nothing of the answer, not even the input


def test_clear_removes_drafts(store: ConversationStore, clock: FakeClock) -> None:
    service = _service(store, clock, DemoProvider())
    key = ConversationKey(tenant="tenant-a", conversation_id="c1")
    w = writer(store, clock, flush_chars=1)
    w.begin()
    sink = DraftedRun(service, key, w)
    answer = edge.turn(service, ANN, "c1", TurnRequest(input="echo: to be cleared"), sink=sink)
    w.finish(answer.model_dump(mode="json"))
    drafts.request_cancel(store, key, 1, now=clock.now(), ttl_seconds=60)
    edge.clear(service, ANN, "c1")
    left = store.query_side_items(key, lower=drafts.DRAFT_PREFIX, upper=drafts.DRAFT_PREFIX + "~")
    assert left == []
    assert drafts.read_state(store, key, 1) is None


def test_draft_items_carry_the_conversation_expiry(
    store: ConversationStore, clock: FakeClock
) -> None:
    w = writer(store, clock, flush_chars=1)
    w.begin()
    w.add("x")
    w.finish({})
    items = store.query_side_items(w.key, lower=drafts.turn_prefix(1), upper=drafts.state_key(1))
    assert len(items) == 2
    assert all(item.expires_at == w.expires_at for item in items)


def _streamed_turn(store: ConversationStore, clock: FakeClock, conversation_id: str) -> None:
    service = _service(store, clock, DemoProvider())
    key = ConversationKey(tenant="tenant-a", conversation_id=conversation_id)
    w = DraftWriter(
        store=store,
        key=key,
        turn=1,
        expires_at=int(clock.now().timestamp()) + 3600,
        now=clock.now,
        flush_chars=1,
    )
    w.begin()
    sink = DraftedRun(service, key, w)
    answer = edge.turn(service, ANN, conversation_id, TurnRequest(input="echo: a b c"), sink=sink)
    w.finish(answer.model_dump(mode="json"))
    assert len(drafts.read(store, key, 1).chunks) == 3


def _draft_items(store: ConversationStore, conversation_id: str) -> list[object]:
    key = ConversationKey(tenant="tenant-a", conversation_id=conversation_id)
    return list(
        store.query_side_items(key, lower=drafts.DRAFT_PREFIX, upper=drafts.DRAFT_PREFIX + "~")
    )


def test_the_sweep_and_tenant_erasure_remove_drafts(
    store: ConversationStore, clock: FakeClock
) -> None:
    from turnledger.ops.sweep import Sweeper

    _streamed_turn(store, clock, "expiring")
    clock.advance(3600 + 1)  # past the conversation's TTL (and the drafts')
    report = Sweeper(store, clock=clock.now).expired()
    assert report.conversations_removed == 1
    assert _draft_items(store, "expiring") == []

    _streamed_turn(store, clock, "erased")
    assert _draft_items(store, "erased")
    report = Sweeper(store, clock=clock.now).erase("tenant-a")
    assert report.complete and report.conversations_removed >= 1
    assert _draft_items(store, "erased") == []


def test_running_turn_finds_the_draft_being_written(
    store: ConversationStore, clock: FakeClock
) -> None:
    key = ConversationKey(tenant="tenant-a", conversation_id="c1")
    assert drafts.running_turn(store, key, 0) is None
    w = writer(store, clock, turn=1)
    w.begin()
    found = drafts.running_turn(store, key, 0)  # a first turn: nothing committed yet
    assert found is not None and found.turn == 1
    w.finish({})
    assert drafts.running_turn(store, key, 1) is None
    again = writer(store, clock, turn=1, kind="approval")
    again.begin()  # an approval continuing turn 1
    found = drafts.running_turn(store, key, 1)
    assert found is not None and (found.turn, found.kind) == (1, "approval")
