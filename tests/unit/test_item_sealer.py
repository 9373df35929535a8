"""ItemSealer: which attributes are sealed, and writes under a key another environment
destroyed (issue 24)."""

from __future__ import annotations

import pytest
from turnledger.core.exceptions import ContentUnreadable
from turnledger.core.models import ConversationKey
from turnledger.store import codec
from turnledger.store.keyring import Keyring, LocalMasterKey, MemoryKeyItems
from turnledger.store.sealed import NO_LIFE, SEALED_VALUE, ItemSealer

PK = "T#acme#C#c1"


def _environments() -> tuple[ItemSealer, ItemSealer]:
    """Two execution environments: their own key caches, one key store and master key."""
    master, items = LocalMasterKey(), MemoryKeyItems()
    return ItemSealer(Keyring(master, items)), ItemSealer(Keyring(master, items))


def test_only_content_is_sealed() -> None:
    sealer, _ = _environments()
    record = {"pk": PK, "sk": "I#abc", "status": "COMPLETED", "expires_at": 5, "data": "answer"}
    event = {"pk": PK, "sk": "E#000000000001", "v": 1, "g": "g1", "d": '{"x":1}'}
    head = {"pk": PK, "sk": "HEAD", "v": 1, "g": "g1", "d": '{"status":"active"}'}
    draft = {"pk": PK, "sk": "S#1#c#000001", "text": "hello", "n": 3, "expires_at": 9}

    sealed_record = sealer.seal(record)
    assert sealed_record["data"].startswith(SEALED_VALUE)
    assert {k: v for k, v in sealed_record.items() if k != "data"} == {
        k: v for k, v in record.items() if k != "data"
    }
    assert sealer.seal(event)[codec.A_BODY].startswith(SEALED_VALUE)
    assert sealer.seal(head) == head  # the head stays clear: sweep and erasure read it
    sealed_draft = sealer.seal(draft)
    assert sealed_draft["text"].startswith(SEALED_VALUE) and sealed_draft["n"] == 3
    for item in (record, event, draft):
        assert sealer.open(sealer.seal(item)) == item


def test_a_value_moved_to_another_attribute_does_not_open() -> None:
    sealer, _ = _environments()
    draft = sealer.seal({"pk": PK, "sk": "S#1#c#000001", "text": "hello", "other": "x"})
    with pytest.raises(ContentUnreadable):
        sealer.open({**draft, "other": draft["text"]})


def test_a_write_after_another_environment_destroyed_the_key_is_readable_everywhere() -> None:
    """The conversation-wide key (records, side items without a life) is read afresh on
    a write: one environment's cached copy of a key another destroyed (a DELETE) never
    seals new content that nobody else could open."""
    first, second = _environments()
    record = {"pk": PK, "sk": "I#abc", "status": "COMPLETED", "data": "before"}
    assert second.open(first.seal(record)) == record  # both hold the key now

    second.destroy(ConversationKey(tenant="acme", conversation_id="c1"), [NO_LIFE])
    after = {**record, "data": "after"}
    assert second.open(first.seal(after)) == after
