"""Pins of a user (:mod:`turnledger.store.user_pins`) on every backend: kept in the user's
memory partition beside the records, read with them in one query, removed with a record of
who removed them, and found by tenant erasure. Runs over the ``store`` fixture's backends;
each test's docstring states the invariant it protects.
"""

from __future__ import annotations

from datetime import timedelta

from turnledger.store.base import ConversationStore
from turnledger.store.memories import MemoryBook, MemoryRecord, memory_users, new_memory_id
from turnledger.store.user_pins import (
    UserPin,
    UserPinBook,
    UserPinRemoval,
    pins_by_id,
    user_memory,
)

from tests.support.factories import START


def pin(pin_id: str, text: str, seconds: int = 0) -> UserPin:
    return UserPin(
        id=pin_id, kind="fact", text=text, author="op", added_at=START + timedelta(seconds=seconds)
    )


def record(text: str) -> MemoryRecord:
    return MemoryRecord(id=new_memory_id(), text=text, created_at=START, updated_at=START)


def test_records_and_active_pins_come_in_one_query(store: ConversationStore) -> None:
    """A turn reads the user's records and active pins with one query, each kind apart;
    the records alone never include a pin, removed pins are not active, and another user's
    or tenant's pins are never among them."""
    book, memory = UserPinBook(store, "acme", "ann"), MemoryBook(store, "acme", "ann")
    kept = record("I like tea.")
    memory.put(kept, first=True)
    first, second, gone = (
        pin("pin_a1", "Minor.", 1),
        pin("pin_b2", "Portuguese.", 2),
        pin("pin_c3", "Old.", 3),
    )
    for each in (second, first, gone):
        book.add(each)
    UserPinBook(store, "acme", "bob").add(pin("pin_d4", "Bob's."))
    UserPinBook(store, "globex", "ann").add(pin("pin_e5", "Other tenant."))
    book.remove(UserPinRemoval(pin=gone, removed_by="op2", removed_at=START, reason="wrong"))
    queries = store.meter.snapshot()
    records, pins = user_memory(store, "acme", "ann", consistent=False)
    assert store.meter.since(queries).read_calls == 1
    assert (records, pins) == ([kept], [first, second])
    assert memory.records() == [kept]
    assert book.active() == [first, second]
    [removal] = book.removals()
    assert (removal.pin, removal.removed_by, removal.reason) == (gone, "op2", "wrong")
    # A rebuild finds every pin the user ever had, by id.
    assert pins_by_id(store, "acme", "ann") == {p.id: p for p in (first, second, gone)}


def test_deleting_the_records_keeps_the_pins_and_tenant_erasure_finds_them(
    store: ConversationStore,
) -> None:
    """``DELETE /v1/memories`` leaves the user's pins and the user's entry (tenant erasure
    must still find the partition); clearing the partition removes the pins too."""
    book, memory = UserPinBook(store, "acme", "ann"), MemoryBook(store, "acme", "ann")
    memory.put(record("One."), first=True)
    book.add(pin("pin_a1", "Minor."))
    assert memory.clear() == 1
    assert [p.id for p in book.active()] == ["pin_a1"]
    assert memory_users(store, "acme") == ["ann"]
    store.clear(book.key, START + timedelta(seconds=1))
    assert book.active() == [] and book.removals() == []
