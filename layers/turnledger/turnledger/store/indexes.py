"""The vocabulary of the store's index and sweep operations, shared by every backend.

The operations themselves are public methods of
:class:`~.base.ConversationStore` (``expiring_in``, ``due_in``, ``of_tenant``,
``event_stamps``, ``delete_event``, ``read_sweep_cursor``,
``advance_sweep_cursor``), built on small backend primitives and run by the
store contract suite on every backend. This module holds what they share and
what is not a store's own: index names, the event stamp, and the sweep
cursor's item.

Three sparse, keys-only indexes over head items, each cheap in proportion to
what it returns, never to the table:

* ``by-expiry`` (attribute ``xb``): the heads filed under one expiry bucket
  partition ``"<expires_at // 3600>#<shard>"`` (:func:`.keys.expiry_bucket`);
* ``by-wait`` (attribute ``wb``, sharded alike): the heads whose next due work falls in
  that hour: the earliest wait (a decision's window, a deferred call's deadline) closes,
  or the content their class's retention keeps falls due (``retention_due``);
* ``by-tenant`` (attribute ``tn``): every head of one tenant.

(The approval inbox's ``by-inbox`` index is over entry items: :mod:`.inbox`.) On
DynamoDB all are global secondary indexes, so they are eventually consistent:
callers re-read the head consistently before acting on an entry.

The sweep's two passes each keep a cursor, one item in the same table under
``pk="#SWEEP"``: ``sk="CURSOR"`` holds the first ``by-expiry`` bucket not yet fully
swept, ``sk="WAITS"`` the first ``by-wait`` bucket. A cursor item has no ``tn``, ``xb``
or ``wb`` attribute, so no index ever lists it, and ``#`` can never start a
conversation's partition key.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..core.models import ConversationKey
from . import codec, keys
from .backend import Condition, ConditionFailed, Delete, Put, Unchanged
from .codec import Item
from .reads import events_in

if TYPE_CHECKING:
    from .base import ConversationStore


#: Index names, as declared in template.yaml.
EXPIRY_INDEX = "by-expiry"
TENANT_INDEX = "by-tenant"
#: Heads with due work (a decision whose window closes, content whose retention falls
#: due), by the hour of the earliest (``wb``, sharded like ``xb``): the sweep's pass over
#: due work.
WAIT_INDEX = "by-wait"


#: The item attribute each index is keyed on (see :mod:`.codec`).
INDEX_ATTRIBUTES = {
    EXPIRY_INDEX: codec.A_EXPIRY_BUCKET,
    TENANT_INDEX: codec.A_TENANT,
    WAIT_INDEX: codec.A_WAIT_BUCKET,
}


#: Where the sweep's cursors live: one item per pass (:data:`SweepPass`).
CURSOR_PK = "#SWEEP"
CURSOR_SK = "CURSOR"
WAIT_CURSOR_SK = "WAITS"
#: The sweep's passes that keep a cursor: over ``by-expiry`` and over ``by-wait``.
type SweepPass = Literal["expiry", "waits"]
_CURSOR_SKS: dict[SweepPass, str] = {"expiry": CURSOR_SK, "waits": WAIT_CURSOR_SK}
CURSOR_SCHEMA_VERSION = 1
#: The cursor item's attribute holding the bucket (its schema version is ``v``).
A_BUCKET = "bucket"


#: Index entries per page (keys only: a page of 500 is about 40 KB).
INDEX_PAGE_SIZE = 500


@dataclass(frozen=True)
class EventStamp:
    """Where an event item is and which life wrote it (``None``: the item has no ``g``)."""

    sort_key: str
    gen: str | None
    #: The events the item holds (a turn item holds one commit's: docs/STORAGE.md).
    events: int = 1


def cursor_sort_key(of: SweepPass) -> str:
    """The sort key of the cursor of the sweep's pass ``of``."""
    return _CURSOR_SKS[of]


def cursor_item(bucket: int, of: SweepPass = "expiry") -> Item:
    """The item of the cursor of the sweep's pass ``of``, holding ``bucket``."""
    return {
        codec.A_PK: CURSOR_PK,
        codec.A_SK: cursor_sort_key(of),
        codec.A_SCHEMA: CURSOR_SCHEMA_VERSION,
        A_BUCKET: bucket,
    }


@dataclass(frozen=True)
class CursorForward(Condition):
    """The backend condition of a cursor's put: no cursor is stored, or one of schema
    version ``schema`` whose bucket is below ``bucket`` (a cursor never goes back, and
    one of an unknown schema version is never overwritten)."""

    schema: int
    bucket: int

    def holds(self, stored: Item | None) -> bool:
        if stored is None:
            return True
        below = stored.get(A_BUCKET)
        return (
            stored.get(codec.A_SCHEMA) == self.schema
            and isinstance(below, int)
            and not isinstance(below, bool)
            and below < self.bucket
        )


def cursor_bucket(item: Item | None) -> int | None:
    """The bucket of a stored cursor item (``None``: absent, or of an unknown schema)."""
    if item is None or item.get(codec.A_SCHEMA) != CURSOR_SCHEMA_VERSION:
        return None
    bucket = item.get(A_BUCKET)
    return bucket if isinstance(bucket, int) and not isinstance(bucket, bool) else None


# --- reading the indexes and the sweep cursor --------------------------------------------


def expiring_in(store: ConversationStore, bucket: int, shard: int) -> Iterator[ConversationKey]:
    """Conversations whose head is filed under one shard of expiry ``bucket`` (``by-expiry``).

    Pages lazily, so a caller may purge as it goes; the index may lag behind
    the table: re-read the head before acting.
    """
    return _index_keys(store, EXPIRY_INDEX, keys.expiry_partition(bucket, shard))


def due_in(store: ConversationStore, bucket: int, shard: int) -> Iterator[ConversationKey]:
    """Conversations whose next due work falls in ``bucket`` (``by-wait``): the earliest
    wait (a decision's window, a deferred call's deadline) closes, or retained content
    falls due.

    Pages lazily; the index may lag behind the table: re-read before acting. A
    conversation is named once even when its head and inbox entries are all filed
    there (entries file their own waits: :mod:`.inbox`).
    """
    seen: set[ConversationKey] = set()
    for key in _index_keys(store, WAIT_INDEX, keys.expiry_partition(bucket, shard)):
        if key not in seen:
            seen.add(key)
            yield key


def of_tenant(store: ConversationStore, tenant: str) -> Iterator[ConversationKey]:
    """Every conversation of ``tenant`` that has a head, tombstones included (``by-tenant``).

    Pages lazily, so a caller may clear as it goes; the index may lag behind
    the table.
    """
    return _index_keys(store, TENANT_INDEX, tenant)


def _index_keys(store: ConversationStore, index: str, value: str) -> Iterator[ConversationKey]:
    cursor: Any = None
    while True:
        page = store._index_page(index, value, limit=store.index_page_size, cursor=cursor)
        for item in page.items:
            try:
                yield keys.parse_partition_key(str(item[codec.A_PK]))
            except ValueError:
                continue  # not a conversation (a foreign item)
        if page.cursor is None:
            return
        cursor = page.cursor


def event_stamps(store: ConversationStore, key: ConversationKey) -> list[EventStamp]:
    """Every event item of ``key``'s partition (sort key and life), ascending, consistently.

    Read whole before it returns (all pages). What reclaiming orphans needs: it
    deletes by life, never by range.
    """
    lower, upper = keys.event_sort_key(0), keys.event_sort_key(10**12 - 1)
    return [
        EventStamp(
            str(item[codec.A_SK]),
            gen if isinstance(gen := item.get(codec.A_GEN), str) else None,
            events_in(item),
        )
        for item in store._keys_between(keys.partition_key(key), lower, upper)
    ]


def delete_event(store: ConversationStore, key: ConversationKey, stamp: EventStamp) -> bool:
    """Delete the event item at ``stamp.sort_key`` if its life is still ``stamp.gen``.

    Returns whether this call deleted it: ``False`` when it is gone already or
    was overwritten by another life since it was read.
    """
    pk = keys.partition_key(key)
    try:
        store._write(Delete(pk, stamp.sort_key, Unchanged({codec.A_GEN: stamp.gen})))
    except ConditionFailed:
        return False
    return True


def read_sweep_cursor(store: ConversationStore, of: SweepPass = "expiry") -> int | None:
    """The first bucket the sweep's pass ``of`` has not fully swept (``"expiry"``: of
    ``by-expiry``; ``"waits"``: of ``by-wait``); ``None``: none stored, or of an unknown
    schema version."""
    return cursor_bucket(store._get_item(CURSOR_PK, cursor_sort_key(of)))


def advance_sweep_cursor(store: ConversationStore, bucket: int, of: SweepPass = "expiry") -> bool:
    """Move the cursor of the sweep's pass ``of`` to ``bucket`` if that is forward;
    returns whether it moved.

    Concurrent sweeps may both call this: a cursor never goes back, and one of an
    unknown schema version is never overwritten.
    """
    try:
        store._write(Put(cursor_item(bucket, of), CursorForward(CURSOR_SCHEMA_VERSION, bucket)))
    except ConditionFailed:
        return False
    return True
