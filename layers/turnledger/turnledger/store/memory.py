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
from . import codec, keys, records
from .base import ConversationStore, Page
from .blobs import BlobStore, MemoryBlobStore
from .codec import Item
from .inbox import A_INBOX, A_INBOX_SORT, EntryKey, entry_key
from .indexes import A_BUCKET, INDEX_ATTRIBUTES
from .slots import slot_free


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

    def _put_items(self, items: list[Item]) -> None:
        with self._lock:
            for item in items:
                self.meter.write(0)
                self.items.setdefault(item[codec.A_PK], {})[item[codec.A_SK]] = dict(item)

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
        codec.check_item_sizes([*events, *puts, *([head] if head is not None else [])])
        pk = (head or events[0])[codec.A_PK]
        with self._lock:
            partition = self.items.get(pk, {})
            ok = (head is None or codec.same_head(partition.get(keys.HEAD_SK), expected)) and all(
                codec.same_head(self.items.get(c[codec.A_PK], {}).get(keys.HEAD_SK), c)
                for c in checks
            )
            for event in events:
                stored = partition.get(event[codec.A_SK])
                ok = ok and slot_free(stored, gen, marker_version, head_locked=head_locked)
            for slot in slots:
                stored = self.items.get(slot[codec.A_PK], {}).get(slot[codec.A_SK])
                ok = ok and slot_free(stored, slot[codec.A_GEN], slot.get(codec.A_VERSION))
            if not ok:
                raise ConversationBusy(
                    "another turn or decision on this conversation committed first"
                )
            self.meter.write(0)
            partition = self.items.setdefault(pk, {})
            for sk in deletes:
                partition.pop(sk, None)
            for item in [*events, *puts, *([head] if head is not None else [])]:
                self.items.setdefault(item[codec.A_PK], {})[item[codec.A_SK]] = dict(item)

    def _put_turn(self, item: Item, marker_version: int | None) -> None:
        codec.check_item_sizes([item])
        with self._lock:
            stored = self.items.get(item[codec.A_PK], {}).get(item[codec.A_SK])
            if not slot_free(stored, item[codec.A_GEN], marker_version):
                raise ConversationBusy(
                    "another turn or decision on this conversation committed first"
                )
            self.meter.write(0)
            self.items.setdefault(item[codec.A_PK], {})[item[codec.A_SK]] = dict(item)

    def _replace_head(self, head: Item, expected: Item | None) -> bool:
        with self._lock:
            partition = self.items.get(head[codec.A_PK], {})
            if not codec.same_head(partition.get(keys.HEAD_SK), expected):
                return False
            self.meter.write(0)
            self.items.setdefault(head[codec.A_PK], {})[keys.HEAD_SK] = dict(head)
            return True

    def _delete_head(self, pk: str, expected: Item) -> bool:
        with self._lock:
            partition = self.items.get(pk, {})
            if not codec.same_head(partition.get(keys.HEAD_SK), expected):
                return False
            self.meter.write(0)
            del partition[keys.HEAD_SK]
            if not partition:
                self.items.pop(pk, None)
            return True

    def _delete_items(self, pk: str, sort_keys: list[str]) -> None:
        with self._lock:
            self.meter.write(0)
            partition = self.items.get(pk, {})
            for sk in sort_keys:
                partition.pop(sk, None)
            if not partition:
                self.items.pop(pk, None)

    def _fence_head(self, pk: str, token: str) -> Item | None:
        with self._lock:
            head = self.items.get(pk, {}).get(keys.HEAD_SK)
            if head is None or codec.A_FENCE in head:
                return None
            self.meter.write(0)
            head[codec.A_FENCE] = token
            return dict(head)

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

    def _delete_if_gen(self, pk: str, sk: str, gen: str | None) -> bool:
        with self._lock:
            partition = self.items.get(pk, {})
            item = partition.get(sk)
            if item is None or item.get(codec.A_GEN) != gen:
                return False
            self.meter.write(0)
            del partition[sk]
            if not partition:
                self.items.pop(pk, None)
            return True

    def _put_if_replaceable(self, item: Item, now: float) -> Item | None:
        pk, sk = item[codec.A_PK], item[codec.A_SK]
        with self._lock:
            stored = self.items.get(pk, {}).get(sk)
            if stored is not None and not records.may_replace(stored, now):
                return dict(stored)
            self.meter.write(0)
            self.items.setdefault(pk, {})[sk] = dict(item)
            return None

    def _set_if_unchanged(self, pk: str, sk: str, attributes: Item, expected: Item) -> bool:
        with self._lock:
            stored = self.items.get(pk, {}).get(sk)
            if stored is None or not codec.unchanged(stored, expected):
                return False
            self.meter.write(0)
            stored.update(attributes)
            return True

    def _set_attributes(self, pk: str, sk: str, attributes: Item) -> None:
        with self._lock:
            self.meter.write(0)
            stored = self.items.setdefault(pk, {}).setdefault(sk, {codec.A_PK: pk, codec.A_SK: sk})
            stored.update(attributes)

    def _advance_cursor(self, item: Item) -> bool:
        pk, sk = item[codec.A_PK], item[codec.A_SK]
        with self._lock:
            stored = self.items.get(pk, {}).get(sk)
            if stored is not None and (
                stored.get(codec.A_SCHEMA) != item[codec.A_SCHEMA]
                or not stored.get(A_BUCKET, item[A_BUCKET]) < item[A_BUCKET]
            ):
                return False
            self.meter.write(0)
            self.items.setdefault(pk, {})[sk] = dict(item)
            return True
