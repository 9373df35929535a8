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
from . import codec, records
from .attributes import deserialize, serialize
from .backend import (
    Absent,
    Condition,
    ConditionFailed,
    Delete,
    Put,
    SlotFree,
    Unchanged,
    Update,
    Write,
)
from .base import ConversationStore, Page
from .blobs import BlobStore
from .codec import Item
from .inbox import A_INBOX, A_INBOX_SORT, INBOX_INDEX, EntryKey, entry_key
from .indexes import A_BUCKET, INDEX_ATTRIBUTES, CursorForward
from .indexes import EXPIRY_INDEX as EXPIRY_INDEX
from .indexes import TENANT_INDEX as TENANT_INDEX

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import ConsumedCapacityTypeDef

#: BatchWriteItem takes at most 25 requests a call.
_BATCH = 25
_BATCH_ATTEMPTS = 8


def _slot_condition(condition: SlotFree) -> tuple[str, dict[str, str], dict[str, Any]]:
    """:func:`.slots.slot_free`: nothing there, another life's gravestone, or this life's
    marker (no gravestone) of the version the commit read; with ``head_locked``, any item
    of another life."""
    names = {"#pk": codec.A_PK, "#g": codec.A_GEN}
    values: dict[str, Any] = {":g": condition.gen}
    if condition.head_locked:
        expression = "attribute_not_exists(#pk) OR #g <> :g"
    else:
        expression = (
            "attribute_not_exists(#pk) OR (#n = :zero AND #g <> :g AND attribute_exists(#x))"
        )
    if condition.marker_version is not None:
        names["#ver"] = codec.A_VERSION
        values[":mv"] = condition.marker_version
        expression += " OR (#n = :zero AND #g = :g AND #ver = :mv AND attribute_not_exists(#x))"
    if "#n" in expression:
        names |= {"#n": codec.A_COUNT, "#x": codec.A_EXPIRES}
        values[":zero"] = 0
    return expression, names, values


def _unchanged(expected: Item) -> tuple[str, dict[str, str], dict[str, Any]]:
    names = {"#pk": codec.A_PK}
    values: dict[str, Any] = {}
    clauses = ["attribute_exists(#pk)"]
    for n, (name, value) in enumerate(expected.items()):
        names[f"#e{n}"] = name
        if value is None:
            clauses.append(f"attribute_not_exists(#e{n})")
        else:
            values[f":e{n}"] = value
            clauses.append(f"#e{n} = :e{n}")
    return " AND ".join(clauses), names, values


def _condition(condition: Condition | None) -> dict[str, Any]:
    """The ``ConditionExpression`` (with its names and values) that says what
    ``condition.holds`` says; nothing for ``None``.

    Raises:
        TypeError: a condition this backend cannot express.
    """
    if condition is None:
        return {}
    values: dict[str, Any]
    match condition:
        case Absent():
            expression, names, values = "attribute_not_exists(#pk)", {"#pk": codec.A_PK}, {}
        case Unchanged(expected=expected):
            expression, names, values = _unchanged(expected)
        case SlotFree():
            expression, names, values = _slot_condition(condition)
        case records.Replaceable(now=now):
            # Powertools' own condition and attribute names (.records), so the records
            # stay those its DynamoDBPersistenceLayer writes and reads.
            expression = (
                "attribute_not_exists(#pk) OR #x < :now"
                " OR (#s = :in_progress AND attribute_exists(#ipx) AND #ipx < :now_ms)"
            )
            names = {
                "#pk": codec.A_PK,
                "#x": codec.A_EXPIRES,
                "#s": records.A_STATUS,
                "#ipx": records.A_IN_PROGRESS_EXPIRY,
            }
            values = {
                ":now": int(now),
                ":now_ms": int(now * 1000),
                ":in_progress": records.IN_PROGRESS,
            }
        case CursorForward(schema=schema, bucket=bucket):
            expression = "attribute_not_exists(#pk) OR (#v = :v AND #b < :b)"
            names = {"#pk": codec.A_PK, "#v": codec.A_SCHEMA, "#b": A_BUCKET}
            values = {":v": schema, ":b": bucket}
        case _:
            raise TypeError(f"no ConditionExpression for {type(condition).__name__}")
    arguments: dict[str, Any] = {
        "ConditionExpression": expression,
        "ExpressionAttributeNames": names,
    }
    if values:
        arguments["ExpressionAttributeValues"] = _to_wire(values)
    return arguments


def _wire_value(value: Any) -> Any:
    # _from_wire turns non-integral numbers into floats, which the serializer refuses.
    return serialize(Decimal(str(value)) if isinstance(value, float) else value)


def _to_wire(item: Item) -> dict[str, Any]:
    return {name: _wire_value(value) for name, value in item.items()}


def _key(pk: str, sk: str) -> dict[str, Any]:
    return _to_wire({codec.A_PK: pk, codec.A_SK: sk})


def _set_attributes(arguments: dict[str, Any], attributes: Item) -> None:
    """Add to the arguments of an update (maybe holding a condition's names and values:
    ``#pk``, ``#e0``, ..., never ``#a0``, ...) the expression that sets ``attributes``."""
    names = {f"#a{n}": name for n, name in enumerate(attributes)}
    values = {f":a{n}": _wire_value(value) for n, value in enumerate(attributes.values())}
    arguments["UpdateExpression"] = "SET " + ", ".join(f"#a{n} = :a{n}" for n in range(len(names)))
    arguments["ExpressionAttributeNames"] = arguments.get("ExpressionAttributeNames", {}) | names
    arguments["ExpressionAttributeValues"] = arguments.get("ExpressionAttributeValues", {}) | values


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
                Key=_key(pk, sk),
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

    def _write(self, write: Put | Update | Delete) -> Item | None:
        kwargs: dict[str, Any] = {
            "TableName": self.table_name,
            "ReturnConsumedCapacity": "TOTAL",
            **_condition(write.when),
        }
        if write.when is not None:
            # The refusing item comes back with the refusal, at no cost (records use it).
            kwargs["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
        call: Any
        match write:
            case Put(item=item):
                call, kwargs["Item"] = self.client.put_item, _to_wire(item)
            case Delete(pk=pk, sk=sk):
                call, kwargs["Key"] = self.client.delete_item, _key(pk, sk)
            case Update(pk=pk, sk=sk, attributes=attributes):
                call, kwargs["Key"] = self.client.update_item, _key(pk, sk)
                _set_attributes(kwargs, attributes)
                if write.returning:
                    kwargs["ReturnValues"] = "ALL_NEW"
        try:
            with _guarded():
                response = call(**kwargs)
        except self.client.exceptions.ConditionalCheckFailedException as exc:
            old: Any = exc.response.get("Item")
            raise ConditionFailed(
                _from_wire(old) if isinstance(old, dict) and old else None
            ) from exc
        self.meter.write(_units(response.get("ConsumedCapacity")))
        if isinstance(write, Update) and write.returning:
            return _from_wire(response["Attributes"])
        return None

    def _transact(self, writes: Sequence[Write]) -> None:
        transact: list[Any] = []
        for write in writes:
            body: dict[str, Any] = {"TableName": self.table_name, **_condition(write.when)}
            if isinstance(write, Put):
                body["Item"] = _to_wire(write.item)
                transact.append({"Put": body})
                continue
            body["Key"] = _key(write.pk, write.sk)
            if isinstance(write, Update):
                _set_attributes(body, write.attributes)
                transact.append({"Update": body})
            else:
                transact.append({"Delete" if isinstance(write, Delete) else "ConditionCheck": body})
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

    def _write_batch(self, writes: Sequence[Put | Delete]) -> None:
        # One PutItem each: a draft writes one chunk at a time, and a batch would only
        # add the unprocessed-items retry loop for no saving (capacity is per item).
        for write in writes:
            if isinstance(write, Put):
                self._write(Put(write.item))
        deletes = [w for w in writes if isinstance(w, Delete)]
        for start in range(0, len(deletes), _BATCH):
            requests: list[Any] = [
                {"DeleteRequest": {"Key": _key(d.pk, d.sk)}}
                for d in deletes[start : start + _BATCH]
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
