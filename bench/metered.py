"""The DynamoDB store, measured: time of its public calls, price of what it read and wrote."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from turnledger.core.models import ConversationKey, Event, Head
from turnledger.store.base import ContextBudget, Page, PurgeReport, Snapshot
from turnledger.store.blobs import BlobStore
from turnledger.store.codec import A_PK, Item
from turnledger.store.dynamodb import DynamoDBConversationStore
from turnledger.store.inbox import InboxChanges

from bench.pricing import TRANSACTION_FACTOR, IndexSpec, item_size, read_units, write_units

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient


@dataclass(frozen=True)
class Commit:
    """The items of one committed transaction."""

    head: Item
    events: list[Item]


@dataclass
class StorageWork:
    """What the store did for one turn, measured on the client side."""

    seconds: float = 0.0
    #: Table and index writes; ``priced_index_wcu`` is the index part of it.
    priced_wcu: float = 0.0
    priced_index_wcu: float = 0.0
    priced_rcu: float = 0.0
    items_read: int = 0
    #: The ``Limit`` of each query, in order.
    query_limits: list[int] = field(default_factory=list)
    commits: list[Commit] = field(default_factory=list)


class MeteredStore(DynamoDBConversationStore):
    """The DynamoDB store, timing its public calls and pricing what it reads and writes.

    Time is taken around the public methods only (a nested call is not counted
    twice), so it covers the round trips and the encoding and decoding around
    them, and nothing of the provider. One instance per thread.
    """

    def __init__(
        self,
        client: DynamoDBClient,
        table_name: str,
        blobs: BlobStore,
        indexes: Sequence[IndexSpec],
    ) -> None:
        super().__init__(client, table_name, blobs)
        self.indexes = list(indexes)
        self.work = StorageWork()
        self._depth = 0
        self._heads: dict[str, Item] = {}

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

    def get_head(self, key: ConversationKey) -> Head | None:
        with self._timed():
            return super().get_head(key)

    def load(self, key: ConversationKey, budget: ContextBudget) -> Snapshot:
        with self._timed():
            return super().load(key, budget)

    def read_events(
        self, key: ConversationKey, head: Head, *, after: int, limit: int
    ) -> list[Event]:
        with self._timed():
            return super().read_events(key, head, after=after, limit=limit)

    def commit(
        self,
        key: ConversationKey,
        *,
        expected_version: int | None,
        head: Head,
        events: Sequence[Event],
        inbox_changes: InboxChanges | None = None,
    ) -> int:
        with self._timed():
            return super().commit(
                key,
                expected_version=expected_version,
                head=head,
                events=events,
                inbox_changes=inbox_changes,
            )

    def clear(self, key: ConversationKey, now: datetime) -> PurgeReport:
        with self._timed():
            return super().clear(key, now)

    def purge_if_unchanged(
        self, key: ConversationKey, head: Head, now: datetime
    ) -> PurgeReport | None:
        with self._timed():
            return super().purge_if_unchanged(key, head, now)

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
        page = super()._query(
            pk,
            lower=lower,
            upper=upper,
            descending=descending,
            limit=limit,
            cursor=cursor,
            keys_only=keys_only,
            consistent=consistent,
        )
        # A query is priced on the whole items it reads, whatever it projects.
        self.work.priced_rcu += read_units(
            sum(item_size(i) for i in page.items), consistent=consistent
        )
        self.work.items_read += len(page.items)
        self.work.query_limits.append(limit)
        return page

    def _transact_commit(
        self,
        head: Item,
        expected_version: int | None,
        events: list[Item],
        gen: str,
        *,
        puts: Sequence[Item] = (),
        deletes: Sequence[str] = (),
        checks: Sequence[Item] = (),
    ) -> None:
        super()._transact_commit(
            head, expected_version, events, gen, puts=puts, deletes=deletes, checks=checks
        )
        # A condition check is priced like a transactional write of the item it checks.
        written = [*events, *puts, *checks, head]
        table = sum(write_units(item_size(item)) for item in written) + len(deletes)
        old = self._heads.get(head[A_PK])
        # Indexes are updated after the transaction commits, at the standard rate.
        index = sum(spec.write_units(old, head) for spec in self.indexes)
        self.work.priced_wcu += TRANSACTION_FACTOR * table + index
        self.work.priced_index_wcu += index
        self.work.commits.append(Commit(head=head, events=events))
        self._heads[head[A_PK]] = head
