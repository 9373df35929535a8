"""The index and sweep primitives of the store contract, on every backend.

What the sweep and tenant erasure read and write beyond turns: the
``by-expiry`` and ``by-tenant`` indexes, the event stamps and the delete that
holds only for the life read, the raw head, and the sweep cursor. Runs over
the ``store`` fixture's backends (memory, moto, DynamoDB Local, SQLite); each
test's docstring states the invariant it protects.
"""

from __future__ import annotations

from datetime import timedelta

from turnledger.core.models import ConversationKey, ConversationStatus
from turnledger.store import codec, keys, slots
from turnledger.store.base import ContextBudget, ConversationStore
from turnledger.store.indexes import CURSOR_PK, CURSOR_SK, EventStamp

from tests.support.factories import (
    START,
    Turn,
    commit_turn,
    corrupt,
    make_key,
    put_raw_item,
    raw_item,
)

EPOCH = int(START.timestamp())
HOUR = keys.EXPIRY_BUCKET_SECONDS
EVERYTHING = ContextBudget(max_events=10_000, max_chars=100_000_000)


def expiring(store: ConversationStore, key: ConversationKey, expires_at: int | None) -> Turn:
    """One turn of ``key`` whose head expires at ``expires_at`` (``None``: never)."""
    return commit_turn(
        store,
        key,
        None,
        ["q", "a"],
        ttl_seconds=60 if expires_at is not None else 0,
        expires_at=expires_at,
    )


def filed_under(key: ConversationKey, expires_at: int) -> tuple[int, int]:
    """The bucket and shard a head of ``key`` expiring at ``expires_at`` is filed under."""
    partition = keys.expiry_bucket(keys.bucket_of(expires_at), keys.partition_key(key))
    bucket, shard = partition.split("#")
    return int(bucket), int(shard)


def everything_in(store: ConversationStore, bucket: int) -> set[ConversationKey]:
    return {k for shard in range(keys.EXPIRY_SHARDS) for k in store.expiring_in(bucket, shard)}


# --- by-expiry ----------------------------------------------------------------------------


def test_expiring_in_lists_the_heads_filed_under_a_bucket(store: ConversationStore) -> None:
    """Each head that can expire is listed under exactly the bucket and shard of its expiry,
    once (its events never are); heads that never expire are listed nowhere."""
    due = EPOCH + 2 * HOUR + 5
    soon = [make_key("tenant-a", f"soon-{n}") for n in range(6)]
    later = make_key("tenant-b", "later")
    forever = make_key("tenant-a", "forever")
    for key in soon:
        expiring(store, key, due)
    expiring(store, later, due + HOUR)
    expiring(store, forever, None)

    bucket = keys.bucket_of(due)
    for key in soon:
        listed_bucket, shard = filed_under(key, due)
        assert listed_bucket == bucket
        assert list(store.expiring_in(bucket, shard)).count(key) == 1
    assert everything_in(store, bucket) == set(soon)
    assert everything_in(store, bucket + 1) == {later}
    assert everything_in(store, bucket - 1) == set()


def test_expiring_in_pages_and_survives_deletes_while_listing(store: ConversationStore) -> None:
    """Listing reads the index in pages; purging each conversation as it is listed never
    makes a later page skip one."""
    due = EPOCH + HOUR
    keys_in = [make_key("tenant-a", f"c-{n:02d}") for n in range(14)]
    for key in keys_in:
        expiring(store, key, due)
    store.index_page_size = 2
    bucket = keys.bucket_of(due)

    seen: list[ConversationKey] = []
    for shard in range(keys.EXPIRY_SHARDS):
        for key in store.expiring_in(bucket, shard):
            seen.append(key)
            store.clear(key, START)

    assert sorted(seen, key=str) == sorted(keys_in, key=str)
    assert everything_in(store, bucket) == set()


def test_a_refiled_head_moves_to_its_new_bucket(store: ConversationStore) -> None:
    """refile moves a head's entry to the bucket of its current expiry, and only there."""
    first_due = EPOCH + HOUR
    key = make_key()
    turn = expiring(store, key, first_due)
    # A later turn keeps the head's bucket while it is ahead of the sweep.
    later = turn.head.model_copy(
        update={
            "expires_at": first_due + 5 * HOUR,
            "expiry_bucket": keys.bucket_of(first_due),
            "version": turn.head.version + 1,
        }
    )
    store.commit(key, expected_version=turn.head.version, head=later, events=[])
    head = store.get_head(key)
    assert head is not None
    assert everything_in(store, keys.bucket_of(first_due)) == {key}

    assert store.refile(key, head)

    assert everything_in(store, keys.bucket_of(first_due)) == set()
    assert everything_in(store, keys.bucket_of(first_due + 5 * HOUR)) == {key}


# --- by-tenant ----------------------------------------------------------------------------


def test_of_tenant_lists_every_conversation_of_one_tenant(store: ConversationStore) -> None:
    """Every conversation of the tenant with a head is listed once, tombstones and damaged
    heads included; tenants that share a prefix (or need encoding) are never mixed."""
    mine = [make_key("acme", f"c-{n}") for n in range(5)]
    for n, key in enumerate(mine):
        expiring(store, key, EPOCH + HOUR if n % 2 else None)
    tombstoned = mine[3]
    head = store.get_head(tombstoned)
    assert head is not None
    put_raw_item(
        store,
        codec.encode_head(
            tombstoned,
            head.model_copy(update={"status": ConversationStatus.CLEARED, "version": 9}),
        ),
    )
    corrupt(store, mine[4], keys.HEAD_SK, d="{not json")
    for tenant in ("acme2", "acm", "acme/x", "acme#C#c-1"):
        expiring(store, make_key(tenant, "c-1"), None)
    store.index_page_size = 2

    listed = list(store.of_tenant("acme"))

    assert sorted(listed, key=str) == sorted(mine, key=str)
    assert list(store.of_tenant("acme#C#c-1")) == [make_key("acme#C#c-1", "c-1")]
    assert list(store.of_tenant("nobody")) == []


def test_of_tenant_drops_what_was_cleared(store: ConversationStore) -> None:
    """A cleared conversation is no longer listed: erasure that resumes does not revisit it."""
    keep, gone = make_key("acme", "keep"), make_key("acme", "gone")
    expiring(store, keep, None)
    expiring(store, gone, EPOCH + HOUR)

    store.clear(gone, START)

    assert list(store.of_tenant("acme")) == [keep]


# --- raw head and event stamps ------------------------------------------------------------


def test_head_item_is_the_raw_head(store: ConversationStore) -> None:
    """head_item returns the stored head item as is, even when it cannot be decoded."""
    key = make_key()
    assert store.head_item(key) is None
    expiring(store, key, EPOCH + HOUR)
    corrupt(store, key, keys.HEAD_SK, v=99)

    assert store.head_item(key) == raw_item(store, key, keys.HEAD_SK)


def _one_event_per_item(store: ConversationStore, key: ConversationKey, texts: list[str]) -> Turn:
    """Commit each of ``texts`` alone: one event item each (a commit of several events writes
    one turn item holding them all)."""
    turn: Turn | None = None
    for text in texts:
        turn = commit_turn(store, key, turn.head if turn else None, [text])
    assert turn is not None
    return turn


def test_a_turn_item_is_stamped_with_its_event_count(store: ConversationStore) -> None:
    """A commit of several events is one item, stamped with how many it holds."""
    key = make_key()
    first = commit_turn(store, key, None, ["a", "b", "c"])
    assert store.event_stamps(key) == [EventStamp(keys.event_sort_key(1), first.head.gen, 3)]


def test_event_stamps_list_every_event_item_with_its_life(store: ConversationStore) -> None:
    """Every event item is stamped with its sort key and ``g``, ascending and across pages;
    the head and items of other kinds are not events; an item without ``g`` has ``None``."""
    key = make_key()
    first = _one_event_per_item(store, key, [f"m{n}" for n in range(5)])
    item = raw_item(store, key, keys.event_sort_key(2))
    assert item is not None
    del item[codec.A_GEN]
    put_raw_item(store, item)
    put_raw_item(store, {codec.A_PK: keys.partition_key(key), codec.A_SK: "I#k", codec.A_GEN: "x"})

    stamps = store.event_stamps(key)

    gen = first.head.gen
    assert stamps == [
        EventStamp(keys.event_sort_key(1), gen),
        EventStamp(keys.event_sort_key(2), None),
        *(EventStamp(keys.event_sort_key(n), gen) for n in range(3, 6)),
    ]
    assert store.event_stamps(make_key("tenant-a", "absent")) == []


def test_delete_event_holds_only_for_the_life_read(store: ConversationStore) -> None:
    """delete_event deletes an item only while its ``g`` is the one stamped: an item another
    life overwrote since, or one already gone, stays as it is and answers False."""
    key = make_key()
    old = _one_event_per_item(store, key, ["old 1", "old 2"])
    stamps = store.event_stamps(key)
    # The old items go (written longer ago than any request runs: no gravestone stays at
    # their slots, docs/STORAGE.md); a new life rewrites sequence 1.
    store.clear(key, START + timedelta(seconds=slots.LATE_TURN_SECONDS + 1))
    new = commit_turn(store, key, None, ["new 1"])

    assert not store.delete_event(key, stamps[0]), "overwritten by the new life"
    assert not store.delete_event(key, stamps[1]), "gone already"
    assert store.load(key, EVERYTHING).events == new.events
    assert stamps[0].gen == old.head.gen

    again = store.event_stamps(key)
    assert store.delete_event(key, again[0])
    assert raw_item(store, key, keys.event_sort_key(1)) is None


def test_delete_event_of_an_item_without_life(store: ConversationStore) -> None:
    """A stamp without ``g`` deletes only an item that has none."""
    key = make_key()
    _one_event_per_item(store, key, ["a", "b"])
    item = raw_item(store, key, keys.event_sort_key(1))
    assert item is not None
    del item[codec.A_GEN]
    put_raw_item(store, item)

    assert not store.delete_event(key, EventStamp(keys.event_sort_key(2), None))
    assert store.delete_event(key, EventStamp(keys.event_sort_key(1), None))
    assert raw_item(store, key, keys.event_sort_key(1)) is None
    assert raw_item(store, key, keys.event_sort_key(2)) is not None


# --- the sweep cursor ---------------------------------------------------------------------


def test_the_sweep_cursor_only_moves_forward(store: ConversationStore) -> None:
    """No cursor at first; it moves only forward, and is listed by neither index."""
    assert store.read_sweep_cursor() is None
    assert store.advance_sweep_cursor(100)
    assert not store.advance_sweep_cursor(99)
    assert not store.advance_sweep_cursor(100)
    assert store.advance_sweep_cursor(101)
    assert store.read_sweep_cursor() == 101
    assert everything_in(store, 101) == set()


def test_the_sweeps_two_passes_keep_cursors_of_their_own(store: ConversationStore) -> None:
    """The ``by-wait`` pass's cursor and the ``by-expiry`` pass's move apart."""
    assert store.read_sweep_cursor("waits") is None
    assert store.advance_sweep_cursor(300, "waits")
    assert store.read_sweep_cursor("expiry") is None
    assert store.advance_sweep_cursor(100)
    assert not store.advance_sweep_cursor(299, "waits")
    assert (store.read_sweep_cursor(), store.read_sweep_cursor("waits")) == (100, 300)


def test_a_cursor_of_an_unknown_schema_is_neither_trusted_nor_overwritten(
    store: ConversationStore,
) -> None:
    put_raw_item(store, {codec.A_PK: CURSOR_PK, codec.A_SK: CURSOR_SK, "v": 2, "bucket": 5})

    assert store.read_sweep_cursor() is None
    assert not store.advance_sweep_cursor(200)


def test_index_entries_follow_the_head_not_the_clock(store: ConversationStore) -> None:
    """An expired head stays listed until it is purged (expiry is the sweep's decision)."""
    key = make_key()
    expiring(store, key, EPOCH - 3 * HOUR)
    bucket, shard = filed_under(key, EPOCH - 3 * HOUR)

    assert list(store.expiring_in(bucket, shard)) == [key]
    store.clear(key, START)
    assert list(store.expiring_in(bucket, shard)) == []
