"""The side items' store contract (long turns' drafts live there), on every backend.

``put_side_item``, ``get_side_item``, ``query_side_items`` and ``delete_side_items``
are every read and write of :mod:`turnledger.turn.drafts`: the caller hands data (a sort
key under ``S#``, its attributes, a TTL, a life) and the store owns the item. Runs
over the ``store`` fixture's backends (memory, moto, DynamoDB Local, SQLite); each
test's docstring states the invariant it protects.
"""

from __future__ import annotations

import pytest
from turnledger.core.exceptions import InternalError, PayloadTooLarge
from turnledger.store import keys
from turnledger.store.base import ContextBudget, ConversationStore
from turnledger.store.codec import MAX_ITEM_BYTES, SideItem

from tests.support.factories import START, build_turn, incompressible, make_key

KEY = make_key("acme", "conv-1")


def side(name: str, **attributes: object) -> SideItem:
    """A side item ``S#<name>`` with ``attributes`` (default: one text attribute)."""
    return SideItem(f"S#{name}", dict(attributes or {"tx": name}), expires_at=1_900_000_000)


def test_a_side_item_round_trips_and_is_replaced(store: ConversationStore) -> None:
    """What a put writes a get reads back (attributes, TTL, life); a second put replaces
    it whole; an absent item is ``None``."""
    assert store.get_side_item(KEY, "S#a") is None
    first = SideItem(
        "S#a", {"tx": "héllo", "nx": 3, "res": '{"a":1}'}, expires_at=1_900_000_000, gen="g1"
    )
    store.put_side_item(KEY, first)
    assert store.get_side_item(KEY, "S#a") == first
    second = SideItem("S#a", {"st": "done"})
    store.put_side_item(KEY, second)
    assert store.get_side_item(KEY, "S#a") == second


def test_a_range_reads_in_key_order_through_pages(store: ConversationStore) -> None:
    """A query returns exactly the items between its bounds (both included), in key
    order, over as many pages as it takes; other conversations' items never show."""
    names = [f"1#{n:03d}" for n in range(7)] + ["1#~", "2#001"]
    for name in reversed(names):
        store.put_side_item(KEY, side(name))
    store.put_side_item(make_key("acme", "conv-2"), side("1#002"))
    store.put_side_item(make_key("globex", "conv-1"), side("1#003"))
    found = store.query_side_items(KEY, lower="S#1#002", upper="S#1#~", limit=2)
    assert [item.sort_key for item in found] == [f"S#{n}" for n in names[2:8]]
    assert found[0] == side("1#002")
    cheap = store.query_side_items(KEY, lower="S#1#", upper="S#1#~", consistent=False)
    assert {item.sort_key for item in cheap} <= {f"S#{n}" for n in names[:8]}


def test_a_delete_removes_only_what_it_names(store: ConversationStore) -> None:
    """Deleting side items removes those keys (absent ones are fine) and nothing else."""
    for name in ["a", "b", "c"]:
        store.put_side_item(KEY, side(name))
    store.delete_side_items(KEY, ["S#a", "S#c", "S#zz"])
    assert [i.sort_key for i in store.query_side_items(KEY, lower="S#", upper="S#~")] == ["S#b"]


def test_side_items_stay_beside_the_transcript(store: ConversationStore) -> None:
    """A conversation's reads never meet its side items, and a clear removes them with
    the conversation."""
    turn = build_turn(KEY, None, ["q", "a"])
    store.commit(KEY, expected_version=None, head=turn.head, events=turn.events)
    store.put_side_item(KEY, side("1#~", st="in_progress"))
    snapshot = store.load(KEY, ContextBudget())
    assert snapshot.head == turn.head and snapshot.events == turn.events
    assert store.read_events(KEY, turn.head, after=0, limit=50) == turn.events
    store.clear(KEY, START)
    assert store.query_side_items(KEY, lower="S#", upper="S#~") == []


@pytest.mark.parametrize("sort_key", [keys.HEAD_SK, "E#000000000001", "I#abc", "W#abc", "T#x"])
def test_only_side_keys_are_touched(store: ConversationStore, sort_key: str) -> None:
    """Side item calls refuse sort keys outside ``S#``: they can never overwrite, read or
    delete a head, an event, an idempotency record or an inbox entry."""
    turn = build_turn(KEY, None, ["q"])
    store.commit(KEY, expected_version=None, head=turn.head, events=turn.events)
    with pytest.raises(InternalError):
        store.put_side_item(KEY, SideItem(sort_key, {"tx": "x"}))
    with pytest.raises(InternalError):
        store.get_side_item(KEY, sort_key)
    with pytest.raises(InternalError):
        store.delete_side_items(KEY, [sort_key])
    with pytest.raises(InternalError):
        store.query_side_items(KEY, lower=sort_key, upper="S#~")
    assert store.get_head(KEY) == turn.head


@pytest.mark.parametrize("attribute", ["pk", "sk", "g", "expires_at", "tn", "xb", "wb", "ib"])
def test_reserved_attributes_are_refused(store: ConversationStore, attribute: str) -> None:
    """A side item may not carry the store's own attributes (an index key would list it
    on that index; a key or TTL attribute would misfile it): nothing is written."""
    with pytest.raises(InternalError):
        store.put_side_item(KEY, SideItem("S#a", {attribute: "x"}))
    assert store.get_side_item(KEY, "S#a") is None
    assert list(store.of_tenant("x")) == []


def test_an_item_over_the_size_limit_is_refused(store: ConversationStore) -> None:
    """DynamoDB's item limit holds on every backend, on the bytes stored: nothing is
    written."""
    with pytest.raises(PayloadTooLarge):
        store.put_side_item(KEY, side("big", tx=incompressible(MAX_ITEM_BYTES * 2)))
    assert store.get_side_item(KEY, "S#big") is None


def test_text_over_the_size_limit_that_deflates_under_it_is_stored(
    store: ConversationStore,
) -> None:
    """The limit is on what the backend holds: content deflated under it (issue 21) is
    stored, as binary, and reads back as it was written, on every backend."""
    text = "a line that repeats; " * (MAX_ITEM_BYTES // 10)
    store.put_side_item(KEY, side("long", tx=text))
    assert store.get_side_item(KEY, "S#long") == side("long", tx=text)


def test_a_purge_deletes_a_side_item_s_companion(store: ConversationStore) -> None:
    """Clearing a conversation deletes, with its side items, each one's companion in the
    tenant's own partition (the OpenAI face's transcript index), and nothing else there."""
    tenant = keys.tenant_items(KEY.tenant)
    for name in ["t#1", "t#2"]:
        store.put_side_item(tenant, side(name))
    chain = SideItem("S#chain", {"h": "1"}, expires_at=1_900_000_000, gen="g1", companion="S#t#1")
    store.put_side_item(KEY, chain)
    assert store.get_side_item(KEY, "S#chain") == chain
    store.clear(KEY, START)
    assert store.get_side_item(KEY, "S#chain") is None
    assert store.get_side_item(tenant, "S#t#1") is None
    assert store.get_side_item(tenant, "S#t#2") == side("t#2")


def test_a_companion_must_be_a_side_item_key(store: ConversationStore) -> None:
    """A companion names a side item of the tenant's partition, never another kind."""
    with pytest.raises(InternalError):
        store.put_side_item(KEY, SideItem("S#a", {"tx": "a"}, companion="HEAD"))
