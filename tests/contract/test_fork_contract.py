"""The store's fork primitives on every backend: the write is all or nothing and conditional
on the parent's head; a fork reads its inherited events through its parent's partition; what
forks read survives the parent's clear and DynamoDB's TTL, and nothing survives the last fork.
"""

from __future__ import annotations

import pytest
from turnledger.core.exceptions import ConversationBusy
from turnledger.core.models import ConversationKey, ForkOrigin, ForkSegment, Head
from turnledger.ops.sweep import Sweeper
from turnledger.store import keys
from turnledger.store.base import ContextBudget, ConversationStore, new_generation

from tests.support.factories import (
    START,
    FakeClock,
    commit_turn,
    delete_raw_item,
    raw_sort_keys,
)

PARENT = ConversationKey(tenant="tenant-a", conversation_id="parent")
FORK = ConversationKey(tenant="tenant-a", conversation_id="fork")


def _parent(store: ConversationStore, turns: int = 3) -> Head:
    head: Head | None = None
    for n in range(turns):
        head = commit_turn(store, PARENT, head, [f"question {n}", f"answer {n}"]).head
    assert head is not None
    return head


def _fork_head(parent: Head, through: int, turn: int) -> Head:
    return Head(
        gen=new_generation(),
        version=1,
        base=0,
        seq=through,
        turn=turn,
        status=parent.status,
        created_at=START,
        updated_at=START,
        ttl_seconds=0,
        fork=ForkOrigin(
            conversation_id=PARENT.conversation_id,
            gen=parent.gen,
            turn=turn,
            seq=through,
            segments=[
                ForkSegment(
                    conversation_id=PARENT.conversation_id,
                    gen=parent.gen,
                    base=parent.base,
                    through=through,
                )
            ],
        ),
    )


def _fork(store: ConversationStore, parent: Head, through: int = 4, turn: int = 2) -> Head:
    head = _fork_head(parent, through, turn)
    store.fork(PARENT, parent, FORK, head, expected_version=None, now=START)
    return head


def _texts(store: ConversationStore, key: ConversationKey) -> list[str]:
    snapshot = store.load(key, ContextBudget())
    return [str(e.payload.get("content")) for e in snapshot.events]


def test_a_fork_reads_its_parents_events_and_its_own(store: ConversationStore) -> None:
    parent = _parent(store)
    fork = _fork(store, parent)
    assert _texts(store, FORK) == ["question 0", "answer 0", "question 1", "answer 1"]
    commit_turn(store, FORK, fork, ["mine", "my answer"], fork=fork.fork)
    head = store.get_head(FORK)
    assert head is not None
    loaded = store.load(FORK, ContextBudget())
    assert [e.conversation_id for e in loaded.events] == ["parent"] * 4 + ["fork"] * 2
    assert [e.sequence for e in loaded.events] == list(range(1, 7)) and loaded.from_start
    page = store.read_events(FORK, head, after=2, limit=3)
    assert [(e.conversation_id, e.sequence) for e in page] == [
        ("parent", 3),
        ("parent", 4),
        ("fork", 5),
    ]
    assert store.event_at(FORK, head, 2).payload["content"] == "answer 0"
    assert store.fork_count(PARENT, parent) == 1


def test_the_fork_write_is_conditional_on_the_parents_head(store: ConversationStore) -> None:
    """A parent that committed since it was read refuses the fork, and nothing is written."""
    stale = _parent(store)
    commit_turn(store, PARENT, stale, ["later", "answer"])
    with pytest.raises(ConversationBusy):
        store.fork(PARENT, stale, FORK, _fork_head(stale, 4, 2), expected_version=None, now=START)
    assert store.get_head(FORK) is None
    assert raw_sort_keys(store, FORK) == []
    assert not [k for k in raw_sort_keys(store, PARENT) if k.startswith(keys.FORK_REF_PREFIX)]


def test_a_cleared_parent_keeps_what_its_fork_reads_until_the_fork_goes(
    store: ConversationStore,
) -> None:
    parent = _parent(store)
    _fork(store, parent)
    store.clear(PARENT, START)
    head = store.get_head(PARENT)
    assert head is not None and not head.is_visible(START), "a tombstone, kept above them"
    left = [k for k in raw_sort_keys(store, PARENT) if k.startswith(keys.EVENT_PREFIX)]
    # One turn item per commit (two events each): the two that hold events 1..4.
    assert left == [keys.event_sort_key(n) for n in (1, 3)], "only what the fork reads"
    assert _texts(store, FORK)[-1] == "answer 1"
    report = store.clear(FORK, START)
    assert report.reclaimed_lives == 1 and report.events == 4
    assert raw_sort_keys(store, PARENT) == [] and raw_sort_keys(store, FORK) == []


def test_ttl_removed_heads_keep_and_then_release_what_forks_read(
    store: ConversationStore, clock: FakeClock
) -> None:
    """DynamoDB's TTL deletes heads on its own; the stream's reclaim keeps a parent's events
    a fork reads, and, once the fork's head is gone too, its origin item says whose they are."""
    parent = _parent(store)
    _fork(store, parent)
    sweeper = Sweeper(store, clock=clock.now)
    delete_raw_item(store, PARENT, keys.HEAD_SK)
    sweeper.reclaim([PARENT])
    assert _texts(store, FORK)[-1] == "answer 1"
    delete_raw_item(store, FORK, keys.HEAD_SK)
    report = sweeper.reclaim([FORK])
    assert report.fork_lives_reclaimed == 1
    assert raw_sort_keys(store, PARENT) == [] and raw_sort_keys(store, FORK) == []


def test_a_new_life_on_a_deleted_parents_id_starts_above_what_forks_read(
    store: ConversationStore,
) -> None:
    """The tombstone stays while forks read the old life (no expiry: neither TTL nor the
    sweep removes it), so the next life writes above those events; the last fork's release
    leaves the new life alone."""
    parent = _parent(store)
    _fork(store, parent)
    store.clear(PARENT, START)
    tomb = store.get_head(PARENT)
    assert tomb is not None and tomb.status.value == "cleared" and tomb.expires_at is None
    assert tomb.base >= parent.seq
    new = commit_turn(store, PARENT, tomb, ["a new question", "a new answer"]).head
    assert _texts(store, PARENT) == ["a new question", "a new answer"]
    assert _texts(store, FORK) == ["question 0", "answer 0", "question 1", "answer 1"]
    store.clear(FORK, START)
    assert _texts(store, PARENT) == ["a new question", "a new answer"]
    assert store.get_head(PARENT) == new
    kept = [k for k in raw_sort_keys(store, PARENT) if k.startswith(keys.EVENT_PREFIX)]
    assert kept == [keys.event_sort_key(new.base + 1)]  # the new turn's one item


def test_a_ttl_removed_parent_gets_a_tombstone_above_what_forks_read(
    store: ConversationStore, clock: FakeClock
) -> None:
    parent = _parent(store)
    _fork(store, parent)
    delete_raw_item(store, PARENT, keys.HEAD_SK)
    Sweeper(store, clock=clock.now).reclaim([PARENT])
    tomb = store.get_head(PARENT)
    assert tomb is not None and tomb.status.value == "cleared" and tomb.base >= parent.seq
    store.clear(FORK, START)
    assert raw_sort_keys(store, PARENT) == []
