"""Encode heads and events into table items and back, validating on every read.

Items are plain dicts of ``str`` and ``int`` attributes (and ``bytes``: content sealed
by :mod:`.sealed`); each backend turns them into its own wire format. Every item
carries ``v`` (its schema version): an unknown version raises
:class:`UnsupportedStateVersion`, anything that does not parse or fit raises
:class:`CorruptedState`. Nothing is repaired.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from ..core.exceptions import (
    CorruptedState,
    InternalError,
    PayloadTooLarge,
    UnsupportedStateVersion,
)
from ..core.models import (
    EXPIRY_BUCKET_SECONDS,
    PAYLOAD_MODELS,
    SCHEMA_VERSION,
    SUPPORTED_SCHEMA_VERSIONS,
    AssistantMessage,
    ConversationKey,
    ConversationStatus,
    Event,
    EventKind,
    Head,
    ImportMark,
)
from . import keys

Item = dict[str, Any]

#: Attribute names. Events are the bulk of every write, so their names are short:
#: an event item's size decides its write units (1 WCU per started KiB).
A_PK = "pk"
A_SK = "sk"
A_SCHEMA = "v"
A_BODY = "d"
A_GEN = "g"
A_VERSION = "ver"
#: DynamoDB's TTL attribute (epoch seconds) on heads; enabled in template.yaml.
A_EXPIRES = "expires_at"
#: Expiry index partition (sparse: only heads that can expire).
A_EXPIRY_BUCKET = "xb"
#: Tenant index partition (tenant-wide erasure).
A_TENANT = "tn"
#: On a head being cleared only: the token of the clear that fenced it (the purge
#: protocol in :mod:`.base`). No turn ever writes it; conditional head writes compare it.
A_FENCE = "fx"
#: Wait index partition (sparse: only heads with due work: a :attr:`Head.wait_deadline`,
#: the earliest deadline of a wait, as the turn layer computed it, or a
#: :attr:`Head.retention_due`): ``"<hour of the earlier>#<shard>"``, for the sweep's pass
#: over due work.
A_WAIT_BUCKET = "wb"
#: A side item's companion: the sort key of a side item in the tenant's own partition
#: (:func:`.keys.tenant_items`) that a purge of the conversation deletes with it.
A_COMPANION = "cx"
#: On a turn item holding several events (docs/STORAGE.md): how many. Absent on an item of
#: one event, whose body is that event's (the layout every older build wrote and reads).
A_COUNT = "n"
#: On a turn item (and a marker): the fast part of the head as of its commit
#: (docs/STORAGE.md, "the effective head"); its version is the item's ``ver``.
A_STATE = "h"
#: On ``HEAD`` and on a turn item (or marker) with a head state, when the store seals
#: content: the content of that state (:data:`STATE_CONTENT`), split out of ``d`` / ``h``
#: by :func:`split_content` and sealed by :mod:`.sealed`; absent when the state holds none.
A_CONTENT = "c"


#: Attributes the store writes on its own items (keys, bodies, lives, TTL, index keys; the
#: inbox's ``ib`` and ``is``): a side item's attributes may not use them, or an index
#: would list it and reads would take it for the store's own. A turn item's ``n`` and ``h``
#: are not among them: only event items are read for those, and a side item is never one.
RESERVED_ATTRIBUTES = frozenset(
    {
        A_PK,
        A_SK,
        A_SCHEMA,
        A_BODY,
        A_GEN,
        A_VERSION,
        A_EXPIRES,
        A_EXPIRY_BUCKET,
        A_TENANT,
        A_FENCE,
        A_WAIT_BUCKET,
        A_COMPANION,
        "ib",
        "is",
    }
)


@dataclass(frozen=True)
class SideItem:
    """An item beside a conversation's transcript (a draft's chunk, state or cancel flag):
    the caller's attributes under a sort key of :data:`.keys.SIDE_PREFIX`, with the
    store's TTL and, optionally, the life that wrote it."""

    sort_key: str
    #: The caller's own attributes (strings and numbers; none of :data:`RESERVED_ATTRIBUTES`).
    attributes: dict[str, Any]
    #: Epoch seconds when the table's TTL may remove it (``None``: never).
    expires_at: int | None = None
    #: The life (``gen``) of the conversation that wrote it (``None``: none).
    gen: str | None = None
    #: The sort key of a side item of the tenant's own partition (:func:`.keys.tenant_items`)
    #: that a purge of this conversation deletes with this one (``None``: none).
    companion: str | None = None


def encode_side_item(key: ConversationKey, side: SideItem) -> Item:
    """The table item of ``side`` in ``key``'s partition.

    Raises:
        InternalError: the sort key is not a side item's, or an attribute is reserved.
    """
    for sort_key in (side.sort_key, side.companion or keys.SIDE_PREFIX):
        if not sort_key.startswith(keys.SIDE_PREFIX):
            raise InternalError(f"not a side item key: {sort_key!r}")
    clash = RESERVED_ATTRIBUTES & side.attributes.keys()
    if clash:
        raise InternalError(f"side item attributes the store reserves: {sorted(clash)}")
    item: Item = {A_PK: keys.partition_key(key), A_SK: side.sort_key, **side.attributes}
    if side.expires_at is not None:
        item[A_EXPIRES] = side.expires_at
    if side.gen is not None:
        item[A_GEN] = side.gen
    if side.companion is not None:
        item[A_COMPANION] = side.companion
    return item


def decode_side_item(item: Item) -> SideItem:
    """The side item ``item`` holds."""
    expires = item.get(A_EXPIRES)
    gen = item.get(A_GEN)
    companion = item.get(A_COMPANION)
    return SideItem(
        sort_key=str(item[A_SK]),
        attributes={k: v for k, v in item.items() if k not in RESERVED_ATTRIBUTES},
        expires_at=int(expires) if isinstance(expires, int | float) else None,
        gen=str(gen) if gen else None,
        companion=str(companion) if companion else None,
    )


class BlobRef(BaseModel):
    """Where an offloaded payload lives in S3, with the hash that proves it whole."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    sha256: str
    size: int


class StoredEvent(BaseModel):
    """The body of an event item: the event without what its key already says."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    turn: int
    kind: EventKind
    actor: str
    at: datetime
    payload: dict[str, Any] | None = None
    ref: BlobRef | None = None
    imported: ImportMark | None = None


def _check_version(item: Item, where: str) -> None:
    found = item.get(A_SCHEMA)
    if not isinstance(found, int) or isinstance(found, bool):
        raise CorruptedState(
            f"{where} has no valid schema version", details={"item": where, "found": found}
        )
    if found not in SUPPORTED_SCHEMA_VERSIONS:
        raise UnsupportedStateVersion(found, SUPPORTED_SCHEMA_VERSIONS, where=where)


def _corrupted(where: str, exc: Exception) -> CorruptedState:
    return CorruptedState(f"{where} fails validation", details={"item": where, "reason": str(exc)})


def encode_head(key: ConversationKey, head: Head) -> Item:
    """The head item of ``head``."""
    pk = keys.partition_key(key)
    item: Item = {
        A_PK: pk,
        A_SK: keys.HEAD_SK,
        A_SCHEMA: SCHEMA_VERSION,
        A_VERSION: head.version,
        # The life as an attribute too: commits and purges condition on it, so a turn
        # that read an earlier life cannot land on a new life that reached the same version.
        A_GEN: head.gen,
        A_TENANT: key.tenant,
        A_BODY: head.model_dump_json(exclude_defaults=True),
    }
    if head.expires_at is not None:
        item[A_EXPIRES] = head.expires_at
        item[A_EXPIRY_BUCKET] = keys.expiry_bucket(head.filed_bucket, pk)
    # The turn layer says when the earliest wait closes and when retained content falls
    # due; the store only files the earlier.
    due = [d for d in (head.wait_deadline, head.retention_due) if d is not None]
    if due and head.status is not ConversationStatus.CLEARED:
        item[A_WAIT_BUCKET] = keys.expiry_bucket(keys.bucket_of(int(min(due).timestamp())), pk)
    return item


def decode_head(item: Item) -> Head:
    """The head in ``item``.

    Raises:
        UnsupportedStateVersion: the item's schema version is unknown to this build.
        CorruptedState: the item does not parse, or its attributes disagree with its body.
    """
    where = "conversation head"
    _check_version(item, where)
    try:
        head = Head.model_validate_json(item[A_BODY])
    except (KeyError, TypeError, ValidationError) as exc:
        raise _corrupted(where, exc) from exc
    if (
        item.get(A_VERSION) != head.version
        or item.get(A_GEN) != head.gen
        or item.get(A_EXPIRES) != head.expires_at
    ):
        raise CorruptedState(
            f"{where} attributes disagree with its body",
            details={"item": where, "reason": "version, gen or expires_at mismatch"},
        )
    return head


def encode_event(
    key: ConversationKey,
    head: Head,
    event: Event,
    ref: BlobRef | None,
    *,
    payload: dict[str, Any] | None = None,
) -> Item:
    """The item of ``event`` in the life ``head.gen``; ``ref`` replaces an offloaded payload.

    ``payload``: the event's :func:`stored_payload`, when the caller has it already.
    """
    body = StoredEvent(
        id=event.event_id,
        turn=event.turn,
        kind=event.kind,
        actor=event.actor,
        at=event.occurred_at,
        payload=None if ref else (payload if payload is not None else stored_payload(event)),
        ref=ref,
        imported=event.imported,
    )
    return {
        A_PK: keys.partition_key(key),
        A_SK: keys.event_sort_key(head.base + event.sequence),
        A_SCHEMA: SCHEMA_VERSION,
        A_GEN: head.gen,
        A_BODY: body.model_dump_json(exclude_none=True),
    }


def decode_stored_event(item: Item, gen: str) -> tuple[int, StoredEvent]:
    """The storage sequence and body of an event item of the life ``gen``.

    Raises:
        UnsupportedStateVersion: the item's schema version is unknown to this build.
        CorruptedState: the item does not parse or belongs to another life.
    """
    sk = str(item.get(A_SK, "?"))
    where = f"event {sk}"
    _check_version(item, where)
    if item.get(A_GEN) != gen:
        raise CorruptedState(
            f"{where} belongs to another life of the conversation",
            details={"item": where, "reason": "generation mismatch"},
        )
    try:
        stored = StoredEvent.model_validate_json(item[A_BODY])
        sequence = keys.sequence_of(sk)
    except (KeyError, TypeError, ValueError, ValidationError) as exc:
        raise _corrupted(where, exc) from exc
    if (stored.payload is None) == (stored.ref is None):
        raise CorruptedState(
            f"{where} must hold exactly one of payload and ref",
            details={"item": where, "reason": "payload/ref"},
        )
    return sequence, stored


_EVENT_LIST: TypeAdapter[list[StoredEvent]] = TypeAdapter(list[StoredEvent])


def encode_turn_item(key: ConversationKey, head: Head, bodies: list[Item]) -> Item:
    """The turn item holding one commit's events (``bodies``: their :func:`encode_event`
    items, consecutive, oldest first) at the storage sequence of the first.

    One event keeps the one-event item every older build wrote and reads; several are
    one item whose body is the list of their bodies and whose ``n`` counts them: a turn's
    events cost one item's write units (1 WCU per started KiB) instead of one per event.

    Raises:
        InternalError: no events.
    """
    if not bodies:
        raise InternalError("a turn item holds at least one event")
    if len(bodies) == 1:
        return bodies[0]
    return {
        A_PK: keys.partition_key(key),
        A_SK: bodies[0][A_SK],
        A_SCHEMA: SCHEMA_VERSION,
        A_GEN: head.gen,
        A_COUNT: len(bodies),
        A_BODY: "[" + ",".join(str(body[A_BODY]) for body in bodies) + "]",
    }


def event_count(item: Item) -> int:
    """How many events the event item ``item`` holds (1 for an item of the older layout,
    0 for a marker).

    Raises:
        CorruptedState: its count is not an integer >= 0.
    """
    count = item.get(A_COUNT, 1)
    if type(count) is not int or count < 0:
        where = f"event {item.get(A_SK, '?')}"
        raise CorruptedState(
            f"{where} has no valid event count", details={"item": where, "found": count}
        )
    return count


def last_sequence(item: Item) -> int:
    """The storage sequence of the newest event of the event item ``item``.

    Raises:
        CorruptedState: its key or count cannot be read.
    """
    sort_key = str(item.get(A_SK, "?"))
    try:
        first = keys.sequence_of(sort_key)
    except ValueError as exc:
        raise CorruptedState(
            "an item of the transcript has no event key",
            details={"item": sort_key, "reason": str(exc)},
        ) from exc
    return first + event_count(item) - 1


def decode_turn_item(item: Item, gen: str) -> list[tuple[int, StoredEvent, int]]:
    """The events of an event item of the life ``gen``, oldest first: storage sequence,
    body, and the characters of the body as stored (what a context read weighs).

    Reads both layouts: an item of one event (no ``n``) and a turn item of several.

    Raises:
        UnsupportedStateVersion: the item's schema version is unknown to this build.
        CorruptedState: the item does not parse or belongs to another life.
    """
    if A_COUNT not in item:
        sequence, stored = decode_stored_event(item, gen)
        return [(sequence, stored, len(str(item.get(A_BODY, ""))))]
    sk = str(item.get(A_SK, "?"))
    where = f"event {sk}"
    _check_version(item, where)
    if item.get(A_GEN) != gen:
        raise CorruptedState(
            f"{where} belongs to another life of the conversation",
            details={"item": where, "reason": "generation mismatch"},
        )
    count = event_count(item)
    if count == 0:
        return []  # a marker: a head state and no event
    try:
        bodies = _EVENT_LIST.validate_json(item[A_BODY])
        first = keys.sequence_of(sk)
    except (KeyError, TypeError, ValueError, ValidationError) as exc:
        raise _corrupted(where, exc) from exc
    if len(bodies) != count:
        raise CorruptedState(
            f"{where} holds another number of events than it says",
            details={"item": where, "reason": f"{len(bodies)} events, n = {count}"},
        )
    if any((stored.payload is None) == (stored.ref is None) for stored in bodies):
        raise CorruptedState(
            f"{where} must hold exactly one of payload and ref",
            details={"item": where, "reason": "payload/ref"},
        )
    # Each body's share of the item, for the context budget (the item's text split by event).
    size = len(str(item[A_BODY])) // count
    return [(first + i, stored, size) for i, stored in enumerate(bodies)]


#: Head fields kept on ``HEAD`` only (docs/STORAGE.md): fixed for a life, or what an index,
#: DynamoDB's TTL or a clear reads there. Every other field is the fast state a turn item
#: carries; a commit that changes one of these rewrites ``HEAD``.
SLOW_FIELDS = frozenset(
    {
        "schema_version",
        "gen",
        "base",
        "created_at",
        "ttl_seconds",
        "fork",
        "memory_off",
        "expiry_bucket",
        "data_class",
        "retention_due",
        "pins",
    }
)
#: Fast fields a turn item does not store: its ``ver`` and its key say them.
_DERIVED = frozenset({"version", "seq"})


def marker_item(key: ConversationKey, head: Head) -> Item:
    """The marker of ``head``: a turn item with no event at the slot after ``head.seq``,
    holding the head state a commit of no event (a lease, a cancel request) writes."""
    return {
        A_PK: keys.partition_key(key),
        A_SK: keys.event_sort_key(head.seq + 1),
        A_SCHEMA: SCHEMA_VERSION,
        A_GEN: head.gen,
        A_COUNT: 0,
    }


@dataclass(frozen=True)
class _Content:
    """A field of a head state that holds content; ``placeholder``: what a reader without
    keys (:func:`without_content`) sees in its place (``None``: the field is left out)."""

    placeholder: Any = None


#: The fields of a head state that hold content (what a person, a model or a caller wrote,
#: and the hash of a call's arguments), by where they sit in the state's JSON: a dict of
#: fields, a one-element list for every element of a list. Everything else (ids, names,
#: call states, statuses, counts, times, the request's fingerprint) stays clear: the
#: sweep, purges and indexes read it.
STATE_CONTENT: dict[str, Any] = {
    "pending": [
        {
            "arguments": _Content(placeholder={}),
            "arguments_sha256": _Content(placeholder=""),
            "reason": _Content(),
            "elicitation": _Content(),
        }
    ],
    "cancel": {"reason": _Content()},
    "options": {"response_format": _Content(), "client_tools": _Content()},
    "pins": [{"text": _Content(placeholder=""), "reason": _Content()}],
}


def _split(state: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """Move the content fields of ``spec`` out of ``state`` (in place); returns them."""
    content: dict[str, Any] = {}
    for name, sub in spec.items():
        if name not in state:
            continue
        value = state[name]
        if isinstance(sub, _Content):
            content[name] = state.pop(name)
        elif isinstance(sub, dict) and isinstance(value, dict):
            inner = _split(value, sub)
            if inner:
                content[name] = inner
        elif isinstance(sub, list) and isinstance(value, list):
            parts = [
                _split(element, sub[0]) if isinstance(element, dict) else {} for element in value
            ]
            if any(parts):
                content[name] = parts
    return content


def _join(state: dict[str, Any], content: dict[str, Any] | None, spec: dict[str, Any]) -> None:
    """Put ``content`` (:func:`_split`'s) back into ``state`` (in place); ``None``: withheld,
    the required fields take their placeholders."""
    for name, sub in spec.items():
        part = None if content is None else content.get(name)
        if isinstance(sub, _Content):
            if content is not None:
                if name in content:
                    state[name] = content[name]
            elif sub.placeholder is not None:
                state[name] = copy.deepcopy(sub.placeholder)
        elif isinstance(sub, dict):
            if isinstance(state.get(name), dict):
                _join(state[name], None if content is None else part or {}, sub)
        elif isinstance(sub, list):
            elements = state.get(name)
            if isinstance(elements, list):
                parts = part if isinstance(part, list) else []
                for i, element in enumerate(elements):
                    given = parts[i] if i < len(parts) and isinstance(parts[i], dict) else {}
                    if isinstance(element, dict):
                        _join(element, None if content is None else given, sub[0])


def state_attribute(item: Item) -> str | None:
    """The attribute of ``item`` that holds a head state: ``HEAD``'s body, a turn item's
    ``h``; ``None`` for any other item."""
    sort_key = str(item.get(A_SK, ""))
    if sort_key == keys.HEAD_SK:
        return A_BODY if A_BODY in item else None
    if sort_key.startswith(keys.EVENT_PREFIX) and A_STATE in item:
        return A_STATE
    return None


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def split_content(item: Item) -> Item:
    """``item`` (``HEAD`` or a turn item) with the content of its head state
    (:data:`STATE_CONTENT`) moved into :data:`A_CONTENT` (clear text, for :mod:`.sealed` to
    seal); ``item`` itself when it holds none, or was split already."""
    name = state_attribute(item)
    if name is None or A_CONTENT in item:
        return item
    try:
        state = json.loads(str(item[name]))
    except ValueError:
        return item  # not a state this build reads: left as it is
    if not isinstance(state, dict):
        return item
    content = _split(state, STATE_CONTENT)
    if not content:
        return item
    return {**item, name: _dumps(state), A_CONTENT: _dumps(content)}


def join_content(item: Item) -> Item:
    """``item`` with the content of its head state (:data:`A_CONTENT`, opened: text) put
    back into it, as :func:`split_content` found it; ``item`` itself when it has none.

    Raises:
        CorruptedState: the content does not parse.
    """
    content = item.get(A_CONTENT)
    name = state_attribute(item)
    if content is None or name is None:
        return item
    if not isinstance(content, str):
        raise InternalError("a head state's content is joined once opened")
    return _joined(item, name, content)


def without_content(item: Item) -> Item:
    """``item`` as a reader without keys sees it: content still sealed (not opened) is
    left out, its required fields at placeholders (a pending call's ``arguments`` ``{}``).

    For readers that use no content (the sweep, purges, re-filing), never to show
    content or to write a head state: what is left out would be lost.

    Raises:
        CorruptedState: clear content that does not parse.
    """
    content = item.get(A_CONTENT)
    name = state_attribute(item)
    if content is None or name is None:
        return item
    if isinstance(content, str):
        return _joined(item, name, content)
    return _joined(item, name, None)


def _joined(item: Item, name: str, content: str | None) -> Item:
    where = f"head state of {item.get(A_SK, '?')}"
    try:
        state = json.loads(str(item[name]))
        parts = None if content is None else json.loads(content)
        if not isinstance(state, dict) or not isinstance(parts, dict | None):
            raise ValueError("not an object")
    except ValueError as exc:
        raise _corrupted(where, exc) from exc
    _join(state, parts, STATE_CONTENT)
    joined = {**item, name: _dumps(state)}
    del joined[A_CONTENT]
    return joined


def holds_clear_content(item: Item | None) -> bool:
    """Whether the head state of ``item`` holds content in clear (written by a build that
    did not seal it): a store that seals rewrites it."""
    if item is None or A_CONTENT in item:
        return False
    return split_content(item) is not item


def with_state(item: Item, head: Head) -> Item:
    """``item`` (a turn item or a marker) carrying ``head``'s fast state and version."""
    state = head.model_dump_json(exclude=set(SLOW_FIELDS | _DERIVED), exclude_defaults=True)
    return {**item, A_VERSION: head.version, A_STATE: state}


def effective_head(head: Head, newest: Item | None) -> Head:
    """The conversation's head: ``head`` (as ``HEAD`` holds it) merged with the fast state of
    ``newest``, the newest event item of the partition, when that item is of ``head``'s life
    and at least as new; else ``head`` itself (a tombstone, today's layout, a leftover).

    Raises:
        CorruptedState: ``newest``'s state cannot be read.
    """
    if (
        newest is None
        or head.status is ConversationStatus.CLEARED
        or A_STATE not in newest
        or newest.get(A_GEN) != head.gen
    ):
        return head
    version = newest.get(A_VERSION)
    where = f"event {newest.get(A_SK, '?')}"
    if type(version) is not int:
        raise CorruptedState(f"{where} has no valid version", details={"item": where})
    if version < head.version:
        return head
    try:
        state = json.loads(str(newest[A_STATE]))
        if not isinstance(state, dict):
            raise ValueError("not an object")
        data = {**json.loads(head.model_dump_json(include=set(SLOW_FIELDS))), **state}
        data["version"] = version
        first = keys.sequence_of(str(newest[A_SK]))
        data["seq"] = first - 1 if event_count(newest) == 0 else last_sequence(newest)
        return Head.model_validate_json(json.dumps(data))
    except (ValueError, ValidationError) as exc:
        raise _corrupted(where, exc) from exc


def bucket_end(expires_at: int | None) -> int | None:
    """The last second of ``expires_at``'s hour bucket: ``HEAD``'s TTL, never earlier than
    the conversation's expiry, and the same for every turn within that hour."""
    if expires_at is None:
        return None
    return (keys.bucket_of(expires_at) + 1) * EXPIRY_BUCKET_SECONDS - 1


def head_of_record(head: Head) -> Head:
    """``head`` as ``HEAD`` stores it: its expiry at the end of its hour bucket."""
    return head.model_copy(update={"expires_at": bucket_end(head.expires_at)})


def same_slow_state(stored: Item | None, wanted: Item) -> bool:
    """Whether the ``HEAD`` item ``stored`` holds what ``wanted`` (a ``HEAD`` item about to be
    written) would: its slow fields, its index attributes and TTL; no fence."""
    if stored is None or A_FENCE in stored:
        return False
    attributes = (A_GEN, A_EXPIRES, A_EXPIRY_BUCKET, A_WAIT_BUCKET, A_TENANT, A_SCHEMA)
    if any(stored.get(name) != wanted.get(name) for name in attributes):
        return False
    try:
        old, new = json.loads(str(stored[A_BODY])), json.loads(str(wanted[A_BODY]))
    except (KeyError, ValueError):
        return False
    if not isinstance(old, dict) or not isinstance(new, dict):
        return False
    if old.get("status") == ConversationStatus.CLEARED.value:
        return False
    return all(old.get(name) == new.get(name) for name in SLOW_FIELDS)


def build_event(
    conversation_id: str, base: int, sequence: int, stored: StoredEvent, payload: dict[str, Any]
) -> Event:
    """The public event from a decoded body and its (possibly fetched) payload, written in
    ``conversation_id`` at the storage ``sequence`` of a life whose ``base`` is given.

    Raises:
        CorruptedState: the payload does not fit the event's kind.
    """
    try:
        return Event(
            event_id=stored.id,
            conversation_id=conversation_id,
            sequence=sequence - base,
            turn=stored.turn,
            kind=stored.kind,
            actor=stored.actor,
            occurred_at=stored.at,
            payload=payload,
            imported=stored.imported,
        )
    except ValidationError as exc:
        raise _corrupted(f"event {keys.event_sort_key(sequence)}", exc) from exc


def stored_payload(event: Event) -> dict[str, Any]:
    """The payload as stored: fields at their defaults are left out.

    Every byte of an event item is paid for on each write (1 WCU per started
    KiB); reads fill the defaults back in, so the public shape is unchanged.
    """
    model = PAYLOAD_MODELS[event.kind].model_validate(event.payload)
    if isinstance(model, AssistantMessage):
        return model.stored()
    compact: dict[str, Any] = model.model_dump(mode="json", exclude_defaults=True)
    return compact


def payload_bytes(payload: dict[str, Any]) -> bytes:
    """The canonical JSON of a stored payload (what is offloaded and hashed)."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def attribute_size(value: Any) -> int:
    """The bytes DynamoDB counts for one attribute value (its name is counted apart).

    Strings count their UTF-8 bytes, binary values their bytes; numbers one byte per two
    significant digits plus one.

    Raises:
        TypeError: a type the store never writes.
    """
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, bool):
        return 1
    if isinstance(value, int | float | Decimal):
        digits = Decimal(value).normalize().as_tuple().digits
        significant = len(digits) if any(digits) else 1
        return math.ceil(significant / 2) + 1
    raise TypeError(f"no size rule for {type(value).__name__}")


def item_size(item: Item) -> int:
    """The size of an item as DynamoDB counts it: attribute names plus values."""
    return sum(len(name.encode()) + attribute_size(value) for name, value in item.items())


#: DynamoDB's item size limit (attribute names and values, UTF-8): the backends that are
#: not DynamoDB enforce it too, so a turn that fits locally fits when deployed.
MAX_ITEM_BYTES = 400 * 1024

#: The attributes that tell one head from another: any commit changes ``ver``, ``g``
#: tells lives apart, and ``fx`` is a clear's fence.
HEAD_IDENTITY = (A_VERSION, A_GEN, A_FENCE)


def unchanged(stored: Item, expected: Item) -> bool:
    """Whether ``stored`` still holds each attribute of ``expected`` with that value
    (``None``: absent): the reference meaning of :class:`.backend.Unchanged`."""
    return all(stored.get(name) == value for name, value in expected.items())


def check_item_sizes(items: list[Item]) -> None:
    """Refuse a write holding an item over :data:`MAX_ITEM_BYTES`.

    Raises:
        PayloadTooLarge: an item is over the limit.
    """
    for item in items:
        if item_size(item) > MAX_ITEM_BYTES:
            raise PayloadTooLarge(
                "the turn's state is too large to store",
                details={"reason": f"item {item[A_SK]} is over {MAX_ITEM_BYTES} bytes"},
            )


def expected_head(expected_version: int | None, gen: str) -> Item | None:
    """The head identity a commit expects (``None``: no head at all)."""
    return None if expected_version is None else {A_VERSION: expected_version, A_GEN: gen}


def same_head(stored: Item | None, expected: Item | None) -> bool:
    """Whether ``stored`` is still the head ``expected`` (``None``: no head): every
    identity attribute present in both with the same value, or absent in both."""
    if expected is None or stored is None:
        return expected is None and stored is None
    return all(
        (name in stored) == (name in expected) and stored.get(name) == expected.get(name)
        for name in HEAD_IDENTITY
    )
