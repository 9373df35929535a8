"""Memory records (:mod:`turnledger.store.memories`) on every backend: a user's records
live in their own partition under the tenant's prefix, built only of the side items'
primitives. Runs over the ``store`` fixture's backends; each test's docstring states the
invariant it protects.
"""

from __future__ import annotations

from datetime import timedelta

from turnledger.core.models import ConversationKey
from turnledger.store import keys
from turnledger.store.base import ContextBudget, ConversationStore
from turnledger.store.memories import MemoryBook, MemoryRecord, memory_users, new_memory_id

from tests.support.factories import START


def record(text: str, key: str | None = None) -> MemoryRecord:
    return MemoryRecord(id=new_memory_id(), text=text, key=key, created_at=START, updated_at=START)


def test_records_round_trip_per_user_and_tenant(store: ConversationStore) -> None:
    """A user's records read back whole and in id order; another user's, or the same user
    of another tenant, are never among them, and no conversation's partition holds them."""
    ann = MemoryBook(store, "acme", "ann")
    first, second = record("My name is Ann.", "name"), record("I like tea.")
    ann.put(first, first=True)
    ann.put(second)
    MemoryBook(store, "acme", "bob").put(record("My name is Bob.", "name"), first=True)
    MemoryBook(store, "globex", "ann").put(record("My name is Eve.", "name"), first=True)
    assert ann.records() == [first, second]
    assert ann.get(first.id) == first
    assert MemoryBook(store, "acme", "carol").records() == []
    assert MemoryBook(store, "globex", "ann").get(first.id) is None
    assert sorted(memory_users(store, "acme")) == ["ann", "bob"]
    # The partition is the tenant's, never a conversation's (its id holds a '#').
    assert keys.partition_key(ann.key).startswith(keys.tenant_partition_prefix("acme"))
    assert store.get_head(ann.key) is None
    assert "#" in ann.key.conversation_id


def test_a_user_with_an_awkward_name_has_a_partition_of_their_own(
    store: ConversationStore,
) -> None:
    """Users are percent-encoded: ``a#b`` and ``a/b`` never share or break a partition."""
    for user in ("a#b", "a/b", "a%23b"):
        MemoryBook(store, "acme", user).put(record(f"I am {user}."), first=True)
    for user in ("a#b", "a/b", "a%23b"):
        assert [r.text for r in MemoryBook(store, "acme", user).records()] == [f"I am {user}."]
    assert sorted(memory_users(store, "acme")) == sorted(["a#b", "a/b", "a%23b"])


def test_clear_deletes_every_record_and_the_users_entry(store: ConversationStore) -> None:
    """Deleting all of a user's memory leaves nothing of it, and no entry to erase later;
    clearing the partition as tenant erasure does removes what is left of it too."""
    ann = MemoryBook(store, "acme", "ann")
    ann.put(record("One."), first=True)
    ann.put(record("Two."))
    assert ann.clear() == 2
    assert ann.records() == []
    assert memory_users(store, "acme") == []
    ann.put(record("Three."), first=True)
    store.clear(ann.key, START + timedelta(seconds=1))
    assert ann.records() == []
    # A conversation of the same tenant is untouched by all this.
    key = ConversationKey(tenant="acme", conversation_id="conv-1")
    assert store.load(key, ContextBudget(max_events=10, max_chars=10_000)).head is None
