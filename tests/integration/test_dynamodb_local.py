"""What only the real engine shows: item and transaction size limits, consumed capacity,
1 MB query pages, and transaction conflicts between concurrent writers.

Runs :class:`DynamoDBConversationStore` against DynamoDB Local (S3 on moto's
server). moto does not enforce these limits the way DynamoDB does, so these
checks live here rather than in the contract suite.
"""

from __future__ import annotations

import itertools
import json
import threading
import time

import pytest
from turnledger.core.exceptions import ConversationBusy, PayloadTooLarge
from turnledger.core.models import Head
from turnledger.store.base import ContextBudget
from turnledger.store.dynamodb import DynamoDBConversationStore

from tests.support.concurrency import all_at_once
from tests.support.factories import (
    START,
    Turn,
    another_environment,
    blob_keys,
    build_turn,
    commit_turn,
    data_sort_keys,
    incompressible,
    make_key,
    raw_sort_keys,
)

pytestmark = pytest.mark.integration

KEY = make_key("tenant-int", "conv-int")
EVERYTHING = ContextBudget(max_events=10_000, max_chars=100_000_000)


def inline_content(store: DynamoDBConversationStore, tag: str) -> str:
    """Message text whose payload stays inline, as large as that allows (~64 KB), and that
    DEFLATE does not shrink much (an item of ~48 KB stored: content is stored deflated)."""
    envelope = len(json.dumps({"content": ""}, separators=(",", ":")))
    room = store.offload_threshold - envelope - 1
    return (tag + ":" + incompressible(room))[:room]


def test_an_item_over_400_kb_is_payload_too_large(
    ddb_local_store: DynamoDBConversationStore,
) -> None:
    """DynamoDB refuses an item over 400 KB; the store reports PayloadTooLarge and nothing of the
    commit is stored: no head, no event, no offloaded object."""
    pending = {
        "id": "call-1",
        "name": "lookup",
        "arguments": {"blob": "x" * 450_000},
        "requires": "approval",
        "state": "awaiting_approval",
        "idempotency_key": "idem-1",
        "arguments_sha256": "0" * 64,
    }
    huge = build_turn(KEY, None, ["q1", "b" * 100_000], pending=[pending])

    with pytest.raises(PayloadTooLarge):
        ddb_local_store.commit(KEY, expected_version=None, head=huge.head, events=huge.events)

    assert ddb_local_store.get_head(KEY) is None
    assert raw_sort_keys(ddb_local_store, KEY) == []
    assert blob_keys(ddb_local_store, KEY) == []


def test_a_commit_over_the_transaction_size_limit_is_payload_too_large(
    ddb_local_store: DynamoDBConversationStore,
) -> None:
    """A turn whose events are each under the offload threshold but together over a
    transaction's 4 MB is PayloadTooLarge (the caller's input is too large), never an
    internal error, and nothing is stored."""
    store = ddb_local_store
    first = commit_turn(store, KEY, None, ["q1"])
    bulky = build_turn(KEY, first.head, [inline_content(store, str(n)) for n in range(90)])

    with pytest.raises(PayloadTooLarge):
        store.commit(KEY, expected_version=1, head=bulky.head, events=bulky.events)

    assert store.get_head(KEY) == first.head
    assert raw_sort_keys(store, KEY) == ["E#000000000001", "HEAD"]


def test_consumed_capacity_is_metered(ddb_local_store: DynamoDBConversationStore) -> None:
    """The store's meter records the capacity DynamoDB reports: a commit consumes write units,
    more for a larger turn, and a load consumes read units."""
    store = ddb_local_store
    first = commit_turn(store, KEY, None, ["q1", "a1"])
    # Plain turns, each one conditional put (DynamoDB Local misprices transactions).
    before = store.meter.snapshot()
    small = commit_turn(store, KEY, first.head, ["q2", "a2"])
    small_cost = store.meter.since(before)

    before = store.meter.snapshot()
    commit_turn(store, KEY, small.head, ["q3", inline_content(store, "a3")])
    large_cost = store.meter.since(before)

    before = store.meter.snapshot()
    store.load(KEY, EVERYTHING)
    load_cost = store.meter.since(before)

    assert small_cost.write_units > 0
    assert large_cost.write_units > small_cost.write_units * 10
    assert load_cost.read_units > 0
    assert load_cost.write_units == 0


def test_a_history_larger_than_one_query_page_is_read_whole(
    ddb_local_store: DynamoDBConversationStore,
) -> None:
    """A transcript of several megabytes spans several 1 MB query pages; read_events and load
    (with a budget that fits it) return every event, in order."""
    store = ddb_local_store
    committed: list[Turn] = []
    head: Head | None = None
    for turn_number in range(7):
        turn = commit_turn(
            store, KEY, head, [inline_content(store, f"{turn_number}.{n}") for n in range(10)]
        )
        committed.append(turn)
        head = turn.head
    assert head is not None
    every = [event for turn in committed for event in turn.events]
    assert len(every) == 70

    before = store.meter.snapshot()
    assert store.read_events(KEY, head, after=0, limit=1000) == every
    read_pages = store.meter.since(before).read_calls

    # From an environment that kept nothing of it (this one kept what it wrote).
    fresh = another_environment(store)
    before = fresh.meter.snapshot()
    snapshot = fresh.load(KEY, EVERYTHING)
    load_pages = fresh.meter.since(before).read_calls

    assert snapshot.events == every
    assert snapshot.from_start
    # ~3.3 MB of items stored: the engine really cut the answer into 1 MB pages (the load reads
    # turn items of up to 400 KB, several events each: fewer, larger pages).
    assert read_pages >= 3
    assert load_pages >= 2


@pytest.mark.parametrize("round_number", range(3))
def test_concurrent_commits_lose_as_conversation_busy(
    ddb_local_store: DynamoDBConversationStore, round_number: int
) -> None:
    """Commits racing on one version against the real engine, whether they lose on a failed
    condition or on a transaction conflict, raise ConversationBusy (never an internal error),
    and exactly one lands whole."""
    store = ddb_local_store
    key = make_key("tenant-int", f"race-{round_number}")
    first = commit_turn(store, key, None, ["q1"])
    contenders = [
        build_turn(key, first.head, [f"q2 from {n}", f"a2 from {n}", f"b2 from {n}"])
        for n in range(8)
    ]

    def race(index: int) -> str:
        turn = contenders[index]
        try:
            store.commit(key, expected_version=1, head=turn.head, events=turn.events)
        except ConversationBusy:
            return "busy"
        return "won"

    outcomes = all_at_once(len(contenders), race)

    assert sorted(outcomes) == ["busy"] * (len(contenders) - 1) + ["won"]
    winner = contenders[outcomes.index("won")]
    assert store.get_head(key) == winner.head
    assert store.load(key, EVERYTHING).events == first.events + winner.events


def test_clear_always_wins_against_turns_committing_on_threads(
    ddb_local_store: DynamoDBConversationStore,
) -> None:
    """Four threads commit turns in a loop, each on the head it just read, while clears run
    one after another: every clear succeeds (never ConversationBusy), turns keep landing
    between them, and after each clear the conversation holds only turns that read it after
    the clear began, never an older one."""
    store = ddb_local_store
    key = make_key("tenant-int", "clear-race")
    counter = itertools.count(1)
    stop = threading.Event()
    landed: list[int] = []
    errors: list[BaseException] = []

    def writer() -> None:
        while not stop.is_set():
            try:
                current = store.get_head(key)
                number = next(counter)  # taken after the read: later than any clear it saw
                turn = build_turn(key, current, [f"{number}", f"answer {number}"])
                store.commit(
                    key, expected_version=turn.expected_version, head=turn.head, events=turn.events
                )
            except ConversationBusy:
                continue
            except BaseException as exc:
                errors.append(exc)
                return
            landed.append(number)

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(12):
            while len(landed) < 3:
                time.sleep(0.005)  # let turns land before each clear
            before = next(counter)
            landed.clear()
            store.clear(key, START)
            snapshot = store.load(key, EVERYTHING)
            numbers = [
                int(e.payload["content"]) for e in snapshot.events if e.kind.value == "user_message"
            ]
            assert all(n > before for n in numbers), (before, numbers)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert errors == []
    store.clear(key, START)
    assert data_sort_keys(store, key) == []
