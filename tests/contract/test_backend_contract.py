"""The backend's contract: each condition of each primitive of :mod:`turnledger.store.backend`.

Beside the scenario suite (``test_store_contract.py``: what a store does), this suite
checks the seven primitives a backend implements (four reads; :meth:`_write`,
:meth:`_transact` and :meth:`_write_batch`), each condition (:class:`Absent`,
:class:`Unchanged` and the head's :func:`head_is`, :class:`SlotFree`,
:class:`Replaceable`, :class:`CursorForward`) under the writes that use it, on raw
items, over the ``store`` fixture's backends (memory, moto, DynamoDB Local, SQLite,
sealed): so the memory and SQLite backends' :meth:`Condition.holds` and the DynamoDB
backend's ``ConditionExpression`` are held to the same answers. Every check is a plain
function of a fresh store (:data:`CHECKS`), so the last test can run the whole suite
against a backend that breaks one condition and show that the suite catches it. Each
check's docstring states the condition it protects.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest
from turnledger.core.exceptions import ConversationBusy
from turnledger.store import codec, keys, records
from turnledger.store.backend import (
    Absent,
    Check,
    Condition,
    ConditionFailed,
    Delete,
    Put,
    SlotFree,
    Unchanged,
    Update,
    Write,
    head_is,
)
from turnledger.store.base import ConversationStore
from turnledger.store.codec import Item
from turnledger.store.indexes import (
    A_BUCKET,
    CURSOR_PK,
    CURSOR_SCHEMA_VERSION,
    CursorForward,
    cursor_item,
    cursor_sort_key,
)
from turnledger.store.memory import MemoryConversationStore
from turnledger.store.records import Replaceable

PK = "T#acme#C#backend"
OTHER_PK = "T#acme#C#backend-2"


def head(version: int = 1, gen: str = "g1", **extra: Any) -> Item:
    """A ``HEAD`` item as the conditions see it: version, life, maybe a fence."""
    identity = {codec.A_VERSION: version, codec.A_GEN: gen}
    return {codec.A_PK: PK, codec.A_SK: keys.HEAD_SK} | identity | extra


def slot(sequence: int, gen: str, *, count: int, **extra: Any) -> Item:
    """An event item (``count`` events; 0: a marker) of life ``gen`` at ``sequence``."""
    return {
        codec.A_PK: PK,
        codec.A_SK: keys.event_sort_key(sequence),
        codec.A_GEN: gen,
        codec.A_COUNT: count,
    } | extra


def put(store: ConversationStore, *items: Item) -> None:
    store._put_items(list(items))


def stored(store: ConversationStore, sk: str, pk: str = PK) -> Item | None:
    return store._get_item(pk, sk)


# --- reads --------------------------------------------------------------------------------


def check_get_item_reads_what_was_put(store: ConversationStore) -> None:
    """``_get_item``: the item at the key as put, or ``None`` when there is none."""
    assert stored(store, "S#a") is None
    put(store, {codec.A_PK: PK, codec.A_SK: "S#a", "x": "one", "n": 2})
    assert stored(store, "S#a") == {codec.A_PK: PK, codec.A_SK: "S#a", "x": "one", "n": 2}


def check_query_bounds_order_and_cursor(store: ConversationStore) -> None:
    """``_query``: both bounds included, either order, at most ``limit`` items a page, a
    cursor that resumes after the page's last item even when it was deleted since, and
    nothing of another partition."""
    put(store, *[{codec.A_PK: PK, codec.A_SK: f"S#{n}"} for n in range(6)])
    put(store, {codec.A_PK: OTHER_PK, codec.A_SK: "S#2"})
    page = store._query(PK, lower="S#1", upper="S#4", descending=False, limit=2, cursor=None)
    assert [i[codec.A_SK] for i in page.items] == ["S#1", "S#2"]
    assert page.cursor is not None
    store._write_batch([Delete(PK, "S#2")])
    rest = store._query(PK, lower="S#1", upper="S#4", descending=False, limit=5, cursor=page.cursor)
    assert [i[codec.A_SK] for i in rest.items] == ["S#3", "S#4"]
    assert rest.cursor is None
    down = store._query(PK, lower=None, upper="S#3", descending=True, limit=10, cursor=None)
    assert [i[codec.A_SK] for i in down.items] == ["S#3", "S#1", "S#0"]


def check_query_keys_only_keeps_life_and_count(store: ConversationStore) -> None:
    """``_query(keys_only=True)``: each item has at least ``pk``, ``sk``, ``g`` and ``n``."""
    put(store, slot(1, "g1", count=3, d="body"))
    (item,) = store._query(
        PK, lower=None, upper=None, descending=False, limit=5, cursor=None, keys_only=True
    ).items
    assert {n: item[n] for n in (codec.A_PK, codec.A_SK, codec.A_GEN, codec.A_COUNT)} == {
        codec.A_PK: PK,
        codec.A_SK: keys.event_sort_key(1),
        codec.A_GEN: "g1",
        codec.A_COUNT: 3,
    }


# --- _write: each kind of write, unconditional ----------------------------------------------


def _writes(store: ConversationStore, write: Put | Update | Delete) -> bool:
    """Whether ``write`` landed (``False``: its condition failed, nothing was written,
    and the refusal named the stored item or nothing)."""
    before = stored(store, *reversed(write.key))
    try:
        store._write(write)
    except ConditionFailed as refused:
        assert refused.stored in (None, before)
        assert stored(store, *reversed(write.key)) == before
        return False
    return True


def check_write_put_replaces_whole(store: ConversationStore) -> None:
    """``_write(Put)``: the item is put whole, replacing every attribute of what was there."""
    put(store, {codec.A_PK: PK, codec.A_SK: "S#a", "x": 1, "y": 2})
    assert store._write(Put({codec.A_PK: PK, codec.A_SK: "S#a", "x": 3})) is None
    assert stored(store, "S#a") == {codec.A_PK: PK, codec.A_SK: "S#a", "x": 3}


def check_write_update_sets_keeps_and_creates(store: ConversationStore) -> None:
    """``_write(Update)``: sets the attributes and keeps the others; creates an absent item
    with just its keys and the attributes; with ``returning``, returns the item as updated
    (else ``None``)."""
    assert store._write(Update(PK, "I#x", {"a": 1})) is None
    assert stored(store, "I#x") == {codec.A_PK: PK, codec.A_SK: "I#x", "a": 1}
    updated = store._write(Update(PK, "I#x", {"b": "two"}, returning=True))
    assert updated == {codec.A_PK: PK, codec.A_SK: "I#x", "a": 1, "b": "two"}
    assert stored(store, "I#x") == updated


def check_write_delete_absent_is_fine(store: ConversationStore) -> None:
    """``_write(Delete)``: removes the item; an absent one is fine when unconditional."""
    put(store, {codec.A_PK: PK, codec.A_SK: "S#a"})
    store._write(Delete(PK, "S#a"))
    store._write(Delete(PK, "S#a"))
    assert stored(store, "S#a") is None


# --- _write: each condition ----------------------------------------------------------------


def check_condition_absent(store: ConversationStore) -> None:
    """:class:`Absent`: a put lands where nothing is stored, never over an item."""
    assert _writes(store, Put({codec.A_PK: PK, codec.A_SK: "S#a", "x": 1}, Absent()))
    assert not _writes(store, Put({codec.A_PK: PK, codec.A_SK: "S#a", "x": 2}, Absent()))
    assert stored(store, "S#a") == {codec.A_PK: PK, codec.A_SK: "S#a", "x": 1}


def check_condition_unchanged(store: ConversationStore) -> None:
    """:class:`Unchanged`: the item exists and each expected attribute still holds its
    value (``None``: absent); an update on it keeps the item's other attributes and never
    creates an item; a delete on it (a sweep's: the item's life still ``g``) deletes only
    that item."""
    put(store, {codec.A_PK: PK, codec.A_SK: "S#x", "a": "one", "k": "keep"})
    assert not _writes(store, Update(PK, "S#x", {"a": "two"}, Unchanged({"a": "changed"})))
    assert not _writes(store, Update(PK, "S#x", {"a": "two"}, Unchanged({"k": None})))
    assert not _writes(store, Update(PK, "S#absent", {"a": "two"}, Unchanged({"a": None})))
    assert stored(store, "S#absent") is None
    assert _writes(store, Update(PK, "S#x", {"a": "two"}, Unchanged({"a": "one", "b": None})))
    assert stored(store, "S#x") == {codec.A_PK: PK, codec.A_SK: "S#x", "a": "two", "k": "keep"}
    put(store, slot(1, "g1", count=1), {codec.A_PK: PK, codec.A_SK: "S#y"})
    event = keys.event_sort_key(1)
    assert not _writes(store, Delete(PK, event, Unchanged({codec.A_GEN: "g2"})))
    assert not _writes(store, Delete(PK, event, Unchanged({codec.A_GEN: None})))
    assert _writes(store, Delete(PK, event, Unchanged({codec.A_GEN: "g1"})))
    assert not _writes(store, Delete(PK, event, Unchanged({codec.A_GEN: "g1"})))
    assert not _writes(store, Delete(PK, "S#y", Unchanged({codec.A_GEN: "g1"})))
    assert _writes(store, Delete(PK, "S#y", Unchanged({codec.A_GEN: None})))


def check_head_is_compares_version_life_and_fence(store: ConversationStore) -> None:
    """:func:`head_is` (``_replace_head``): a head is put only when the stored one has the
    expected ``ver``, ``g`` and ``fx``, each equal or absent in both; ``None`` expects no
    head."""
    assert store._replace_head(head(1), None)
    assert not store._replace_head(head(2), None)
    assert not store._replace_head(head(2), {codec.A_VERSION: 2, codec.A_GEN: "g1"})
    assert not store._replace_head(head(2), {codec.A_VERSION: 1, codec.A_GEN: "g2"})
    assert not store._replace_head(head(2), head(1, fx="t"))
    assert store._replace_head(head(2, fx="t"), head(1))
    assert not store._replace_head(head(3), head(2))  # the fence is part of the identity
    assert store._replace_head(head(3), head(2, fx="t"))
    assert stored(store, keys.HEAD_SK) == head(3)


def check_head_is_on_delete(store: ConversationStore) -> None:
    """:func:`head_is` (``_delete_head``): the head is deleted only while still ``expected``."""
    put(store, head(2, x="y"))
    assert not store._delete_head(PK, head(1))
    assert not store._delete_head(PK, head(2, gen="g2"))
    assert store._delete_head(PK, head(2))
    assert stored(store, keys.HEAD_SK) is None
    assert not store._delete_head(PK, head(2))


def check_fence_head_only_an_unfenced_existing_head(store: ConversationStore) -> None:
    """``_fence_head`` (an update on :class:`Unchanged` ``fx`` absent, returning): sets
    ``fx`` on a head without one and returns it as fenced; a fenced head or no head is
    left alone (no item is created)."""
    assert store._fence_head(PK, "t1") is None
    assert stored(store, keys.HEAD_SK) is None
    put(store, head(1, x="keep"))
    assert store._fence_head(PK, "t1") == head(1, x="keep", fx="t1")
    assert store._fence_head(PK, "t2") is None
    assert stored(store, keys.HEAD_SK) == head(1, x="keep", fx="t1")


def _lands(store: ConversationStore, item: Item, marker_version: int | None) -> bool:
    try:
        store._put_turn(item, marker_version)
    except ConversationBusy:
        return False
    return True


def check_slot_free_when_nothing_is_there(store: ConversationStore) -> None:
    """:class:`SlotFree` (``_put_turn``): a turn item lands at an empty slot."""
    assert _lands(store, slot(1, "g1", count=1), None)
    assert stored(store, keys.event_sort_key(1)) == slot(1, "g1", count=1)


def check_slot_taken_by_an_event_item(store: ConversationStore) -> None:
    """:class:`SlotFree`: an event item of this life or another holds its slot: busy,
    nothing written."""
    put(store, slot(1, "g1", count=1), slot(2, "g0", count=2))
    assert not _lands(store, slot(1, "g1", count=1, x="late"), None)
    assert not _lands(store, slot(2, "g1", count=1), 1)
    assert stored(store, keys.event_sort_key(1)) == slot(1, "g1", count=1)


def check_slot_free_over_another_lifes_gravestone(store: ConversationStore) -> None:
    """:class:`SlotFree`: another life's gravestone (a marker with an expiry) frees its
    slot for this life."""
    put(store, slot(1, "g0", count=0, expires_at=1))
    assert _lands(store, slot(1, "g1", count=1), None)


def check_slot_taken_by_another_lifes_marker(store: ConversationStore) -> None:
    """:class:`SlotFree`: another life's marker that is no gravestone holds its slot."""
    put(store, slot(1, "g0", count=0, ver=3))
    assert not _lands(store, slot(1, "g1", count=1), 3)


def check_slot_free_over_this_lifes_marker_of_the_version_read(store: ConversationStore) -> None:
    """:class:`SlotFree`: this life's marker of the version the turn read is replaced; of
    another version (or when the turn read none) it holds the slot."""
    put(store, slot(1, "g1", count=0, ver=4))
    assert not _lands(store, slot(1, "g1", count=1), None)
    assert not _lands(store, slot(1, "g1", count=1), 3)
    assert _lands(store, slot(1, "g1", count=1), 4)


def check_slot_taken_by_this_lifes_gravestone(store: ConversationStore) -> None:
    """:class:`SlotFree`: this life's own gravestone holds its slot against late turns,
    whatever the version."""
    put(store, slot(1, "g1", count=0, ver=4, expires_at=1))
    assert not _lands(store, slot(1, "g1", count=1), 4)


def _record(sk: str, **attributes: Any) -> Item:
    return {codec.A_PK: PK, codec.A_SK: sk, records.A_STATUS: "COMPLETED"} | attributes


def check_condition_replaceable(store: ConversationStore) -> None:
    """:class:`Replaceable` (Powertools' condition): a record is put over nothing, an
    expired record, or one in progress whose in-progress expiry passed; a live record
    refuses it."""
    now = 1_000.0
    assert _writes(store, Put(_record("I#a", expires_at=2_000), Replaceable(now)))
    assert not _writes(store, Put(_record("I#a", expires_at=3_000, x="new"), Replaceable(now)))
    assert stored(store, "I#a") == _record("I#a", expires_at=2_000)
    put(store, _record("I#b", expires_at=999))
    assert _writes(store, Put(_record("I#b", expires_at=2_000), Replaceable(now)))
    running = {records.A_STATUS: records.IN_PROGRESS, records.A_IN_PROGRESS_EXPIRY: 999_000}
    put(store, _record("I#c", expires_at=2_000) | running)
    assert _writes(store, Put(_record("I#c", expires_at=2_000), Replaceable(now)))
    busy = running | {records.A_IN_PROGRESS_EXPIRY: 1_001_000}
    put(store, _record("I#d", expires_at=2_000) | busy)
    assert not _writes(store, Put(_record("I#d", expires_at=2_000), Replaceable(now)))


def _advances(store: ConversationStore, bucket: int) -> bool:
    item = cursor_item(bucket)
    return _writes(store, Put(item, CursorForward(CURSOR_SCHEMA_VERSION, bucket)))


def check_condition_cursor_forward(store: ConversationStore) -> None:
    """:class:`CursorForward`: a cursor is put over none or one of the same schema version
    with a lower bucket; never backwards, never over another schema version."""
    assert _advances(store, 10)
    assert not _advances(store, 10)
    assert not _advances(store, 9)
    assert _advances(store, 11)
    sk = cursor_sort_key("expiry")
    put(store, cursor_item(11) | {codec.A_SCHEMA: 99})
    assert not _advances(store, 12)
    assert stored(store, sk, CURSOR_PK) == cursor_item(11) | {codec.A_SCHEMA: 99}
    assert stored(store, sk, CURSOR_PK)[A_BUCKET] == 11  # type: ignore[index]


# --- _transact ------------------------------------------------------------------------------


def _commits(store: ConversationStore, *writes: Write) -> bool:
    try:
        store._transact(list(writes))
    except ConversationBusy:
        return False
    return True


def check_transaction_all_or_nothing(store: ConversationStore) -> None:
    """``_transact``: when one condition fails nothing of the transaction is written, its
    unconditional puts, updates and deletes included; when all hold, all of it is."""
    put(store, {codec.A_PK: PK, codec.A_SK: "W#b"}, {codec.A_PK: PK, codec.A_SK: "W#u", "k": 1})
    update = Update(PK, "W#u", {"a": 2}, Unchanged({"k": 1}))
    side = {codec.A_PK: PK, codec.A_SK: "W#x"}
    one = slot(1, "g1", count=1)
    expected = {codec.A_VERSION: 1, codec.A_GEN: "g1"}
    assert not _commits(
        store,
        Put(one, SlotFree("g1")),
        Put(side),
        update,
        Delete(PK, "W#b"),
        Put(head(2), head_is(expected)),
    )
    assert stored(store, keys.event_sort_key(1)) is None
    assert stored(store, "W#x") is None
    assert stored(store, "W#b") is not None
    assert stored(store, "W#u") == {codec.A_PK: PK, codec.A_SK: "W#u", "k": 1}
    assert _commits(
        store,
        Put(one, SlotFree("g1")),
        Put(side),
        update,
        Delete(PK, "W#b"),
        Delete(PK, "W#absent"),
        Put(head(1), head_is(None)),
    )
    assert stored(store, keys.HEAD_SK) == head(1)
    assert stored(store, keys.event_sort_key(1)) == one
    assert stored(store, "W#x") == side
    assert stored(store, "W#u") == {codec.A_PK: PK, codec.A_SK: "W#u", "k": 1, "a": 2}
    assert stored(store, "W#b") is None


def check_transaction_head_condition(store: ConversationStore) -> None:
    """``_transact`` with :func:`head_is`: the head lands only while the stored one is
    still the one expected (``None``: absent)."""
    assert _commits(store, Put(slot(1, "g1", count=1), SlotFree("g1")), Put(head(1), Absent()))
    assert not _commits(store, Put(slot(2, "g1", count=1), SlotFree("g1")), Put(head(2), Absent()))
    stale = {codec.A_VERSION: 2, codec.A_GEN: "g1"}
    assert not _commits(store, Put(head(2), head_is(stale)))
    assert _commits(store, Put(head(2), head_is({codec.A_VERSION: 1, codec.A_GEN: "g1"})))
    assert stored(store, keys.HEAD_SK) == head(2)


def check_transaction_head_lock_takes_other_lives_items(store: ConversationStore) -> None:
    """:class:`SlotFree` with ``head_locked`` (in a transaction that puts the head): an
    event may replace any item of another life (a leftover), never one of its own."""
    put(store, slot(1, "g0", count=2), slot(2, "g1", count=1))
    one = slot(1, "g1", count=1)
    assert not _commits(store, Put(one, SlotFree("g1")), Put(head(1), Absent()))
    assert _commits(store, Put(one, SlotFree("g1", head_locked=True)), Put(head(1), Absent()))
    expected = head_is({codec.A_VERSION: 1, codec.A_GEN: "g1"})
    two = Put(slot(2, "g1", count=1), SlotFree("g1", head_locked=True))
    assert not _commits(store, two, Put(head(2), expected))


def check_transaction_checks(store: ConversationStore) -> None:
    """``_transact`` with :class:`Check`: another partition's head is still that item
    (:func:`head_is`), its slot still free for its life and version (:class:`SlotFree`);
    either failing writes nothing, and a check writes nothing itself."""
    parent = head(5, "p1") | {codec.A_PK: OTHER_PK}
    put(store, parent)
    next_slot = keys.event_sort_key(9)
    stale = Check(OTHER_PK, keys.HEAD_SK, head_is(parent | {codec.A_VERSION: 4}))
    current = Check(OTHER_PK, keys.HEAD_SK, head_is(parent))
    free = Check(OTHER_PK, next_slot, SlotFree("p1", 5))
    assert not _commits(store, stale, free, Put(head(1), Absent()))
    put(store, slot(9, "p1", count=1) | {codec.A_PK: OTHER_PK})
    assert not _commits(store, current, free, Put(head(1), Absent()))
    assert stored(store, keys.HEAD_SK) is None
    store._write_batch([Delete(OTHER_PK, next_slot)])
    assert _commits(store, current, free, Put(head(1), Absent()))
    assert stored(store, keys.HEAD_SK, OTHER_PK) == parent
    assert stored(store, next_slot, OTHER_PK) is None


# --- _write_batch ---------------------------------------------------------------------------


def check_write_batch_puts_and_deletes(store: ConversationStore) -> None:
    """``_write_batch``: puts replace what is there, deletes remove items (absent ones are
    fine), across partitions."""
    put(store, {codec.A_PK: PK, codec.A_SK: "S#a", "x": 1}, {codec.A_PK: PK, codec.A_SK: "S#b"})
    store._write_batch(
        [
            Put({codec.A_PK: PK, codec.A_SK: "S#a", "x": 2}),
            Put({codec.A_PK: OTHER_PK, codec.A_SK: "S#c"}),
            Delete(PK, "S#b"),
            Delete(PK, "S#zzz"),
        ]
    )
    assert stored(store, "S#a") == {codec.A_PK: PK, codec.A_SK: "S#a", "x": 2}
    assert stored(store, "S#c", OTHER_PK) == {codec.A_PK: OTHER_PK, codec.A_SK: "S#c"}
    assert stored(store, "S#b") is None


#: Every check of the suite, by name.
CHECKS: dict[str, Callable[[ConversationStore], None]] = {
    name: check for name, check in sorted(globals().items()) if name.startswith("check_")
}


@pytest.mark.parametrize("name", list(CHECKS))
def test_backend_primitive(store: ConversationStore, name: str) -> None:
    """Each check of :data:`CHECKS` on each backend."""
    CHECKS[name](store)


@dataclass(frozen=True)
class _FenceBlind(Condition):
    """A head condition evaluated without its fence."""

    expected: Item

    def holds(self, stored: Item | None) -> bool:
        if stored is None:
            return False
        return all(
            stored.get(name) == value
            for name, value in self.expected.items()
            if name != codec.A_FENCE
        )


class _FenceBlindBackend(MemoryConversationStore):
    """A broken backend: a single-item write's head condition (:func:`head_is`) ignores
    the fence (``fx``): one condition of one primitive."""

    def _write(self, write: Put | Update | Delete) -> Item | None:
        when = write.when
        if isinstance(when, Unchanged) and set(when.expected) == {
            codec.A_VERSION,
            codec.A_GEN,
            codec.A_FENCE,
        }:
            write = replace(write, when=_FenceBlind(when.expected))
        return super()._write(write)


def test_the_suite_catches_a_backend_that_breaks_one_condition() -> None:
    """The primitives' suite fails on a backend whose ``_write`` ignores the fence in the
    head's condition, in the check of that condition, and only there: every other check
    passes, so the failure names the broken condition."""
    failed = []
    for name, check in CHECKS.items():
        try:
            check(_FenceBlindBackend())
        except AssertionError:
            failed.append(name)
    assert failed == ["check_head_is_compares_version_life_and_fence"]
    CHECKS["check_head_is_compares_version_life_and_fence"](MemoryConversationStore())
