"""Reading one turn's events never reads the whole conversation
(:func:`turnledger.turn.turn_log.turn_events`): the latest turn is one query of the tail,
an older one a binary search of one-event reads and then its own events."""

from __future__ import annotations

import math
from typing import Any

from turnledger.api.schemas import TurnRequest
from turnledger.core.config import Settings
from turnledger.core.models import ConversationKey, Event, Head
from turnledger.providers.demo import DemoProvider
from turnledger.store.memory import MemoryConversationStore
from turnledger.turn.pipeline import Conversations
from turnledger.turn.turn_log import latest_turn, turn_events, turns_range

from tests.support import edge
from tests.support.edge import Caller
from tests.support.factories import FakeClock

ANN = Caller(tenant="t", actor="ann")
KEY = ConversationKey(tenant="t", conversation_id="c")


class CountingStore(MemoryConversationStore):
    """Counts ``read_events`` calls and the events they return."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.events_read = 0

    def read_events(self, key: ConversationKey, head: Head, **kwargs: Any) -> list[Event]:
        events = super().read_events(key, head, **kwargs)
        self.reads += 1
        self.events_read += len(events)
        return events


def test_a_turn_is_found_without_reading_the_conversation() -> None:
    store = CountingStore()
    svc = Conversations(
        store=store, provider=DemoProvider(), settings=Settings(), clock=FakeClock().now
    )
    for n in range(1, 61):
        edge.turn(svc, ANN, "c", TurnRequest(input=f"message {n}"))
    head = store.get_head(KEY)
    assert head is not None and head.event_count == 120

    store.reads = store.events_read = 0
    latest = turn_events(store, KEY, head, 60)
    assert [e.sequence for e in latest] == [119, 120]
    assert (store.reads, store.events_read) == (1, 16)  # one query of the tail

    store.reads = store.events_read = 0
    old = turn_events(store, KEY, head, 7)
    assert [e.sequence for e in old] == [13, 14]
    search = math.ceil(math.log2(120)) + 1
    assert store.reads <= search + 1 and store.events_read <= search + 100

    store.reads = 0
    assert latest_turn(store, KEY, head) == 60 and store.reads == 1
    by_turn = turns_range(store, KEY, head, 10, 12)
    assert {n: [e.sequence for e in events] for n, events in by_turn.items()} == {
        10: [19, 20],
        11: [21, 22],
        12: [23, 24],
    }
    assert turn_events(store, KEY, head, 61) == []
