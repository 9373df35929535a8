"""A frozen copy of the storage layout of commit a5910d8 (before issue 21): the *legacy* layout.

It writes and reads exactly the items that commit's store wrote: one ``E#<storage
sequence:012>`` item per event (``v``, ``g``, ``d`` = the event's JSON body), the full
``HEAD`` item rewritten by every commit, and every commit one ``TransactWriteItems``
(each event put on ``attribute_not_exists(pk) OR g <> :g``, the inbox entries of the same
commit, and the head put on the version and life the turn read). Tests use it to create
conversations as the deployed store did and check that the current store reads and
continues them with no migration step; the benchmarks use it as the baseline.

It is self-contained on purpose: it keeps today's encoding and commit and load paths
whatever the store under it becomes. From the store it imports only public names that
both layouts share (the models, the inbox entry encoding, the key builders of
:mod:`turnledger.store.keys`, :class:`~turnledger.store.base.Snapshot` and
:class:`~turnledger.store.base.ContextBudget`), never a private helper.

:class:`LegacyLayout` is a mixin over any current backend class: it replaces ``get_head``,
``load``, ``read_events`` and ``commit`` with the legacy ones and leaves every other
operation (clear, sweep, side items, records, inbox pages, forks...) to the backend, so a
service built on it runs whole turns, approvals and compactions with legacy items. The
raw reads and writes go through a :class:`LegacyBackend` of the same database:
:class:`LegacyDynamoDB` (moto, DynamoDB Local) or :class:`LegacySQLite`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import secrets
import sqlite3
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict, ValidationError
from turnledger.core.exceptions import (
    ConversationBusy,
    CorruptedState,
    InternalError,
    PayloadTooLarge,
    ServiceUnavailable,
    TurnledgerError,
    UnsupportedStateVersion,
)
from turnledger.core.models import (
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
from turnledger.store import inbox, keys
from turnledger.store.base import ContextBudget, Snapshot
from turnledger.store.dynamodb import DynamoDBConversationStore
from turnledger.store.sqlite import SQLiteConversationStore

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from turnledger.store.base import CapacityMeter
    from turnledger.store.blobs import BlobStore

Item = dict[str, Any]

# --- the item encoding (store/codec.py of a5910d8) ------------------------------------------

A_PK = "pk"
A_SK = "sk"
A_SCHEMA = "v"
A_BODY = "d"
A_GEN = "g"
A_VERSION = "ver"
A_EXPIRES = "expires_at"
A_EXPIRY_BUCKET = "xb"
A_TENANT = "tn"
A_FENCE = "fx"
A_WAIT_BUCKET = "wb"

HEAD_SK = "HEAD"
EVENT_PREFIX = "E#"
_SEQ_WIDTH = 12
#: A transaction holds at most 100 items; one is the head.
MAX_EVENTS_PER_COMMIT = 99
#: Items of the load's first query: the head and the newest events.
FIRST_PAGE = 8
DEFAULT_OFFLOAD_THRESHOLD = 64 * 1024
MAX_ITEM_BYTES = 400 * 1024


def event_sort_key(storage_sequence: int) -> str:
    """The legacy sort key of the event at ``storage_sequence``: one item per event."""
    return f"{EVENT_PREFIX}{storage_sequence:0{_SEQ_WIDTH}d}"


class BlobRef(BaseModel):
    """Where an offloaded payload lives, with the hash that proves it whole."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    sha256: str
    size: int


class StoredEvent(BaseModel):
    """The body of a legacy event item: the event without what its key already says."""

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
        raise CorruptedState(f"{where} has no valid schema version", details={"item": where})
    if found not in SUPPORTED_SCHEMA_VERSIONS:
        raise UnsupportedStateVersion(found, SUPPORTED_SCHEMA_VERSIONS, where=where)


def _corrupted(where: str, exc: Exception) -> CorruptedState:
    return CorruptedState(f"{where} fails validation", details={"item": where, "reason": str(exc)})


def expiry_partition_of(bucket: int, pk: str) -> str:
    """The ``by-expiry`` partition of a head of ``pk`` filed under the hour ``bucket``."""
    shard = int.from_bytes(hashlib.sha256(pk.encode()).digest()[:2], "big") % 4
    return f"{bucket}#{shard}"


def encode_head(key: ConversationKey, head: Head) -> Item:
    """The legacy head item of ``head``: the whole head in ``d``, its index keys beside it."""
    pk = keys.partition_key(key)
    item: Item = {
        A_PK: pk,
        A_SK: HEAD_SK,
        A_SCHEMA: SCHEMA_VERSION,
        A_VERSION: head.version,
        A_GEN: head.gen,
        A_TENANT: key.tenant,
        A_BODY: head.model_dump_json(exclude_defaults=True),
    }
    if head.expires_at is not None:
        item[A_EXPIRES] = head.expires_at
        item[A_EXPIRY_BUCKET] = expiry_partition_of(head.filed_bucket, pk)
    if head.wait_deadline is not None and head.status is not ConversationStatus.CLEARED:
        due = int(head.wait_deadline.timestamp())
        item[A_WAIT_BUCKET] = expiry_partition_of(due // 3600, pk)
    return item


def decode_head(item: Item) -> Head:
    """The head in a legacy head item.

    Raises:
        CorruptedState, UnsupportedStateVersion: the item cannot be read.
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
        raise CorruptedState(f"{where} attributes disagree with its body")
    return head


def stored_payload(event: Event) -> dict[str, Any]:
    """The payload as the legacy layout stored it: fields at their defaults left out."""
    model = PAYLOAD_MODELS[event.kind].model_validate(event.payload)
    if isinstance(model, AssistantMessage):
        return model.stored()
    compact: dict[str, Any] = model.model_dump(mode="json", exclude_defaults=True)
    return compact


def payload_bytes(payload: dict[str, Any]) -> bytes:
    """The canonical JSON of a stored payload (what is offloaded and hashed)."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def encode_event(key: ConversationKey, head: Head, event: Event, ref: BlobRef | None) -> Item:
    """The legacy item of ``event``: one item per event, ``ref`` replacing an offloaded payload."""
    body = StoredEvent(
        id=event.event_id,
        turn=event.turn,
        kind=event.kind,
        actor=event.actor,
        at=event.occurred_at,
        payload=None if ref else stored_payload(event),
        ref=ref,
        imported=event.imported,
    )
    return {
        A_PK: keys.partition_key(key),
        A_SK: event_sort_key(head.base + event.sequence),
        A_SCHEMA: SCHEMA_VERSION,
        A_GEN: head.gen,
        A_BODY: body.model_dump_json(exclude_none=True),
    }


def decode_stored_event(item: Item, gen: str) -> tuple[int, StoredEvent]:
    """The storage sequence and body of a legacy event item of the life ``gen``.

    Raises:
        CorruptedState, UnsupportedStateVersion: the item cannot be read.
    """
    sk = str(item.get(A_SK, "?"))
    where = f"event {sk}"
    _check_version(item, where)
    if item.get(A_GEN) != gen:
        raise CorruptedState(f"{where} belongs to another life of the conversation")
    try:
        stored = StoredEvent.model_validate_json(item[A_BODY])
        sequence = int(sk.removeprefix(EVENT_PREFIX))
    except (KeyError, TypeError, ValueError, ValidationError) as exc:
        raise _corrupted(where, exc) from exc
    if (stored.payload is None) == (stored.ref is None):
        raise CorruptedState(f"{where} must hold exactly one of payload and ref")
    return sequence, stored


def attribute_size(value: Any) -> int:
    """The bytes DynamoDB counts for one attribute value."""
    if isinstance(value, str):
        return len(value.encode())
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


def _storage_sequence(item: Item) -> int:
    sort_key = str(item.get(A_SK, ""))
    try:
        return int(sort_key.removeprefix(EVENT_PREFIX))
    except ValueError as exc:
        raise CorruptedState("an item of the transcript has no event key") from exc


def _gaps(first: int, last: int) -> CorruptedState:
    return CorruptedState(
        "the transcript has gaps",
        details={"item": "events", "reason": f"expected sequences {first}..{last}"},
    )


# --- the raw reads and writes of one database -----------------------------------------------


@dataclass(frozen=True)
class RawPage:
    """One page of a raw query: items, and the opaque resume point (``None``: exhausted)."""

    items: list[Item]
    cursor: Any = None


class LegacyBackend(Protocol):
    """The three raw operations the legacy layout needs, on one database."""

    def get(self, pk: str, sk: str) -> Item | None:
        """The item at ``(pk, sk)``, strongly consistent."""

    def query(
        self,
        pk: str,
        *,
        lower: str | None,
        upper: str | None,
        descending: bool,
        limit: int,
        cursor: Any,
        consistent: bool = True,
    ) -> RawPage:
        """One page of ``pk``'s items with ``lower <= sk <= upper``."""

    def transact_commit(
        self,
        head: Item,
        expected: Item | None,
        events: list[Item],
        gen: str,
        *,
        puts: Sequence[Item],
        deletes: Sequence[str],
    ) -> None:
        """The legacy commit: the events (never over an event of life ``gen``), the entry
        puts and deletes, and the head on the condition that the stored one is ``expected``
        (``ver``, ``g``, ``fx`` each equal or absent in both; ``None``: no head), at once.

        Raises:
            ConversationBusy: a condition failed; nothing was written.
        """


_serializer = TypeSerializer()
_deserializer = TypeDeserializer()


def _wire_value(value: Any) -> Any:
    return _serializer.serialize(Decimal(str(value)) if isinstance(value, float) else value)


def to_wire(item: Item) -> dict[str, Any]:
    """``item`` in DynamoDB's wire format."""
    return {name: _wire_value(value) for name, value in item.items()}


def from_wire(wire: dict[str, Any]) -> Item:
    """An item from DynamoDB's wire format (integral numbers as ``int``)."""
    item: Item = {}
    for name, value in wire.items():
        if "B" in value:
            item[name] = bytes(value["B"])  # sealed content (store/sealed.py)
            continue
        plain = _deserializer.deserialize(value)
        if isinstance(plain, Decimal):
            plain = int(plain) if plain == plain.to_integral_value() else float(plain)
        item[name] = plain
    return item


_HEAD_IDENTITY = {"#ver": A_VERSION, "#g": A_GEN, "#fx": A_FENCE}


def _expect_head(expected: Item | None) -> dict[str, Any]:
    if expected is None:
        return {
            "ConditionExpression": "attribute_not_exists(#pk)",
            "ExpressionAttributeNames": {"#pk": A_PK},
        }
    clauses = ["attribute_exists(#pk)"]
    values: dict[str, Any] = {}
    for placeholder, name in _HEAD_IDENTITY.items():
        if name in expected:
            clauses.append(f"{placeholder} = :{name}")
            values[f":{name}"] = _wire_value(expected[name])
        else:
            clauses.append(f"attribute_not_exists({placeholder})")
    condition: dict[str, Any] = {
        "ConditionExpression": " AND ".join(clauses),
        "ExpressionAttributeNames": {"#pk": A_PK, **_HEAD_IDENTITY},
    }
    if values:
        condition["ExpressionAttributeValues"] = values
    return condition


def _units(consumed: Any) -> float:
    if consumed is None:
        return 0.0
    if isinstance(consumed, list):
        return sum(float(c.get("CapacityUnits", 0.0)) for c in consumed)
    return float(consumed.get("CapacityUnits", 0.0))


@dataclass
class LegacyDynamoDB:
    """The legacy layout's raw operations on a DynamoDB table (moto or DynamoDB Local)."""

    client: DynamoDBClient
    table_name: str
    meter: CapacityMeter

    def get(self, pk: str, sk: str) -> Item | None:
        """The item at ``(pk, sk)``, strongly consistent."""
        response = self.client.get_item(
            TableName=self.table_name,
            Key=to_wire({A_PK: pk, A_SK: sk}),
            ConsistentRead=True,
            ReturnConsumedCapacity="TOTAL",
        )
        self.meter.read(_units(response.get("ConsumedCapacity")))
        wire = response.get("Item")
        return from_wire(wire) if wire else None

    def query(
        self,
        pk: str,
        *,
        lower: str | None,
        upper: str | None,
        descending: bool,
        limit: int,
        cursor: Any,
        consistent: bool = True,
    ) -> RawPage:
        """One page of ``pk``'s items with ``lower <= sk <= upper``."""
        names = {"#pk": A_PK}
        values: dict[str, Any] = {":pk": pk}
        clauses = ["#pk = :pk"]
        if lower is not None and upper is not None:
            clauses.append("#sk BETWEEN :lower AND :upper")
        elif lower is not None:
            clauses.append("#sk >= :lower")
        elif upper is not None:
            clauses.append("#sk <= :upper")
        if lower is not None:
            values[":lower"] = lower
        if upper is not None:
            values[":upper"] = upper
        if lower is not None or upper is not None:
            names["#sk"] = A_SK
        kwargs: dict[str, Any] = {
            "TableName": self.table_name,
            "KeyConditionExpression": " AND ".join(clauses),
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": to_wire(values),
            "ScanIndexForward": not descending,
            "ConsistentRead": consistent,
            "Limit": limit,
            "ReturnConsumedCapacity": "TOTAL",
        }
        if cursor is not None:
            kwargs["ExclusiveStartKey"] = cursor
        response = self.client.query(**kwargs)
        self.meter.read(_units(response.get("ConsumedCapacity")))
        return RawPage(
            items=[from_wire(i) for i in response.get("Items", [])],
            cursor=response.get("LastEvaluatedKey"),
        )

    def transact_commit(
        self,
        head: Item,
        expected: Item | None,
        events: list[Item],
        gen: str,
        *,
        puts: Sequence[Item],
        deletes: Sequence[str],
    ) -> None:
        """The legacy commit as one ``TransactWriteItems``.

        Raises:
            ConversationBusy: a condition failed or another transaction held an item.
            PayloadTooLarge: DynamoDB refused the size.
            ServiceUnavailable, InternalError: any other refusal.
        """
        event_condition = {
            "ConditionExpression": "attribute_not_exists(#pk) OR #g <> :g",
            "ExpressionAttributeNames": {"#pk": A_PK, "#g": A_GEN},
            "ExpressionAttributeValues": {":g": _serializer.serialize(gen)},
        }
        transact: list[Any] = [
            {"Put": {"TableName": self.table_name, "Item": to_wire(e), **event_condition}}
            for e in events
        ]
        transact.extend({"Put": {"TableName": self.table_name, "Item": to_wire(p)}} for p in puts)
        transact.extend(
            {"Delete": {"TableName": self.table_name, "Key": to_wire({A_PK: head[A_PK], A_SK: sk})}}
            for sk in deletes
        )
        transact.append(
            {"Put": {"TableName": self.table_name, "Item": to_wire(head), **_expect_head(expected)}}
        )
        try:
            response = self.client.transact_write_items(
                TransactItems=transact,
                ReturnConsumedCapacity="TOTAL",
                ClientRequestToken=uuid.uuid4().hex,
            )
        except ClientError as exc:
            raise _commit_error(exc) from exc
        self.meter.write(_units(response.get("ConsumedCapacity")))


def _commit_error(exc: ClientError) -> TurnledgerError:
    code = str(exc.response.get("Error", {}).get("Code", ""))
    reasons = [str(r.get("Code", "")) for r in exc.response.get("CancellationReasons", [])]
    if code == "TransactionConflictException" or "TransactionConflict" in reasons:
        return ConversationBusy(
            "another turn or decision on this conversation is committing",
            details={"retry_after_seconds": 1},
        )
    if "ConditionalCheckFailed" in reasons:
        return ConversationBusy("another turn or decision on this conversation committed first")
    message = str(exc).lower()
    if "size" in message or "larger than" in message:
        return PayloadTooLarge("the turn's state is too large to store")
    if "Throttl" in code or "Throughput" in code or any("Throttl" in r for r in reasons):
        return ServiceUnavailable("the conversation store is throttling requests; retry shortly")
    return InternalError(f"DynamoDB refused the commit: {code}")


#: The SQLite backend's row of a5910d8: ``(pk, sk, item, xb, tn, wb, inbox_pk, inbox_sk)``,
#: each index column holding its attribute when it is a string.
_SQLITE_INDEXED = (A_EXPIRY_BUCKET, A_TENANT, A_WAIT_BUCKET, inbox.A_INBOX, inbox.A_INBOX_SORT)
_SQLITE_INSERT = (
    "INSERT OR REPLACE INTO items (pk, sk, item, xb, tn, wb, inbox_pk, inbox_sk) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)


def _sqlite_row(item: Item) -> tuple[Any, ...]:
    indexed = [item[n] if isinstance(item.get(n), str) else None for n in _SQLITE_INDEXED]
    text = json.dumps(item, ensure_ascii=False, separators=(",", ":"))
    return (item[A_PK], item[A_SK], text, *indexed)


@dataclass
class LegacySQLite:
    """The legacy layout's raw operations on the SQLite store's database file (the table
    ``items`` the current SQLite store created), one connection of its own."""

    path: Path
    meter: CapacityMeter
    _db: sqlite3.Connection | None = field(default=None, repr=False)

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            self._db = sqlite3.connect(
                self.path, timeout=30.0, isolation_level=None, check_same_thread=False
            )
        return self._db

    def get(self, pk: str, sk: str) -> Item | None:
        """The item at ``(pk, sk)``."""
        self.meter.read(0)
        row = (
            self._connection()
            .execute("SELECT item FROM items WHERE pk = ? AND sk = ?", (pk, sk))
            .fetchone()
        )
        return None if row is None else dict(json.loads(row[0]))

    def query(
        self,
        pk: str,
        *,
        lower: str | None,
        upper: str | None,
        descending: bool,
        limit: int,
        cursor: Any,
        consistent: bool = True,
    ) -> RawPage:
        """One page of ``pk``'s items with ``lower <= sk <= upper``; the cursor is the last
        sort key returned."""
        self.meter.read(0)
        clauses, values = ["pk = ?"], [pk]
        if lower is not None:
            clauses.append("sk >= ?")
            values.append(lower)
        if upper is not None:
            clauses.append("sk <= ?")
            values.append(upper)
        if cursor is not None:
            clauses.append("sk < ?" if descending else "sk > ?")
            values.append(cursor)
        order = "DESC" if descending else "ASC"
        rows = (
            self._connection()
            .execute(
                f"SELECT sk, item FROM items WHERE {' AND '.join(clauses)} "
                f"ORDER BY sk {order} LIMIT ?",
                (*values, limit + 1),
            )
            .fetchall()
        )
        chosen = rows[:limit]
        return RawPage(
            items=[dict(json.loads(item)) for _, item in chosen],
            cursor=chosen[-1][0] if len(rows) > limit else None,
        )

    def transact_commit(
        self,
        head: Item,
        expected: Item | None,
        events: list[Item],
        gen: str,
        *,
        puts: Sequence[Item],
        deletes: Sequence[str],
    ) -> None:
        """The legacy commit as one ``BEGIN IMMEDIATE`` transaction.

        Raises:
            ConversationBusy: a condition failed; nothing was written.
        """
        db = self._connection()
        db.execute("BEGIN IMMEDIATE")
        try:
            pk = head[A_PK]
            stored = self._item(db, pk, HEAD_SK)
            if not _same_head(stored, expected):
                raise ConversationBusy("another turn or decision on this conversation committed")
            for event in events:
                old = self._item(db, pk, event[A_SK])
                if old is not None and old.get(A_GEN) == gen:
                    raise ConversationBusy("another turn on this conversation committed first")
            db.executemany(_SQLITE_INSERT, [_sqlite_row(i) for i in [*events, *puts, head]])
            db.executemany("DELETE FROM items WHERE pk = ? AND sk = ?", [(pk, s) for s in deletes])
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        self.meter.write(0)

    @staticmethod
    def _item(db: sqlite3.Connection, pk: str, sk: str) -> Item | None:
        row = db.execute("SELECT item FROM items WHERE pk = ? AND sk = ?", (pk, sk)).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def close(self) -> None:
        """Close the connection."""
        if self._db is not None:
            self._db.close()
            self._db = None


def _same_head(stored: Item | None, expected: Item | None) -> bool:
    if expected is None or stored is None:
        return expected is None and stored is None
    return all(
        (name in stored) == (name in expected) and stored.get(name) == expected.get(name)
        for name in (A_VERSION, A_GEN, A_FENCE)
    )


# --- the read and commit paths (store/base.py of a5910d8) ----------------------------------


@dataclass(frozen=True)
class _Piece:
    key: ConversationKey
    gen: str
    base: int
    first: int
    last: int


_Placed = tuple[_Piece, int]


def _pieces(key: ConversationKey, head: Head) -> list[_Piece]:
    pieces: list[_Piece] = []
    first = 1
    if head.fork is not None:
        for segment in head.fork.segments:
            if segment.through >= first:
                where = ConversationKey(tenant=key.tenant, conversation_id=segment.conversation_id)
                pieces.append(_Piece(where, segment.gen, segment.base, first, segment.through))
            first = segment.through + 1
    if head.event_count >= first:
        pieces.append(_Piece(key, head.gen, head.base, first, head.event_count))
    return pieces


@dataclass
class _Window:
    budget: ContextBudget
    taken: list[tuple[_Placed, StoredEvent]] = field(default_factory=list)
    chars: int = 0
    turn: list[tuple[_Placed, StoredEvent]] = field(default_factory=list)
    turn_chars: int = 0

    def offer(self, item: Item, where: _Placed, stored: StoredEvent) -> bool:
        if self.turn and stored.turn != self.turn[-1][1].turn and not self.close():
            return False
        self.turn.append((where, stored))
        self.turn_chars += len(item.get(A_BODY, "")) + (stored.ref.size if stored.ref else 0)
        return not self.taken or self._fits()

    def close(self) -> bool:
        if self.taken and not self._fits():
            return False
        self.taken.extend(self.turn)
        self.chars += self.turn_chars
        self.turn = []
        self.turn_chars = 0
        return True

    def _fits(self) -> bool:
        return (
            len(self.taken) + len(self.turn) <= self.budget.max_events
            and self.chars + self.turn_chars <= self.budget.max_chars
        )


class LegacyLayout:
    """The legacy layout's ``get_head``, ``load``, ``read_events`` and ``commit``, over a
    :class:`LegacyBackend`; mixed in before a current store class (``legacy``, ``blobs``,
    ``offload_threshold`` and ``meter`` come from it)."""

    legacy: LegacyBackend
    offload_threshold: int
    blobs: BlobStore

    # Every method takes (and ignores) keyword arguments a later store may add: the legacy
    # layout keeps its own behaviour whatever the service asks of the current one.

    def get_head(self, key: ConversationKey, **_: Any) -> Head | None:
        """The stored head, whatever its state (``None`` when absent)."""
        item = self.legacy.get(keys.partition_key(key), HEAD_SK)
        return None if item is None else decode_head(item)

    def load(self, key: ConversationKey, budget: ContextBudget, **_: Any) -> Snapshot:
        """The head and the events after the newest summary, capped by ``budget``: the head
        and the newest ``FIRST_PAGE - 1`` events in one consistent query, the rest in one
        more (eventually consistent)."""
        pk = keys.partition_key(key)
        page = self.legacy.query(
            pk, upper=HEAD_SK, lower=None, descending=True, limit=FIRST_PAGE, cursor=None
        )
        if not page.items or page.items[0][A_SK] != HEAD_SK:
            return Snapshot(head=None, events=[], from_start=True)
        head = decode_head(page.items[0])
        if head.status is ConversationStatus.CLEARED:
            return Snapshot(head=head, events=[], from_start=True)
        floor = head.summary.through if head.summary is not None else 0
        window = _Window(budget)
        complete = True
        for piece in reversed(_pieces(key, head)):
            low = max(piece.first, floor + 1)
            if low > piece.last:
                break
            own = piece.gen == head.gen and piece.key == key
            first = (page.items[1:], page.cursor is not None) if own else None
            if not self._read_back(piece, low, first, budget, window):
                complete = False
                break
        from_start = complete and window.close() and floor == 0
        events = [
            self._event(piece, seq, stored) for (piece, seq), stored in reversed(window.taken)
        ]
        return Snapshot(head=head, events=events, from_start=from_start)

    def _read_back(
        self,
        piece: _Piece,
        low: int,
        first: tuple[Sequence[Item], bool] | None,
        budget: ContextBudget,
        window: _Window,
    ) -> bool:
        expected = piece.last
        items: Sequence[Item] = first[0] if first is not None else ()
        more = first[1] if first is not None else True
        if first is None:
            items = self._older_events(piece, low, expected, budget, window)
        while True:
            reached_low = False
            for item in items:
                sequence = _storage_sequence(item)
                if sequence > piece.base + piece.last:
                    continue
                if sequence < piece.base + low:
                    reached_low = True
                    break
                if sequence != piece.base + expected:
                    raise _gaps(piece.base + low, piece.base + piece.last)
                expected -= 1
                _, stored = decode_stored_event(item, piece.gen)
                if not window.offer(item, (piece, sequence), stored):
                    return False
            if reached_low or not more or expected < low:
                break
            items = self._older_events(piece, low, expected, budget, window)
            more = bool(items)
        if expected != low - 1:
            raise _gaps(piece.base + low, piece.base + piece.last)
        return True

    def _older_events(
        self, piece: _Piece, low: int, newest: int, budget: ContextBudget, window: _Window
    ) -> list[Item]:
        wanted = max(min(newest - low + 1, budget.max_events - len(window.taken) + 2), 1)
        lower = event_sort_key(piece.base + max(low, newest - wanted + 1))
        upper = event_sort_key(piece.base + newest)
        top = piece.base + newest
        page = RawPage(items=[])
        for consistent in (False, True):
            page = self.legacy.query(
                keys.partition_key(piece.key),
                upper=upper,
                lower=lower,
                descending=True,
                limit=wanted,
                cursor=None,
                consistent=consistent,
            )
            found = [_storage_sequence(item) for item in page.items]
            if found == list(range(top, top - len(found), -1)) and found:
                break
        return page.items

    def read_events(
        self, key: ConversationKey, head: Head, *, after: int, limit: int, **_: Any
    ) -> list[Event]:
        """Up to ``limit`` events of ``head``'s life with public sequence > ``after``."""
        lower = after + 1
        upper = min(head.event_count, after + limit)
        events: list[Event] = []
        for piece in _pieces(key, head):
            first, last = max(lower, piece.first), min(upper, piece.last)
            if first > last:
                continue
            cursor: Any = None
            while True:
                page = self.legacy.query(
                    keys.partition_key(piece.key),
                    lower=event_sort_key(piece.base + first),
                    upper=event_sort_key(piece.base + last),
                    descending=False,
                    limit=min(last - first + 1, 1000),
                    cursor=cursor,
                )
                for item in page.items:
                    sequence, stored = decode_stored_event(item, piece.gen)
                    events.append(self._event(piece, sequence, stored))
                if page.cursor is None:
                    break
                cursor = page.cursor
        if [e.sequence for e in events] != list(range(lower, upper + 1)):
            raise _gaps(head.base + lower, head.base + upper)
        return events

    def _event(self, piece: _Piece, sequence: int, stored: StoredEvent) -> Event:
        if stored.ref is not None:
            payload = self._fetch_legacy(stored.ref)
        else:
            assert stored.payload is not None
            payload = stored.payload
        try:
            return Event(
                event_id=stored.id,
                conversation_id=piece.key.conversation_id,
                sequence=sequence - piece.base,
                turn=stored.turn,
                kind=stored.kind,
                actor=stored.actor,
                occurred_at=stored.at,
                payload=payload,
                imported=stored.imported,
            )
        except ValidationError as exc:
            raise _corrupted(f"event {event_sort_key(sequence)}", exc) from exc

    def _fetch_legacy(self, ref: BlobRef) -> dict[str, Any]:
        data = self.blobs.get(ref.key)
        if hashlib.sha256(data).hexdigest() != ref.sha256 or len(data) != ref.size:
            raise CorruptedState("an offloaded payload does not match its hash")
        payload = json.loads(data)
        if not isinstance(payload, dict):
            raise CorruptedState("an offloaded payload is not an object")
        return payload

    def commit(
        self,
        key: ConversationKey,
        *,
        expected_version: int | None,
        head: Head,
        events: Sequence[Event],
        inbox_changes: inbox.InboxChanges | None = None,
        **_: Any,
    ) -> int:
        """Append ``events`` (one item each) and replace the whole head in one transaction.

        Returns:
            The bytes written (items and offloaded objects).

        Raises:
            ConversationBusy: the head changed since it was read; nothing was stored.
            PayloadTooLarge: an item would exceed 400 KB; nothing was stored.
            InternalError: more than ``MAX_EVENTS_PER_COMMIT`` events and entries, or
                ``head.seq`` not covering the events.
        """
        if len(events) > MAX_EVENTS_PER_COMMIT:
            raise InternalError(f"a commit holds at most {MAX_EVENTS_PER_COMMIT} events")
        if events and head.base + events[-1].sequence != head.seq:
            raise InternalError("head.seq does not cover the committed events")
        attempt = secrets.token_hex(4)
        written: list[str] = []
        offloaded = 0
        try:
            items = []
            for event in events:
                ref = self._offload_legacy(key, head, event, attempt)
                if ref is not None:
                    written.append(ref.key)
                    offloaded += ref.size
                items.append(encode_event(key, head, event, ref))
        except BaseException:
            self._discard_legacy(written)
            raise
        head_item = encode_head(key, head)
        changes = inbox_changes or inbox.InboxChanges()
        puts = [inbox.entry_item(key, head.gen, entry) for entry in changes.puts]
        deletes = [inbox.entry_sort_key(call_id) for call_id in changes.deletes]
        if len(events) + len(puts) + len(deletes) > MAX_EVENTS_PER_COMMIT:
            self._discard_legacy(written)
            raise InternalError("a commit holds at most 99 events and inbox entries")
        for item in [*items, *puts, head_item]:
            if item_size(item) > MAX_ITEM_BYTES:
                self._discard_legacy(written)
                raise PayloadTooLarge("the turn's state is too large to store")
        expected = (
            None if expected_version is None else {A_VERSION: expected_version, A_GEN: head.gen}
        )
        try:
            self.legacy.transact_commit(
                head_item, expected, items, head.gen, puts=puts, deletes=deletes
            )
        except TurnledgerError as exc:
            if not getattr(exc, "outcome_unknown", False):
                self._discard_legacy(written)
            raise
        return sum(item_size(item) for item in [*items, *puts, head_item]) + offloaded

    def _offload_legacy(
        self, key: ConversationKey, head: Head, event: Event, attempt: str
    ) -> BlobRef | None:
        data = payload_bytes(stored_payload(event))
        if len(data) < self.offload_threshold:
            return None
        digest = hashlib.sha256(data).hexdigest()
        sequence = head.base + event.sequence
        blob = keys.blob_key(key, head.gen, sequence, digest, attempt=attempt)
        self.blobs.put(blob, data)
        return BlobRef(key=blob, sha256=digest, size=len(data))

    def _discard_legacy(self, written: list[str]) -> None:
        if written:
            with contextlib.suppress(Exception):
                self.blobs.delete_keys(written)


class LegacyDynamoDBStore(LegacyLayout, DynamoDBConversationStore):
    """The DynamoDB store with the legacy layout's reads and commits (everything else current)."""

    def __init__(
        self, client: DynamoDBClient, table_name: str, blobs: BlobStore, **kwargs: Any
    ) -> None:
        super().__init__(client, table_name, blobs, **kwargs)
        self.legacy = LegacyDynamoDB(client, table_name, self.meter)


class LegacySQLiteStore(LegacyLayout, SQLiteConversationStore):
    """The SQLite store with the legacy layout's reads and commits (everything else current)."""

    def __init__(self, path: str | Path, blobs: BlobStore, **kwargs: Any) -> None:
        super().__init__(path, blobs, **kwargs)
        self.legacy = LegacySQLite(Path(path), self.meter)

    def close(self) -> None:
        """Close the legacy connection and the store's own."""
        self.legacy.close()  # type: ignore[attr-defined]
        super().close()


def legacy_items(items: Iterator[Item]) -> list[Item]:
    """The items of ``items`` that only the legacy layout writes: one ``E#`` item per event
    whose body is one event (``id``, ``kind`` at the top level of ``d``)."""
    found = []
    for item in items:
        sk = str(item.get(A_SK, ""))
        if not sk.startswith(EVENT_PREFIX):
            continue
        body = json.loads(item[A_BODY])
        if isinstance(body, dict) and "kind" in body and "id" in body:
            found.append(item)
    return found
