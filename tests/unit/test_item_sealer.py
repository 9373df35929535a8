"""ItemSealer: which attributes are sealed, and writes under a key another environment
destroyed (issue 24)."""

from __future__ import annotations

import json

import pytest
from turnledger.core.exceptions import ContentUnreadable, CorruptedState
from turnledger.core.models import ConversationKey
from turnledger.store import codec, keyring
from turnledger.store import sealed as sealed_module
from turnledger.store.keyring import Keyring, LocalMasterKey, MemoryKeyItems
from turnledger.store.sealed import (
    DEFLATED,
    DEFLATED_VALUE,
    NO_LIFE,
    SEALED_VALUE,
    ItemSealer,
)

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


def test_a_servers_question_on_a_waiting_call_is_sealed_with_its_request_state() -> None:
    """An MCP call waiting for a person's answer keeps the server's question and its opaque
    ``request_state`` on the pending call: content, sealed apart as its arguments are."""
    sealer, _ = _environments()
    asked = {
        "key": "confirm",
        "message": "Type the name of /a.txt",
        "requested_schema": {"type": "object"},
        "request_state": "v1.opaque-state",
    }
    call = {"id": "call_1", "name": "mcp__files__delete_file", "arguments": {"path": "/a.txt"}}
    state = {"status": "awaiting_hitl", "pending": [{**call, "elicitation": asked}]}
    head = {"pk": PK, "sk": "HEAD", "v": 2, "g": "g1", "d": json.dumps(state)}
    sealed = sealer.seal(head)
    assert (
        "opaque-state" not in sealed[codec.A_BODY] and "Type the name" not in sealed[codec.A_BODY]
    )
    assert json.loads(sealed[codec.A_BODY])["pending"] == [{"id": "call_1", "name": call["name"]}]
    assert json.loads(sealer.open(sealed)[codec.A_BODY]) == state


# --- compression before sealing (issue 21) ------------------------------------------------

#: An event body as a turn writes it: JSON whose ids, times and arguments repeat.
_BODY = json.dumps(
    [
        {
            "id": f"ev_{n}",
            "turn": 3,
            "kind": "tool_call_requested",
            "actor": "model:demo-1",
            "at": "2026-12-04T07:00:04.500000Z",
            "payload": {"call_id": "call_1", "arguments": {"to": "ops@example.com"}},
        }
        for n in range(4)
    ]
)
_EVENT = {"pk": PK, "sk": "E#000000000005", "v": 3, "g": "g1", "n": 4, "d": _BODY}


def test_a_long_content_value_is_deflated_then_sealed_and_opens_as_it_was() -> None:
    sealer, other = _environments()
    sealed = sealer.seal(_EVENT)
    body = sealed[codec.A_BODY]
    assert body.startswith(SEALED_VALUE + DEFLATED)
    # Smaller than the clear text, although the seal adds its nonce and tag.
    assert len(body) < len(_BODY.encode()) * 2 // 3
    assert sealer.open(sealed) == _EVENT
    assert other.open(sealed) == _EVENT  # another environment, the same keys


def test_a_short_content_value_is_sealed_as_before() -> None:
    sealer, _ = _environments()
    short = {**_EVENT, "d": '{"x":1}'}
    body = sealer.seal(short)[codec.A_BODY]
    assert body.startswith(SEALED_VALUE + keyring.FORMAT)
    assert len(body) == len(SEALED_VALUE) + len('{"x":1}') + 29  # format, nonce, tag
    assert sealer.open(sealer.seal(short)) == short


def test_without_keys_a_long_content_value_is_stored_deflated_and_reads_back() -> None:
    clear = ItemSealer(None)
    stored = clear.seal(_EVENT)
    assert stored[codec.A_BODY].startswith(DEFLATED_VALUE)
    assert codec.item_size(stored) < codec.item_size(_EVENT) * 2 // 3
    assert {k: v for k, v in stored.items() if k != "d"} == {
        k: v for k, v in _EVENT.items() if k != "d"
    }
    assert clear.open(stored) == _EVENT
    sealer, _ = _environments()
    assert sealer.open(stored) == _EVENT  # a store with keys reads it too
    # ... and seals it when it next writes it (seal-existing): still deflated.
    resealed = sealer.seal(stored)
    assert resealed[codec.A_BODY].startswith(SEALED_VALUE + DEFLATED)
    assert sealer.open(resealed) == _EVENT


def test_values_written_before_compression_still_open() -> None:
    """Clear text and values sealed without compression (what every earlier build wrote)."""
    master, items = LocalMasterKey(), MemoryKeyItems()
    ring = Keyring(master, items)
    sealer = ItemSealer(ring)
    key = ring.data_key("acme", "c1", "g1", create=True)
    aad = keyring.item_aad(PK, _EVENT["sk"], "d")
    old = {**_EVENT, "d": SEALED_VALUE + key.seal(_BODY.encode(), aad)}
    assert sealer.open(old) == _EVENT
    assert sealer.open(_EVENT) == _EVENT
    assert ItemSealer(None).open(_EVENT) == _EVENT


@pytest.mark.parametrize(
    "value",
    [
        SEALED_VALUE + b"\x02" + bytes(40),  # an unknown format after the sealed marker
        SEALED_VALUE + DEFLATED + b"\x07" + bytes(40),  # deflated, then an unknown format
        b"\x1ftl9:" + bytes(40),  # an unknown marker
        DEFLATED_VALUE + b"not deflate at all",  # deflated in clear, but damaged
    ],
)
def test_a_value_in_an_unknown_format_is_refused(value: bytes) -> None:
    sealer, _ = _environments()
    for reader in (sealer, ItemSealer(None)):
        with pytest.raises(CorruptedState):
            reader.open({**_EVENT, "d": value})


def test_a_deflated_sealed_value_copied_to_another_item_does_not_open() -> None:
    sealer, _ = _environments()
    sealed = sealer.seal(_EVENT)
    elsewhere = sealer.seal({**_EVENT, "sk": "E#000000000009"})
    with pytest.raises(ContentUnreadable):
        sealer.open({**elsewhere, "d": sealed["d"]})
    with pytest.raises(ContentUnreadable):  # another attribute of the same item
        sealer.open({**sealed, "c": sealed["d"]})


def test_the_deflate_marker_is_bound_to_the_seal() -> None:
    """Dropping the marker (or adding one) makes the value not open: the encoding is part
    of the associated data, so a reader never inflates text or reads a stream as text."""
    sealer, _ = _environments()
    deflated = sealer.seal(_EVENT)["d"]
    stripped = SEALED_VALUE + deflated[len(SEALED_VALUE) + len(DEFLATED) :]
    with pytest.raises(ContentUnreadable):
        sealer.open({**_EVENT, "d": stripped})
    plain = sealer.seal({**_EVENT, "d": '{"x":1}'})["d"]
    added = SEALED_VALUE + DEFLATED + plain[len(SEALED_VALUE) :]
    with pytest.raises(ContentUnreadable):
        sealer.open({**_EVENT, "d": added})


def test_a_value_that_inflates_beyond_the_bound_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stored = ItemSealer(None).seal(_EVENT)
    monkeypatch.setattr(sealed_module, "MAX_INFLATED_BYTES", 100)
    with pytest.raises(CorruptedState):
        ItemSealer(None).open(stored)
    # ... and a value over it is never deflated, so every value stored deflated reads back.
    assert ItemSealer(None).seal(_EVENT) == _EVENT
