"""The backend: the seven primitives a storage engine implements, and what each must do.

Every protocol of the store (:mod:`.reads`, :mod:`.commit`, :mod:`.purge`,
:mod:`.forks`, :mod:`.imports`, and the side items, records, inbox and indexes) is
written once over these primitives; a backend (:mod:`.memory`, :mod:`.sqlite`,
:mod:`.dynamodb`) implements only them, each documented with what it must do and
raise (the pattern of Powertools' idempotency persistence layers).

Four read (:meth:`~Backend._get_item`, :meth:`~Backend._query`,
:meth:`~Backend._index_page`, :meth:`~Backend._inbox_query`) and three write: one item
(:meth:`~Backend._write`), several atomically (:meth:`~Backend._transact`), several
each on its own (:meth:`~Backend._write_batch`). A write is a :class:`Put`,
:class:`Update` or :class:`Delete` (in a transaction also a :class:`Check`) with an
optional :class:`Condition` on the item stored at its key. Each condition's
:meth:`~Condition.holds` is its reference meaning: the memory and SQLite backends
evaluate it, the DynamoDB backend translates it into a ``ConditionExpression`` that
must agree. The conditions:

* :class:`Absent`: no item at the key;
* :class:`Unchanged`: the item exists and each named attribute holds a value (or is
  absent); :func:`head_is` builds the head's (``ver``, ``g`` and ``fx``), so a head
  write compares version, life and fence;
* :class:`SlotFree`: the key is a free slot for a commit of a life (the optimistic
  lock of every commit; the rule is :func:`.slots.slot_free`);
* :class:`.records.Replaceable`: an idempotency record may be replaced (Powertools'
  condition);
* :class:`.indexes.CursorForward`: the sweep's cursor moves forward.

The few named helpers below the primitives (:meth:`~Backend._put_turn`,
:meth:`~Backend._replace_head`, :meth:`~Backend._fence_head`, ...) are writes the
protocols send often, kept by name so that tests can stage a crash or a concurrent
writer at them. ``tests/contract/test_backend_contract.py`` checks each condition of
each primitive on every backend.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.exceptions import ConversationBusy
from . import codec, keys
from .codec import Item
from .inbox import EntryKey
from .slots import slot_free


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


# --- conditions ---------------------------------------------------------------------------


class Condition(ABC):
    """What a write requires of the item stored at its key when it lands."""

    @abstractmethod
    def holds(self, stored: Item | None) -> bool:
        """Whether the write may land over ``stored`` (``None``: no item at its key).

        The reference meaning of the condition: the memory and SQLite backends
        evaluate it under their write lock; the DynamoDB backend's
        ``ConditionExpression`` for it must agree (the backend contract checks both).
        """


@dataclass(frozen=True)
class Absent(Condition):
    """No item is stored at the key."""

    def holds(self, stored: Item | None) -> bool:
        return stored is None


@dataclass(frozen=True)
class Unchanged(Condition):
    """An item is stored at the key and each attribute of ``expected`` still holds that
    value (``None``: the attribute is absent)."""

    expected: Item

    def holds(self, stored: Item | None) -> bool:
        return stored is not None and codec.unchanged(stored, self.expected)


@dataclass(frozen=True)
class SlotFree(Condition):
    """The key is a free slot for a commit of the life ``gen`` that read the head of
    version ``marker_version`` (:func:`.slots.slot_free`, ``head_locked`` included)."""

    gen: str
    marker_version: int | None = None
    head_locked: bool = False

    def holds(self, stored: Item | None) -> bool:
        return slot_free(stored, self.gen, self.marker_version, head_locked=self.head_locked)


def head_is(expected: Item | None) -> Condition:
    """The stored head is still ``expected`` (``None``: no head exists): its ``ver``,
    ``g`` and ``fx`` each present with the same value, or absent in both."""
    if expected is None:
        return Absent()
    return Unchanged({name: expected.get(name) for name in codec.HEAD_IDENTITY})


# --- writes -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Put:
    """Put ``item`` whole at its key (replacing what is there)."""

    item: Item
    when: Condition | None = None

    @property
    def key(self) -> tuple[str, str]:
        return str(self.item[codec.A_PK]), str(self.item[codec.A_SK])


@dataclass(frozen=True)
class Update:
    """Set ``attributes`` on the item at ``(pk, sk)``, its other attributes kept; an
    absent item is created with just its keys and ``attributes`` (unless ``when``
    requires one). With ``returning``, :meth:`Backend._write` returns the item as updated."""

    pk: str
    sk: str
    attributes: Item
    when: Condition | None = None
    returning: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return self.pk, self.sk


@dataclass(frozen=True)
class Delete:
    """Delete the item at ``(pk, sk)`` (an absent one is fine, unless ``when`` requires one)."""

    pk: str
    sk: str
    when: Condition | None = None

    @property
    def key(self) -> tuple[str, str]:
        return self.pk, self.sk


@dataclass(frozen=True)
class Check:
    """In a transaction only: writes nothing; the transaction lands only if ``when``
    holds of the item at ``(pk, sk)``."""

    pk: str
    sk: str
    when: Condition

    @property
    def key(self) -> tuple[str, str]:
        return self.pk, self.sk


#: One step of a transaction.
Write = Put | Update | Delete | Check


class ConditionFailed(Exception):
    """A write's condition did not hold: nothing was written.

    ``stored`` is the item that refused it when the backend returned it (DynamoDB's
    ``ReturnValuesOnConditionCheckFailure``: not when the item was deleted since);
    ``None`` otherwise.
    """

    def __init__(self, stored: Item | None = None) -> None:
        super().__init__("the write's condition did not hold")
        self.stored = stored


def applied(write: Put | Update | Delete, stored: Item | None) -> Item | None:
    """The item at ``write``'s key after it lands over ``stored`` (``None``: none): the
    reference meaning of a write, shared by the memory and SQLite backends."""
    if isinstance(write, Put):
        return dict(write.item)
    if isinstance(write, Update):
        return {codec.A_PK: write.pk, codec.A_SK: write.sk, **(stored or {}), **write.attributes}
    return None


#: What a transaction or turn put whose condition failed answers.
BUSY = "another turn or decision on this conversation committed first"


class Backend(ABC):
    """The primitives over one table of items keyed ``(pk, sk)``."""

    #: Consumed capacity and round trips of every primitive call.
    meter: CapacityMeter

    # --- reads --------------------------------------------------------------------------

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

    # --- writes -------------------------------------------------------------------------

    @abstractmethod
    def _write(self, write: Put | Update | Delete) -> Item | None:
        """Apply ``write`` if its condition holds of the item stored at its key, atomically
        (a condition, not a read then a write).

        Returns:
            The item as updated, for an :class:`Update` with ``returning``; else ``None``.

        Raises:
            ConditionFailed: the condition did not hold; nothing was written.
        """

    @abstractmethod
    def _transact(self, writes: Sequence[Write]) -> None:
        """Apply every one of ``writes`` or none: each lands only if every condition holds
        of the items as they were before the transaction. At most one write per key.

        Raises:
            ConversationBusy: a condition failed or a concurrent transaction conflicted;
                nothing was written.
            PayloadTooLarge: an item exceeds the backend's item size limit.
        """

    @abstractmethod
    def _write_batch(self, writes: Sequence[Put | Delete]) -> None:
        """Apply each of ``writes``, unconditionally (their ``when`` is not set), not
        atomically as a group; deleting an absent item is fine."""

    # --- named writes (the protocols' common ones, where tests stage crashes and races) ---

    def _put_turn(self, item: Item, marker_version: int | None) -> None:
        """Put the turn item (or marker) ``item`` if its key is a free slot for its life
        (:class:`SlotFree` with ``marker_version``): one conditional write, the
        optimistic lock of a plain turn (docs/STORAGE.md).

        Raises:
            ConversationBusy: the slot is taken; nothing was written.
            PayloadTooLarge: the item exceeds the backend's item size limit.
        """
        codec.check_item_sizes([item])
        try:
            self._write(Put(item, SlotFree(str(item[codec.A_GEN]), marker_version)))
        except ConditionFailed as exc:
            raise ConversationBusy(BUSY) from exc

    def _replace_head(self, head: Item, expected: Item | None) -> bool:
        """Put ``head`` if the stored head is still ``expected`` (:func:`head_is`);
        returns whether it was written."""
        try:
            self._write(Put(head, head_is(expected)))
        except ConditionFailed:
            return False
        return True

    def _delete_head(self, pk: str, expected: Item) -> bool:
        """Delete the head if it is still ``expected`` (:func:`head_is`); returns whether
        it was deleted."""
        try:
            self._write(Delete(pk, keys.HEAD_SK, head_is(expected)))
        except ConditionFailed:
            return False
        return True

    def _fence_head(self, pk: str, token: str) -> Item | None:
        """Set the head's ``fx`` to ``token`` if it exists and has no ``fx`` (nothing else
        of it changes; no item is created).

        Returns:
            The head item as fenced, or ``None`` when there is no head or it is fenced already.
        """
        unfenced = Unchanged({codec.A_FENCE: None})
        try:
            return self._write(
                Update(pk, keys.HEAD_SK, {codec.A_FENCE: token}, unfenced, returning=True)
            )
        except ConditionFailed:
            return None

    def _put_items(self, items: list[Item]) -> None:
        """Put each of ``items`` unconditionally (not atomically as a group)."""
        self._write_batch([Put(item) for item in items])

    def _delete_items(self, pk: str, sort_keys: list[str]) -> None:
        """Delete the items of ``pk`` at ``sort_keys`` (absent ones are fine)."""
        self._write_batch([Delete(pk, sk) for sk in sort_keys])

    # --- reads over every page ----------------------------------------------------------

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
