"""Where a head is filed in the expiry index, as turns refresh its TTL and the sweep passes.

A turn keeps the head's bucket while it is still ahead of the sweep, so a
conversation whose turns are spread over hours does not move an index entry
on every turn; a head whose bucket came due while it was in use is re-filed
(by its next turn, or by the sweep passing it) and purged when it really expires.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from turnledger.api.schemas import TurnRequest
from turnledger.core.config import Settings
from turnledger.core.models import ConversationKey
from turnledger.ops.sweep import Sweeper
from turnledger.providers.demo import DemoProvider
from turnledger.store import codec, keys
from turnledger.store.base import ConversationStore
from turnledger.turn.pipeline import Conversations

from tests.support import edge
from tests.support.edge import Caller
from tests.support.factories import FakeClock, make_key, raw_item

HOUR = keys.EXPIRY_BUCKET_SECONDS
TTL = 6 * HOUR
ANN = Caller(tenant="tenant-a", actor="ann")
KEY: ConversationKey = make_key("tenant-a", "conv-1")


@pytest.fixture(params=["memory", "moto", "sqlite"])
def store(request: pytest.FixtureRequest) -> ConversationStore:
    backend: ConversationStore = request.getfixturevalue(f"{request.param}_store")
    return backend


def service(store: ConversationStore, clock: FakeClock) -> Conversations:
    settings = replace(Settings(), ttl_seconds=TTL)
    return Conversations(store=store, provider=DemoProvider(), settings=settings, clock=clock.now)


def filed(store: ConversationStore) -> str:
    item = raw_item(store, KEY, keys.HEAD_SK)
    assert item is not None
    return str(item[codec.A_EXPIRY_BUCKET]).split("#")[0]


def due(clock: FakeClock) -> str:
    return str(keys.bucket_of(int(clock.now().timestamp()) + TTL))


def test_turns_hours_apart_keep_the_heads_bucket(
    store: ConversationStore, clock: FakeClock
) -> None:
    """While its bucket is ahead of the sweep, a turn does not move the head's index entry."""
    svc = service(store, clock)
    edge.turn(svc, ANN, "conv-1", TurnRequest(input="My name is Ann."))
    first = filed(store)
    assert first == due(clock)
    for _ in range(4):
        clock.advance(HOUR + 1)
        edge.turn(svc, ANN, "conv-1", TurnRequest(input="Still here."))
        assert filed(store) == first
    assert due(clock) != first


def test_a_turn_after_the_bucket_came_due_refiles_the_head(
    store: ConversationStore, clock: FakeClock
) -> None:
    """A head whose bucket has passed is filed under its new expiry by the next turn."""
    svc = service(store, clock)
    edge.turn(svc, ANN, "conv-1", TurnRequest(input="Hi."))
    for _ in range(7):  # keep it alive past its first bucket
        clock.advance(HOUR)
        edge.turn(svc, ANN, "conv-1", TurnRequest(input="Still here."))
    assert filed(store) == due(clock)


def test_the_sweep_refiles_a_head_in_use_and_purges_it_once_it_expires(
    store: ConversationStore, clock: FakeClock
) -> None:
    """The sweep passing a live head's bucket re-files it; after the real expiry it is gone."""
    svc = service(store, clock)
    edge.turn(svc, ANN, "conv-1", TurnRequest(input="My name is Ann."))
    first = int(filed(store))
    clock.advance(3 * HOUR)
    edge.turn(svc, ANN, "conv-1", TurnRequest(input="Still here."))  # expiry moves 3 h on
    assert int(filed(store)) == first

    clock.advance(TTL - 3 * HOUR + 60)  # the first bucket is due, the conversation is not
    sweeper = Sweeper(store, clock=clock.now)
    report = sweeper.expired()
    assert report.conversations_removed == 0
    assert int(filed(store)) > first
    assert edge.get(svc, ANN, "conv-1").turns == 2

    clock.advance(3 * HOUR + 60)  # now it has expired
    report = Sweeper(store, clock=clock.now).expired()
    assert report.conversations_removed == 1
    assert raw_item(store, KEY, keys.HEAD_SK) is None
