"""Objects at rest are ciphertext bound to their key, and erasure makes every copy unreadable."""

from __future__ import annotations

import pytest
from turnledger.core.exceptions import ContentUnreadable, InternalError
from turnledger.core.models import ConversationKey
from turnledger.store import keys
from turnledger.store.blobs import MemoryBlobStore
from turnledger.store.keyring import Keyring, LocalMasterKey, MemoryKeyItems
from turnledger.store.sealed import MAGIC, SealedBlobStore, object_life

KEY = ConversationKey(tenant="acme corp/eu", conversation_id="c1")
OBJECT = keys.blob_key(KEY, "g1", 7, "ab" * 32, attempt="a1")
TEXT = b'{"text": "my name is Ivo"}'


def _stores() -> tuple[MemoryBlobStore, SealedBlobStore]:
    raw = MemoryBlobStore()
    return raw, SealedBlobStore(raw, Keyring(LocalMasterKey(), MemoryKeyItems()))


def test_an_object_key_names_its_life() -> None:
    assert object_life(OBJECT) == ("acme corp/eu", "c1", "g1")
    assert object_life(keys.export_key(KEY, "g2")) == ("acme corp/eu", "c1", "g2")
    assert object_life("t/acme/other") is None


def test_objects_are_ciphertext_at_rest_and_read_back_clear() -> None:
    raw, sealed = _stores()
    sealed.put(OBJECT, TEXT)
    stored = raw.get(OBJECT)
    assert stored.startswith(MAGIC) and b"Ivo" not in stored
    assert sealed.get(OBJECT) == TEXT


def test_an_object_copied_to_another_key_does_not_open() -> None:
    raw, sealed = _stores()
    sealed.put(OBJECT, TEXT)
    other = keys.blob_key(KEY, "g1", 8, "ab" * 32, attempt="a1")
    raw.put(other, raw.get(OBJECT))
    # Answered as unreadable (410), like a destroyed key: never content, never a 500.
    with pytest.raises(ContentUnreadable, match="sealed for another object"):
        sealed.get(other)


def test_after_the_key_is_destroyed_a_restored_object_is_unreadable() -> None:
    raw, sealed = _stores()
    sealed.put(OBJECT, TEXT)
    backup = raw.get(OBJECT)
    sealed.keyring.destroy_conversation("acme corp/eu", "c1", ["g1"])
    raw.put(OBJECT, backup)  # restored from an old object version
    with pytest.raises(ContentUnreadable):
        sealed.get(OBJECT)


def test_objects_written_before_encryption_still_read() -> None:
    raw, sealed = _stores()
    raw.put(OBJECT, TEXT)
    assert sealed.get(OBJECT) == TEXT


def test_an_object_outside_any_life_is_refused() -> None:
    _, sealed = _stores()
    with pytest.raises(InternalError):
        sealed.put("t/acme/loose.json", TEXT)


def test_listing_deleting_and_streams_go_to_the_inner_store() -> None:
    raw, sealed = _stores()
    export = keys.export_key(KEY, "g1")
    assert sealed.put_stream(export, [b"a", b"b"], "application/x-ndjson") == 2
    assert raw.get(export) == b"ab"  # the export its owner downloads stays clear
    sealed.put(OBJECT, TEXT)
    assert sorted(sealed.list_keys(keys.blob_prefix(KEY))) == sorted([export, OBJECT])
    assert sealed.delete_keys([export, OBJECT]) == 2
    assert list(raw.list_keys(keys.blob_prefix(KEY))) == []
