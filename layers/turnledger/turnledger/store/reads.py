"""Reads of the transcript: a turn's snapshot, a range of events, one event.

A load reads the head and the newest events in one consistent query
(:func:`.views.first_page`), then, when the context needs more, the rest of the range
eventually consistent (docs/STORAGE.md, "Reads"). A fork's inherited events are read
from each ancestor's partition (its *pieces*: :func:`pieces`). Items of another life
than the one read (*leftovers*) are skipped; a missing event is a gap
(:class:`~turnledger.core.exceptions.CorruptedState`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..core.exceptions import CorruptedState
from ..core.models import ConversationKey, ConversationStatus, Event, Head
from . import codec, keys, views
from .codec import BlobRef, Item, StoredEvent
from .runs import RunFlag, decode_flag
from .views import Context, storage_sequence

if TYPE_CHECKING:
    from .base import ConversationStore


@dataclass(frozen=True)
class Snapshot:
    """What a turn reads: the head (``None`` when absent) and the newest whole turns."""

    head: Head | None
    #: Oldest first; whole turns, the newest that fit the context budget.
    events: list[Event]
    #: True when ``events`` start at the conversation's first event.
    from_start: bool
    #: The run flag read with the head (:func:`.runs.put_run_flag`), ``None``
    #: when there is none; says something only when :attr:`run_read`. Not part of what
    #: the snapshot compares equal by (the transcript's state).
    run: RunFlag | None = field(default=None, compare=False)
    #: Whether the load read the run flag (a store that does not says nothing of runs).
    run_read: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class ContextBudget:
    """A safety cap on the history one turn reads: whole turns, newest first, within
    both limits. The token budget of :mod:`turnledger.context.assembly` decides what is sent;
    this only bounds a read when compaction could not keep the log short.

    The current (newest) turn is always read whole, whatever its size.
    """

    max_events: int = 400
    max_chars: int = 400_000


def events_in(item: Item) -> int:
    """The events an event item holds, for reports: 1 when its count cannot be read (a purge
    deletes damaged items too)."""
    try:
        return codec.event_count(item)
    except CorruptedState:
        return 1


def leftover(item: Item, piece: Piece) -> bool:
    """Whether the event ``item`` is a leftover of another life than ``piece``'s.

    A life that began with no head (DynamoDB's TTL removed it, the stream's reclaim has not
    run yet) writes over an earlier life's items: a turn item of several events replaces
    only the item at its first key, so the others stay until the reclaim deletes them.
    """
    return item.get(codec.A_GEN) != piece.gen and codec.A_GEN in item


def _contiguous(items: Sequence[Item], top: int) -> bool:
    """Whether event ``items`` (newest first) hold every storage sequence from ``top`` down
    to their oldest: a query that missed the newest writes (eventually consistent) has a hole.
    """
    if not items:
        return False
    expected = top
    for item in items:
        if codec.last_sequence(item) != expected:
            return False
        expected = storage_sequence(item) - 1
    return True


def gaps(first: int, last: int) -> CorruptedState:
    return CorruptedState(
        "the transcript has gaps",
        details={"item": "events", "reason": f"expected sequences {first}..{last}"},
    )


@dataclass(frozen=True)
class Piece:
    """Public sequences ``first..last`` of a log, stored in ``key``'s partition by its life
    ``gen`` (storage sequence = ``base`` + public sequence)."""

    key: ConversationKey
    gen: str
    base: int
    first: int
    last: int


#: An event's piece and storage sequence.
Placed = tuple[Piece, int]


def pieces(key: ConversationKey, head: Head) -> list[Piece]:
    """Where ``head``'s log is, oldest first: a fork's inherited segments, then its own."""
    pieces: list[Piece] = []
    first = 1
    if head.fork is not None:
        for segment in head.fork.segments:
            if segment.through >= first:
                where = ConversationKey(tenant=key.tenant, conversation_id=segment.conversation_id)
                pieces.append(Piece(where, segment.gen, segment.base, first, segment.through))
            first = segment.through + 1
    if head.event_count >= first:
        pieces.append(Piece(key, head.gen, head.base, first, head.event_count))
    return pieces


@dataclass(frozen=True)
class _FirstPage:
    """The events a load's first query read with the head (newest first), and whether
    the query had more."""

    items: Sequence[Item]
    more: bool


@dataclass
class _Window:
    """Whole turns read newest first, within a budget; the newest turn is taken whatever its size.

    An event weighs the characters of its item plus the size of its offloaded
    payload: a large message counts as large wherever it is stored.
    """

    budget: ContextBudget
    #: Taken events (where, body), newest first, forming whole turns.
    taken: list[tuple[Placed, StoredEvent]] = field(default_factory=list)
    chars: int = 0
    #: The turn being read, newest first; whole only once an older event (or the start) is seen.
    turn: list[tuple[Placed, StoredEvent]] = field(default_factory=list)
    turn_chars: int = 0

    def offer(self, chars: int, where: Placed, stored: StoredEvent) -> bool:
        """Add the next older event, whose stored body has ``chars`` characters; ``False``
        once nothing older can be taken."""
        if self.turn and stored.turn != self.turn[-1][1].turn and not self.close():
            return False
        self.turn.append((where, stored))
        self.turn_chars += chars + (stored.ref.size if stored.ref else 0)
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


def get_head(
    store: ConversationStore, key: ConversationKey, *, content: bool = True
) -> Head | None:
    """The stored head, whatever its state (``None`` when absent).

    Args:
        content: ``False``: the content of the head state is not opened but left out
            (pending calls' arguments ``{}``: :func:`.codec.without_content`), for
            readers that use none (the sweep); never to show or write it.

    Raises:
        CorruptedState, UnsupportedStateVersion: the head cannot be read.
        ContentUnreadable: ``content``, and its content does not open (its key was
            destroyed by an erasure: an item restored from a backup).
    """
    return views.read_view(store, keys.partition_key(key), content=content)[0]


def load(store: ConversationStore, key: ConversationKey, budget: ContextBudget) -> Snapshot:
    """The head and what the next context needs: the events after the newest summary.

    A head with a summary (:attr:`Head.summary`) needs only the events after
    the range that summary covers (the summary's own event is among them);
    without one, the whole log. Either way the read is capped by ``budget``
    (whole turns, newest first; the newest turn is always taken whole,
    whatever its size, because pending tool calls and their results live in
    it). A cleared head comes back with no events.

    One round trip reads the head and the newest :data:`FIRST_PAGE` - 1
    events; when the head says more are needed, one more query reads exactly
    the rest of the range, eventually consistent (a query is priced by what
    it reads, so a large first page would pay for events below the summary,
    at the consistent price). A fork's inherited events are read the same way from
    each ancestor's partition the read reaches: one more query per ancestor.

    Raises:
        CorruptedState, UnsupportedStateVersion: an item read cannot be used.
    """
    pk = keys.partition_key(key)
    page, flag = views.first_page(store, pk)
    run = decode_flag(flag)
    head = views.effective(store, pk, page.items)
    view = store.views.recalled(pk)
    if head is None or head.status is ConversationStatus.CLEARED or (view and view.crowded):
        store.views.keep_context(pk, None)
    if head is None:
        return Snapshot(head=None, events=[], from_start=True, run=run, run_read=True)
    if head.status is ConversationStatus.CLEARED:
        return Snapshot(head=head, events=[], from_start=True, run=run, run_read=True)
    floor = head.summary.through if head.summary is not None else 0
    window = _Window(budget)
    complete = True
    # The own life's items this read went through, newest first: kept for the next load.
    seen: list[Item] = []
    for piece in reversed(pieces(key, head)):
        low = max(piece.first, floor + 1)
        if low > piece.last:
            break
        own = piece.gen == head.gen and piece.key == key
        first = _FirstPage(page.items[1:], page.cursor is not None) if own else None
        if not _read_back(store, piece, low, first, budget, window, seen if own else None):
            complete = False
            break
    if seen and not (view and view.crowded):
        store.views.keep_context(pk, Context(head.gen, tuple(seen)))
    from_start = complete and window.close() and floor == 0
    events = [_event(store, piece, seq, stored) for (piece, seq), stored in reversed(window.taken)]
    return Snapshot(head=head, events=events, from_start=from_start, run=run, run_read=True)


def _read_back(
    store: ConversationStore,
    piece: Piece,
    low: int,
    first: _FirstPage | None,
    budget: ContextBudget,
    window: _Window,
    seen: list[Item] | None = None,
) -> bool:
    """Offer ``piece``'s events from its newest down to public sequence ``low`` to
    ``window``, newest first; ``False`` once the window takes nothing older.

    ``first``: items already read (the load's first page, newest first), used before
    any query of this piece. ``seen``: gets the items of this life gone through, newest
    first (consecutive: the context an environment keeps).
    """
    expected = piece.last  # the next (older) public sequence the log must hold
    items: Sequence[Item] = first.items if first is not None else ()
    more = first.more if first is not None else True
    if first is None:
        items = _older_events(store, piece, low, expected, budget, window)
    while True:
        reached_low = False
        for item in items:
            if leftover(item, piece):
                continue  # a leftover of an earlier life (a gap, if it hides an event)
            if seen is not None and (
                not seen or storage_sequence(seen[-1]) > (storage_sequence(item))
            ):
                seen.append(item)
            if storage_sequence(item) > piece.base + piece.last:
                continue  # a marker above the log: no event
            if codec.last_sequence(item) < piece.base + low:
                reached_low = True
                break
            # A turn item holds a commit's events: newest first, down to ``low``.
            for sequence, stored, chars in reversed(
                codec.decode_turn_item(store.sealer.open(item), piece.gen)
            ):
                if sequence < piece.base + low:
                    reached_low = True
                    break
                if sequence != piece.base + expected:
                    raise gaps(piece.base + low, piece.base + piece.last)
                expected -= 1
                if not window.offer(chars, (piece, sequence), stored):
                    return False
            if reached_low:
                break
        if reached_low or not more or expected < low:
            break
        items = _older_events(store, piece, low, expected, budget, window)
        more = bool(items)
    if expected != low - 1:
        raise gaps(piece.base + low, piece.base + piece.last)
    return True


def _older_events(
    store: ConversationStore,
    piece: Piece,
    low: int,
    newest: int,
    budget: ContextBudget,
    window: _Window,
) -> list[Item]:
    """``piece``'s events at public sequences ``newest`` down to ``low``, as many as
    ``budget`` may still take, newest first.

    Events are never rewritten once the head that covers them is read, so an
    eventually consistent read (half the price) is safe; only one that missed
    the newest moments' writes (a hole in the range) is read again consistently.
    """
    wanted = max(min(newest - low + 1, budget.max_events - len(window.taken) + 2), 1)
    # Bounded by ``low`` and by the item count: a turn item holds one or more events.
    lower = keys.event_sort_key(piece.base + low)
    upper = keys.event_sort_key(piece.base + newest)
    top = piece.base + newest
    for consistent in (False, True):
        page = store._query(
            keys.partition_key(piece.key),
            upper=upper,
            lower=lower,
            descending=True,
            limit=wanted,
            cursor=None,
            consistent=consistent,
        )
        items = page.items
        bottom = storage_sequence(items[-1]) if items else top + 1
        if page.cursor is None and bottom > piece.base + low:
            # A turn item holds several events: the one holding the range's low end
            # may start below the range's key. One more item, at or below it.
            items = [*items, *_item_below(store, piece, bottom)]
        if _contiguous([item for item in items if not leftover(item, piece)], top):
            break
    return items


def _item_below(store: ConversationStore, piece: Piece, sequence: int) -> list[Item]:
    """The event item of ``piece``'s life just below the storage ``sequence`` (none or
    one), past leftovers of other lives."""
    while True:
        page = store._query(
            keys.partition_key(piece.key),
            upper=keys.event_sort_key(sequence - 1),
            lower=keys.event_sort_key(0),
            descending=True,
            limit=1,
            cursor=None,
        )
        if not page.items or not leftover(page.items[0], piece):
            return page.items
        sequence = storage_sequence(page.items[0])


def read_events(
    store: ConversationStore, key: ConversationKey, head: Head, *, after: int, limit: int
) -> list[Event]:
    """Up to ``limit`` events of ``head``'s life with public sequence > ``after``:
    a fork's inherited events (each as written in its ancestor) before its own.

    Pages through the backend as long as needed: never stops at a page boundary.

    Raises:
        CorruptedState, UnsupportedStateVersion: an event cannot be read.
    """
    lower = after + 1
    upper = min(head.event_count, after + limit)
    events: list[Event] = []
    for piece in pieces(key, head):
        first, last = max(lower, piece.first), min(upper, piece.last)
        if first > last:
            continue
        cursor: Any = None
        low, high = piece.base + first, piece.base + last
        while True:
            page = store._query(
                keys.partition_key(piece.key),
                lower=keys.event_sort_key(low),
                upper=keys.event_sort_key(high),
                descending=False,
                limit=min(last - first + 1, 1000),
                cursor=cursor,
            )
            items = page.items
            if cursor is None and (not items or storage_sequence(items[0]) > low):
                # The turn item holding ``low`` may start below it.
                items = [*_item_below(store, piece, low + 1), *items]
            for item in items:
                if leftover(item, piece):
                    continue  # an earlier life's (a gap, if it hides an event)
                for sequence, stored, _ in codec.decode_turn_item(
                    store.sealer.open(item), piece.gen
                ):
                    if low <= sequence <= high:
                        events.append(_event(store, piece, sequence, stored))
            if page.cursor is None:
                break
            cursor = page.cursor
    expected = list(range(lower, upper + 1))
    if [e.sequence for e in events] != expected:
        raise gaps(head.base + lower, head.base + upper)
    return events


def _event(store: ConversationStore, piece: Piece, sequence: int, stored: StoredEvent) -> Event:
    if stored.ref is not None:
        payload = _fetch(store, stored.ref)
    else:
        assert stored.payload is not None  # decode_stored_event checked: one of the two
        payload = stored.payload
    return codec.build_event(piece.key.conversation_id, piece.base, sequence, stored, payload)


def _fetch(store: ConversationStore, ref: BlobRef) -> dict[str, Any]:
    data = store.blobs.get(ref.key)
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


def stored_at(
    store: ConversationStore, key: ConversationKey, head: Head, sequence: int
) -> StoredEvent:
    """The stored body of the event at public ``sequence`` of ``head``'s log, wherever
    it is (a fork's ancestor included); its payload may be an offloaded reference.
    One point read.

    Raises:
        CorruptedState: there is no such event, or it cannot be read.
    """
    return _stored_at(store, key, head, sequence)[1]


def event_at(store: ConversationStore, key: ConversationKey, head: Head, sequence: int) -> Event:
    """The event at public ``sequence`` of ``head``'s log, payload included.

    Raises:
        CorruptedState: there is no such event, or it cannot be read.
    """
    piece, stored = _stored_at(store, key, head, sequence)
    return _event(store, piece, piece.base + sequence, stored)


def _stored_at(
    store: ConversationStore, key: ConversationKey, head: Head, sequence: int
) -> tuple[Piece, StoredEvent]:
    piece = next((p for p in pieces(key, head) if p.first <= sequence <= p.last), None)
    if piece is None:
        raise gaps(head.base + sequence, head.base + sequence)
    wanted = piece.base + sequence
    # The item holding it: the event item whose key is at or just below its sequence.
    for item in _item_below(store, piece, wanted + 1):
        for found, stored, _ in codec.decode_turn_item(store.sealer.open(item), piece.gen):
            if found == wanted:
                return piece, stored
    raise gaps(wanted, wanted)
