"""What the sweep and tenant erasure read beyond the store's contract: indexes, stamps, a cursor.

:class:`ConversationIndex` answers four kinds of question, each cheap in
proportion to what it returns, never to the table:

* ``by-expiry``: the conversations whose head expires in one bucket
  partition ``"<expires_at // 3600>#<shard>"`` (:func:`.keys.expiry_bucket`);
* ``by-tenant``: every conversation of one tenant;
* the *stamps* of a conversation's event items (sort key and life ``g``), and a
  delete that holds only while an item still belongs to the life it was read
  in: what reclaiming orphans needs to stay safe against a concurrent turn;
* the sweep cursor, one item at ``pk="#SWEEP"``, ``sk="CURSOR"`` in the
  same table holding the first expiry bucket not yet fully swept. It has no
  ``tn`` or ``xb`` attribute, so neither index ever lists it.

Both indexes are global secondary indexes (``KEYS_ONLY``), so they are
eventually consistent: callers re-read the head consistently before acting.
Every DynamoDB call is metered on the store's :class:`~.base.CapacityMeter`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..exceptions import InternalError
from ..models import ConversationKey
from . import codec, keys
from .base import CapacityMeter, ConversationStore
from .codec import Item
from .dynamodb import EXPIRY_INDEX, TENANT_INDEX, DynamoDBConversationStore
from .memory import MemoryConversationStore

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.type_defs import ConsumedCapacityTypeDef

#: Where the sweep cursor lives; ``#`` can never start a conversation partition key.
CURSOR_PK = "#SWEEP"
CURSOR_SK = "CURSOR"
CURSOR_SCHEMA_VERSION = 1
_A_BUCKET = "bucket"

#: Items per index query page (keys only: a page of 500 is about 40 KB).
_PAGE = 500


@dataclass(frozen=True)
class EventStamp:
    """Where an event item is and which life wrote it (``None``: the item has no ``g``)."""

    sort_key: str
    gen: str | None


class ConversationIndex(ABC):
    """Index queries, event stamps and the sweep cursor of one conversation store."""

    def __init__(self, store: ConversationStore) -> None:
        self.store = store

    @property
    def meter(self) -> CapacityMeter:
        """The store's meter, which every read and write here is recorded on."""
        return self.store.meter

    def head_item(self, key: ConversationKey) -> Item | None:
        """The raw head item, read consistently (``None`` when absent); nothing is decoded."""
        return self.store._get_item(keys.partition_key(key), keys.HEAD_SK)

    @abstractmethod
    def expiring_in(self, partition: str) -> Iterator[ConversationKey]:
        """Conversations whose head sits in the expiry partition ``"<bucket>#<shard>"``.

        Pages lazily; the index may lag behind the table.
        """

    @abstractmethod
    def of_tenant(self, tenant: str) -> Iterator[ConversationKey]:
        """Every conversation of ``tenant`` that has a head (tombstones included).

        Pages lazily; the index may lag behind the table.
        """

    @abstractmethod
    def event_stamps(self, key: ConversationKey) -> Iterator[EventStamp]:
        """Every event item of ``key``'s partition, ascending, read consistently."""

    @abstractmethod
    def delete_event(self, key: ConversationKey, stamp: EventStamp) -> bool:
        """Delete the event item at ``stamp.sort_key`` if its life is still ``stamp.gen``.

        Returns whether this call deleted it: ``False`` when it is gone already or
        was overwritten by another life since it was read.
        """

    @abstractmethod
    def read_cursor(self) -> int | None:
        """The first expiry bucket not yet fully swept, or ``None`` when there is none
        (or it was written by an unknown schema version)."""

    @abstractmethod
    def advance_cursor(self, bucket: int) -> bool:
        """Move the cursor to ``bucket`` if that is forward; returns whether it moved.

        Concurrent sweeps may both call this: the cursor never goes back.
        """


def index_for(store: ConversationStore) -> ConversationIndex:
    """The index implementation of ``store``'s backend.

    Raises:
        InternalError: the backend has no index implementation.
    """
    if isinstance(store, DynamoDBConversationStore):
        return DynamoDBConversationIndex(store)
    if isinstance(store, MemoryConversationStore):
        return MemoryConversationIndex(store)
    raise InternalError(f"no conversation index for {type(store).__name__}")


def _conversation_keys(pks: Iterator[str]) -> Iterator[ConversationKey]:
    for pk in pks:
        try:
            yield keys.parse_partition_key(pk)
        except ValueError:
            continue  # not a conversation (the sweep cursor, or a foreign item)


def _cursor_bucket(item: Item | None) -> int | None:
    if item is None or item.get(codec.A_SCHEMA) != CURSOR_SCHEMA_VERSION:
        return None
    bucket = item.get(_A_BUCKET)
    return bucket if isinstance(bucket, int) and not isinstance(bucket, bool) else None


# --- memory -------------------------------------------------------------------------------


class MemoryConversationIndex(ConversationIndex):
    """Reads a :class:`MemoryConversationStore`'s items the way the DynamoDB indexes would."""

    store: MemoryConversationStore

    def __init__(self, store: MemoryConversationStore) -> None:
        super().__init__(store)

    def _heads_where(self, attribute: str, value: str) -> Iterator[ConversationKey]:
        with self.store._lock:
            self.meter.read(0)
            pks = sorted(
                pk
                for pk, partition in self.store.items.items()
                if partition.get(keys.HEAD_SK, {}).get(attribute) == value
            )
        return _conversation_keys(iter(pks))

    def expiring_in(self, partition: str) -> Iterator[ConversationKey]:
        return self._heads_where(codec.A_EXPIRY_BUCKET, partition)

    def of_tenant(self, tenant: str) -> Iterator[ConversationKey]:
        return self._heads_where(codec.A_TENANT, tenant)

    def event_stamps(self, key: ConversationKey) -> Iterator[EventStamp]:
        with self.store._lock:
            self.meter.read(0)
            partition = self.store.items.get(keys.partition_key(key), {})
            stamps = [
                EventStamp(sk, item.get(codec.A_GEN))
                for sk, item in sorted(partition.items())
                if sk.startswith(keys.EVENT_PREFIX)
            ]
        return iter(stamps)

    def delete_event(self, key: ConversationKey, stamp: EventStamp) -> bool:
        pk = keys.partition_key(key)
        with self.store._lock:
            partition = self.store.items.get(pk, {})
            item = partition.get(stamp.sort_key)
            if item is None or item.get(codec.A_GEN) != stamp.gen:
                return False
            self.meter.write(0)
            del partition[stamp.sort_key]
            if not partition:
                self.store.items.pop(pk, None)
            return True

    def read_cursor(self) -> int | None:
        with self.store._lock:
            self.meter.read(0)
            return _cursor_bucket(self.store.items.get(CURSOR_PK, {}).get(CURSOR_SK))

    def advance_cursor(self, bucket: int) -> bool:
        with self.store._lock:
            partition = self.store.items.setdefault(CURSOR_PK, {})
            stored = partition.get(CURSOR_SK)
            if stored is not None and (
                stored.get(codec.A_SCHEMA) != CURSOR_SCHEMA_VERSION
                or not stored.get(_A_BUCKET, bucket) < bucket
            ):
                return False
            self.meter.write(0)
            partition[CURSOR_SK] = {
                codec.A_PK: CURSOR_PK,
                codec.A_SK: CURSOR_SK,
                codec.A_SCHEMA: CURSOR_SCHEMA_VERSION,
                _A_BUCKET: bucket,
            }
            return True


# --- DynamoDB -----------------------------------------------------------------------------


def _units(consumed: ConsumedCapacityTypeDef | None) -> float:
    return 0.0 if consumed is None else float(consumed.get("CapacityUnits", 0.0))


def _s(value: str) -> dict[str, Any]:
    return {"S": value}


class DynamoDBConversationIndex(ConversationIndex):
    """The ``by-expiry`` and ``by-tenant`` indexes and the cursor item of the store's table."""

    store: DynamoDBConversationStore

    def __init__(self, store: DynamoDBConversationStore, *, page_size: int = _PAGE) -> None:
        super().__init__(store)
        self.page_size = page_size

    def _query(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        start: Any = None
        while True:
            page_kwargs: dict[str, Any] = {
                "TableName": self.store.table_name,
                "ReturnConsumedCapacity": "TOTAL",
                "Limit": self.page_size,
                **kwargs,
            }
            if start is not None:
                page_kwargs["ExclusiveStartKey"] = start
            response = self.store.client.query(**page_kwargs)
            self.meter.read(_units(response.get("ConsumedCapacity")))
            yield from response.get("Items", [])
            start = response.get("LastEvaluatedKey")
            if start is None:
                return

    def _index_keys(self, index: str, attribute: str, value: str) -> Iterator[ConversationKey]:
        items = self._query(
            IndexName=index,
            KeyConditionExpression="#a = :v",
            ExpressionAttributeNames={"#a": attribute},
            ExpressionAttributeValues={":v": _s(value)},
        )
        return _conversation_keys(item[codec.A_PK]["S"] for item in items)

    def expiring_in(self, partition: str) -> Iterator[ConversationKey]:
        return self._index_keys(EXPIRY_INDEX, codec.A_EXPIRY_BUCKET, partition)

    def of_tenant(self, tenant: str) -> Iterator[ConversationKey]:
        return self._index_keys(TENANT_INDEX, codec.A_TENANT, tenant)

    def event_stamps(self, key: ConversationKey) -> Iterator[EventStamp]:
        items = self._query(
            KeyConditionExpression="#pk = :pk AND begins_with(#sk, :e)",
            ProjectionExpression="#sk, #g",
            ExpressionAttributeNames={"#pk": codec.A_PK, "#sk": codec.A_SK, "#g": codec.A_GEN},
            ExpressionAttributeValues={
                ":pk": _s(keys.partition_key(key)),
                ":e": _s(keys.EVENT_PREFIX),
            },
            ConsistentRead=True,
        )
        for item in items:
            gen = item.get(codec.A_GEN, {}).get("S")
            yield EventStamp(item[codec.A_SK]["S"], gen)

    def delete_event(self, key: ConversationKey, stamp: EventStamp) -> bool:
        condition: dict[str, Any]
        if stamp.gen is None:
            condition = {
                "ConditionExpression": "attribute_exists(#sk) AND attribute_not_exists(#g)",
                "ExpressionAttributeNames": {"#sk": codec.A_SK, "#g": codec.A_GEN},
            }
        else:
            condition = {
                "ConditionExpression": "#g = :g",
                "ExpressionAttributeNames": {"#g": codec.A_GEN},
                "ExpressionAttributeValues": {":g": _s(stamp.gen)},
            }
        client = self.store.client
        try:
            response = client.delete_item(
                TableName=self.store.table_name,
                Key={codec.A_PK: _s(keys.partition_key(key)), codec.A_SK: _s(stamp.sort_key)},
                ReturnConsumedCapacity="TOTAL",
                **condition,
            )
        except client.exceptions.ConditionalCheckFailedException:
            return False
        self.meter.write(_units(response.get("ConsumedCapacity")))
        return True

    def _cursor_key(self) -> dict[str, Any]:
        return {codec.A_PK: _s(CURSOR_PK), codec.A_SK: _s(CURSOR_SK)}

    def read_cursor(self) -> int | None:
        response = self.store.client.get_item(
            TableName=self.store.table_name,
            Key=self._cursor_key(),
            ConsistentRead=True,
            ReturnConsumedCapacity="TOTAL",
        )
        self.meter.read(_units(response.get("ConsumedCapacity")))
        wire = response.get("Item")
        if wire is None:
            return None
        item: Item = {
            codec.A_SCHEMA: int(wire[codec.A_SCHEMA]["N"]) if codec.A_SCHEMA in wire else None,
            _A_BUCKET: int(wire[_A_BUCKET]["N"]) if _A_BUCKET in wire else None,
        }
        return _cursor_bucket(item)

    def advance_cursor(self, bucket: int) -> bool:
        client = self.store.client
        try:
            response = client.put_item(
                TableName=self.store.table_name,
                Item={
                    **self._cursor_key(),
                    codec.A_SCHEMA: {"N": str(CURSOR_SCHEMA_VERSION)},
                    _A_BUCKET: {"N": str(bucket)},
                },
                ConditionExpression="attribute_not_exists(#pk) OR (#v = :v AND #b < :b)",
                ExpressionAttributeNames={"#pk": codec.A_PK, "#v": codec.A_SCHEMA, "#b": _A_BUCKET},
                ExpressionAttributeValues={
                    ":v": {"N": str(CURSOR_SCHEMA_VERSION)},
                    ":b": {"N": str(bucket)},
                },
                ReturnConsumedCapacity="TOTAL",
            )
        except client.exceptions.ConditionalCheckFailedException:
            return False
        self.meter.write(_units(response.get("ConsumedCapacity")))
        return True
