"""The DynamoDB backend: one table, conditional writes, consumed capacity metered.

Every call asks for ``ReturnConsumedCapacity=TOTAL`` and records it on the
store's :class:`~turnledger.store.base.CapacityMeter` (metrics and ``bench/`` read it). Botocore
errors are translated into domain errors here and nowhere else.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from ..core.exceptions import (
    ConversationBusy,
    InternalError,
    PayloadTooLarge,
    ServiceUnavailable,
    TurnledgerError,
)
from . import codec, keys, records
from .attributes import deserialize, serialize
from .base import ConversationStore, Page
from .blobs import BlobStore
from .codec import Item
from .inbox import A_INBOX, A_INBOX_SORT, INBOX_INDEX, EntryKey, entry_key
from .indexes import A_BUCKET, INDEX_ATTRIBUTES
from .indexes import EXPIRY_INDEX as EXPIRY_INDEX
from .indexes import TENANT_INDEX as TENANT_INDEX

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import ConsumedCapacityTypeDef

#: BatchWriteItem takes at most 25 requests a call.
_BATCH = 25
_BATCH_ATTEMPTS = 8
#: Puts of an idempotency record that found a live one deleted before it could be read.
_RECORD_ATTEMPTS = 3

#: The attributes that say which head a conditional write expects.
_HEAD_IDENTITY = {"#ver": codec.A_VERSION, "#g": codec.A_GEN, "#fx": codec.A_FENCE}


def _slot_condition(
    gen: str, marker_version: int | None, *, head_locked: bool = False
) -> dict[str, Any]:
    """Condition arguments of a write at a turn slot (:func:`.slots.slot_free`): nothing
    there, another life's gravestone, or this life's marker (no gravestone) of the version
    the commit read; with ``head_locked``, any item of another life."""
    names = {"#pk": codec.A_PK, "#g": codec.A_GEN}
    values: dict[str, Any] = {":g": serialize(gen)}
    if head_locked:
        expression = "attribute_not_exists(#pk) OR #g <> :g"
    else:
        expression = (
            "attribute_not_exists(#pk) OR (#n = :zero AND #g <> :g AND attribute_exists(#x))"
        )
    if marker_version is not None:
        names["#ver"] = codec.A_VERSION
        values[":mv"] = serialize(marker_version)
        expression += " OR (#n = :zero AND #g = :g AND #ver = :mv AND attribute_not_exists(#x))"
    if "#n" in expression:
        names |= {"#n": codec.A_COUNT, "#x": codec.A_EXPIRES}
        values[":zero"] = serialize(0)
    return {
        "ConditionExpression": expression,
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": values,
    }


def _wire_value(value: Any) -> Any:
    # _from_wire turns non-integral numbers into floats, which the serializer refuses.
    return serialize(Decimal(str(value)) if isinstance(value, float) else value)


def _to_wire(item: Item) -> dict[str, Any]:
    return {name: _wire_value(value) for name, value in item.items()}


def _expect_head(expected: Item | None) -> dict[str, Any]:
    """Condition arguments: the stored head is still ``expected`` (``None``: no head).

    "Still" compares ``ver``, ``g`` and ``fx``, each equal or absent in both.
    """
    if expected is None:
        return {
            "ConditionExpression": "attribute_not_exists(#pk)",
            "ExpressionAttributeNames": {"#pk": codec.A_PK},
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
        "ExpressionAttributeNames": {"#pk": codec.A_PK, **_HEAD_IDENTITY},
    }
    if values:
        condition["ExpressionAttributeValues"] = values
    return condition


def _from_wire(wire: dict[str, Any]) -> Item:
    item: Item = {}
    for name, value in wire.items():
        if "B" in value:
            item[name] = bytes(value["B"])  # sealed content (store/sealed.py)
            continue
        plain = deserialize(value)
        if isinstance(plain, Decimal):
            plain = int(plain) if plain == plain.to_integral_value() else float(plain)
        item[name] = plain
    return item


def _units(consumed: ConsumedCapacityTypeDef | list[ConsumedCapacityTypeDef] | None) -> float:
    if consumed is None:
        return 0.0
    if isinstance(consumed, list):
        return sum(float(c.get("CapacityUnits", 0.0)) for c in consumed)
    return float(consumed.get("CapacityUnits", 0.0))


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


#: Error codes that say DynamoDB refused the call for capacity: nothing was written.
_THROTTLED = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
        # The codes a cancelled transaction's per-item reasons use for the same.
        "ProvisionedThroughputExceeded",
        "ThrottlingError",
    }
)
#: Error codes that say DynamoDB failed on its side: a write may or may not have landed
#: (whole: every call is one item or one transaction).
_FAILED = frozenset({"InternalServerError", "ServiceUnavailable", "TransactionInProgressException"})
#: What a caller is told to wait before retrying a throttled or conflicting write.
RETRY_AFTER_SECONDS = 1


def transient_error(exc: ClientError) -> TurnledgerError | None:
    """The domain error for a call DynamoDB throttled, failed (after botocore's retries) or
    refused for a conflicting transaction; ``None`` when ``exc`` is another refusal.

    Throttling and failures are ``ServiceUnavailable`` (503); a write that met a running
    transaction on the same item is ``ConversationBusy`` (409). Both say to retry in
    ``RETRY_AFTER_SECONDS``.
    """
    code = _code(exc)
    if code == "TransactionConflictException":
        return ConversationBusy(
            "another turn or decision on this conversation is committing",
            details={"retry_after_seconds": RETRY_AFTER_SECONDS},
        )
    if code in _THROTTLED:
        return ServiceUnavailable(
            "the conversation store is throttling requests; retry shortly",
            retry_after_seconds=RETRY_AFTER_SECONDS,
        )
    if code in _FAILED:
        return ServiceUnavailable(
            "the conversation store is failing; retry shortly",
            retry_after_seconds=RETRY_AFTER_SECONDS,
            outcome_unknown=True,
        )
    return None


@contextmanager
def _guarded() -> Iterator[None]:
    """Throttling, server failures and transaction conflicts of the calls inside answer
    their domain errors (:func:`transient_error`); every other ``ClientError`` (a failed
    condition among them) goes through unchanged."""
    try:
        yield
    except ClientError as exc:
        error = transient_error(exc)
        if error is None:
            raise
        raise error from exc


def _commit_error(exc: ClientError) -> TurnledgerError:
    """The domain error for a refused commit transaction."""
    code = _code(exc)
    reasons = [str(r.get("Code", "")) for r in exc.response.get("CancellationReasons", [])]
    if code == "TransactionCanceledException" and "ConditionalCheckFailed" in reasons:
        return ConversationBusy("another turn or decision on this conversation committed first")
    if code == "TransactionCanceledException" and "TransactionConflict" in reasons:
        return ConversationBusy(
            "another turn or decision on this conversation is committing",
            details={"retry_after_seconds": RETRY_AFTER_SECONDS},
        )
    if code == "TransactionCanceledException" and any(r in _THROTTLED for r in reasons):
        return ServiceUnavailable(
            "the conversation store is throttling requests; retry shortly",
            retry_after_seconds=RETRY_AFTER_SECONDS,
        )
    error = transient_error(exc)
    if error is not None:
        return error
    message = str(exc).lower()
    if code in {"ValidationException", "TransactionCanceledException"} and (
        "size" in message or "larger than" in message or "ValidationError" in reasons
    ):
        # One item over 400 KB, or the whole transaction over 4 MB.
        return PayloadTooLarge(
            "the turn's state is too large to store", details={"reason": str(exc)}
        )
    return InternalError(f"DynamoDB refused the commit: {code}")


class DynamoDBConversationStore(ConversationStore):
    """Conversations in one DynamoDB table (keys ``pk``/``sk``, see :mod:`.keys`)."""

    def __init__(
        self, client: DynamoDBClient, table_name: str, blobs: BlobStore, **kwargs: Any
    ) -> None:
        super().__init__(blobs, **kwargs)
        self.client = client
        self.table_name = table_name

    def _get_item(self, pk: str, sk: str) -> Item | None:
        with _guarded():
            response = self.client.get_item(
                TableName=self.table_name,
                Key=_to_wire({codec.A_PK: pk, codec.A_SK: sk}),
                ConsistentRead=True,
                ReturnConsumedCapacity="TOTAL",
            )
        self.meter.read(_units(response.get("ConsumedCapacity")))
        wire = response.get("Item")
        return _from_wire(wire) if wire else None

    def _query(
        self,
        pk: str,
        *,
        lower: str | None,
        upper: str | None,
        descending: bool,
        limit: int,
        cursor: Any,
        keys_only: bool = False,
        consistent: bool = True,
    ) -> Page:
        names = {"#pk": codec.A_PK}
        values: dict[str, Any] = {":pk": pk}
        if lower is None and upper is None:
            condition = "#pk = :pk"
        elif lower is None:
            condition = "#pk = :pk AND #sk <= :upper"
            values[":upper"] = upper
        elif upper is None:
            condition = "#pk = :pk AND #sk >= :lower"
            values[":lower"] = lower
        else:
            condition = "#pk = :pk AND #sk BETWEEN :lower AND :upper"
            values[":lower"] = lower
            values[":upper"] = upper
        if lower is not None or upper is not None or keys_only:
            names["#sk"] = codec.A_SK
        kwargs: dict[str, Any] = {
            "TableName": self.table_name,
            "KeyConditionExpression": condition,
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": _to_wire(values),
            "ScanIndexForward": not descending,
            "ConsistentRead": consistent,
            "Limit": limit,
            "ReturnConsumedCapacity": "TOTAL",
        }
        if keys_only:
            names["#g"] = codec.A_GEN
            names["#n"] = codec.A_COUNT
            kwargs["ProjectionExpression"] = "#pk, #sk, #g, #n"
        if cursor is not None:
            kwargs["ExclusiveStartKey"] = cursor
        with _guarded():
            response = self.client.query(**kwargs)
        self.meter.read(_units(response.get("ConsumedCapacity")))
        return Page(
            items=[_from_wire(i) for i in response.get("Items", [])],
            cursor=response.get("LastEvaluatedKey"),
        )

    def _transact_commit(
        self,
        head: Item | None,
        expected: Item | None,
        events: list[Item],
        gen: str,
        *,
        puts: Sequence[Item] = (),
        deletes: Sequence[str] = (),
        checks: Sequence[Item] = (),
        slots: Sequence[Item] = (),
        marker_version: int | None = None,
        head_locked: bool = False,
    ) -> None:
        pk = (head or events[0])[codec.A_PK]
        transact: list[Any] = [
            {
                "Put": {
                    "TableName": self.table_name,
                    "Item": _to_wire(e),
                    **_slot_condition(gen, marker_version, head_locked=head_locked),
                }
            }
            for e in events
        ]
        # Inbox entries (store/inbox.py): unconditional, the slot's condition guards them.
        transact.extend({"Put": {"TableName": self.table_name, "Item": _to_wire(p)}} for p in puts)
        transact.extend(
            {
                "Delete": {
                    "TableName": self.table_name,
                    "Key": _to_wire({codec.A_PK: pk, codec.A_SK: sk}),
                }
            }
            for sk in deletes
        )
        # Other conversations' heads the write depends on (a fork's parent).
        transact.extend(
            {
                "ConditionCheck": {
                    "TableName": self.table_name,
                    "Key": _to_wire({codec.A_PK: c[codec.A_PK], codec.A_SK: keys.HEAD_SK}),
                    **_expect_head(c),
                }
            }
            for c in checks
        )
        # Other conversations' next slots (a fork's parent: no commit since it was read).
        transact.extend(
            {
                "ConditionCheck": {
                    "TableName": self.table_name,
                    "Key": _to_wire({codec.A_PK: c[codec.A_PK], codec.A_SK: c[codec.A_SK]}),
                    **_slot_condition(str(c[codec.A_GEN]), c.get(codec.A_VERSION)),
                }
            }
            for c in slots
        )
        if head is not None:
            transact.append(
                {
                    "Put": {
                        "TableName": self.table_name,
                        "Item": _to_wire(head),
                        **_expect_head(expected),
                    }
                }
            )
        try:
            response = self.client.transact_write_items(
                TransactItems=transact,
                ReturnConsumedCapacity="TOTAL",
                # botocore retries a call whose answer was lost; with the token, a retry
                # of a transaction that did land succeeds instead of failing its own
                # conditions (which would make the caller delete the turn's objects).
                ClientRequestToken=uuid.uuid4().hex,
            )
        except ClientError as exc:
            raise _commit_error(exc) from exc
        self.meter.write(_units(response.get("ConsumedCapacity")))

    def _put_turn(self, item: Item, marker_version: int | None) -> None:
        codec.check_item_sizes([item])
        try:
            with _guarded():
                response = self.client.put_item(
                    TableName=self.table_name,
                    Item=_to_wire(item),
                    ReturnConsumedCapacity="TOTAL",
                    **_slot_condition(str(item[codec.A_GEN]), marker_version),
                )
        except self.client.exceptions.ConditionalCheckFailedException as exc:
            raise ConversationBusy(
                "another turn or decision on this conversation committed first"
            ) from exc
        self.meter.write(_units(response.get("ConsumedCapacity")))

    def _put_items(self, items: list[Item]) -> None:
        # One PutItem each: a draft writes one chunk at a time, and a batch would only
        # add the unprocessed-items retry loop for no saving (capacity is per item).
        for item in items:
            with _guarded():
                response = self.client.put_item(
                    TableName=self.table_name,
                    Item=_to_wire(item),
                    ReturnConsumedCapacity="TOTAL",
                )
            self.meter.write(_units(response.get("ConsumedCapacity")))

    def _replace_head(self, head: Item, expected: Item | None) -> bool:
        try:
            with _guarded():
                response = self.client.put_item(
                    TableName=self.table_name,
                    Item=_to_wire(head),
                    ReturnConsumedCapacity="TOTAL",
                    **_expect_head(expected),
                )
        except self.client.exceptions.ConditionalCheckFailedException:
            return False
        self.meter.write(_units(response.get("ConsumedCapacity")))
        return True

    def _delete_head(self, pk: str, expected: Item) -> bool:
        try:
            with _guarded():
                response = self.client.delete_item(
                    TableName=self.table_name,
                    Key=_to_wire({codec.A_PK: pk, codec.A_SK: keys.HEAD_SK}),
                    ReturnConsumedCapacity="TOTAL",
                    **_expect_head(expected),
                )
        except self.client.exceptions.ConditionalCheckFailedException:
            return False
        self.meter.write(_units(response.get("ConsumedCapacity")))
        return True

    def _delete_items(self, pk: str, sort_keys: list[str]) -> None:
        for start in range(0, len(sort_keys), _BATCH):
            requests: list[Any] = [
                {"DeleteRequest": {"Key": _to_wire({codec.A_PK: pk, codec.A_SK: sk})}}
                for sk in sort_keys[start : start + _BATCH]
            ]
            pending: dict[str, Any] = {self.table_name: requests}
            # Unprocessed items (throttling) are retried with backoff; deletes are idempotent.
            for attempt in range(_BATCH_ATTEMPTS):
                if attempt:
                    time.sleep(min(0.05 * 2**attempt, 2.0))
                with _guarded():
                    response = self.client.batch_write_item(
                        RequestItems=pending, ReturnConsumedCapacity="TOTAL"
                    )
                self.meter.write(_units(response.get("ConsumedCapacity")))
                pending = dict(response.get("UnprocessedItems") or {})
                if not pending:
                    break
            else:
                raise InternalError("DynamoDB kept events unprocessed while deleting")

    def _fence_head(self, pk: str, token: str) -> Item | None:
        try:
            with _guarded():
                response = self.client.update_item(
                    TableName=self.table_name,
                    Key=_to_wire({codec.A_PK: pk, codec.A_SK: keys.HEAD_SK}),
                    UpdateExpression="SET #fx = :fx",
                    ConditionExpression="attribute_exists(#pk) AND attribute_not_exists(#fx)",
                    ExpressionAttributeNames={"#pk": codec.A_PK, "#fx": codec.A_FENCE},
                    ExpressionAttributeValues={":fx": serialize(token)},
                    ReturnValues="ALL_NEW",
                    ReturnConsumedCapacity="TOTAL",
                )
        except self.client.exceptions.ConditionalCheckFailedException:
            return None
        self.meter.write(_units(response.get("ConsumedCapacity")))
        return _from_wire(response["Attributes"])

    def _index_page(self, index: str, value: str, *, limit: int, cursor: Any) -> Page:
        kwargs: dict[str, Any] = {
            "TableName": self.table_name,
            "IndexName": index,
            "KeyConditionExpression": "#a = :v",
            "ExpressionAttributeNames": {"#a": INDEX_ATTRIBUTES[index]},
            "ExpressionAttributeValues": {":v": serialize(value)},
            "Limit": limit,
            "ReturnConsumedCapacity": "TOTAL",
        }
        if cursor is not None:
            kwargs["ExclusiveStartKey"] = cursor
        with _guarded():
            response = self.client.query(**kwargs)
        self.meter.read(_units(response.get("ConsumedCapacity")))
        return Page(
            items=[_from_wire(i) for i in response.get("Items", [])],
            cursor=response.get("LastEvaluatedKey"),
        )

    def _inbox_query(self, partition: str, *, after: EntryKey | None, limit: int) -> Page:
        kwargs: dict[str, Any] = {
            "TableName": self.table_name,
            "IndexName": INBOX_INDEX,
            "KeyConditionExpression": "#ib = :ib",
            "ExpressionAttributeNames": {"#ib": A_INBOX},
            "ExpressionAttributeValues": {":ib": serialize(partition)},
            "Limit": limit,
            "ReturnConsumedCapacity": "TOTAL",
        }
        if after is not None:
            kwargs["ExclusiveStartKey"] = _to_wire(
                {
                    A_INBOX: partition,
                    A_INBOX_SORT: after.sort,
                    codec.A_PK: after.pk,
                    codec.A_SK: after.sk,
                }
            )
        with _guarded():
            response = self.client.query(**kwargs)
        self.meter.read(_units(response.get("ConsumedCapacity")))
        items = [_from_wire(i) for i in response.get("Items", [])]
        more = bool(response.get("LastEvaluatedKey")) and bool(items)
        return Page(items=items, cursor=entry_key(items[-1]) if more else None)

    def _delete_if_gen(self, pk: str, sk: str, gen: str | None) -> bool:
        condition: dict[str, Any]
        if gen is None:
            condition = {
                "ConditionExpression": "attribute_exists(#sk) AND attribute_not_exists(#g)",
                "ExpressionAttributeNames": {"#sk": codec.A_SK, "#g": codec.A_GEN},
            }
        else:
            condition = {
                "ConditionExpression": "#g = :g",
                "ExpressionAttributeNames": {"#g": codec.A_GEN},
                "ExpressionAttributeValues": {":g": serialize(gen)},
            }
        try:
            with _guarded():
                response = self.client.delete_item(
                    TableName=self.table_name,
                    Key=_to_wire({codec.A_PK: pk, codec.A_SK: sk}),
                    ReturnConsumedCapacity="TOTAL",
                    **condition,
                )
        except self.client.exceptions.ConditionalCheckFailedException:
            return False
        self.meter.write(_units(response.get("ConsumedCapacity")))
        return True

    def _put_if_replaceable(self, item: Item, now: float) -> Item | None:
        # Powertools' own condition and attribute names (.records), so the records stay
        # those its DynamoDBPersistenceLayer writes and reads.
        condition = (
            "attribute_not_exists(#pk) OR #x < :now"
            " OR (#s = :in_progress AND attribute_exists(#ipx) AND #ipx < :now_ms)"
        )
        names = {
            "#pk": codec.A_PK,
            "#x": codec.A_EXPIRES,
            "#s": records.A_STATUS,
            "#ipx": records.A_IN_PROGRESS_EXPIRY,
        }
        values = {":now": int(now), ":now_ms": int(now * 1000), ":in_progress": records.IN_PROGRESS}
        for _ in range(_RECORD_ATTEMPTS):
            try:
                with _guarded():
                    response = self.client.put_item(
                        TableName=self.table_name,
                        Item=_to_wire(item),
                        ConditionExpression=condition,
                        ExpressionAttributeNames=names,
                        ExpressionAttributeValues=_to_wire(values),
                        ReturnValuesOnConditionCheckFailure="ALL_OLD",
                        ReturnConsumedCapacity="TOTAL",
                    )
            except self.client.exceptions.ConditionalCheckFailedException as exc:
                old: Any = exc.response.get("Item")
                stored = (
                    _from_wire(old)
                    if isinstance(old, dict) and old
                    else self._get_item(item[codec.A_PK], item[codec.A_SK])
                )
                if stored is not None:
                    return stored
                continue  # deleted since the condition failed: try again
            self.meter.write(_units(response.get("ConsumedCapacity")))
            return None
        raise ConversationBusy(
            "the idempotency record kept changing; retry",
            details={"retry_after_seconds": RETRY_AFTER_SECONDS},
        )

    def _set_if_unchanged(self, pk: str, sk: str, attributes: Item, expected: Item) -> bool:
        names = {"#pk": codec.A_PK}
        values: dict[str, Any] = {}
        clauses = ["attribute_exists(#pk)"]
        for n, (name, value) in enumerate(expected.items()):
            names[f"#e{n}"] = name
            if value is None:
                clauses.append(f"attribute_not_exists(#e{n})")
            else:
                values[f":e{n}"] = _wire_value(value)
                clauses.append(f"#e{n} = :e{n}")
        sets = []
        for n, (name, value) in enumerate(attributes.items()):
            names[f"#a{n}"] = name
            values[f":a{n}"] = _wire_value(value)
            sets.append(f"#a{n} = :a{n}")
        try:
            with _guarded():
                response = self.client.update_item(
                    TableName=self.table_name,
                    Key=_to_wire({codec.A_PK: pk, codec.A_SK: sk}),
                    UpdateExpression="SET " + ", ".join(sets),
                    ConditionExpression=" AND ".join(clauses),
                    ExpressionAttributeNames=names,
                    ExpressionAttributeValues=values,
                    ReturnConsumedCapacity="TOTAL",
                )
        except self.client.exceptions.ConditionalCheckFailedException:
            return False
        self.meter.write(_units(response.get("ConsumedCapacity")))
        return True

    def _set_attributes(self, pk: str, sk: str, attributes: Item) -> None:
        names = {f"#a{n}": name for n, name in enumerate(attributes)}
        values = {f":a{n}": value for n, value in enumerate(attributes.values())}
        with _guarded():
            response = self.client.update_item(
                TableName=self.table_name,
                Key=_to_wire({codec.A_PK: pk, codec.A_SK: sk}),
                UpdateExpression="SET " + ", ".join(f"#a{n} = :a{n}" for n in range(len(names))),
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=_to_wire(values),
                ReturnConsumedCapacity="TOTAL",
            )
        self.meter.write(_units(response.get("ConsumedCapacity")))

    def _advance_cursor(self, item: Item) -> bool:
        try:
            with _guarded():
                response = self.client.put_item(
                    TableName=self.table_name,
                    Item=_to_wire(item),
                    ConditionExpression="attribute_not_exists(#pk) OR (#v = :v AND #b < :b)",
                    ExpressionAttributeNames={
                        "#pk": codec.A_PK,
                        "#v": codec.A_SCHEMA,
                        "#b": A_BUCKET,
                    },
                    ExpressionAttributeValues=_to_wire(
                        {":v": item[codec.A_SCHEMA], ":b": item[A_BUCKET]}
                    ),
                    ReturnConsumedCapacity="TOTAL",
                )
        except self.client.exceptions.ConditionalCheckFailedException:
            return False
        self.meter.write(_units(response.get("ConsumedCapacity")))
        return True
