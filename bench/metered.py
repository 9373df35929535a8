"""The DynamoDB store, measured: time of its public calls, price of what it read and wrote.

Prices are taken on the wire, not inside the store: :class:`MeteredStore` hands its
backend a client (:class:`PricingClient`) that prices every request it sends, whatever
store method sent it (a transaction, a conditional ``PutItem``, a batch, an update), by
the rules of :mod:`bench.pricing`, and reports each priced write to the store's
:meth:`MeteredStore._on_write` hook and each read to :meth:`MeteredStore._on_read`. So a
store that changes how it writes (issue 21: one conditional put per plain turn) is
priced the same way as the layout it replaces, and a benchmark that prices some items
apart overrides a hook, never a store primitive.

:class:`MeteredLegacyStore` is the same over
:class:`tests.support.legacy_layout.LegacyDynamoDBStore`
(the layout before issue 21): the baseline the benchmarks run beside the current store.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError
from turnledger.store.blobs import BlobStore
from turnledger.store.codec import event_count
from turnledger.store.dynamodb import DynamoDBConversationStore

from bench.pricing import TRANSACTION_FACTOR, IndexSpec, item_size, read_units, write_units
from tests.support.legacy_layout import LegacyDynamoDBStore, from_wire

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

Item = dict[str, Any]

#: Sort keys of the head and of transcript items (``E#...``), as both layouts write them.
HEAD_SK = "HEAD"
TRANSCRIPT_PREFIX = "E#"


@dataclass(frozen=True)
class Commit:
    """The transcript items (``E#...``) and the head one write request put (``head`` is
    ``None`` when the request left the head alone)."""

    head: Item | None
    events: list[Item]
    transactional: bool = True


@dataclass(frozen=True)
class PricedItem:
    """One item a write request put, deleted, updated or checked, and its price."""

    pk: str
    sk: str
    #: The item as put (``None``: deleted, updated in place or only checked).
    item: Item | None
    #: The table write (x2 inside a transaction).
    table_wcu: float
    #: Index entries put, moved or deleted, by index name.
    index_wcu: dict[str, int] = field(default_factory=dict)
    deleted: bool = False


@dataclass(frozen=True)
class PricedWrite:
    """One write request: its operation, the items it touched, and whether it landed."""

    operation: str
    items: list[PricedItem]
    succeeded: bool = True

    @property
    def wcu(self) -> float:
        """Table and index write units of the request."""
        return sum(i.table_wcu + sum(i.index_wcu.values()) for i in self.items)

    @property
    def index_wcu(self) -> float:
        """The index part of :attr:`wcu`."""
        return sum(sum(i.index_wcu.values()) for i in self.items)


@dataclass
class StorageWork:
    """What the store did for one turn, measured on the client side."""

    seconds: float = 0.0
    #: Table and index writes; ``priced_index_wcu`` is the index part of it.
    priced_wcu: float = 0.0
    priced_index_wcu: float = 0.0
    priced_rcu: float = 0.0
    #: Items read, a turn item counted once per event it holds (the older layout's unit).
    items_read: int = 0
    #: The ``Limit`` of each query, in order.
    query_limits: list[int] = field(default_factory=list)
    #: Write requests that put the head or transcript items, in order.
    commits: list[Commit] = field(default_factory=list)
    #: Every write request, priced.
    writes: list[PricedWrite] = field(default_factory=list)
    read_requests: int = 0
    write_requests: int = 0


class PricingClient:
    """A DynamoDB client that prices every request and reports it to ``store``'s hooks.

    Every other attribute (``exceptions``, ``meta``, other calls) is the wrapped client's.
    Failed conditional writes are priced too: DynamoDB bills them.
    """

    def __init__(self, client: DynamoDBClient, store: MeteredStore) -> None:
        self._client = client
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def _call(self, name: str, kwargs: dict[str, Any]) -> tuple[Any, bool]:
        call: Callable[..., Any] = getattr(self._client, name)
        started = time.perf_counter()
        try:
            return call(**kwargs), True
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code not in ("ConditionalCheckFailedException", "TransactionCanceledException"):
                raise
            self._store._on_failed_write(name, kwargs, exc)
            raise
        finally:
            self._store._client_time(time.perf_counter() - started)

    # --- writes -------------------------------------------------------------------------

    def put_item(self, **kwargs: Any) -> Any:
        response, _ = self._call("put_item", kwargs)
        self._store._priced_write("PutItem", [("Put", kwargs)], response)
        return response

    def update_item(self, **kwargs: Any) -> Any:
        response, _ = self._call("update_item", kwargs)
        self._store._priced_write("UpdateItem", [("Update", kwargs)], response)
        return response

    def delete_item(self, **kwargs: Any) -> Any:
        response, _ = self._call("delete_item", kwargs)
        self._store._priced_write("DeleteItem", [("Delete", kwargs)], response)
        return response

    def transact_write_items(self, **kwargs: Any) -> Any:
        response, _ = self._call("transact_write_items", kwargs)
        ops = [(kind, body) for op in kwargs["TransactItems"] for kind, body in op.items()]
        self._store._priced_write("TransactWriteItems", ops, response)
        return response

    def batch_write_item(self, **kwargs: Any) -> Any:
        response, _ = self._call("batch_write_item", kwargs)
        unprocessed = response.get("UnprocessedItems") or {}
        ops: list[tuple[str, dict[str, Any]]] = []
        for table, requests in kwargs["RequestItems"].items():
            for request in requests:
                if request in unprocessed.get(table, []):
                    continue
                if "PutRequest" in request:
                    ops.append(("Put", {"TableName": table, **request["PutRequest"]}))
                else:
                    ops.append(("Delete", {"TableName": table, **request["DeleteRequest"]}))
        self._store._priced_write("BatchWriteItem", ops, response)
        return response

    # --- reads --------------------------------------------------------------------------

    def get_item(self, **kwargs: Any) -> Any:
        response, _ = self._call("get_item", kwargs)
        wire = response.get("Item")
        item = from_wire(wire) if wire else None
        consistent = bool(kwargs.get("ConsistentRead", False))
        # DynamoDB charges a read of a missing item too; DynamoDB Local reports 0.
        units = read_units(item_size(item) if item else 0, consistent=consistent)
        self._store._on_read(units, [item] if item else [], None, None)
        return response

    def query(self, **kwargs: Any) -> Any:
        response, _ = self._call("query", kwargs)
        items = [from_wire(i) for i in response.get("Items", [])]
        consistent = bool(kwargs.get("ConsistentRead", False))
        if "IndexName" in kwargs:
            # A global index is read eventually consistent, priced on its entries.
            units = read_units(sum(item_size(i) for i in items), consistent=False)
            self._store._on_read(units, items, kwargs.get("Limit"), str(kwargs["IndexName"]))
            return response
        if "ProjectionExpression" in kwargs:
            # A query is priced on the whole items it reads, whatever it projects.
            whole = [self._store._known.get((str(i["pk"]), str(i["sk"])), i) for i in items]
            units = read_units(sum(item_size(i) for i in whole), consistent=consistent)
        else:
            units = read_units(sum(item_size(i) for i in items), consistent=consistent)
        self._store._on_read(units, items, kwargs.get("Limit"), None)
        return response


class MeteredStore(DynamoDBConversationStore):
    """The DynamoDB store, timing its public calls and pricing what it reads and writes.

    Time is taken around the public methods only (a nested call is not counted
    twice), so it covers the round trips and the encoding and decoding around
    them, and nothing of the provider; a request sent outside them is timed alone.
    One instance per thread.
    """

    def __init__(
        self,
        client: DynamoDBClient,
        table_name: str,
        blobs: BlobStore,
        indexes: Sequence[IndexSpec],
    ) -> None:
        self.indexes = list(indexes)
        self.work = StorageWork()
        self._depth = 0
        #: The last item written at each key (what a later delete or index move replaces).
        self._known: dict[tuple[str, str], Item] = {}
        priced: Any = PricingClient(client, self)
        super().__init__(priced, table_name, blobs)

    def begin(self) -> StorageWork:
        """Start measuring a new turn."""
        self.work = StorageWork()
        return self.work

    @contextmanager
    def _timed(self) -> Iterator[None]:
        self._depth += 1
        started = time.perf_counter()
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self.work.seconds += time.perf_counter() - started

    def _client_time(self, seconds: float) -> None:
        # A request outside every timed public call (a store method this class does not
        # wrap) still counts as storage time.
        if self._depth == 0:
            self.work.seconds += seconds

    # The public calls, timed; arguments pass through so a changed signature still works.

    def get_head(self, *args: Any, **kwargs: Any) -> Any:
        with self._timed():
            return super().get_head(*args, **kwargs)

    def load(self, *args: Any, **kwargs: Any) -> Any:
        with self._timed():
            return super().load(*args, **kwargs)

    def read_events(self, *args: Any, **kwargs: Any) -> Any:
        with self._timed():
            return super().read_events(*args, **kwargs)

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        with self._timed():
            return super().commit(*args, **kwargs)

    def clear(self, *args: Any, **kwargs: Any) -> Any:
        with self._timed():
            return super().clear(*args, **kwargs)

    def purge_if_unchanged(self, *args: Any, **kwargs: Any) -> Any:
        with self._timed():
            return super().purge_if_unchanged(*args, **kwargs)

    # --- pricing ------------------------------------------------------------------------

    def _index_units(self, old: Item | None, new: Item | None) -> dict[str, int]:
        found = {}
        for spec in self.indexes:
            if new is None:
                units = 1 if spec.entry(old) is not None else 0
            else:
                units = spec.write_units(old, new)
            if units:
                found[spec.name] = units
        return found

    def _price_op(self, kind: str, body: dict[str, Any], factor: int, response: Any) -> PricedItem:
        if kind == "Put":
            item = from_wire(body["Item"])
            where = (str(item["pk"]), str(item["sk"]))
            index = self._index_units(self._known.get(where), item)
            self._known[where] = item
            return PricedItem(*where, item, factor * write_units(item_size(item)), index)
        key = from_wire(body["Key"])
        where = (str(key["pk"]), str(key["sk"]))
        old = self._known.get(where)
        if kind == "Delete":
            self._known.pop(where, None)
            units = factor * write_units(item_size(old) if old else 0)
            return PricedItem(*where, None, units, self._index_units(old, None), deleted=True)
        if kind == "Update":
            new_wire = response.get("Attributes") if response is not None else None
            index: dict[str, int] = {}
            if new_wire and body.get("ReturnValues") == "ALL_NEW":
                new = from_wire(new_wire)
                index = self._index_units(old, new)
                self._known[where] = new
                units = write_units(item_size(new))
            else:
                # DynamoDB Local prices a single-item update as DynamoDB does.
                reported = response.get("ConsumedCapacity", {}) if response is not None else {}
                units = max(1, int(float(reported.get("CapacityUnits", 1.0))))
            return PricedItem(*where, None, factor * units, index)
        # A condition check is priced like a write of the item it checks.
        return PricedItem(*where, None, factor * write_units(item_size(old) if old else 0))

    def _priced_write(
        self, operation: str, ops: list[tuple[str, dict[str, Any]]], response: Any
    ) -> None:
        factor = TRANSACTION_FACTOR if operation == "TransactWriteItems" else 1
        items = [self._price_op(kind, body, factor, response) for kind, body in ops]
        self._on_write(PricedWrite(operation, items))

    def _on_failed_write(self, name: str, kwargs: dict[str, Any], exc: ClientError) -> None:
        # Billed like the write it would have been; nothing is remembered as stored.
        factor = TRANSACTION_FACTOR if name == "transact_write_items" else 1
        units = 0.0
        if name == "transact_write_items":
            for op in kwargs["TransactItems"]:
                body = next(iter(op.values()))
                wire = body["Item"] if "Item" in body else body["Key"]
                units += factor * write_units(item_size(from_wire(wire)))
        elif "Item" in kwargs:
            units = write_units(item_size(from_wire(kwargs["Item"])))
        else:
            units = 1
        key = from_wire(kwargs.get("Item") or kwargs.get("Key") or {"pk": {"S": "?"}})
        failed = PricedItem(str(key.get("pk", "?")), str(key.get("sk", "?")), None, units)
        self._on_write(PricedWrite(name, [failed], succeeded=False))

    def _on_write(self, write: PricedWrite) -> None:
        """Hook: one priced write request (subclasses add their own accounting)."""
        work = self.work
        work.writes.append(write)
        work.write_requests += 1
        work.priced_wcu += write.wcu
        work.priced_index_wcu += write.index_wcu
        if not write.succeeded:
            return
        put = [i.item for i in write.items if i.item is not None]
        heads = [i for i in put if i["sk"] == HEAD_SK]
        events = [i for i in put if str(i["sk"]).startswith(TRANSCRIPT_PREFIX)]
        if heads or events:
            transactional = write.operation == "TransactWriteItems"
            work.commits.append(Commit(heads[-1] if heads else None, events, transactional))

    def _on_read(
        self, units: float, items: list[Item], limit: int | None, index: str | None
    ) -> None:
        """Hook: one priced read request (``index``: the global index it queried)."""
        self.work.read_requests += 1
        self.work.priced_rcu += units
        # A turn item holds a commit's events: count what was read, not how it was packed.
        self.work.items_read += sum(
            event_count(i) if str(i["sk"]).startswith(TRANSCRIPT_PREFIX) else 1 for i in items
        )
        if limit is not None:
            self.work.query_limits.append(limit)


class MeteredLegacyStore(MeteredStore, LegacyDynamoDBStore):
    """:class:`MeteredStore` over the legacy layout (before issue 21): the baseline."""


#: The layouts a benchmark can run, by the name its results use.
LAYOUTS: dict[str, type[MeteredStore]] = {
    "legacy": MeteredLegacyStore,
    "current": MeteredStore,
}
