"""The store's facade: one object over a backend, each operation a protocol of its own module.

:class:`ConversationStore` is what the layers above hold. It owns what an execution
environment keeps (the blob store, the item sealer, the view cache, the capacity meter)
and names every operation; each is written once, over the backend's primitives
(:mod:`.backend`), in the module of its protocol:

* reads (:mod:`.reads`, the view cache in :mod:`.views`, the run flag in :mod:`.runs`);
* the commit (:mod:`.commit`);
* the purge: clear, sweep, the fence, and the lives forks keep (:mod:`.purge`);
* forks (:mod:`.forks`), imports (:mod:`.imports`);
* side items (:mod:`.side`), idempotency records (:mod:`.records`), the approval inbox
  (:mod:`.inbox`), the indexes and the sweep cursor (:mod:`.indexes`), sealing what was
  written clear (:mod:`.sealed`).

It names the operations that more than one caller, or a test of every backend, needs; an
operation with a single caller is called as its protocol's function (the run flag's
:func:`.runs.put_run_flag` from the draft, :func:`.forks.fork_refs` from the forks' page,
:func:`.imports.import_conversation` from the transfer, :func:`.purge.retention` and
:func:`.purge.release_forks` from the purge and the sweep's reclaim).

It knows no turn rules: the head, its status and the inbox changes come from the caller.
A backend (:mod:`.memory`, :mod:`.sqlite`, :mod:`.dynamodb`) subclasses it and implements
only the primitives. ``tests/contract`` runs the scenario suite and the primitives' suite
over every backend (memory, DynamoDB on moto and on DynamoDB Local, SQLite).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime

from ..core.models import ConversationKey, Event, Head
from . import commit as commit_protocol
from . import forks, inbox, indexes, keys, purge, reads, records, retention, sealed
from . import side as side_items
from .backend import Backend, CapacityMeter, Page
from .blobs import BlobStore
from .codec import Item, SideItem
from .commit import DEFAULT_OFFLOAD_THRESHOLD, MAX_EVENTS_PER_COMMIT, new_generation
from .inbox import EntryKey
from .indexes import INDEX_PAGE_SIZE, EventStamp, SweepPass
from .keyring import Keyring
from .purge import PurgeReport
from .reads import ContextBudget, Snapshot
from .runs import RunFlag
from .sealed import ItemSealer, SealedBlobStore, SealReport
from .views import FIRST_PAGE, ViewCache

__all__ = [
    "DEFAULT_OFFLOAD_THRESHOLD",
    "FIRST_PAGE",
    "MAX_EVENTS_PER_COMMIT",
    "CapacityMeter",
    "ContextBudget",
    "ConversationStore",
    "Page",
    "PurgeReport",
    "RunFlag",
    "SealReport",
    "Snapshot",
    "new_generation",
]


class ConversationStore(Backend):
    """Conversation heads and events, with large payloads offloaded to a :class:`BlobStore`."""

    #: Index entries a page of :meth:`expiring_in` and :meth:`of_tenant` reads.
    index_page_size: int = INDEX_PAGE_SIZE
    #: Index queries one inbox page may take when filters or expiries skip entries.
    inbox_rounds: int = 8
    #: How long an import's hidden staging head lives: past this, the sweep (or DynamoDB's
    #: TTL) treats it as a dead purge and removes what the import had written.
    import_staging_seconds: int = 900
    #: Item bytes one staging write holds at most (DynamoDB's transactions take 4 MB).
    import_chunk_bytes: int = 3_000_000

    def __init__(
        self,
        blobs: BlobStore,
        *,
        offload_threshold: int = DEFAULT_OFFLOAD_THRESHOLD,
        meter: CapacityMeter | None = None,
        keyring: Keyring | None = None,
    ) -> None:
        # With a keyring, content is sealed at rest (.sealed): items' content attributes
        # and objects, under keys that erasure destroys first.
        self.blobs = blobs if keyring is None else SealedBlobStore(blobs, keyring)
        self.sealer = ItemSealer(keyring)
        self.offload_threshold = offload_threshold
        self.meter = meter or CapacityMeter()
        self.views = ViewCache()

    # --- reads (.reads) -----------------------------------------------------------------

    def get_head(self, key: ConversationKey, *, content: bool = True) -> Head | None:
        """The stored head, whatever its state (``None`` when absent): :func:`.reads.get_head`."""
        return reads.get_head(self, key, content=content)

    def load(self, key: ConversationKey, budget: ContextBudget) -> Snapshot:
        """The head and what the next context needs: :func:`.reads.load`."""
        return reads.load(self, key, budget)

    def read_events(
        self, key: ConversationKey, head: Head, *, after: int, limit: int
    ) -> list[Event]:
        """Up to ``limit`` events after public sequence ``after``: :func:`.reads.read_events`."""
        return reads.read_events(self, key, head, after=after, limit=limit)

    def event_at(self, key: ConversationKey, head: Head, sequence: int) -> Event:
        """The event at public ``sequence``, payload included: :func:`.reads.event_at`."""
        return reads.event_at(self, key, head, sequence)

    def head_item(self, key: ConversationKey) -> Item | None:
        """The raw head item, read consistently (``None`` when absent); nothing is decoded."""
        return self._get_item(keys.partition_key(key), keys.HEAD_SK)

    # --- the commit (.commit) -----------------------------------------------------------

    def commit(
        self,
        key: ConversationKey,
        *,
        expected_version: int | None,
        head: Head,
        events: Sequence[Event],
        inbox_changes: inbox.InboxChanges | None = None,
    ) -> int:
        """Append ``events`` and replace the head, atomically: :func:`.commit.commit`."""
        return commit_protocol.commit(
            self,
            key,
            expected_version=expected_version,
            head=head,
            events=events,
            inbox_changes=inbox_changes,
        )

    # --- the purge (.purge) -------------------------------------------------------------

    def clear(self, key: ConversationKey, now: datetime) -> PurgeReport:
        """Delete the conversation, winning against turns: :func:`.purge.clear`."""
        return purge.clear(self, key, now)

    def purge_if_unchanged(
        self, key: ConversationKey, head: Head, now: datetime
    ) -> PurgeReport | None:
        """Purge the conversation if its head is still ``head``:
        :func:`.purge.purge_if_unchanged`."""
        return purge.purge_if_unchanged(self, key, head, now)

    def refile(self, key: ConversationKey, head: Head) -> bool:
        """File a live head under its current expiry bucket: :func:`.purge.refile`."""
        return purge.refile(self, key, head)

    def refile_retention(self, key: ConversationKey, head: Head, due: datetime | None) -> bool:
        """File a live head as holding retained content due at ``due``:
        :func:`.retention.refile_retention`."""
        return retention.refile_retention(self, key, head, due)

    # --- forks (.forks) and imports (.imports) ------------------------------------------

    def fork(
        self,
        parent: ConversationKey,
        parent_head: Head,
        target: ConversationKey,
        head: Head,
        *,
        expected_version: int | None,
        now: datetime,
    ) -> None:
        """Create the fork ``head`` at ``target``, atomically: :func:`.forks.fork`."""
        forks.fork(
            self, parent, parent_head, target, head, expected_version=expected_version, now=now
        )

    def fork_count(self, key: ConversationKey, head: Head) -> int:
        """How many live forks ``head``'s life has: :func:`.forks.fork_count`."""
        return forks.fork_count(self, key, head)

    # --- side items (.side) and idempotency records (.records) --------------------------

    def put_side_item(self, key: ConversationKey, side: SideItem) -> None:
        """Put a side item, unconditionally: :func:`.side.put_side_item`."""
        side_items.put_side_item(self, key, side)

    def get_side_item(self, key: ConversationKey, sort_key: str) -> SideItem | None:
        """The side item at ``sort_key``, or ``None``: :func:`.side.get_side_item`."""
        return side_items.get_side_item(self, key, sort_key)

    def query_side_items(
        self,
        key: ConversationKey,
        *,
        lower: str,
        upper: str,
        limit: int = 1000,
        consistent: bool = True,
    ) -> list[SideItem]:
        """The side items in a key range: :func:`.side.query_side_items`."""
        return side_items.query_side_items(
            self, key, lower=lower, upper=upper, limit=limit, consistent=consistent
        )

    def delete_side_items(self, key: ConversationKey, sort_keys: list[str]) -> None:
        """Delete side items (absent ones are fine): :func:`.side.delete_side_items`."""
        side_items.delete_side_items(self, key, sort_keys)

    def get_record(self, key: ConversationKey, record_key: str) -> records.Record | None:
        """An idempotency record, or ``None``: :func:`.records.get_record`."""
        return records.get_record(self, key, record_key)

    def put_record(
        self, key: ConversationKey, record: records.Record, *, now: float
    ) -> records.Record | None:
        """Put ``record`` unless a live record holds its key: :func:`.records.put_record`."""
        return records.put_record(self, key, record, now=now)

    def update_record(self, key: ConversationKey, record: records.Record) -> None:
        """Set a record's outcome, unconditionally: :func:`.records.update_record`."""
        records.update_record(self, key, record)

    def delete_record(self, key: ConversationKey, record_key: str) -> None:
        """Delete an idempotency record (absent is fine): :func:`.records.delete_record`."""
        records.delete_record(self, key, record_key)

    # --- the inbox (.inbox), indexes and the sweep cursor (.indexes), sealing (.sealed) --

    def inbox_page(
        self,
        tenant: str,
        *,
        now: datetime,
        limit: int,
        after: EntryKey | None = None,
        tool: str | None = None,
        conversation_id: str | None = None,
    ) -> inbox.InboxPage:
        """A page of the calls of ``tenant`` waiting for a person: :func:`.inbox.inbox_page`."""
        return inbox.inbox_page(
            self,
            tenant,
            now=now,
            limit=limit,
            after=after,
            tool=tool,
            conversation_id=conversation_id,
        )

    def expiring_in(self, bucket: int, shard: int) -> Iterator[ConversationKey]:
        """Conversations filed under one shard of an expiry bucket: :func:`.indexes.expiring_in`."""
        return indexes.expiring_in(self, bucket, shard)

    def due_in(self, bucket: int, shard: int) -> Iterator[ConversationKey]:
        """Conversations whose next due work falls in ``bucket``: :func:`.indexes.due_in`."""
        return indexes.due_in(self, bucket, shard)

    def of_tenant(self, tenant: str) -> Iterator[ConversationKey]:
        """Every conversation of ``tenant`` that has a head: :func:`.indexes.of_tenant`."""
        return indexes.of_tenant(self, tenant)

    def event_stamps(self, key: ConversationKey) -> list[EventStamp]:
        """Every event item of ``key``'s partition: :func:`.indexes.event_stamps`."""
        return indexes.event_stamps(self, key)

    def delete_event(self, key: ConversationKey, stamp: EventStamp) -> bool:
        """Delete an event item if its life is still the one read: :func:`.indexes.delete_event`."""
        return indexes.delete_event(self, key, stamp)

    def read_sweep_cursor(self, of: SweepPass = "expiry") -> int | None:
        """The first bucket a sweep pass has not swept: :func:`.indexes.read_sweep_cursor`."""
        return indexes.read_sweep_cursor(self, of)

    def advance_sweep_cursor(self, bucket: int, of: SweepPass = "expiry") -> bool:
        """Move a sweep pass's cursor forward: :func:`.indexes.advance_sweep_cursor`."""
        return indexes.advance_sweep_cursor(self, bucket, of)

    def seal_existing(self, key: ConversationKey) -> SealReport:
        """Rewrite sealed what ``key``'s partition holds clear: :func:`.sealed.seal_existing`."""
        return sealed.seal_existing(self, key)
