"""An in-process backend with the same semantics as DynamoDB, for tests and demos.

Items are kept in their encoded form, so everything the DynamoDB backend
validates on read is validated here too, and tests can corrupt items by hand.
Conditions, cursors and the item size limit behave as DynamoDB's do.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from ..core.exceptions import ConversationBusy
from . import codec
from .backend import BUSY, Check, ConditionFailed, Delete, Put, Update, Write, applied
from .base import ConversationStore, Page
from .blobs import BlobStore, MemoryBlobStore
from .codec import Item
from .inbox import A_INBOX, A_INBOX_SORT, EntryKey, entry_key
from .indexes import INDEX_ATTRIBUTES


class MemoryConversationStore(ConversationStore):
    """A dict of partitions, each a dict of sort key to item, behind one lock."""

    def __init__(self, blobs: BlobStore | None = None, **kwargs: Any) -> None:
        super().__init__(blobs or MemoryBlobStore(), **kwargs)
        self.items: dict[str, dict[str, Item]] = {}
        self._lock = threading.RLock()

    def _get_item(self, pk: str, sk: str) -> Item | None:
        with self._lock:
            self.meter.read(0)
            item = self.items.get(pk, {}).get(sk)
            return dict(item) if item is not None else None

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
        with self._lock:
            self.meter.read(0)
            partition = self.items.get(pk, {})
            matching = sorted(
                (
                    sk
                    for sk in partition
                    if (lower is None or sk >= lower) and (upper is None or sk <= upper)
                ),
                reverse=descending,
            )
            # The cursor is the last key returned, as DynamoDB's LastEvaluatedKey: a page
            # resumes after it even when items before it were deleted in between.
            if cursor is not None:
                matching = [sk for sk in matching if (sk < cursor if descending else sk > cursor)]
            chosen = matching[:limit]
            more = len(matching) > limit
            return Page(
                items=[dict(partition[sk]) for sk in chosen],
                cursor=chosen[-1] if more else None,
            )

    def _stored(self, key: tuple[str, str]) -> Item | None:
        return self.items.get(key[0], {}).get(key[1])

    def _apply(self, write: Put | Update | Delete) -> Item | None:
        pk, sk = write.key
        item = applied(write, self._stored(write.key))
        if item is not None:
            self.items.setdefault(pk, {})[sk] = item
            return dict(item)
        partition = self.items.get(pk, {})
        partition.pop(sk, None)
        if not partition:
            self.items.pop(pk, None)
        return None

    def _write(self, write: Put | Update | Delete) -> Item | None:
        with self._lock:
            stored = self._stored(write.key)
            if write.when is not None and not write.when.holds(stored):
                raise ConditionFailed(None if stored is None else dict(stored))
            self.meter.write(0)
            item = self._apply(write)
        return item if isinstance(write, Update) and write.returning else None

    def _transact(self, writes: Sequence[Write]) -> None:
        codec.check_item_sizes([w.item for w in writes if isinstance(w, Put)])
        with self._lock:
            if not all(w.when is None or w.when.holds(self._stored(w.key)) for w in writes):
                raise ConversationBusy(BUSY)
            self.meter.write(0)
            for write in writes:
                if not isinstance(write, Check):
                    self._apply(write)

    def _write_batch(self, writes: Sequence[Put | Delete]) -> None:
        with self._lock:
            # As DynamoDB's: one round trip a put, one for the deletes (per 25 there).
            for write in writes:
                if isinstance(write, Put):
                    self.meter.write(0)
            if any(isinstance(write, Delete) for write in writes):
                self.meter.write(0)
            for write in writes:
                self._apply(write)

    def _index_page(self, index: str, value: str, *, limit: int, cursor: Any) -> Page:
        attribute = INDEX_ATTRIBUTES[index]
        with self._lock:
            self.meter.read(0)
            pks = sorted(
                pk
                for pk, partition in self.items.items()
                if any(item.get(attribute) == value for item in partition.values())
                and (cursor is None or pk > cursor)
            )
        chosen = pks[:limit]
        return Page(
            items=[{codec.A_PK: pk} for pk in chosen],
            cursor=chosen[-1] if len(pks) > limit else None,
        )

    def _inbox_query(self, partition: str, *, after: EntryKey | None, limit: int) -> Page:
        with self._lock:
            self.meter.read(0)
            entries = sorted(
                (
                    dict(item)
                    for items in self.items.values()
                    for item in items.values()
                    if item.get(A_INBOX) == partition
                    and (after is None or str(item.get(A_INBOX_SORT)) > after.sort)
                ),
                key=lambda item: str(item[A_INBOX_SORT]),
            )
        chosen = entries[:limit]
        return Page(items=chosen, cursor=entry_key(chosen[-1]) if len(entries) > limit else None)
