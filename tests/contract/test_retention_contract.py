"""Content removed when its retention is due (issue 41), on every backend.

:func:`turnledger.store.retention.remove_content` rewrites the bodies of the event items
holding events older than a time: their content becomes a marker, everything else of
them (and the head state a turn item carries) stays, and a second pass writes nothing;
it says when the oldest content it kept was written. ``refile_retention`` files a head
on ``by-wait`` under the hour its retained content falls due (the earlier of that and its
wait deadline), or takes it off, without a new version.
"""

from __future__ import annotations

from datetime import timedelta

from turnledger.core.models import ConversationKey, EventKind
from turnledger.store import keys
from turnledger.store.base import ConversationStore
from turnledger.store.retention import removal_marker, remove_content

from tests.support.factories import (
    START,
    commit_turn,
    holds_text,
    make_key,
    raw_item,
    raw_sort_keys,
)

OLD = "my card is 4111111111111111"
ANSWER = "noted, the card ending 1111"
NEW = "what is the weather?"


def test_old_content_becomes_a_marker_and_the_rest_stays(store: ConversationStore) -> None:
    key = make_key(conversation_id="retained-1")
    first = commit_turn(store, key, None, [OLD, ANSWER], now=START)
    later = START + timedelta(seconds=120)
    second = commit_turn(store, key, first.head, [NEW, "sunny"], now=later)
    head = store.get_head(key)
    assert head is not None and head.version == second.head.version
    marker = removal_marker("pii", START + timedelta(seconds=61))

    removal = remove_content(store, key, head, before=START + timedelta(seconds=1), marker=marker)

    assert removal.sequences == [1, 2]
    assert removal.items >= 1
    assert removal.kept_since == later  # the newer turn's content stays
    events = store.read_events(key, head, after=0, limit=10)
    assert [e.kind for e in events] == [
        EventKind.USER_MESSAGE,
        EventKind.ASSISTANT_MESSAGE,
        EventKind.USER_MESSAGE,
        EventKind.ASSISTANT_MESSAGE,
    ]
    assert [e.event_id for e in events] == [e.event_id for e in [*first.events, *second.events]]
    text = " ".join(str(e.payload) for e in events)
    assert OLD not in text and ANSWER not in text
    assert events[0].payload["content"].startswith('{"removed":"retention","class":"pii"')
    assert events[2].payload["content"] == NEW
    for event in events:
        event.body()  # each payload still valid for its kind
    raw = [raw_item(store, key, sk) for sk in raw_sort_keys(store, key)]
    assert not any(holds_text(item, OLD) for item in raw if item is not None)

    # The head (and its fast state) as it was; a turn still commits on top.
    assert store.get_head(key) == head
    commit_turn(store, key, head, ["and tomorrow?"], now=later + timedelta(seconds=1))

    again = remove_content(store, key, head, before=START + timedelta(seconds=1), marker=marker)
    assert again.sequences == [] and again.items == 0


def test_nothing_is_due_nothing_is_written(store: ConversationStore) -> None:
    key = make_key(conversation_id="retained-2")
    commit_turn(store, key, None, [OLD, ANSWER], now=START)
    head = store.get_head(key)
    assert head is not None
    before = [raw_item(store, key, sk) for sk in raw_sort_keys(store, key)]
    removal = remove_content(store, key, head, before=START, marker=removal_marker("pii", START))
    assert removal.sequences == [] and removal.items == 0
    assert removal.kept_since == START
    assert [raw_item(store, key, sk) for sk in raw_sort_keys(store, key)] == before


def _listed_in(store: ConversationStore, hour: int) -> list[ConversationKey]:
    return [k for shard in range(keys.EXPIRY_SHARDS) for k in store.due_in(hour, shard)]


def test_a_head_is_filed_under_its_retention_due_and_taken_off(store: ConversationStore) -> None:
    key = make_key(conversation_id="retained-3")
    commit_turn(store, key, None, [OLD, ANSWER], now=START)
    head = store.get_head(key)
    assert head is not None and head.retention_due is None
    due = START + timedelta(hours=5)
    hour = keys.bucket_of(int(due.timestamp()))
    assert _listed_in(store, hour) == []

    assert store.refile_retention(key, head, due)
    assert _listed_in(store, hour) == [key]
    filed = store.get_head(key)
    assert filed is not None and filed.retention_due == due
    assert filed.version == head.version  # index upkeep, not a new state
    # A turn on top that carries it (as a session does) does not rewrite HEAD.
    stored = store.head_item(key)
    commit_turn(store, key, filed, [NEW], now=START + timedelta(seconds=5), retention_due=due)
    assert store.head_item(key) == stored
    assert _listed_in(store, hour) == [key]

    later = store.get_head(key)
    assert later is not None and later.retention_due == due
    assert store.refile_retention(key, later, None)
    assert _listed_in(store, hour) == []
    gone = store.get_head(key)
    assert gone is not None and gone.retention_due is None


def test_the_earlier_of_a_wait_and_the_retention_due_files_the_head(
    store: ConversationStore,
) -> None:
    key = make_key(conversation_id="retained-4")
    wait = START + timedelta(hours=2)
    commit_turn(store, key, None, [OLD], now=START, wait_deadline=wait)
    head = store.get_head(key)
    assert head is not None
    hour_of = lambda at: keys.bucket_of(int(at.timestamp()))  # noqa: E731
    assert _listed_in(store, hour_of(wait)) == [key]

    assert store.refile_retention(key, head, START + timedelta(hours=1))
    assert _listed_in(store, hour_of(wait)) == []
    assert _listed_in(store, hour_of(START + timedelta(hours=1))) == [key]
    assert store.refile_retention(key, head, START + timedelta(hours=4))
    assert _listed_in(store, hour_of(wait)) == [key]


def test_refiling_a_head_of_another_life_writes_nothing(store: ConversationStore) -> None:
    key = make_key(conversation_id="retained-5")
    commit_turn(store, key, None, [OLD], now=START)
    head = store.get_head(key)
    assert head is not None
    stored = store.head_item(key)
    other = head.model_copy(update={"gen": "another-life"})
    assert not store.refile_retention(key, other, START + timedelta(hours=1))
    assert store.head_item(key) == stored
