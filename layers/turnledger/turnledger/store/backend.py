"""The backend: the few primitives a storage engine implements, and what each must do.

Every protocol of the store (:mod:`.reads`, :mod:`.commit`, :mod:`.purge`,
:mod:`.forks`, :mod:`.imports`, and the side items, records, inbox and indexes) is
written once over these primitives; a backend (:mod:`.memory`, :mod:`.sqlite`,
:mod:`.dynamodb`) implements only them, each documented with what it must do and
raise (the pattern of Powertools' idempotency persistence layers).
``tests/contract/test_backend_contract.py`` checks each condition of each primitive on
every backend.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .codec import Item
from .inbox import EntryKey


@dataclass
class CapacityMeter:
    """Consumed capacity and round trips, as reported by the backend."""

    read_units: float = 0.0
    write_units: float = 0.0
    read_calls: int = 0
    write_calls: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def read(self, units: float) -> None:
        """Record one read round trip that consumed ``units``."""
        with self._lock:
            self.read_units += units
            self.read_calls += 1

    def write(self, units: float) -> None:
        """Record one write round trip that consumed ``units``."""
        with self._lock:
            self.write_units += units
            self.write_calls += 1

    def snapshot(self) -> CapacityMeter:
        """A copy of the current totals."""
        with self._lock:
            return CapacityMeter(
                self.read_units, self.write_units, self.read_calls, self.write_calls
            )

    def since(self, earlier: CapacityMeter) -> CapacityMeter:
        """What was consumed after ``earlier`` (a :meth:`snapshot`)."""
        now = self.snapshot()
        return CapacityMeter(
            now.read_units - earlier.read_units,
            now.write_units - earlier.write_units,
            now.read_calls - earlier.read_calls,
            now.write_calls - earlier.write_calls,
        )


@dataclass(frozen=True)
class Page:
    """One page of a backend query."""

    items: list[Item]
    #: Opaque resume point; ``None`` when the query is exhausted.
    cursor: Any = None


class Backend(ABC):
    """The primitives over one table of items keyed ``(pk, sk)``."""

    #: Consumed capacity and round trips of every primitive call.
    meter: CapacityMeter

    def _keys_between(self, pk: str, lower: str, upper: str) -> Iterator[Item]:
        """The items of ``pk`` with ``lower <= sk <= upper`` (keys and ``g`` only), every page."""
        return self._items_between(pk, lower, upper, keys_only=True)

    def _items_between(
        self, pk: str, lower: str, upper: str, *, keys_only: bool = False
    ) -> Iterator[Item]:
        """The items of ``pk`` with ``lower <= sk <= upper``, ascending, every page."""
        cursor: Any = None
        while True:
            page = self._query(
                pk,
                lower=lower,
                upper=upper,
                descending=False,
                limit=1000,
                cursor=cursor,
                keys_only=keys_only,
            )
            yield from page.items
            if page.cursor is None:
                return
            cursor = page.cursor

    @abstractmethod
    def _get_item(self, pk: str, sk: str) -> Item | None:
        """The item at ``(pk, sk)``, read consistently, or ``None``."""

    @abstractmethod
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
        """One page of items of ``pk`` with ``lower <= sk <= upper``.

        ``None`` for a bound means none on that side. At most ``limit`` items;
        ``cursor`` resumes a previous page (after its last item, even if that was
        deleted since). With ``keys_only`` only ``pk``, ``sk``, ``g`` and ``n`` are needed.
        ``consistent=False`` allows an eventually consistent read (half the price
        on DynamoDB): it may miss items written in the last moments.
        """

    @abstractmethod
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
        """Atomically put ``events`` and ``head`` (``None``: no head is written), put ``puts``
        (each in its own item's partition) and delete the items of the partition at the
        sort keys ``deletes`` (inbox entries; absent ones are fine).

        Conditions: the stored head is still ``expected`` (as in :meth:`_replace_head`:
        ``ver``, ``g`` and ``fx``; ``None``: no head exists), when ``head`` is given; each
        event item's key is a free slot for the life ``gen`` (:func:`.slots.slot_free`
        with ``marker_version`` and ``head_locked``: nothing, another life's gravestone, the
        marker of that version; with ``head_locked``, any item of another life); the head
        of each of ``checks``' partitions is still that head item; the key of each of
        ``slots`` (items with ``pk``, ``sk``, ``g`` and maybe ``ver``) is a
        free slot for its ``g`` and ``ver``. ``puts`` and ``deletes`` carry no condition of
        their own.

        Raises:
            ConversationBusy: a condition failed or a concurrent transaction conflicted.
            PayloadTooLarge: an item exceeds the backend's item size limit.
        """

    @abstractmethod
    def _put_turn(self, item: Item, marker_version: int | None) -> None:
        """Put the turn item (or marker) ``item`` if its key is a free slot for its life
        (:func:`.slots.slot_free` with ``marker_version``): one conditional write, the
        optimistic lock of a plain turn (docs/STORAGE.md).

        Raises:
            ConversationBusy: the slot is taken; nothing was written.
            PayloadTooLarge: the item exceeds the backend's item size limit.
        """

    @abstractmethod
    def _replace_head(self, head: Item, expected: Item | None) -> bool:
        """Put ``head`` if the stored head is still ``expected``; returns whether it was written.

        "Still" compares the ``ver``, ``g`` and ``fx`` attributes (each present with
        the same value, or absent in both): any commit changes ``ver``, ``g`` tells
        lives apart, and ``fx`` is a clear's fence. ``expected=None`` requires that
        no head exists. The head condition of :meth:`_transact_commit` is the same
        comparison with an ``expected`` of ``ver`` and ``g`` only (so: no fence).
        """

    @abstractmethod
    def _delete_head(self, pk: str, expected: Item) -> bool:
        """Delete the head if it is still ``expected`` (as in :meth:`_replace_head`).

        Returns whether it was deleted.
        """

    @abstractmethod
    def _delete_items(self, pk: str, sort_keys: list[str]) -> None:
        """Delete the items of ``pk`` at ``sort_keys`` (absent ones are fine)."""

    @abstractmethod
    def _fence_head(self, pk: str, token: str) -> Item | None:
        """Set the head's ``fx`` attribute to ``token`` if it exists and has no ``fx``.

        Nothing else of the item changes. Must not create an item.

        Returns:
            The head item as fenced, or ``None`` when there is no head or it is fenced already.
        """

    @abstractmethod
    def _index_page(self, index: str, value: str, *, limit: int, cursor: Any) -> Page:
        """One page of the items whose ``index`` attribute equals ``value``, by ``pk``.

        ``index`` is a name of :data:`.indexes.INDEX_ATTRIBUTES`; the attribute is
        the one it maps to, and items without it are never listed. Items need only
        ``pk``. The index may lag behind the table (DynamoDB's global indexes do).
        """

    @abstractmethod
    def _inbox_query(self, partition: str, *, after: EntryKey | None, limit: int) -> Page:
        """One page of the ``by-inbox`` index's partition ``partition``, by sort key ascending.

        Items are entries (:mod:`.inbox`) with at least ``pk``, ``sk``, ``v``, ``is`` and
        ``d``; ``after`` resumes after that entry (even if it was deleted since). The page's
        cursor is the :class:`.inbox.EntryKey` of its last item, ``None`` when the query is
        exhausted. The index may lag behind the table (DynamoDB's global indexes do).
        """

    @abstractmethod
    def _delete_if_gen(self, pk: str, sk: str, gen: str | None) -> bool:
        """Delete the item at ``(pk, sk)`` if its ``g`` is ``gen`` (``None``: it has no ``g``).

        Returns whether this call deleted it.
        """

    @abstractmethod
    def _put_if_replaceable(self, item: Item, now: float) -> Item | None:
        """Put the idempotency record ``item`` if :func:`.records.may_replace` holds for
        the item stored under its key at ``now``, atomically (a condition, not a read then
        a write).

        Returns:
            ``None`` when ``item`` was written; else the stored item that refused it.
        """

    @abstractmethod
    def _set_if_unchanged(self, pk: str, sk: str, attributes: Item, expected: Item) -> bool:
        """Set ``attributes`` on the item at ``(pk, sk)`` if it exists and each attribute
        named in ``expected`` still holds that value (``None``: is absent), atomically;
        its other attributes stay. Returns whether it was written (it never creates one)."""

    @abstractmethod
    def _set_attributes(self, pk: str, sk: str, attributes: Item) -> None:
        """Set ``attributes`` on the item at ``(pk, sk)``, unconditionally, creating it
        (with just its keys and ``attributes``) when absent; its other attributes stay."""

    @abstractmethod
    def _advance_cursor(self, item: Item) -> bool:
        """Put the sweep cursor ``item`` (:func:`.indexes.cursor_item`) if it moves forward.

        Written when no cursor is stored, or when the stored one has the same
        schema version ``v`` and a ``bucket`` below ``item``'s; returns whether it was.
        """

    @abstractmethod
    def _put_items(self, items: list[Item]) -> None:
        """Put each of ``items`` unconditionally (not atomically as a group)."""
