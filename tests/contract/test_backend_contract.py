"""The backend's contract: each condition of each primitive of :mod:`turnledger.store.backend`.

Beside the scenario suite (``test_store_contract.py``: what a store does), this suite
checks the primitives a backend implements, one condition at a time, on raw items, over
the ``store`` fixture's backends (memory, moto, DynamoDB Local, SQLite, sealed). Every
check is a plain function of a fresh store (:data:`CHECKS`), so the last test can run
the whole suite against a backend that breaks one condition and show that the suite
catches it. Each check's docstring states the condition it protects.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from turnledger.core.exceptions import ConversationBusy
from turnledger.store import codec, keys, records
from turnledger.store.base import ConversationStore
from turnledger.store.codec import Item
from turnledger.store.indexes import A_BUCKET, CURSOR_PK, cursor_item, cursor_sort_key
from turnledger.store.memory import MemoryConversationStore

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
    store._delete_items(PK, ["S#2"])
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


# --- the slot condition (_put_turn, and each event of _transact_commit) -------------------


def _lands(store: ConversationStore, item: Item, marker_version: int | None) -> bool:
    try:
        store._put_turn(item, marker_version)
    except ConversationBusy:
        return False
    return True


def check_slot_free_when_nothing_is_there(store: ConversationStore) -> None:
    """A turn item lands at an empty slot."""
    assert _lands(store, slot(1, "g1", count=1), None)
    assert stored(store, keys.event_sort_key(1)) == slot(1, "g1", count=1)


def check_slot_taken_by_an_event_item(store: ConversationStore) -> None:
    """An event item of this life or another holds its slot: busy, nothing written."""
    put(store, slot(1, "g1", count=1), slot(2, "g0", count=2))
    assert not _lands(store, slot(1, "g1", count=1, x="late"), None)
    assert not _lands(store, slot(2, "g1", count=1), 1)
    assert stored(store, keys.event_sort_key(1)) == slot(1, "g1", count=1)


def check_slot_free_over_another_lifes_gravestone(store: ConversationStore) -> None:
    """Another life's gravestone (a marker with an expiry) frees its slot for this life."""
    put(store, slot(1, "g0", count=0, expires_at=1))
    assert _lands(store, slot(1, "g1", count=1), None)


def check_slot_taken_by_another_lifes_marker(store: ConversationStore) -> None:
    """Another life's marker that is no gravestone holds its slot."""
    put(store, slot(1, "g0", count=0, ver=3))
    assert not _lands(store, slot(1, "g1", count=1), 3)


def check_slot_free_over_this_lifes_marker_of_the_version_read(store: ConversationStore) -> None:
    """This life's marker of the version the turn read is replaced; of another version
    (or when the turn read none) it holds the slot."""
    put(store, slot(1, "g1", count=0, ver=4))
    assert not _lands(store, slot(1, "g1", count=1), None)
    assert not _lands(store, slot(1, "g1", count=1), 3)
    assert _lands(store, slot(1, "g1", count=1), 4)


def check_slot_taken_by_this_lifes_gravestone(store: ConversationStore) -> None:
    """This life's own gravestone holds its slot against late turns, whatever the version."""
    put(store, slot(1, "g1", count=0, ver=4, expires_at=1))
    assert not _lands(store, slot(1, "g1", count=1), 4)


# --- _transact_commit ----------------------------------------------------------------------


def _commits(
    store: ConversationStore, new_head: Item | None, expected: Item | None, **kw: Any
) -> bool:
    events = kw.pop("events", [slot(1, "g1", count=1)])
    try:
        store._transact_commit(new_head, expected, events, "g1", **kw)
    except ConversationBusy:
        return False
    return True


def check_transaction_head_condition(store: ConversationStore) -> None:
    """The head is put only if the stored one is still ``expected`` (``None``: absent):
    else nothing of the transaction is written, its events and puts included."""
    side = {codec.A_PK: PK, codec.A_SK: "W#x"}
    assert not _commits(store, head(2), {codec.A_VERSION: 1, codec.A_GEN: "g1"}, puts=[side])
    assert stored(store, keys.event_sort_key(1)) is None
    assert stored(store, "W#x") is None
    assert _commits(store, head(1), None)
    assert stored(store, keys.HEAD_SK) == head(1)
    assert not _commits(store, head(2), None, events=[slot(2, "g1", count=1)])
    assert _commits(
        store, head(2), {codec.A_VERSION: 1, codec.A_GEN: "g1"}, events=[slot(2, "g1", count=1)]
    )


def check_transaction_head_lock_takes_other_lives_items(store: ConversationStore) -> None:
    """With ``head_locked``, an event may replace any item of another life (a leftover),
    never one of its own."""
    put(store, slot(1, "g0", count=2), slot(2, "g1", count=1))
    assert not _commits(store, head(1), None, events=[slot(1, "g1", count=1)])
    assert _commits(store, head(1), None, events=[slot(1, "g1", count=1)], head_locked=True)
    assert not _commits(
        store,
        head(2),
        {codec.A_VERSION: 1, codec.A_GEN: "g1"},
        events=[slot(2, "g1", count=1)],
        head_locked=True,
    )


def check_transaction_checks_and_slots(store: ConversationStore) -> None:
    """``checks``: another partition's head is still that item; ``slots``: another
    partition's slot is still free for its life and version. Either failing writes nothing."""
    parent = head(5, "p1") | {codec.A_PK: OTHER_PK}
    put(store, parent)
    free = {codec.A_PK: OTHER_PK, codec.A_SK: keys.event_sort_key(9), codec.A_GEN: "p1"}
    stale = parent | {codec.A_VERSION: 4}
    assert not _commits(store, head(1), None, events=[], checks=[stale], slots=[free])
    put(store, slot(9, "p1", count=1) | {codec.A_PK: OTHER_PK})
    assert not _commits(store, head(1), None, events=[], checks=[parent], slots=[free])
    assert stored(store, keys.HEAD_SK) is None
    store._delete_items(OTHER_PK, [keys.event_sort_key(9)])
    assert _commits(store, head(1), None, events=[], checks=[parent], slots=[free])


def check_transaction_puts_and_deletes_carry_no_condition(store: ConversationStore) -> None:
    """``puts`` replace what is there and ``deletes`` remove items (absent ones are fine)."""
    put(store, {codec.A_PK: PK, codec.A_SK: "W#a", "x": 1}, {codec.A_PK: PK, codec.A_SK: "W#b"})
    assert _commits(
        store,
        None,
        None,
        puts=[{codec.A_PK: PK, codec.A_SK: "W#a", "x": 2}],
        deletes=["W#b", "W#absent"],
    )
    assert stored(store, "W#a") == {codec.A_PK: PK, codec.A_SK: "W#a", "x": 2}
    assert stored(store, "W#b") is None


# --- single-item conditional writes on the head --------------------------------------------


def check_replace_head_compares_version_life_and_fence(store: ConversationStore) -> None:
    """``_replace_head``: written only when the stored head has the expected ``ver``, ``g``
    and ``fx``, each equal or absent in both; ``None`` expects no head."""
    assert store._replace_head(head(1), None)
    assert not store._replace_head(head(2), None)
    assert not store._replace_head(head(2), {codec.A_VERSION: 2, codec.A_GEN: "g1"})
    assert not store._replace_head(head(2), {codec.A_VERSION: 1, codec.A_GEN: "g2"})
    assert not store._replace_head(head(2), head(1, fx="t"))
    assert store._replace_head(head(2, fx="t"), head(1))
    assert not store._replace_head(head(3), head(2))  # the fence is part of the identity
    assert store._replace_head(head(3), head(2, fx="t"))
    assert stored(store, keys.HEAD_SK) == head(3)


def check_delete_head_compares_version_life_and_fence(store: ConversationStore) -> None:
    """``_delete_head``: deleted only when the stored head is still ``expected``."""
    put(store, head(2, fx="t"))
    assert not store._delete_head(PK, head(2))
    assert not store._delete_head(PK, head(1, fx="t"))
    assert store._delete_head(PK, head(2, fx="t"))
    assert stored(store, keys.HEAD_SK) is None
    assert not store._delete_head(PK, head(2, fx="t"))


def check_fence_head_only_an_unfenced_existing_head(store: ConversationStore) -> None:
    """``_fence_head``: sets ``fx`` on a head without one and returns it as fenced; a
    fenced head or no head is left alone (no item is created)."""
    assert store._fence_head(PK, "t1") is None
    assert stored(store, keys.HEAD_SK) is None
    put(store, head(1, x="keep"))
    assert store._fence_head(PK, "t1") == head(1, x="keep", fx="t1")
    assert store._fence_head(PK, "t2") is None
    assert stored(store, keys.HEAD_SK) == head(1, x="keep", fx="t1")


# --- other single-item writes ----------------------------------------------------------------


def check_delete_if_gen(store: ConversationStore) -> None:
    """``_delete_if_gen``: deletes the item only while its ``g`` is the one given
    (``None``: it has none); an absent item is not deleted."""
    put(store, slot(1, "g1", count=1), {codec.A_PK: PK, codec.A_SK: "S#x"})
    assert not store._delete_if_gen(PK, keys.event_sort_key(1), "g2")
    assert not store._delete_if_gen(PK, keys.event_sort_key(1), None)
    assert store._delete_if_gen(PK, keys.event_sort_key(1), "g1")
    assert not store._delete_if_gen(PK, keys.event_sort_key(1), "g1")
    assert not store._delete_if_gen(PK, "S#x", "g1")
    assert store._delete_if_gen(PK, "S#x", None)


def _record(sk: str, **attributes: Any) -> Item:
    return {codec.A_PK: PK, codec.A_SK: sk, records.A_STATUS: "COMPLETED"} | attributes


def check_put_if_replaceable(store: ConversationStore) -> None:
    """``_put_if_replaceable`` (Powertools' condition): written over nothing, an expired
    record, or one in progress whose in-progress expiry passed; a live record refuses it
    and comes back."""
    now = 1_000.0
    assert store._put_if_replaceable(_record("I#a", expires_at=2_000), now) is None
    live = store._put_if_replaceable(_record("I#a", expires_at=3_000, x="new"), now)
    assert live == _record("I#a", expires_at=2_000)
    put(store, _record("I#b", expires_at=999))
    assert store._put_if_replaceable(_record("I#b", expires_at=2_000), now) is None
    running = {records.A_STATUS: records.IN_PROGRESS, records.A_IN_PROGRESS_EXPIRY: 999_000}
    put(store, _record("I#c", expires_at=2_000) | running)
    assert store._put_if_replaceable(_record("I#c", expires_at=2_000), now) is None
    busy = running | {records.A_IN_PROGRESS_EXPIRY: 1_001_000}
    put(store, _record("I#d", expires_at=2_000) | busy)
    assert store._put_if_replaceable(_record("I#d", expires_at=2_000), now) is not None
    assert stored(store, "I#d") == _record("I#d", expires_at=2_000) | busy


def check_set_if_unchanged(store: ConversationStore) -> None:
    """``_set_if_unchanged``: sets the attributes when the item exists and each expected
    attribute still holds its value (``None``: absent); never creates an item; keeps the
    item's other attributes."""
    put(store, {codec.A_PK: PK, codec.A_SK: "S#x", "a": "one", "k": "keep"})
    assert not store._set_if_unchanged(PK, "S#x", {"a": "two"}, {"a": "changed"})
    assert not store._set_if_unchanged(PK, "S#x", {"a": "two"}, {"k": None})
    assert not store._set_if_unchanged(PK, "S#absent", {"a": "two"}, {"a": None})
    assert stored(store, "S#absent") is None
    assert store._set_if_unchanged(PK, "S#x", {"a": "two"}, {"a": "one", "b": None})
    assert stored(store, "S#x") == {codec.A_PK: PK, codec.A_SK: "S#x", "a": "two", "k": "keep"}


def check_set_attributes(store: ConversationStore) -> None:
    """``_set_attributes``: unconditional, creating the item when absent, keeping the
    stored item's other attributes."""
    store._set_attributes(PK, "I#x", {"a": 1})
    assert stored(store, "I#x") == {codec.A_PK: PK, codec.A_SK: "I#x", "a": 1}
    store._set_attributes(PK, "I#x", {"b": "two"})
    assert stored(store, "I#x") == {codec.A_PK: PK, codec.A_SK: "I#x", "a": 1, "b": "two"}


def check_advance_cursor(store: ConversationStore) -> None:
    """``_advance_cursor``: written over no cursor or one of the same schema version with a
    lower bucket; never backwards, never over another schema version."""
    assert store._advance_cursor(cursor_item(10))
    assert not store._advance_cursor(cursor_item(10))
    assert not store._advance_cursor(cursor_item(9))
    assert store._advance_cursor(cursor_item(11))
    sk = cursor_sort_key("expiry")
    put(store, cursor_item(11) | {codec.A_SCHEMA: 99})
    assert not store._advance_cursor(cursor_item(12))
    assert stored(store, sk, CURSOR_PK) == cursor_item(11) | {codec.A_SCHEMA: 99}
    assert stored(store, sk, CURSOR_PK)[A_BUCKET] == 11  # type: ignore[index]


def check_delete_items_ignores_absent_ones(store: ConversationStore) -> None:
    """``_delete_items``: removes the named items of the partition, absent ones are fine."""
    put(store, {codec.A_PK: PK, codec.A_SK: "S#a"}, {codec.A_PK: PK, codec.A_SK: "S#b"})
    store._delete_items(PK, ["S#a", "S#zzz"])
    assert stored(store, "S#a") is None
    assert stored(store, "S#b") is not None


#: Every check of the suite, by name.
CHECKS: dict[str, Callable[[ConversationStore], None]] = {
    name: check for name, check in sorted(globals().items()) if name.startswith("check_")
}


@pytest.mark.parametrize("name", list(CHECKS))
def test_backend_primitive(store: ConversationStore, name: str) -> None:
    """Each check of :data:`CHECKS` on each backend."""
    CHECKS[name](store)


class _FenceBlind(MemoryConversationStore):
    """A broken backend: its head writes ignore the fence (``fx``), one condition of one
    primitive."""

    def _replace_head(self, head: Item, expected: Item | None) -> bool:
        def blind(item: Item | None) -> Item | None:
            return None if item is None else {n: v for n, v in item.items() if n != codec.A_FENCE}

        with self._lock:
            current = blind(self.items.get(head[codec.A_PK], {}).get(keys.HEAD_SK))
            if not codec.same_head(current, blind(expected)):
                return False
            self.items.setdefault(head[codec.A_PK], {})[keys.HEAD_SK] = dict(head)
            return True


def test_the_suite_catches_a_backend_that_breaks_one_condition() -> None:
    """The primitives' suite fails on a backend whose ``_replace_head`` ignores the fence,
    in the check of that condition, and only there: every other check passes, so the
    failure names the broken condition."""
    failed = []
    for name, check in CHECKS.items():
        try:
            check(_FenceBlind())
        except AssertionError:
            failed.append(name)
    assert failed == ["check_replace_head_compares_version_life_and_fence"]
    CHECKS["check_replace_head_compares_version_life_and_fence"](MemoryConversationStore())
