"""Forks in the service: what a fork takes from its parent (summaries), and tenant erasure
of a lineage whose parent was deleted first."""

from __future__ import annotations

from turnledger.core.models import ConversationKey
from turnledger.ops.sweep import Sweeper
from turnledger.store.base import ConversationStore

from tests.functional.test_working_context import (
    ANN,
    service,
    summaries,
    summary_calls,
    ten_words,
    transcript,
    turn,
)
from tests.support.factories import FakeClock, data_sort_keys, raw_sort_keys
from tests.support.providers import Recording


def test_a_fork_after_a_summary_inherits_it_and_one_before_does_not(
    memory_store: ConversationStore, clock: FakeClock
) -> None:
    """The parent's newest summary, at or before the fork point, is the fork's: its first
    turn reuses it (no summarizer call); a fork before it reads its inherited turns."""
    recording = Recording()
    svc = service(memory_store, clock, recording, context_max_tokens=400)
    for index in range(1, 28):
        turn(svc, ten_words(index))
    [summary] = summaries(transcript(svc))
    assert summary_calls(recording) == 1

    svc.fork(ANN.key("conv-1"), "after", None)
    reply = turn(svc, ten_words(28), conversation="after")
    assert reply.context.summary_through == summary.to_sequence
    assert summary_calls(recording) == 1, "the inherited summary was reused"

    svc.fork(ANN.key("conv-1"), "before", 5)
    early = turn(svc, ten_words(6), conversation="before")
    assert early.context.summary_through is None
    # The five inherited turns (16 words each) and the input (10), nothing else.
    assert (early.context.messages_sent, early.context.tokens_estimated) == (2 * 5 + 1, 90)
    assert summary_calls(recording) == 1


def test_tenant_erasure_removes_a_deleted_parent_kept_for_its_fork(
    memory_store: ConversationStore, clock: FakeClock
) -> None:
    svc = service(memory_store, clock)
    turn(svc, "My name is Sam.", conversation="parent")
    svc.fork(ANN.key("parent"), "child", None)
    turn(svc, "Hello.", conversation="child")
    svc.clear(ANN.key("parent"))
    assert raw_sort_keys(memory_store, ANN.key("parent")), "kept for the fork"
    report = Sweeper(memory_store, clock=clock.now).erase(ANN.tenant)
    assert report.complete and report.fork_lives_reclaimed == 1
    for conversation in ("parent", "child"):
        key = ConversationKey(tenant=ANN.tenant, conversation_id=conversation)
        assert data_sort_keys(memory_store, key) == []


def test_deleting_the_last_fork_of_a_lineage_reclaims_every_deleted_ancestor(
    memory_store: ConversationStore, clock: FakeClock
) -> None:
    """Root, middle (a fork of root) and leaf (a fork of middle): root and middle deleted
    first stay stored for leaf, which still reads both; deleting leaf reclaims all three."""
    svc = service(memory_store, clock)
    turn(svc, "My name is Sam.", conversation="root")
    svc.fork(ANN.key("root"), "middle", None)
    turn(svc, "I like tea.", conversation="middle")
    svc.fork(ANN.key("middle"), "leaf", None)
    for gone in ("root", "middle"):
        svc.clear(ANN.key(gone))
    assert [e.conversation_id for e in transcript(svc, "leaf")] == ["root"] * 2 + ["middle"] * 2
    report = svc.clear(ANN.key("leaf"))
    assert report.reclaimed_lives == 2 and report.events == 4  # two of root, two of middle
    for conversation in ("root", "middle", "leaf"):
        assert data_sort_keys(memory_store, ANN.key(conversation)) == []
