"""Content removed when its retention is due (issue 41), on every backend.

:func:`turnledger.store.retention.remove_content` rewrites the bodies of the event items
holding events older than a time: their content becomes a marker, everything else of
them (and the head state a turn item carries) stays, and a second pass writes nothing.
"""

from __future__ import annotations

from datetime import timedelta

from turnledger.core.models import EventKind
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
    assert [raw_item(store, key, sk) for sk in raw_sort_keys(store, key)] == before
