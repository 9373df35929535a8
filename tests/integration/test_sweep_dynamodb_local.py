"""The sweep on the real engine (DynamoDB Local): real GSIs, conditions and consumed capacity.

DynamoDB Local runs TTL in the background against the real clock, like the
service: a head whose ``expires_at`` is past in real time may vanish at any
moment. These tests put the injected clock three days ahead of real time, so
the heads they expire are expired for the sweep and not yet for DynamoDB.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from turnledger.ops.sweep import Sweeper
from turnledger.store import keys
from turnledger.store.dynamodb import DynamoDBConversationStore
from turnledger.store.indexes import CURSOR_PK, CURSOR_SK

from tests.functional.test_sweep import HOUR, TTL, assert_gone, assert_intact, key_of, seed
from tests.support.concurrency import all_at_once
from tests.support.factories import (
    FakeClock,
    Turn,
    commit_turn,
    delete_raw_item,
    raw_sort_keys,
)

pytestmark = pytest.mark.integration

#: The injected now: on an hour boundary, three days ahead of the real clock.
NOW = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(days=3)
EPOCH = int(NOW.timestamp())


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW)


@pytest.fixture
def store(ddb_local_store: DynamoDBConversationStore) -> DynamoDBConversationStore:
    return ddb_local_store


def sweep(store: DynamoDBConversationStore, clock: FakeClock) -> Any:
    return Sweeper(store, clock=clock.now).expired()


def test_scheduled_sweep_on_the_real_indexes(
    store: DynamoDBConversationStore, clock: FakeClock
) -> None:
    """Expired heads go with their events and objects; reads are metered; the cursor is stored."""
    expired = [key_of(n) for n in range(1, 4)]
    for n, key in enumerate(expired):
        seed(store, key, expires_at=EPOCH - n * HOUR - 5)
    live = key_of(10)
    kept = seed(store, live, expires_at=EPOCH + HOUR)

    report = sweep(store, clock)

    assert (report.conversations_removed, report.events_removed, report.objects_removed) == (
        3,
        12,
        3,
    )
    assert report.read_units > 0
    for key in expired:
        assert_gone(store, key)
    assert_intact(store, live, kept)
    cursor = store.client.get_item(
        TableName=store.table_name,
        Key={"pk": {"S": CURSOR_PK}, "sk": {"S": CURSOR_SK}},
        ConsistentRead=True,
    )["Item"]
    assert cursor == {
        "pk": {"S": CURSOR_PK},
        "sk": {"S": CURSOR_SK},
        "v": {"N": "1"},
        "bucket": {"N": str(EPOCH // HOUR - 1)},
    }


def test_the_sweep_reads_what_expired_not_the_table(
    store: DynamoDBConversationStore, clock: FakeClock
) -> None:
    """Four times the live conversations leave the sweep's read units unchanged (no scan)."""
    store.advance_sweep_cursor(EPOCH // HOUR - 1)

    def run(first: int, live: int) -> float:
        for n in range(first, first + live):
            seed(store, key_of(n), expires_at=EPOCH + 30 * HOUR, turns=1, big=False)
        # Conversations of their own (a purged one leaves gravestones for a day).
        expired = [key_of(first + n, "expired") for n in range(2)]
        for key in expired:
            seed(store, key, expires_at=EPOCH - 60, turns=1, big=False)
        report = sweep(store, clock)
        assert report.conversations_removed == 2
        return float(report.read_units)

    small = run(100, 10)
    large = run(200, 30)  # 30 more live conversations on top of the first 10
    assert small > 0
    assert large == small


def test_cursor_writes_only_move_forward(store: DynamoDBConversationStore) -> None:
    assert store.read_sweep_cursor() is None
    assert store.advance_sweep_cursor(100)
    assert not store.advance_sweep_cursor(99)
    assert not store.advance_sweep_cursor(100)
    assert store.advance_sweep_cursor(101)
    assert store.read_sweep_cursor() == 101
    store.client.put_item(
        TableName=store.table_name,
        Item={
            "pk": {"S": CURSOR_PK},
            "sk": {"S": CURSOR_SK},
            "v": {"N": "2"},
            "bucket": {"N": "5"},
        },
    )
    assert store.read_sweep_cursor() is None, "an unknown cursor version is not trusted"
    assert not store.advance_sweep_cursor(200), "nor overwritten"


def test_concurrent_sweeps_on_the_real_engine(
    store: DynamoDBConversationStore, clock: FakeClock
) -> None:
    expired = [key_of(n) for n in range(1, 13)]
    for n, key in enumerate(expired):
        seed(store, key, expires_at=EPOCH - (n % 2) * HOUR - 1, turns=1)
    reports = all_at_once(3, lambda _: sweep(store, clock))

    assert all(r.complete for r in reports)
    assert sum(r.conversations_removed for r in reports) == len(expired)
    assert sum(r.events_removed for r in reports) == 2 * len(expired)
    assert sum(r.objects_removed for r in reports) == len(expired)
    for key in expired:
        assert_gone(store, key)


def test_reclaim_after_ttl_keeps_the_new_life(
    store: DynamoDBConversationStore, clock: FakeClock
) -> None:
    """Conditional deletes on the real engine: a new life's items and objects survive."""
    key = key_of(1)
    seed(store, key, expires_at=EPOCH - 10, turns=3)
    delete_raw_item(store, key, keys.HEAD_SK)
    new_life: list[Turn] = [
        commit_turn(store, key, None, ["again"], ttl_seconds=TTL, expires_at=EPOCH + TTL)
    ]

    report = Sweeper(store, clock=clock.now).reclaim([key])

    # The new life's turn item replaced the old one of sequences 1..2: 4 events are left.
    assert (report.events_removed, report.objects_removed) == (4, 1)
    assert_intact(store, key, new_life)
    assert raw_sort_keys(store, key) == [keys.event_sort_key(1), keys.HEAD_SK]


def test_erasure_pages_through_the_tenant_index(
    store: DynamoDBConversationStore, clock: FakeClock
) -> None:
    """Pages of two keys, deleting as it goes: every conversation of the tenant is erased."""
    mine = [key_of(n, "acme") for n in range(1, 8)]
    for key in mine:
        seed(store, key, expires_at=None, turns=1)
    theirs = key_of(1, "globex")
    kept = seed(store, theirs, expires_at=None, turns=1)
    store.index_page_size = 2

    report = Sweeper(store, clock=clock.now).erase("acme")

    assert report.complete
    assert (report.conversations_removed, report.events_removed, report.objects_removed) == (
        7,
        14,
        7,
    )
    assert report.read_units > 0
    for key in mine:
        assert_gone(store, key)
    assert_intact(store, theirs, kept)
