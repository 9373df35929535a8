"""DynamoDB's billing rules, applied to the items the store reads and writes.

DynamoDB Local reports ``ConsumedCapacity`` for ``PutItem``, ``GetItem`` and
``Query`` by these same rules, but not for ``TransactWriteItems`` (it reports
4 x the units of one item, whatever the item count), so the benchmark prices
every request itself from the byte size of the items involved:

* an item's size is the UTF-8 bytes of its attribute names and values (a
  number: one byte per two significant digits, plus one): ``codec.item_size``,
  the rule the store's own metrics and the memory backend's item limit use;
* a standard write costs 1 WCU per started KiB of the item; inside a
  transaction every item is written twice (prepare and commit): 2 WCU per KiB;
* a strongly consistent query costs 1 RCU per started 4 KiB of all the items
  it read (the whole items, whatever it projects); at least 1;
* a global secondary index entry (keys only, well under 1 KiB) costs 1 WCU to
  put or delete, 2 to move when its key changes, nothing when unchanged. Index
  updates propagate after the transaction commits; they are priced here at the
  standard rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from boto3.dynamodb.types import TypeSerializer
from turnledger.store.codec import Item, item_size
from turnledger_local.template import load_template, table_definition

from tests.support.aws import TABLE_RESOURCE

__all__ = [
    "TRANSACTION_FACTOR",
    "IndexSpec",
    "item_size",
    "read_units",
    "write_units",
]

#: A write unit covers one started KiB of an item; a strongly consistent read unit 4 KiB.
WRITE_UNIT_BYTES = 1024
READ_UNIT_BYTES = 4096
#: Every item of a TransactWriteItems is written twice (prepare and commit).
TRANSACTION_FACTOR = 2


def write_units(size: int) -> int:
    """Write units of one standard write of an item of ``size`` bytes."""
    return max(1, math.ceil(size / WRITE_UNIT_BYTES))


def read_units(total_bytes: int, *, consistent: bool = True) -> float:
    """Read units of one query that read ``total_bytes`` of items: one per started 4 KiB
    when strongly consistent, half that when eventually consistent."""
    units = max(1, math.ceil(total_bytes / READ_UNIT_BYTES))
    return units if consistent else units / 2


@dataclass(frozen=True)
class IndexSpec:
    """A global secondary index: its key attributes and the other attributes it projects
    (``KEYS_ONLY``: none; ``INCLUDE``: the listed ones)."""

    name: str
    key_attributes: tuple[str, ...]
    included: tuple[str, ...] = ()

    def entry(self, item: Item | None) -> tuple[Any, ...] | None:
        """The index entry ``item`` has (its key and projected values), ``None`` when it is
        not indexed."""
        if item is None or any(a not in item for a in self.key_attributes):
            return None
        return tuple(item.get(a) for a in (*self.key_attributes, *self.included))

    def write_units(self, old: Item | None, new: Item) -> int:
        """Index writes of replacing ``old`` by ``new``: entries are small (1 WCU each).

        An unchanged entry costs nothing; a new or removed one, or one whose projected
        attributes changed in place, one write; a moved one (key changed) two.
        """
        before, after = self.entry(old), self.entry(new)
        if before == after:
            return 0
        if before is None or after is None:
            return 1
        keys = len(self.key_attributes)
        return 1 if before[:keys] == after[:keys] else 2


def index_specs() -> list[IndexSpec]:
    """The conversations table's indexes, as ``template.yaml`` declares them."""
    definition = table_definition(load_template(), TABLE_RESOURCE, "any")
    specs = []
    for index in definition.get("GlobalSecondaryIndexes", []):
        projection = index["Projection"]
        if projection["ProjectionType"] not in ("KEYS_ONLY", "INCLUDE"):
            raise ValueError(f"index {index['IndexName']}: only KEYS_ONLY and INCLUDE are priced")
        specs.append(
            IndexSpec(
                name=index["IndexName"],
                key_attributes=tuple(k["AttributeName"] for k in index["KeySchema"]),
                included=tuple(projection.get("NonKeyAttributes", ())),
            )
        )
    return specs


def to_wire(item: Item) -> dict[str, Any]:
    """``item`` in DynamoDB's wire format (for requests the benchmark makes itself)."""
    serializer = TypeSerializer()
    return {name: serializer.serialize(value) for name, value in item.items()}


@dataclass(frozen=True)
class OnDemandPrices:
    """DynamoDB on-demand prices of one region and table class, and when they were read.

    A priced WCU is one write request unit (a transactional write of 1 KiB is two), a
    priced RCU one read request unit (an eventually consistent read of 4 KiB is half).
    """

    region: str
    table_class: str
    #: USD per million write request units and per million read request units.
    write_per_million: float
    read_per_million: float
    #: USD per GB-month of table storage (items and index entries).
    storage_per_gb_month: float
    #: When these prices were published (the date the benchmark's figures assume).
    as_of: str

    def request_cost(self, wcu: float, rcu: float) -> float:
        """USD of ``wcu`` write and ``rcu`` read request units."""
        return (wcu * self.write_per_million + rcu * self.read_per_million) / 1e6

    def storage_cost(self, stored_bytes: float) -> float:
        """USD of keeping ``stored_bytes`` for a month (DynamoDB adds 100 bytes per item,
        counted by the caller)."""
        return stored_bytes / 1e9 * self.storage_per_gb_month


#: us-east-1, Standard table class, on-demand: the prices AWS set on 2024-11-01 (on-demand
#: throughput halved that day) and still published when this benchmark was written.
US_EAST_1 = OnDemandPrices(
    region="us-east-1",
    table_class="Standard",
    write_per_million=0.625,
    read_per_million=0.125,
    storage_per_gb_month=0.25,
    as_of="2024-11-01",
)
