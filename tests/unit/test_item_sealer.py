"""ItemSealer: which attributes are sealed, and writes under a key another environment
destroyed (issue 24)."""

from __future__ import annotations

import json

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
    assert sealer.seal(head) == head  # a head state without content stays as it is
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


def test_a_head_states_content_is_sealed_apart_and_put_back() -> None:
    """The content of a head state (calls' arguments, hashes and reasons, a cancel's reason,
    a response format, client tools) moves to its own sealed attribute ``c``; the rest
    stays in clear where it was; opening puts it back as it was; a reader without keys
    sees the required fields at placeholders."""
    sealer, _ = _environments()
    calls = [
        {"id": "call_1", "name": "send", "arguments": {"to": "ann"}, "arguments_sha256": "ab"},
        {"id": "call_2", "name": "ask", "arguments": {"q": "why"}, "reason": "a person's"},
    ]
    state = {
        "status": "awaiting_approval",
        "updated_at": "2099-01-01T00:00:00Z",
        "pending": calls,
        "cancel": {"requested_by": "ann", "reason": "stop it"},
        "options": {"model": "m", "response_format": {"type": "json_object"}},
        "provider_cursor": {"response_id": "resp_1"},
    }
    for item in (
        {"pk": PK, "sk": "HEAD", "v": 2, "g": "g1", "d": json.dumps(state)},
        {"pk": PK, "sk": "E#000000000001", "v": 2, "g": "g1", "n": 0, "h": json.dumps(state)},
    ):
        name = codec.state_attribute(item)
        assert name is not None
        sealed = sealer.seal(item)
        assert sealed[codec.A_CONTENT].startswith(SEALED_VALUE)
        clear = json.loads(sealed[name])
        assert clear["pending"] == [
            {"id": "call_1", "name": "send"},
            {"id": "call_2", "name": "ask"},
        ]
        assert clear["cancel"] == {"requested_by": "ann"}
        assert clear["options"] == {"model": "m"}
        assert clear["provider_cursor"] == state["provider_cursor"]
        opened = sealer.open(sealed)
        assert codec.A_CONTENT not in opened and json.loads(opened[name]) == state
        keyless = json.loads(codec.without_content(sealed)[name])
        assert [c["arguments"] for c in keyless["pending"]] == [{}, {}]
        assert keyless["cancel"] == {"requested_by": "ann"}
        assert not codec.holds_clear_content(sealed) and codec.holds_clear_content(item)
