"""The storage contract and all the logic every backend shares.

:class:`ConversationStore` owns encoding, validation, payload offloading,
context windowing, the commit protocol and the purge protocol. A backend
implements only the small private primitives at the bottom of the class, each
documented with what it must do and raise (the pattern of Powertools'
idempotency persistence layers). ``tests/contract`` runs one suite over every
backend.

The commit protocol (a turn lands whole or not at all)
    One atomic write: put each new event item (``attribute_not_exists(pk) OR
    g <> :gen``: never overwrite an event of this life) and put the head on
    the condition that its version and life (``ver``, ``g``) are still the
    ones the turn read (``attribute_not_exists`` for a new conversation). A
    lost race raises :class:`ConversationBusy` and nothing of it is stored.
    Offloaded payloads are written first under keys unique to the commit
    call, and deleted again when the backend refuses the write.

The purge protocol (clear, sweep, a turn on an expired conversation)
    1. Replace the head with a *tombstone* on the condition that the head is
       still the one that was read (absent, when there was none but leftovers
       remain): in-flight commits of the old life now fail, and readers see
       nothing. The tombstone names the next life (a new ``gen``) and keeps
       the storage sequence, so a turn that starts during the purge writes
       above every old event and can never be mixed with them.
    2. Delete every event item up to the tombstone's sequence, and every S3
       object of the conversation that is not the next life's.
    3. Delete the tombstone if it is unchanged (no new life began).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import secrets
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..exceptions import (
    ConversationBusy,
    CorruptedState,
    InternalError,
    StateError,
    TurnledgerError,
)
from ..models import ConversationKey, ConversationStatus, Event, Head
from . import codec, keys
from .blobs import BlobStore
from .codec import BlobRef, Item, StoredEvent

#: Payloads at or over this size go to S3. DynamoDB's item limit is 400 KB; a
#: 64 KiB threshold leaves wide margin for the item's other attributes and
#: keeps event reads cheap (a read unit covers 4 KiB).
DEFAULT_OFFLOAD_THRESHOLD = 64 * 1024

#: A transaction holds at most 100 items; one is the head.
MAX_EVENTS_PER_COMMIT = 99


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
class Snapshot:
    """What a turn reads: the head (``None`` when absent) and the newest whole turns."""

    head: Head | None
    #: Oldest first; whole turns, the newest that fit the context budget.
    events: list[Event]
    #: True when ``events`` start at the conversation's first event.
    from_start: bool


@dataclass(frozen=True)
class ContextBudget:
    """How much history a turn reads: whole turns, newest first, within both limits.

    The current (newest) turn is always read whole, whatever its size.
    """

    max_events: int = 400
    max_chars: int = 400_000


@dataclass
class PurgeReport:
    """What a purge removed."""

    conversations: int = 0
    events: int = 0
    objects: int = 0

    def __iadd__(self, other: PurgeReport) -> PurgeReport:
        self.conversations += other.conversations
        self.events += other.events
        self.objects += other.objects
        return self


@dataclass(frozen=True)
class Page:
    """One page of a backend query."""

    items: list[Item]
    #: Opaque resume point; ``None`` when the query is exhausted.
    cursor: Any = None


def new_generation() -> str:
    """A fresh name for one life of a conversation."""
    return secrets.token_hex(6)


def _storage_sequence(item: Item) -> int:
    sort_key = str(item.get(codec.A_SK, ""))
    try:
        return keys.sequence_of(sort_key)
    except ValueError as exc:
        raise CorruptedState(
            "an item of the transcript has no event key",
            details={"item": sort_key, "reason": str(exc)},
        ) from exc


def _gaps(first: int, last: int) -> CorruptedState:
    return CorruptedState(
        "the transcript has gaps",
        details={"item": "events", "reason": f"expected sequences {first}..{last}"},
    )


@dataclass
class _Window:
    """Whole turns read newest first, within a budget; the newest turn is taken whatever its size.

    An event weighs the characters of its item plus the size of its offloaded
    payload: a large message counts as large wherever it is stored.
    """

    budget: ContextBudget
    #: Taken events (storage sequence, body), newest first, forming whole turns.
    taken: list[tuple[int, StoredEvent]] = field(default_factory=list)
    chars: int = 0
    #: The turn being read, newest first; whole only once an older event (or the start) is seen.
    turn: list[tuple[int, StoredEvent]] = field(default_factory=list)
    turn_chars: int = 0

    def offer(self, item: Item, sequence: int, stored: StoredEvent) -> bool:
        """Add the next older event; ``False`` once nothing older can be taken."""
        if self.turn and stored.turn != self.turn[-1][1].turn and not self.close():
            return False
        self.turn.append((sequence, stored))
        self.turn_chars += len(item.get(codec.A_BODY, "")) + (stored.ref.size if stored.ref else 0)
        # An older turn already over budget can never fit: stop reading there.
        return not self.taken or self._fits()

    def close(self) -> bool:
        """End the turn being read and take it if it fits (the newest turn always does)."""
        if self.taken and not self._fits():
            return False
        self.taken.extend(self.turn)
        self.chars += self.turn_chars
        self.turn = []
        self.turn_chars = 0
        return True

    def _fits(self) -> bool:
        return (
            len(self.taken) + len(self.turn) <= self.budget.max_events
            and self.chars + self.turn_chars <= self.budget.max_chars
        )


class ConversationStore(ABC):
    """Conversation heads and events, with large payloads offloaded to a :class:`BlobStore`."""

    def __init__(
        self,
        blobs: BlobStore,
        *,
        offload_threshold: int = DEFAULT_OFFLOAD_THRESHOLD,
        meter: CapacityMeter | None = None,
    ) -> None:
        self.blobs = blobs
        self.offload_threshold = offload_threshold
        self.meter = meter or CapacityMeter()

    # --- reads --------------------------------------------------------------------------

    def get_head(self, key: ConversationKey) -> Head | None:
        """The stored head, whatever its state (``None`` when absent).

        Raises:
            CorruptedState, UnsupportedStateVersion: the head cannot be read.
        """
        item = self._get_item(keys.partition_key(key), keys.HEAD_SK)
        return None if item is None else codec.decode_head(item)

    def load(self, key: ConversationKey, budget: ContextBudget) -> Snapshot:
        """The head and the newest whole turns within ``budget``, in one query when it fits.

        Turns are taken whole, newest first, while both limits hold; the newest
        (current) turn is always taken whole, whatever its size, because pending
        tool calls and their results live in it. A cleared head comes back with
        no events.

        Raises:
            CorruptedState, UnsupportedStateVersion: an item read cannot be used.
        """
        pk = keys.partition_key(key)
        # The head, the budget, and one event more to see where the oldest turn begins:
        # a context that fits its event budget is read in one round trip (DynamoDB
        # still ends a page at 1 MB; the loop below reads on from there).
        page_size = budget.max_events + 2
        page = self._query(
            pk, upper=keys.HEAD_SK, lower=None, descending=True, limit=page_size, cursor=None
        )
        if not page.items or page.items[0][codec.A_SK] != keys.HEAD_SK:
            return Snapshot(head=None, events=[], from_start=True)
        head = codec.decode_head(page.items[0])
        if head.status is ConversationStatus.CLEARED:
            return Snapshot(head=head, events=[], from_start=True)
        window = _Window(budget)
        expected = head.seq  # the next (older) storage sequence the log must hold
        items = page.items[1:]
        while True:
            stopped = reached_start = False
            for item in items:
                sequence = _storage_sequence(item)
                if sequence > head.seq:
                    continue  # a leftover of an earlier life, above this one's log
                if sequence <= head.base:
                    reached_start = True
                    break
                if sequence != expected:
                    raise _gaps(head.base + 1, head.seq)
                expected -= 1
                _, stored = codec.decode_stored_event(item, head)
                if not window.offer(item, sequence, stored):
                    stopped = True
                    break
            if stopped or reached_start or page.cursor is None:
                break
            page = self._query(
                pk,
                upper=keys.HEAD_SK,
                lower=None,
                descending=True,
                limit=page_size,
                cursor=page.cursor,
            )
            items = page.items
        from_start = False
        if not stopped:
            if expected != head.base:
                raise _gaps(head.base + 1, head.seq)
            from_start = window.close()
        events = [self._event(key, head, seq, stored) for seq, stored in reversed(window.taken)]
        return Snapshot(head=head, events=events, from_start=from_start)

    def read_events(
        self, key: ConversationKey, head: Head, *, after: int, limit: int
    ) -> list[Event]:
        """Up to ``limit`` events of ``head``'s life with public sequence > ``after``.

        Pages through the backend as long as needed: never stops at a page boundary.

        Raises:
            CorruptedState, UnsupportedStateVersion: an event cannot be read.
        """
        lower = head.base + after + 1
        upper = min(head.seq, head.base + after + limit)
        if upper < lower:
            return []
        pk = keys.partition_key(key)
        events: list[Event] = []
        cursor: Any = None
        while True:
            page = self._query(
                pk,
                lower=keys.event_sort_key(lower),
                upper=keys.event_sort_key(upper),
                descending=False,
                limit=min(upper - lower + 1, 1000),
                cursor=cursor,
            )
            for item in page.items:
                sequence, stored = codec.decode_stored_event(item, head)
                events.append(self._event(key, head, sequence, stored))
            if page.cursor is None:
                break
            cursor = page.cursor
        expected = list(range(lower - head.base, upper - head.base + 1))
        if [e.sequence for e in events] != expected:
            raise _gaps(lower, upper)
        return events

    def _event(self, key: ConversationKey, head: Head, sequence: int, stored: StoredEvent) -> Event:
        if stored.ref is not None:
            payload = self._fetch(stored.ref)
        else:
            assert stored.payload is not None  # decode_stored_event checked: one of the two
            payload = stored.payload
        return codec.build_event(key, head, sequence, stored, payload)

    def _fetch(self, ref: BlobRef) -> dict[str, Any]:
        data = self.blobs.get(ref.key)
        if hashlib.sha256(data).hexdigest() != ref.sha256 or len(data) != ref.size:
            raise CorruptedState(
                "an offloaded payload does not match its hash",
                details={"item": ref.key, "reason": "sha256 mismatch"},
            )
        try:
            payload = json.loads(data)
        except ValueError as exc:
            raise CorruptedState(
                "an offloaded payload is not JSON", details={"item": ref.key, "reason": str(exc)}
            ) from exc
        if not isinstance(payload, dict):
            raise CorruptedState("an offloaded payload is not an object", details={"item": ref.key})
        return payload

    # --- writes -------------------------------------------------------------------------

    def commit(
        self,
        key: ConversationKey,
        *,
        expected_version: int | None,
        head: Head,
        events: Sequence[Event],
    ) -> int:
        """Append ``events`` and replace the head, atomically.

        Args:
            expected_version: the head version the caller read (``None``: no head).
            head: the new head; its ``version`` must be ``expected_version + 1``
                and its ``seq`` must cover ``events``.
            events: new events with consecutive public sequences after the old head.

        Returns:
            The bytes written: the items' attribute names and values, and offloaded objects.

        Raises:
            ConversationBusy: the head changed since it was read (another version, or
                another life of the conversation); nothing was stored.
            PayloadTooLarge: an item, or the whole write, would exceed what the backend
                can hold; nothing was stored.
            InternalError: the commit breaks its own rules (more than
                ``MAX_EVENTS_PER_COMMIT`` events, ``head.seq`` not covering them).
        """
        if len(events) > MAX_EVENTS_PER_COMMIT:
            raise InternalError(f"a commit holds at most {MAX_EVENTS_PER_COMMIT} events")
        if events and head.base + events[-1].sequence != head.seq:
            raise InternalError("head.seq does not cover the committed events")
        attempt = secrets.token_hex(4)
        written: list[str] = []
        offloaded = 0
        try:
            items = []
            for event in events:
                payload = codec.stored_payload(event)
                ref = self._offload(key, head, event.sequence, payload, attempt)
                if ref is not None:
                    written.append(ref.key)
                    offloaded += ref.size
                items.append(codec.encode_event(key, head, event, ref, payload=payload))
        except BaseException:
            self._discard(written)
            raise
        head_item = codec.encode_head(key, head)
        try:
            self._transact_commit(head_item, expected_version, items, head.gen)
        except TurnledgerError:
            # The backend answered "no": nothing of the turn is stored, so its objects go too.
            self._discard(written)
            raise
        # Any other failure (a timeout, a dropped connection) leaves the outcome unknown:
        # the objects stay, since deleting them could break a turn that did land. If it
        # did not, they are leftovers under the conversation's prefix that clear and sweep
        # remove.
        return sum(codec.item_size(item) for item in [*items, head_item]) + offloaded

    def _offload(
        self,
        key: ConversationKey,
        head: Head,
        sequence: int,
        payload: dict[str, Any],
        attempt: str,
    ) -> BlobRef | None:
        data = codec.payload_bytes(payload)
        if len(data) < self.offload_threshold:
            return None
        digest = hashlib.sha256(data).hexdigest()
        blob = keys.blob_key(key, head.gen, head.base + sequence, digest, attempt=attempt)
        self.blobs.put(blob, data)
        return BlobRef(key=blob, sha256=digest, size=len(data))

    def _discard(self, written: list[str]) -> None:
        # Best effort: the commit's own error is what the caller must see, and an object
        # left behind is removed with the conversation's prefix later.
        if written:
            with contextlib.suppress(Exception):
                self.blobs.delete_keys(written)

    def clear(self, key: ConversationKey, now: datetime, *, attempts: int = 5) -> PurgeReport:
        """Delete the conversation, its events and its objects; absent is fine.

        Works on corrupted and unknown-version heads too: that is how they recover.
        Also removes what a head left behind when DynamoDB's TTL deleted it.

        Returns:
            What was removed (all zeros for an absent conversation).

        Raises:
            ConversationBusy: turns kept committing through every attempt.
        """
        pk = keys.partition_key(key)
        for _ in range(attempts):
            item = self._get_item(pk, keys.HEAD_SK)
            report = self._purge(key, item, now)
            if report is not None:
                return report
        raise ConversationBusy("the conversation kept changing while it was being cleared")

    def purge_if_unchanged(
        self, key: ConversationKey, head: Head, now: datetime
    ) -> PurgeReport | None:
        """Purge the conversation if its head is still ``head`` (same version and life).

        Returns ``None`` (and deletes nothing) when a commit got there first:
        the sweep uses this so a conversation that just got a turn survives.
        """
        return self._purge(key, codec.encode_head(key, head), now)

    def refile(self, key: ConversationKey, head: Head) -> bool:
        """File a live head under the expiry bucket of its current ``expires_at``.

        The sweep calls this for a head it finds in a bucket that has come due
        while the conversation was still in use. Conditional on the head being
        unchanged; the version stays (this is index upkeep, not a new state), and a
        turn that read the old bucket re-files the head itself.

        Returns:
            Whether the head was re-filed (``False``: it changed meanwhile).
        """
        if head.expires_at is None:
            return False
        moved = head.model_copy(update={"expiry_bucket": keys.bucket_of(head.expires_at)})
        return self._replace_head(codec.encode_head(key, moved), codec.encode_head(key, head))

    def _purge(self, key: ConversationKey, item: Item | None, now: datetime) -> PurgeReport | None:
        """Purge the conversation whose head is ``item`` as read (``None``: no head).

        Returns ``None`` when the head is no longer ``item``.
        """
        pk = keys.partition_key(key)
        report = PurgeReport()
        old: Head | None = None
        if item is not None:
            try:
                old = codec.decode_head(item)
            except StateError:
                old = None  # damaged or from a newer build: replaced all the same
            if old is not None and old.status is ConversationStatus.CLEARED:
                return self._finish_purge(key, old, report)  # a purge that did not finish
        top = max(old.seq if old else 0, self._highest_event_sequence(pk))
        if item is None and top == 0 and not self._has_objects(key):
            return report  # nothing at all: no tombstone to write
        # With no head, the tombstone still goes first (on the condition that there is
        # none): a turn creating the conversation meanwhile is never half deleted.
        raw_version = item.get(codec.A_VERSION) if item is not None else None
        version = raw_version if type(raw_version) is int and raw_version > 0 else 0
        tomb = Head(
            gen=new_generation(),
            version=version + 1,
            base=top,
            seq=top,
            turn=0,
            status=ConversationStatus.CLEARED,
            created_at=now,
            updated_at=now,
            ttl_seconds=0,
            # Due at once: if this purge dies before it ends, DynamoDB's TTL removes the
            # tombstone and the stream of that deletion reclaims what is left.
            expires_at=int(now.timestamp()),
        )
        if not self._replace_head(codec.encode_head(key, tomb), item):
            return None
        report.conversations = 0 if item is None else 1
        return self._finish_purge(key, tomb, report)

    def _finish_purge(self, key: ConversationKey, tomb: Head, report: PurgeReport) -> PurgeReport:
        pk = keys.partition_key(key)
        report.events = self._delete_events(pk, tomb.base)
        self._delete_records(pk)
        report.objects = self._delete_objects(key, keep_gen=tomb.gen)
        self._delete_head(pk, codec.encode_head(key, tomb))
        return report

    def _has_objects(self, key: ConversationKey) -> bool:
        return next(iter(self.blobs.list_keys(keys.blob_prefix(key))), None) is not None

    def _highest_event_sequence(self, pk: str) -> int:
        page = self._query(
            pk,
            lower=None,
            upper=keys.event_sort_key(10**12 - 1),
            descending=True,
            limit=1,
            cursor=None,
        )
        return _storage_sequence(page.items[0]) if page.items else 0

    def _delete_events(self, pk: str, upper: int) -> int:
        count = 0
        cursor: Any = None
        while True:
            page = self._query(
                pk,
                lower=keys.event_sort_key(0),
                upper=keys.event_sort_key(upper),
                descending=False,
                limit=1000,
                cursor=cursor,
                keys_only=True,
            )
            sort_keys = [item[codec.A_SK] for item in page.items]
            if sort_keys:
                self._delete_items(pk, sort_keys)
                count += len(sort_keys)
            if page.cursor is None:
                return count
            cursor = page.cursor

    def _delete_records(self, pk: str) -> None:
        """Delete the partition's idempotency records (``I#...``): a request retried after a
        clear runs anew instead of answering from the erased conversation."""
        cursor: Any = None
        while True:
            page = self._query(
                pk,
                lower=keys.RECORD_PREFIX,
                # "$" follows "#": the bound is above every "I#..." key.
                upper=keys.RECORD_PREFIX[:-1] + "$",
                descending=False,
                limit=1000,
                cursor=cursor,
                keys_only=True,
            )
            sort_keys = [item[codec.A_SK] for item in page.items]
            if sort_keys:
                self._delete_items(pk, sort_keys)
            if page.cursor is None:
                return
            cursor = page.cursor

    def _delete_objects(self, key: ConversationKey, *, keep_gen: str | None) -> int:
        prefix = keys.blob_prefix(key)
        keep = keys.blob_prefix(key, keep_gen) if keep_gen else None
        doomed: Iterator[str] = (
            k for k in self.blobs.list_keys(prefix) if keep is None or not k.startswith(keep)
        )
        return self.blobs.delete_keys(doomed)

    # --- backend primitives -------------------------------------------------------------

    @abstractmethod
    def _get_item(self, pk: str, sk: str) -> Item | None:
        """The item at ``(pk, sk)``, read consistently, or ``None``."""

    @abstractmethod
    def _query(
        self,
        pk: str,
        *,
        lower: str | None,
        upper: str,
        descending: bool,
        limit: int,
        cursor: Any,
        keys_only: bool = False,
    ) -> Page:
        """One page of items of ``pk`` with ``lower <= sk <= upper``, read consistently.

        ``lower=None`` means no lower bound. At most ``limit`` items; ``cursor``
        resumes a previous page. With ``keys_only`` only ``pk``/``sk`` are needed.
        """

    @abstractmethod
    def _transact_commit(
        self, head: Item, expected_version: int | None, events: list[Item], gen: str
    ) -> None:
        """Atomically put ``events`` and ``head``.

        Conditions: the stored head's ``ver`` equals ``expected_version`` and its
        ``g`` equals ``gen`` (or no head exists when ``expected_version`` is
        ``None``); no event item of life ``gen`` exists at any of the events' keys.

        Raises:
            ConversationBusy: a condition failed or a concurrent transaction conflicted.
            PayloadTooLarge: an item exceeds the backend's item size limit.
        """

    @abstractmethod
    def _replace_head(self, head: Item, expected: Item | None) -> bool:
        """Put ``head`` if the stored head is still ``expected``; returns whether it was written.

        "Still" compares the ``ver`` and ``g`` attributes (each present with the
        same value, or absent in both): any commit changes ``ver``, and ``g``
        tells lives apart. ``expected=None`` requires that no head exists.
        """

    @abstractmethod
    def _delete_head(self, pk: str, expected: Item) -> bool:
        """Delete the head if it is still ``expected`` (as in :meth:`_replace_head`).

        Returns whether it was deleted.
        """

    @abstractmethod
    def _delete_items(self, pk: str, sort_keys: list[str]) -> None:
        """Delete the items of ``pk`` at ``sort_keys`` (absent ones are fine)."""
