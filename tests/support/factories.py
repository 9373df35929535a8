"""Test data and test doubles: a fake clock, heads, events, whole turns, and raw item access.

``raw_item``/``put_raw_item``/``corrupt`` read and write the physical items of
any backend without going through the store's own decoding, so tests can check
the stored layout and damage it on purpose.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import sqlite3
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from unittest import mock

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from turnledger.core.models import ConversationKey, ConversationStatus, Event, EventKind, Head
from turnledger.store import codec, keys, sealed
from turnledger.store.base import ConversationStore, new_generation
from turnledger.store.codec import BlobRef, Item
from turnledger.store.dynamodb import DynamoDBConversationStore
from turnledger.store.memory import MemoryConversationStore
from turnledger.store.sqlite import SQLiteConversationStore
from turnledger.store.sqlite import _decode as sqlite_item
from turnledger.store.views import ViewCache

#: Where every fake clock starts.
#: In the future on purpose: DynamoDB Local, like DynamoDB, deletes items whose TTL
#: attribute is in the real past, which would make conversations vanish mid-test.
START = datetime(2099, 1, 15, 12, 0, tzinfo=UTC)


@dataclass
class FakeClock:
    """A clock tests move by hand; ``now()`` is timezone-aware UTC."""

    current: datetime = START

    def now(self) -> datetime:
        """The current fake instant."""
        return self.current

    def advance(self, seconds: float) -> datetime:
        """Move forward by ``seconds``; returns the new instant."""
        self.current += timedelta(seconds=seconds)
        return self.current

    def __call__(self) -> datetime:
        """``now()``, so the clock can be injected where a ``Callable[[], datetime]`` is taken."""
        return self.now()


def make_key(tenant: str = "tenant-a", conversation_id: str = "conv-1") -> ConversationKey:
    """A conversation key."""
    return ConversationKey(tenant=tenant, conversation_id=conversation_id)


def make_head(**overrides: Any) -> Head:
    """A valid head of a conversation with no events; ``overrides`` replace any field."""
    fields: dict[str, Any] = {
        "gen": new_generation(),
        "version": 1,
        "base": 0,
        "seq": 0,
        "turn": 0,
        "status": ConversationStatus.COMPLETE,
        "created_at": START,
        "updated_at": START,
        "ttl_seconds": 0,
    }
    fields.update(overrides)
    return Head(**fields)


def make_event(
    sequence: int = 1,
    *,
    turn: int = 1,
    kind: EventKind = EventKind.USER_MESSAGE,
    content: str = "hello",
    payload: dict[str, Any] | None = None,
    conversation_id: str = "conv-1",
    event_id: str | None = None,
    occurred_at: datetime = START,
    actor: str | None = None,
) -> Event:
    """A valid event; ``payload`` defaults to a message with ``content`` (user or assistant)."""
    if payload is None:
        if kind not in (EventKind.USER_MESSAGE, EventKind.ASSISTANT_MESSAGE):
            raise ValueError(f"give the payload of a {kind.value} event")
        payload = {"content": content}
    return Event(
        event_id=event_id or f"evt-{uuid.uuid4().hex}",
        conversation_id=conversation_id,
        sequence=sequence,
        turn=turn,
        kind=kind,
        actor=actor or ("user" if kind is EventKind.USER_MESSAGE else "assistant"),
        occurred_at=occurred_at,
        payload=payload,
    )


@dataclass(frozen=True)
class Turn:
    """What one commit writes: the version it expects, the new head and its events."""

    expected_version: int | None
    head: Head
    events: list[Event] = field(default_factory=list)


def build_turn(
    key: ConversationKey,
    previous: Head | None,
    messages: Sequence[str],
    *,
    now: datetime = START,
    continue_turn: bool = False,
    **head_overrides: Any,
) -> Turn:
    """The commit of the next turn after ``previous``, the way the turn engine builds it.

    No head or a tombstone starts a new life: over a tombstone the new life takes
    the tombstone's ``gen`` and ``base`` (so it writes above every old event and
    a purge in progress keeps its objects), and public sequences restart at 1.
    The first message is the user's, the others the assistant's.

    Args:
        continue_turn: append to ``previous``'s turn instead of starting the next
            (a turn longer than one commit can hold).
        head_overrides: fields of the new head to replace.
    """
    if previous is None or previous.status is ConversationStatus.CLEARED:
        gen = previous.gen if previous else new_generation()
        base = previous.base if previous else 0
        last, turn, created_at = base, 1, now
    else:
        gen, base, last, created_at = previous.gen, previous.base, previous.seq, previous.created_at
        turn = previous.turn if continue_turn else previous.turn + 1
    events = [
        make_event(
            last - base + offset + 1,
            turn=turn,
            kind=(
                EventKind.USER_MESSAGE
                if offset == 0 and not continue_turn
                else EventKind.ASSISTANT_MESSAGE
            ),
            content=content,
            conversation_id=key.conversation_id,
            occurred_at=now,
        )
        for offset, content in enumerate(messages)
    ]
    fields: dict[str, Any] = {
        "gen": gen,
        "version": previous.version + 1 if previous else 1,
        "base": base,
        "seq": last + len(events),
        "turn": turn,
        "status": ConversationStatus.COMPLETE,
        "created_at": created_at,
        "updated_at": now,
        "ttl_seconds": 0,
    }
    fields.update(head_overrides)
    return Turn(
        expected_version=previous.version if previous else None,
        head=Head(**fields),
        events=events,
    )


def commit_turn(
    store: ConversationStore,
    key: ConversationKey,
    previous: Head | None,
    messages: Sequence[str],
    **options: Any,
) -> Turn:
    """Build the next turn with :func:`build_turn` and commit it; returns what was committed."""
    turn = build_turn(key, previous, messages, **options)
    store.commit(key, expected_version=turn.expected_version, head=turn.head, events=turn.events)
    return turn


# --- physical items -----------------------------------------------------------------------


def _sqlite_rows(store: SQLiteConversationStore, sql: str, *params: str) -> list[Any]:
    """Rows read on a connection of its own to the store's file (it sees every commit)."""
    with closing(sqlite3.connect(store.path)) as db:
        return db.execute(sql, params).fetchall()


_serializer = TypeSerializer()
_deserializer = TypeDeserializer()


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value


def holds_text(item: Item | None, text: str) -> bool:
    """Whether a value of the raw ``item`` (text, or bytes read as UTF-8) holds ``text``
    as it was written (a ``repr`` of the item would escape its quotes), as anyone who reads
    the table without keys would see it: a value stored deflated in clear is inflated."""
    assert item is not None
    return any(text in _as_read_without_keys(value) for value in item.values())


def _as_read_without_keys(value: Any) -> str:
    if not isinstance(value, bytes):
        return str(value)
    if value.startswith(sealed.DEFLATED_VALUE):
        value = sealed.inflate(value[len(sealed.DEFLATED_VALUE) :], where="test")
    return value.decode("utf-8", "replace")


def incompressible(length: int) -> str:
    """``length`` characters that DEFLATE does not shrink below ``length * 3 / 4`` bytes
    (random bytes as base64): a value whose stored size is near its clear size."""
    return base64.b64encode(os.urandom(length))[:length].decode()


@contextmanager
def stored_uncompressed() -> Iterator[None]:
    """Within it, stores write content values as every build before compression did
    (issue 21: :data:`turnledger.store.sealed.COMPRESS_MIN_BYTES`): with no keys, in clear
    text. For tests of what such builds left in a table."""
    with mock.patch.object(sealed, "COMPRESS_MIN_BYTES", codec.MAX_ITEM_BYTES):
        yield


def raw_item(store: ConversationStore, key: ConversationKey, sk: str) -> Item | None:
    """The item at ``sk`` of ``key``'s partition exactly as the backend holds it."""
    pk = keys.partition_key(key)
    if isinstance(store, MemoryConversationStore):
        item = store.items.get(pk, {}).get(sk)
        return dict(item) if item is not None else None
    if isinstance(store, DynamoDBConversationStore):
        response = store.client.get_item(
            TableName=store.table_name,
            Key={codec.A_PK: {"S": pk}, codec.A_SK: {"S": sk}},
            ConsistentRead=True,
        )
        wire = response.get("Item")
        if wire is None:
            return None
        return {
            name: bytes(v["B"]) if "B" in v else _plain(_deserializer.deserialize(v))
            for name, v in wire.items()
        }
    if isinstance(store, SQLiteConversationStore):
        rows = _sqlite_rows(store, "SELECT item FROM items WHERE pk = ? AND sk = ?", pk, sk)
        return sqlite_item(rows[0][0]) if rows else None
    raise TypeError(f"no raw access to {type(store).__name__}")


def raw_sort_keys(store: ConversationStore, key: ConversationKey) -> list[str]:
    """Every sort key in ``key``'s partition, ascending (events first, then ``HEAD``)."""
    pk = keys.partition_key(key)
    if isinstance(store, MemoryConversationStore):
        return sorted(store.items.get(pk, {}))
    if isinstance(store, DynamoDBConversationStore):
        found: list[str] = []
        paginator = store.client.get_paginator("query")
        for page in paginator.paginate(
            TableName=store.table_name,
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": pk}},
            ProjectionExpression="sk",
            ConsistentRead=True,
        ):
            found.extend(item["sk"]["S"] for item in page.get("Items", []))
        return found
    if isinstance(store, SQLiteConversationStore):
        rows = _sqlite_rows(store, "SELECT sk FROM items WHERE pk = ? ORDER BY sk", pk)
        return [sk for (sk,) in rows]
    raise TypeError(f"no raw access to {type(store).__name__}")


def another_environment(store: ConversationStore) -> ConversationStore:
    """``store`` as another execution environment sees it: the same table (or file, or
    dict) and objects, none of what ``store`` remembers of the conversations it read."""
    twin = copy.copy(store)
    twin.views = ViewCache()
    return twin


def data_sort_keys(store: ConversationStore, key: ConversationKey) -> list[str]:
    """:func:`raw_sort_keys` without gravestones: a clear's claim on the next slot holds no
    data and stays for DynamoDB's TTL (docs/STORAGE.md, "clear wins")."""
    kept = []
    for sort_key in raw_sort_keys(store, key):
        item = raw_item(store, key, sort_key) if sort_key.startswith(keys.EVENT_PREFIX) else None
        if item is not None and item.get(codec.A_COUNT) == 0 and codec.A_EXPIRES in item:
            continue
        kept.append(sort_key)
    return kept


def put_raw_item(store: ConversationStore, item: Item) -> None:
    """Write ``item`` as is, bypassing every check of the store."""
    if isinstance(store, MemoryConversationStore):
        store.items.setdefault(item[codec.A_PK], {})[item[codec.A_SK]] = dict(item)
        return
    if isinstance(store, DynamoDBConversationStore):
        wire = {name: _serializer.serialize(value) for name, value in item.items()}
        store.client.put_item(TableName=store.table_name, Item=wire)
        return
    if isinstance(store, SQLiteConversationStore):
        with store._transaction() as db:
            store._put(db, [item])
        return
    raise TypeError(f"no raw access to {type(store).__name__}")


def delete_raw_item(store: ConversationStore, key: ConversationKey, sk: str) -> None:
    """Remove one item behind the store's back (as DynamoDB TTL would remove a head)."""
    pk = keys.partition_key(key)
    if isinstance(store, MemoryConversationStore):
        store.items.get(pk, {}).pop(sk, None)
        return
    if isinstance(store, DynamoDBConversationStore):
        store.client.delete_item(
            TableName=store.table_name, Key={codec.A_PK: {"S": pk}, codec.A_SK: {"S": sk}}
        )
        return
    if isinstance(store, SQLiteConversationStore):
        with store._transaction() as db:
            db.execute("DELETE FROM items WHERE pk = ? AND sk = ?", (pk, sk))
        return
    raise TypeError(f"no raw access to {type(store).__name__}")


#: Pass as an attribute's new value to :func:`corrupt` to remove the attribute.
REMOVE = object()


def corrupt(store: ConversationStore, key: ConversationKey, sk: str, **changes: Any) -> Item:
    """Change attributes of a stored item (``REMOVE`` drops one); returns the new item.

    Example: ``corrupt(store, key, "HEAD", v=99)`` gives the head an unknown schema version.
    """
    item = raw_item(store, key, sk)
    assert item is not None, f"no item at {sk}"
    for name, value in changes.items():
        if value is REMOVE:
            item.pop(name, None)
        else:
            item[name] = value
    put_raw_item(store, item)
    return item


def corrupt_body(
    store: ConversationStore, key: ConversationKey, sk: str, edit: Callable[[Any], None]
) -> Item:
    """Parse an item's JSON body, let ``edit`` change it in place, and store it back (sealed
    again when the store seals content)."""
    item = opened_item(store, key, sk)
    assert item is not None, f"no item at {sk}"
    body = json.loads(item[codec.A_BODY])
    edit(body)
    edited = store.sealer.seal({**item, codec.A_BODY: json.dumps(body)})
    return corrupt(store, key, sk, **{codec.A_BODY: edited[codec.A_BODY]})


def opened_item(store: ConversationStore, key: ConversationKey, sk: str) -> Item | None:
    """The item at ``sk`` of ``key``'s partition as the backend holds it, its sealed content
    opened (issue 24: a store with a keyring seals content at rest)."""
    item = raw_item(store, key, sk)
    return None if item is None else store.sealer.open(item)


def holding(store: ConversationStore, key: ConversationKey, storage_sequence: int) -> str:
    """The sort key of the event item that holds ``storage_sequence``: a turn item holds
    every event of one commit under the key of its first (docs/STORAGE.md)."""
    for sort_key in reversed(raw_sort_keys(store, key)):
        if not sort_key.startswith(keys.EVENT_PREFIX):
            continue
        if keys.sequence_of(sort_key) <= storage_sequence:
            item = raw_item(store, key, sort_key)
            if item is not None and item.get(codec.A_COUNT) == 0:
                continue  # a marker or a gravestone: no event
            assert item is not None and codec.last_sequence(item) >= storage_sequence
            return sort_key
    raise AssertionError(f"no event at storage sequence {storage_sequence}")


def stored_body(
    store: ConversationStore, key: ConversationKey, storage_sequence: int
) -> dict[str, Any]:
    """The stored body (JSON) of the event at ``storage_sequence``, whatever item holds it."""
    sort_key = holding(store, key, storage_sequence)
    item = opened_item(store, key, sort_key)
    assert item is not None
    body = json.loads(item[codec.A_BODY])
    if isinstance(body, list):
        found: dict[str, Any] = body[storage_sequence - keys.sequence_of(sort_key)]
        return found
    assert isinstance(body, dict)
    return body


def corrupt_event_body(
    store: ConversationStore,
    key: ConversationKey,
    storage_sequence: int,
    edit: Callable[[dict[str, Any]], None],
) -> Item:
    """Let ``edit`` change the stored body of the event at ``storage_sequence`` in place, in
    whatever item holds it, and store that item back."""
    sort_key = holding(store, key, storage_sequence)

    def edit_event(body: Any) -> None:
        edit(
            body[storage_sequence - keys.sequence_of(sort_key)] if isinstance(body, list) else body
        )

    return corrupt_body(store, key, sort_key, edit_event)


def stored_ref(
    store: ConversationStore, key: ConversationKey, storage_sequence: int
) -> BlobRef | None:
    """The blob reference held by the event at ``storage_sequence`` (``None``: inline)."""
    ref = stored_body(store, key, storage_sequence).get("ref")
    return None if ref is None else BlobRef.model_validate(ref)


def blob_keys(store: ConversationStore, key: ConversationKey) -> list[str]:
    """Every object key of the conversation in the store's blob store, sorted."""
    return sorted(store.blobs.list_keys(keys.blob_prefix(key)))


# --- staging races ------------------------------------------------------------------------


@contextmanager
def small_pages(store: ConversationStore, size: int) -> Iterator[None]:
    """Make every backend query return at most ``size`` items, so paging is exercised."""
    original = store._query

    def capped(pk: str, **kwargs: Any) -> Any:
        kwargs["limit"] = min(kwargs["limit"], size)
        return original(pk, **kwargs)

    with mock.patch.object(store, "_query", side_effect=capped):
        yield


@dataclass
class Interleaving:
    """Whether the staged action ran (assert it did, or the race was never staged)."""

    ran: int = 0


@contextmanager
def interleave(
    store: object,
    primitive: str,
    action: Callable[[], None],
    *,
    call: int = 1,
    after: bool = False,
) -> Iterator[Interleaving]:
    """Run ``action`` once, just before (or after) the ``call``-th call of a backend primitive
    (``store``: the store) or of a step of a protocol (``store``: its module, e.g.
    :func:`turnledger.store.purge._fence`).

    This stages a concurrent writer at an exact point of a store operation
    (between reading the head and writing the tombstone, in the middle of a
    purge...), deterministically and without threads.
    """
    original = getattr(store, primitive)
    state = Interleaving()
    calls = 0

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        fire = calls == call and not state.ran
        if fire and not after:
            state.ran += 1
            action()
        result = original(*args, **kwargs)
        if fire and after:
            state.ran += 1
            action()
        return result

    with mock.patch.object(store, primitive, side_effect=wrapped):
        yield state
