"""The storage contract and all the logic every backend shares.

:class:`ConversationStore` owns encoding, validation, payload offloading,
context windowing, the commit protocol, the purge protocol, the index and
sweep-cursor operations the sweep and tenant erasure use, the approval inbox's
pages, all-or-nothing imports, and two kinds of items beside the transcript that
the layers above give meaning to: side items (drafts) and idempotency records. It
knows no turn rules: the head, its status and the inbox changes come from the caller.
A backend implements only the small private primitives under "backend primitives",
each documented with what it must do and raise (the pattern of Powertools'
idempotency persistence layers). ``tests/contract`` runs one suite over every backend
(memory, DynamoDB on moto and on DynamoDB Local, SQLite).

The commit protocol (a turn lands whole or not at all)
    One atomic write: put the commit's turn item (every event of the commit in one
    item under the storage sequence of its first, docs/STORAGE.md; more than one only
    when they would not fit one) on ``attribute_not_exists(pk) OR g <> :gen`` (never
    overwrite an event of this life), and put the head on
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
       the storage sequence's high-water mark, so a turn that starts during
       the purge writes above every old event and can never be mixed with them.
    2. Delete every item of the conversation's partition except the head and
       what the next life may have written: event items up to the tombstone's
       sequence, and items of any other kind (idempotency records under
       ``I#``...) unless they carry the next life's ``g``; then every object of
       the conversation that is not the next life's.
    3. Delete the tombstone if it is unchanged (no new life began).

Clear wins: the fence
    The sweep purges only the head it judged expired, so a turn that lands
    first makes it give up, as it should. A clear (``DELETE``, erasure) must
    win instead, in bounded time, however many turns keep committing; retrying
    step 1 cannot promise that, since each retry reads a head the next commit
    replaces. So a clear first *fences* the head: one write, conditional only on
    the head existing with no fence yet, that sets ``fx`` to a token of this
    clear and returns the head as fenced. Every conditional head write compares
    ``fx`` together with ``ver`` and ``g`` (each equal, or absent in both) and
    only a clear ever writes ``fx``, so from the fence on:

    * no commit can land: a commit expects a head without ``fx`` (or no head,
      and there is one), so it raises ConversationBusy and stores nothing;
    * the storage sequence's high-water mark is final (only commits write
      events): the tombstone's base, computed after the fence, covers every
      old event, and step 1's guarantee holds as without a fence;
    * the sweep's conditional purge and re-filing fail too (they expect no
      fence) and leave the conversation to the clear.

    Step 1 is then conditional on the fenced head, token included: it fails
    only when another clear replaced it. A clear that finds a fence already
    there *adopts* it (writes none of its own, so two clears never undo each
    other's fences) and races its owner to step 1: the first tombstone wins,
    and the other clear reads it and finishes that purge. A clear that finds
    an unfenced tombstone finishes that purge; a fenced tombstone (fenced by a
    clear that read the live head just before a purge replaced it) is replaced
    like any fenced head. Every round of a clear thus either writes its
    tombstone or moves to a state from which the next round ends (another
    clear's tombstone, a head that appeared over leftovers, a head that
    vanished): turns alone can never make it fail. A clear that dies between
    its fence and its tombstone leaves a fenced head on which turns answer
    busy until the next clear adopts the fence and finishes (the sweep clears
    such a head once it has expired).

    Leftovers of an old life are never read as the new one: a new life starts
    only on a tombstone (above its base) or on no head (conditionally, so a
    tombstone written meanwhile makes it fail), reads check ``g`` on every
    item, and the items of its range are all written by its own commits.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import secrets
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from ..core.exceptions import (
    ContentUnreadable,
    ConversationBusy,
    ConversationExists,
    CorruptedState,
    InternalError,
    InvalidRequest,
    StateError,
    TurnledgerError,
)
from ..core.models import MAX_FORK_DEPTH, ConversationKey, ConversationStatus, Event, Head
from . import codec, forks, inbox, keys, records
from .blobs import BlobStore
from .codec import BlobRef, Item, SideItem, StoredEvent
from .inbox import EntryKey
from .indexes import (
    CURSOR_PK,
    EXPIRY_INDEX,
    INDEX_PAGE_SIZE,
    TENANT_INDEX,
    WAIT_INDEX,
    EventStamp,
    SweepPass,
    cursor_bucket,
    cursor_item,
    cursor_sort_key,
)
from .keyring import Keyring
from .sealed import NO_LIFE, ItemSealer, SealedBlobStore

#: Payloads at or over this size go to S3. DynamoDB's item limit is 400 KB; a
#: 64 KiB threshold leaves wide margin for the item's other attributes and
#: keeps event reads cheap (a read unit covers 4 KiB).
DEFAULT_OFFLOAD_THRESHOLD = 64 * 1024

#: A transaction holds at most 100 items; one is the head.
MAX_EVENTS_PER_COMMIT = 99

#: Items the first query of :meth:`ConversationStore.load` reads: the head and the
#: newest events, consistently. Enough for a short conversation in one round trip;
#: small, because the rest is read at the eventually consistent (half) price, and
#: what it reads below the summary is paid for.
FIRST_PAGE = 8
#: Rounds of a clear before it gives up. Turns cannot make a round fail (see the
#: fence); a few rounds cover other clears, a head appearing over leftovers, TTL.
_CLEAR_ROUNDS = 32


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
    #: The run flag read with the head (:meth:`ConversationStore.put_run_flag`), ``None``
    #: when there is none; says something only when :attr:`run_read`. Not part of what
    #: the snapshot compares equal by (the transcript's state).
    run: RunFlag | None = field(default=None, compare=False)
    #: Whether the load read the run flag (a store that does not says nothing of runs).
    run_read: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class RunFlag:
    """The partition's run flag: the turn whose draft began last, when, and in what life.

    Every begin of a turn's draft puts it before the draft's state
    (:mod:`turnledger.turn.drafts`), so no draft of a turn the flag does not name is
    running: the load's one read tells a new turn whether it must read its draft's state
    (the busy check)."""

    turn: int
    #: When the run began (epoch seconds).
    started_at: int
    gen: str | None = None


@dataclass(frozen=True)
class ContextBudget:
    """A safety cap on the history one turn reads: whole turns, newest first, within
    both limits. The token budget of :mod:`turnledger.context.assembly` decides what is sent;
    this only bounds a read when compaction could not keep the log short.

    The current (newest) turn is always read whole, whatever its size.
    """

    max_events: int = 400
    max_chars: int = 400_000


@dataclass
class PurgeReport:
    """What a purge removed, and the provider-side state it found (for the caller to delete:
    the store talks to no model provider)."""

    conversations: int = 0
    events: int = 0
    objects: int = 0
    #: ``(provider, response id)`` of the stored responses the purged head knew of.
    provider_responses: list[tuple[str, str]] = field(default_factory=list)
    #: Deleted conversations' lives kept for their forks and reclaimed once no fork reads
    #: them any more (their events and objects are counted above).
    reclaimed_lives: int = 0

    def __iadd__(self, other: PurgeReport) -> PurgeReport:
        self.conversations += other.conversations
        self.events += other.events
        self.objects += other.objects
        self.reclaimed_lives += other.reclaimed_lives
        self.provider_responses.extend(other.provider_responses)
        return self


@dataclass
class SealReport:
    """What :meth:`ConversationStore.seal_existing` did to the items and objects it walked."""

    #: Items (and objects) whose clear content it rewrote sealed.
    sealed: int = 0
    #: Items that held no clear content (sealed before, or holding none).
    already_sealed: int = 0
    #: Items left as they were: of a life being purged (a fenced head, a tombstone, no
    #: head), changed while being sealed (the writer that changed them sealed them), or too
    #: large once sealed.
    skipped: int = 0

    def __iadd__(self, other: SealReport) -> SealReport:
        self.sealed += other.sealed
        self.already_sealed += other.already_sealed
        self.skipped += other.skipped
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


def _identity(item: Item | None) -> Item | None:
    """What a conditional write expects of the ``HEAD`` item ``item`` (``None``: no head)."""
    if item is None:
        return None
    return {
        name: item[name] for name in (codec.A_VERSION, codec.A_GEN, codec.A_FENCE) if name in item
    }


def _turn_chunks(bodies: list[Item], limit: int = codec.MAX_ITEM_BYTES) -> list[list[Item]]:
    """``bodies`` (one commit's event items, oldest first) in runs that each fit one turn
    item under ``limit`` (the item size limit, less what sealing adds), as few as
    possible, in order."""
    chunks: list[list[Item]] = []
    size = 0
    for body in bodies:
        grows = codec.item_size(body)
        if chunks and size + grows <= limit:
            chunks[-1].append(body)
            size += grows
        else:
            chunks.append([body])
            size = grows
    return chunks


def _events_in(item: Item) -> int:
    """The events an event item holds, for reports: 1 when its count cannot be read (a purge
    deletes damaged items too)."""
    try:
        return codec.event_count(item)
    except CorruptedState:
        return 1


def _leftover(item: Item, piece: _Piece) -> bool:
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
        expected = _storage_sequence(item) - 1
    return True


def _needs_more(items: Sequence[Item]) -> bool:
    """Whether a descending read from ``HEAD`` (``items``, so far) has yet to reach the newest
    item of ``HEAD``'s life: a live ``HEAD`` followed by no item, or only by other lives'."""
    if not items or items[0].get(codec.A_SK) != keys.HEAD_SK:
        return False
    gen = items[0].get(codec.A_GEN)
    if any(item.get(codec.A_GEN) == gen for item in items[1:]):
        return False
    # A tombstone's life has no item yet; the items below it are the purge's to delete.
    return len(items) == 1 or _tombstone_of(items[0]) is None


def _run_flag_off(page: Page) -> tuple[Item | None, Page]:
    """The run flag's item, when ``page`` (descending from it) begins with it, and the page
    without it."""
    items = page.items
    if items and items[0].get(codec.A_SK) == keys.RUN_FLAG_SK:
        return items[0], Page(items[1:], page.cursor)
    return None, page


#: Attributes of the run flag (numbers: it holds no content, so nothing of it is sealed).
_A_RUN_TURN = "rt"
_A_RUN_AT = "ra"


def _run_flag(item: Item | None) -> RunFlag | None:
    """The run flag ``item`` holds (``None``: none, or one this code cannot read)."""
    if item is None:
        return None
    turn, at, gen = item.get(_A_RUN_TURN), item.get(_A_RUN_AT), item.get(codec.A_GEN)
    if not isinstance(turn, int | float) or not isinstance(at, int | float):
        return None
    return RunFlag(turn=int(turn), started_at=int(at), gen=str(gen) if gen else None)


def _tombstone_of(item: Item) -> Head | None:
    """The tombstone ``item`` holds, or ``None`` (a live head, or one that cannot be read)."""
    try:
        head = codec.decode_head(codec.without_content(item))
    except StateError:
        return None
    return head if head.status is ConversationStatus.CLEARED else None


def _stored_responses(item: Item) -> list[tuple[str, str]]:
    """``(provider, response id)`` named by the run record of an answer's item, if any:
    answers of this conversation's own turns only (an imported answer's response is its
    source's, which a purge here never deletes).

    Best effort over whatever the item holds: a purge removes damaged items too.
    """
    body = item.get(codec.A_BODY)
    if not isinstance(body, str) or '"response_id"' not in body:
        return []
    try:
        parsed = json.loads(body)
    except ValueError:
        return []
    found: list[tuple[str, str]] = []
    # A turn item's body is the list of its events' bodies; an older item's, one body.
    for event in parsed if isinstance(parsed, list) else [parsed]:
        try:
            if event.get("imported"):
                continue
            run = event["payload"]["run"]
            found.append((str(run["provider"]), str(run["response_id"])))
        except (KeyError, TypeError, AttributeError):
            continue
    return found


def _cursor_responses(item: Item, owner: str) -> list[tuple[str, str]]:
    """``(provider, response id)`` of the provider cursor that the head state of a turn item
    (or ``HEAD``) names, if any: clear at rest (:data:`.codec.STATE_CONTENT`), so a purge
    reads it after an erasure destroyed the keys that sealed the run records. Only a cursor
    ``owner`` (the conversation purged) owns: a fork's inherited one is its parent's
    (:meth:`~turnledger.core.models.ProviderCursor.owned_by`).

    Best effort over whatever the item holds: a purge removes damaged items too.
    """
    name = codec.state_attribute(item)
    state = None if name is None else item.get(name)
    if not isinstance(state, str) or '"provider_cursor"' not in state:
        return []
    try:
        cursor = json.loads(state)["provider_cursor"]
        if cursor.get("conversation_id") not in (None, owner):
            return []
        return [(str(cursor["provider"]), str(cursor["response_id"]))]
    except (ValueError, KeyError, TypeError, AttributeError):
        return []


def _record_key(record_key: str) -> str:
    """``record_key`` if it names an idempotency record (never a head, an event or
    another kind of item).

    Raises:
        InternalError: it does not.
    """
    if not record_key.startswith(keys.RECORD_PREFIX):
        raise InternalError(f"not an idempotency record key: {record_key!r}")
    return record_key


def _checked_record(record: records.Record) -> records.Record:
    """``record`` if its key names an idempotency record (see :func:`_record_key`)."""
    _record_key(record.key)
    return record


def _side_key(sort_key: str) -> str:
    """``sort_key`` if it is a side item's (never a head, an event, a record, an entry).

    Raises:
        InternalError: it is not.
    """
    if not sort_key.startswith(keys.SIDE_PREFIX):
        raise InternalError(f"not a side item key: {sort_key!r}")
    return sort_key


def _gaps(first: int, last: int) -> CorruptedState:
    return CorruptedState(
        "the transcript has gaps",
        details={"item": "events", "reason": f"expected sequences {first}..{last}"},
    )


@dataclass(frozen=True)
class _Piece:
    """Public sequences ``first..last`` of a log, stored in ``key``'s partition by its life
    ``gen`` (storage sequence = ``base`` + public sequence)."""

    key: ConversationKey
    gen: str
    base: int
    first: int
    last: int


#: An event's piece and storage sequence.
_Placed = tuple[_Piece, int]


def _pieces(key: ConversationKey, head: Head) -> list[_Piece]:
    """Where ``head``'s log is, oldest first: a fork's inherited segments, then its own."""
    pieces: list[_Piece] = []
    first = 1
    if head.fork is not None:
        for segment in head.fork.segments:
            if segment.through >= first:
                where = ConversationKey(tenant=key.tenant, conversation_id=segment.conversation_id)
                pieces.append(_Piece(where, segment.gen, segment.base, first, segment.through))
            first = segment.through + 1
    if head.event_count >= first:
        pieces.append(_Piece(key, head.gen, head.base, first, head.event_count))
    return pieces


@dataclass(frozen=True)
class _View:
    """What a commit needs of what its turn read: the ``HEAD`` item as stored (``None``:
    none) and the effective head's version (docs/STORAGE.md)."""

    head_item: Item | None
    version: int | None
    #: The newest item below ``HEAD`` is another life's: leftovers may hold the next slots,
    #: so commits put ``HEAD`` too (its condition is then the lock, as before issue 21).
    crowded: bool = False


#: Views a store keeps (the newest conversations it read or wrote), so a commit needs no
#: read of its own: an execution environment serves the same conversations again and again.
_VIEWS = 1024


@dataclass(frozen=True)
class _Context:
    """The newest event items of one life a load read (newest first, consecutive slots),
    kept by the execution environment: the next load checks that the newest is still the
    newest item and reads only what is above it (docs/STORAGE.md, "Reads")."""

    gen: str
    items: tuple[Item, ...]


#: Conversations whose newest items an execution environment keeps, and items kept of each:
#: as many as a load may read (:class:`ContextBudget`'s 400 events, 400,000 characters), so
#: at most some 16 MB in all.
_CONTEXTS = 32
_CONTEXT_ITEMS = 400


def _same_item(a: Item, b: Item) -> bool:
    """Whether ``a`` and ``b`` are one stored item: an item of a life at a slot is never
    rewritten, but for a marker, which a commit replaces at a new version."""
    names = (codec.A_SK, codec.A_GEN, codec.A_VERSION, codec.A_COUNT)
    return all(a.get(name) == b.get(name) for name in names)


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
    taken: list[tuple[_Placed, StoredEvent]] = field(default_factory=list)
    chars: int = 0
    #: The turn being read, newest first; whole only once an older event (or the start) is seen.
    turn: list[tuple[_Placed, StoredEvent]] = field(default_factory=list)
    turn_chars: int = 0

    def offer(self, chars: int, where: _Placed, stored: StoredEvent) -> bool:
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


class ConversationStore(ABC):
    """Conversation heads and events, with large payloads offloaded to a :class:`BlobStore`."""

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
        self._views: dict[str, _View] = {}
        self._views_lock = threading.Lock()
        self._contexts: dict[str, _Context] = {}

    def _remember(self, pk: str, view: _View) -> None:
        with self._views_lock:
            self._views.pop(pk, None)
            self._views[pk] = view
            while len(self._views) > _VIEWS:
                del self._views[next(iter(self._views))]

    def _recalled(self, pk: str) -> _View | None:
        with self._views_lock:
            return self._views.get(pk)

    def _keep_context(self, pk: str, context: _Context | None) -> None:
        with self._views_lock:
            self._contexts.pop(pk, None)
            if context is not None and context.items:
                self._contexts[pk] = _Context(context.gen, context.items[:_CONTEXT_ITEMS])
                while len(self._contexts) > _CONTEXTS:
                    del self._contexts[next(iter(self._contexts))]

    def _kept_context(self, pk: str) -> _Context | None:
        with self._views_lock:
            return self._contexts.get(pk)

    def _first_page(self, pk: str) -> tuple[Page, Item | None]:
        """The load's first read: the run flag, ``HEAD`` and the newest items, consistently.
        When this environment kept the newest items of its last read (or commit) and the
        newest of them is still the newest item, only ``HEAD`` and what lies above it are
        read, and the kept items follow (one round trip of about 1 RCU on most turns).

        Returns:
            The page from ``HEAD`` down (the flag taken out), and the run flag's item."""
        kept = self._kept_context(pk)
        if kept is not None:
            newest = kept.items[0]
            flag, page = _run_flag_off(
                self._query(
                    pk,
                    upper=keys.RUN_FLAG_SK,
                    lower=str(newest[codec.A_SK]),
                    descending=True,
                    limit=FIRST_PAGE,
                    cursor=None,
                )
            )
            items = page.items
            if (
                page.cursor is None
                and len(items) >= 2
                and items[0].get(codec.A_SK) == keys.HEAD_SK
                and items[0].get(codec.A_GEN) == kept.gen
                and _same_item(items[-1], newest)
            ):
                # The newest item as just read (its head state is what counts), then the
                # kept ones below it, never rewritten; older ones may follow (a cursor).
                return Page([*items, *kept.items[1:]], cursor=True), flag
            self._keep_context(pk, None)  # another environment wrote meanwhile: read anew
        page = self._from_head(pk, FIRST_PAGE, upper=keys.RUN_FLAG_SK)
        flag, page = _run_flag_off(page)
        return page, flag

    def _effective(self, pk: str, items: Sequence[Item], *, content: bool = True) -> Head | None:
        """The effective head from a descending read from ``HEAD`` (``items``: ``HEAD`` first,
        then the newest event items), remembered for the next commit.

        Args:
            content: open the content of the head state (:mod:`.sealed`); ``False``: leave
                it out (:func:`.codec.without_content`), for readers that use none.

        Raises:
            ContentUnreadable: ``content``, and it does not open (its key was destroyed).
        """
        if not items or items[0].get(codec.A_SK) != keys.HEAD_SK:
            # No HEAD: items read are leftovers of a life whose HEAD TTL removed.
            self._remember(pk, _View(None, None, crowded=bool(items)))
            return None
        state = self._opened_state if content else codec.without_content
        head = codec.decode_head(state(items[0]))
        # The newest item of this life: past another life's leftovers and gravestones.
        newest = next((i for i in items[1:] if i.get(codec.A_GEN) == head.gen), None)
        effective = codec.effective_head(head, None if newest is None else state(newest))
        crowded = len(items) > 1 and items[1].get(codec.A_GEN) != head.gen
        self._remember(pk, _View(items[0], effective.version, crowded))
        return effective

    def _opened_state(self, item: Item) -> Item:
        """``item`` (``HEAD`` or an event item) with its head state's content opened; a turn
        item's events are left out (only its state is read here)."""
        if codec.A_SK in item and item[codec.A_SK] != keys.HEAD_SK:
            item = {name: value for name, value in item.items() if name != codec.A_BODY}
        return self.sealer.open(item)

    def _from_head(self, pk: str, limit: int, *, upper: str = keys.HEAD_SK) -> Page:
        """The first ``limit`` items descending from ``HEAD``, consistently; at least ``HEAD``
        and the newest item of ``HEAD``'s life below it when there is one, however the
        backend pages and however many leftovers of other lives lie above it.
        ``upper=keys.RUN_FLAG_SK``: the run flag first, when there is one."""
        page = self._query(pk, upper=upper, lower=None, descending=True, limit=limit, cursor=None)
        items = page.items
        while page.cursor is not None and _needs_more(_run_flag_off(Page(items))[1].items):
            # Only past leftovers (a life that began after TTL removed the last HEAD, before
            # the stream's reclaim) or a page of HEAD alone: rare, and bounded by them.
            page = self._query(
                pk,
                upper=keys.HEAD_SK,
                lower=None,
                descending=True,
                limit=FIRST_PAGE,
                cursor=page.cursor,
            )
            items = [*items, *page.items]
        return Page(items, page.cursor)

    def _read_view(self, pk: str, *, content: bool = True) -> tuple[Head | None, _View]:
        """The effective head and its view, read consistently: ``HEAD`` and the newest items
        (``content``: as in :meth:`_effective`)."""
        items = self._from_head(pk, 2).items
        head = self._effective(pk, items, content=content)
        view = self._recalled(pk)
        assert view is not None
        return head, view

    def _view_for(self, pk: str, expected_version: int | None) -> _View:
        """The view a commit expecting ``expected_version`` works from: remembered when it is
        that version, else read.

        Raises:
            ConversationBusy: the conversation is at another version, or being cleared.
        """
        view = self._recalled(pk)
        if view is None or view.version != expected_version:
            _, view = self._read_view(pk)
        if view.version != expected_version:
            raise ConversationBusy("another turn or decision on this conversation committed first")
        if view.head_item is not None and codec.A_FENCE in view.head_item:
            raise ConversationBusy("the conversation is being cleared; retry")
        return view

    # --- reads --------------------------------------------------------------------------

    def get_head(self, key: ConversationKey, *, content: bool = True) -> Head | None:
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
        return self._read_view(keys.partition_key(key), content=content)[0]

    def load(self, key: ConversationKey, budget: ContextBudget) -> Snapshot:
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
        page, flag = self._first_page(pk)
        run = _run_flag(flag)
        head = self._effective(pk, page.items)
        view = self._recalled(pk)
        if head is None or head.status is ConversationStatus.CLEARED or (view and view.crowded):
            self._keep_context(pk, None)
        if head is None:
            return Snapshot(head=None, events=[], from_start=True, run=run, run_read=True)
        if head.status is ConversationStatus.CLEARED:
            return Snapshot(head=head, events=[], from_start=True, run=run, run_read=True)
        floor = head.summary.through if head.summary is not None else 0
        window = _Window(budget)
        complete = True
        # The own life's items this read went through, newest first: kept for the next load.
        seen: list[Item] = []
        for piece in reversed(_pieces(key, head)):
            low = max(piece.first, floor + 1)
            if low > piece.last:
                break
            own = piece.gen == head.gen and piece.key == key
            first = _FirstPage(page.items[1:], page.cursor is not None) if own else None
            if not self._read_back(piece, low, first, budget, window, seen if own else None):
                complete = False
                break
        if seen and not (view and view.crowded):
            self._keep_context(pk, _Context(head.gen, tuple(seen)))
        from_start = complete and window.close() and floor == 0
        events = [
            self._event(piece, seq, stored) for (piece, seq), stored in reversed(window.taken)
        ]
        return Snapshot(head=head, events=events, from_start=from_start, run=run, run_read=True)

    def _read_back(
        self,
        piece: _Piece,
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
            items = self._older_events(piece, low, expected, budget, window)
        while True:
            reached_low = False
            for item in items:
                if _leftover(item, piece):
                    continue  # a leftover of an earlier life (a gap, if it hides an event)
                if seen is not None and (
                    not seen or _storage_sequence(seen[-1]) > (_storage_sequence(item))
                ):
                    seen.append(item)
                if _storage_sequence(item) > piece.base + piece.last:
                    continue  # a marker above the log: no event
                if codec.last_sequence(item) < piece.base + low:
                    reached_low = True
                    break
                # A turn item holds a commit's events: newest first, down to ``low``.
                for sequence, stored, chars in reversed(
                    codec.decode_turn_item(self.sealer.open(item), piece.gen)
                ):
                    if sequence < piece.base + low:
                        reached_low = True
                        break
                    if sequence != piece.base + expected:
                        raise _gaps(piece.base + low, piece.base + piece.last)
                    expected -= 1
                    if not window.offer(chars, (piece, sequence), stored):
                        return False
                if reached_low:
                    break
            if reached_low or not more or expected < low:
                break
            items = self._older_events(piece, low, expected, budget, window)
            more = bool(items)
        if expected != low - 1:
            raise _gaps(piece.base + low, piece.base + piece.last)
        return True

    def _older_events(
        self, piece: _Piece, low: int, newest: int, budget: ContextBudget, window: _Window
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
            page = self._query(
                keys.partition_key(piece.key),
                upper=upper,
                lower=lower,
                descending=True,
                limit=wanted,
                cursor=None,
                consistent=consistent,
            )
            items = page.items
            bottom = _storage_sequence(items[-1]) if items else top + 1
            if page.cursor is None and bottom > piece.base + low:
                # A turn item holds several events: the one holding the range's low end
                # may start below the range's key. One more item, at or below it.
                items = [*items, *self._item_below(piece, bottom)]
            if _contiguous([item for item in items if not _leftover(item, piece)], top):
                break
        return items

    def _item_below(self, piece: _Piece, sequence: int) -> list[Item]:
        """The event item of ``piece``'s life just below the storage ``sequence`` (none or
        one), past leftovers of other lives."""
        while True:
            page = self._query(
                keys.partition_key(piece.key),
                upper=keys.event_sort_key(sequence - 1),
                lower=keys.event_sort_key(0),
                descending=True,
                limit=1,
                cursor=None,
            )
            if not page.items or not _leftover(page.items[0], piece):
                return page.items
            sequence = _storage_sequence(page.items[0])

    def read_events(
        self, key: ConversationKey, head: Head, *, after: int, limit: int
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
        for piece in _pieces(key, head):
            first, last = max(lower, piece.first), min(upper, piece.last)
            if first > last:
                continue
            cursor: Any = None
            low, high = piece.base + first, piece.base + last
            while True:
                page = self._query(
                    keys.partition_key(piece.key),
                    lower=keys.event_sort_key(low),
                    upper=keys.event_sort_key(high),
                    descending=False,
                    limit=min(last - first + 1, 1000),
                    cursor=cursor,
                )
                items = page.items
                if cursor is None and (not items or _storage_sequence(items[0]) > low):
                    # The turn item holding ``low`` may start below it.
                    items = [*self._item_below(piece, low + 1), *items]
                for item in items:
                    if _leftover(item, piece):
                        continue  # an earlier life's (a gap, if it hides an event)
                    for sequence, stored, _ in codec.decode_turn_item(
                        self.sealer.open(item), piece.gen
                    ):
                        if low <= sequence <= high:
                            events.append(self._event(piece, sequence, stored))
                if page.cursor is None:
                    break
                cursor = page.cursor
        expected = list(range(lower, upper + 1))
        if [e.sequence for e in events] != expected:
            raise _gaps(head.base + lower, head.base + upper)
        return events

    def _event(self, piece: _Piece, sequence: int, stored: StoredEvent) -> Event:
        if stored.ref is not None:
            payload = self._fetch(stored.ref)
        else:
            assert stored.payload is not None  # decode_stored_event checked: one of the two
            payload = stored.payload
        return codec.build_event(piece.key.conversation_id, piece.base, sequence, stored, payload)

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
        inbox_changes: inbox.InboxChanges | None = None,
    ) -> int:
        """Append ``events`` and replace the head, atomically.

        Args:
            expected_version: the head version the caller read (``None``: no head).
            head: the new head; its ``version`` must be ``expected_version + 1``
                and its ``seq`` must cover ``events``.
            events: new events with consecutive public sequences after the old head.
            inbox_changes: the approval inbox entries to write and delete in the same
                transaction, as the turn layer decided them (the calls that start or
                stop waiting for a person: :func:`turnledger.turn.lifecycle.inbox_changes`).

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
        # One item for the commit's events (docs/STORAGE.md): 1 WCU per started KiB of it
        # (more only when they would not fit one); with none, a marker. The first takes the
        # next slot; the newest holds the head's fast state.
        turn_items = [
            codec.encode_turn_item(key, head, chunk)
            for chunk in _turn_chunks(items, self.sealer.clear_limit(codec.MAX_ITEM_BYTES))
        ]
        turn_items = turn_items or [codec.marker_item(key, head)]
        turn_items[-1] = codec.with_state(turn_items[-1], head)
        turn_items = [self.sealer.seal(item) for item in turn_items]
        pk = keys.partition_key(key)
        try:
            view = self._view_for(pk, expected_version)
        except BaseException:
            self._discard(written)
            raise
        head_item = self.sealer.seal(codec.encode_head(key, codec.head_of_record(head)))
        # HEAD only when what it holds changes (or leftovers of another life crowd the next
        # slots, or it holds content a build that did not seal wrote there): a plain turn
        # is one conditional put. Slow fields are never content: they compare in clear.
        write_head = (
            view.crowded
            or not codec.same_slow_state(view.head_item, head_item)
            or self.sealer.reseals(view.head_item)
        )
        changes = inbox_changes or inbox.InboxChanges()
        puts = [self.sealer.seal(inbox.entry_item(key, head.gen, entry)) for entry in changes.puts]
        deletes = [inbox.entry_sort_key(call_id) for call_id in changes.deletes]
        if len(events) + len(puts) + len(deletes) > MAX_EVENTS_PER_COMMIT:
            # One transaction holds 100 items; the inbox entries count with the events.
            self._discard(written)
            raise InternalError(
                f"a commit holds at most {MAX_EVENTS_PER_COMMIT} events and inbox entries"
            )
        try:
            if write_head or puts or deletes or len(turn_items) > 1:
                self._transact_commit(
                    head_item if write_head else None,
                    _identity(view.head_item),
                    turn_items,
                    head.gen,
                    puts=puts,
                    deletes=deletes,
                    marker_version=expected_version,
                    # HEAD's condition is the lock: another life's items are leftovers.
                    head_locked=write_head,
                )
            else:
                self._put_turn(turn_items[0], expected_version)
        except TurnledgerError as exc:
            # The backend answered "no": nothing of the turn is stored, so its objects go too.
            # Unless it failed on its side (ServiceUnavailable.outcome_unknown): the
            # transaction may have landed, and then its events point at these objects.
            if not getattr(exc, "outcome_unknown", False):
                self._discard(written)
            raise
        # Any other failure (a timeout, a dropped connection) leaves the outcome unknown:
        # the objects stay, since deleting them could break a turn that did land. If it
        # did not, they are leftovers under the conversation's prefix that clear and sweep
        # remove.
        # Leftovers may lie above the slot just written: the next commit reads again.
        if view.crowded:
            with self._views_lock:
                self._views.pop(pk, None)
            self._keep_context(pk, None)
        else:
            self._remember(pk, _View(head_item if write_head else view.head_item, head.version))
            self._keep_context(pk, self._context_after(pk, head.gen, turn_items))
        heads = [head_item] if write_head else []
        return sum(codec.item_size(item) for item in [*turn_items, *puts, *heads]) + offloaded

    def _context_after(self, pk: str, gen: str, written: list[Item]) -> _Context:
        """What this environment keeps of the conversation once it wrote ``written`` (turn
        items or a marker, oldest first): those, over what it kept before when that ends
        just below them (a marker they replaced left out)."""
        kept = self._kept_context(pk)
        newest = tuple(reversed(written))
        if kept is None or kept.gen != gen:
            return _Context(gen, newest)
        below = [i for i in kept.items if i.get(codec.A_SK) != written[0].get(codec.A_SK)]
        if below and codec.last_sequence(below[0]) + 1 == _storage_sequence(written[0]):
            return _Context(gen, (*newest, *below))
        return _Context(gen, newest)

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

    def clear(self, key: ConversationKey, now: datetime) -> PurgeReport:
        """Delete the conversation, its events, its other items and its objects; absent is fine.

        Wins against concurrent turns in bounded time (the fence, in the module
        docstring): turns that race it answer ConversationBusy, the clear never does.
        Works on corrupted and unknown-version heads too: that is how they recover.
        Also removes what a head left behind when DynamoDB's TTL deleted it.

        Returns:
            What was removed (all zeros for an absent conversation).

        Raises:
            InternalError: the head kept changing in ways no turn can cause (a bug).
        """
        pk = keys.partition_key(key)
        for _ in range(_CLEAR_ROUNDS):
            item = self._get_item(pk, keys.HEAD_SK)
            if item is not None and codec.A_FENCE not in item:
                tomb = _tombstone_of(item)
                if tomb is not None:
                    return self._finish_purge(key, tomb, PurgeReport())
                item = self._fence(key, item, secrets.token_hex(8), now)
                if item is None:
                    continue  # gone, changed, or fenced by another clear first: read again
            report = self._purge(key, item, now)
            if report is not None:
                return report
        raise InternalError("the conversation's head kept changing while it was being cleared")

    def _fence(self, key: ConversationKey, item: Item, token: str, now: datetime) -> Item | None:
        """Fence the head ``item`` as read and claim the conversation's next slot with a
        gravestone, in one write (docs/STORAGE.md, "clear wins"): turns that read the head
        before can no longer land (the slot is taken), turns that read it after refuse.

        Returns the head as fenced, ``None`` when it changed since it was read (or another
        clear fenced it first). A head that cannot be read is fenced alone: no turn can
        commit on it anyway.
        """
        pk = keys.partition_key(key)
        try:
            codec.decode_head(codec.without_content(item))
        except StateError:
            return self._fence_head(pk, token)
        view, claim = self._claim(key, now)
        if claim is None or not codec.same_head(view.head_item, _identity(item)):
            return None
        # HEAD as read (its sealed content as it is: bound to HEAD, it opens there).
        fenced = {**item, codec.A_FENCE: token}
        try:
            self._transact_commit(
                fenced,
                _identity(item),
                [claim],
                str(claim[codec.A_GEN]),
                marker_version=view.version,
            )
        except ConversationBusy:
            return None
        return fenced

    def _claim(self, key: ConversationKey, now: datetime) -> tuple[_View, Item | None]:
        """The view of the conversation as read now, and the gravestone that claims the next
        slot of its effective head (``None``: no head): holding that head's state, its
        content sealed again, when it opens; else no state at all (an erased life's content,
        restored from a backup, is not written again, and no key is made for it)."""
        pk = keys.partition_key(key)
        try:
            live, view = self._read_view(pk)
        except ContentUnreadable:
            live, view = self._read_view(pk, content=False)
            return view, None if live is None else codec.gravestone(key, live, now, False)
        if live is None:
            return view, None
        return view, self.sealer.seal(codec.gravestone(key, live, now))

    def purge_if_unchanged(
        self, key: ConversationKey, head: Head, now: datetime
    ) -> PurgeReport | None:
        """Purge the conversation if its head is still ``head`` (same version and life).

        Returns ``None`` (and deletes nothing) when a commit got there first:
        the sweep uses this so a conversation that just got a turn survives.
        """
        if head.status is ConversationStatus.CLEARED:
            # Finishing a tombstone's purge deletes only what lies below it and is not the
            # next life's: safe whatever happened since.
            return self._purge(key, codec.encode_head(key, head), now)
        _, view = self._read_view(keys.partition_key(key), content=False)
        item = view.head_item
        # ``head`` as read (the effective head: HEAD and the newest turn item).
        if item is None or item.get(codec.A_GEN) != head.gen or view.version != head.version:
            return None
        if codec.A_FENCE in item:
            return None  # a clear is in flight: it wins
        return self._purge(key, item, now)

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
        # HEAD as stored, re-filed: the head given is the effective one (docs/STORAGE.md).
        item = self._get_item(keys.partition_key(key), keys.HEAD_SK)
        if item is None or item.get(codec.A_GEN) != head.gen or codec.A_FENCE in item:
            return False
        moved = codec.decode_head(codec.without_content(item)).model_copy(
            update={
                "expiry_bucket": keys.bucket_of(head.expires_at),
                "expires_at": codec.bucket_end(head.expires_at),
                "wait_deadline": head.wait_deadline,
            }
        )
        refiled = codec.encode_head(key, moved)
        sealed = item.get(codec.A_CONTENT)
        if isinstance(sealed, bytes):
            # The content is unchanged and was not opened: HEAD keeps it as sealed.
            refiled = {**codec.split_content(refiled), codec.A_CONTENT: sealed}
        else:
            refiled = self.sealer.seal(refiled)
        return self._replace_head(refiled, item)

    def _purge(self, key: ConversationKey, item: Item | None, now: datetime) -> PurgeReport | None:
        """Purge the conversation whose head is ``item`` as read (``None``: no head).

        Returns ``None`` when the head is no longer ``item``.
        """
        pk = keys.partition_key(key)
        report = PurgeReport()
        old: Head | None = None
        if item is not None:
            try:
                old = codec.decode_head(codec.without_content(item))
            except StateError:
                old = None  # damaged or from a newer build: replaced all the same
            # A purge that did not finish; a fenced tombstone is replaced like any fenced head.
            if (
                old is not None
                and old.status is ConversationStatus.CLEARED
                and codec.A_FENCE not in item
            ):
                return self._finish_purge(key, old, report)
        if item is None and not self._has_items(pk) and not self._has_objects(key):
            return report  # nothing at all: no tombstone to write
        # The next slot of the life being purged (docs/STORAGE.md, "clear wins"): the
        # tombstone claims it in the same write, so a turn that read before cannot land.
        # A fenced head's clear claimed it with its fence.
        claim: tuple[Item, int | None] | None = None
        if old is not None and item is not None and codec.A_FENCE not in item:
            view, grave = self._claim(key, now)
            if grave is None or not codec.same_head(view.head_item, _identity(item)):
                return None
            claim = (grave, view.version)
        top = max(old.seq if old else 0, self._highest_event_sequence(pk))
        if claim is not None:
            top = max(top, _storage_sequence(claim[0]))
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
        if claim is not None:
            marker, claimed = claim
            try:
                self._transact_commit(
                    codec.encode_head(key, tomb),
                    _identity(item),
                    [marker],
                    str(marker[codec.A_GEN]),
                    marker_version=claimed,
                )
            except ConversationBusy:
                return None
        elif not self._replace_head(codec.encode_head(key, tomb), item):
            return None
        report.conversations = 0 if item is None else 1
        cursor = old.provider_cursor if old is not None else None
        if cursor is not None and cursor.owned_by(key.conversation_id):
            report.provider_responses.append((cursor.provider, cursor.response_id))
        return self._finish_purge(key, tomb, report)

    def _finish_purge(self, key: ConversationKey, tomb: Head, report: PurgeReport) -> PurgeReport:
        pk = keys.partition_key(key)
        kept = self.retention(key)
        report += self.release_forks(key, live_gen=tomb.gen, kept=kept)
        report.events += self._delete_partition(pk, tomb, report, kept)
        report.provider_responses = list(dict.fromkeys(report.provider_responses))
        report.objects += self._delete_objects(key, keep_gen=tomb.gen, kept=kept)
        if kept:
            # Forks still read events below the tombstone's base: it stays, so a new life
            # starts above them instead of over them. With no expiry (no TTL removes it, no
            # sweep finishes it); the release that frees the last of them deletes it.
            marker = tomb.model_copy(update={"version": tomb.version + 1, "expires_at": None})
            self._replace_head(codec.encode_head(key, marker), codec.encode_head(key, tomb))
        else:
            self._delete_head(pk, codec.encode_head(key, tomb))
        return report

    def _has_items(self, pk: str) -> bool:
        page = self._query(
            pk, lower=None, upper=None, descending=False, limit=1, cursor=None, keys_only=True
        )
        return bool(page.items)

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
        if not page.items:
            return 0
        # A marker (a clear's claim among them) holds its slot without an event.
        return max(codec.last_sequence(page.items[0]), _storage_sequence(page.items[0]))

    def _delete_partition(
        self, pk: str, tomb: Head, report: PurgeReport, kept: dict[str, int]
    ) -> int:
        """Delete every item of ``pk`` that ``tomb``'s purge removes; returns the events deleted.

        Kept: the head, event items above the tombstone's sequence (only the next
        life writes there), the events forks still read (``kept``: :meth:`retention`),
        fork references and origins (:meth:`release_forks` owns them), and items of other
        kinds that carry the next life's ``g``.
        A deleted side item's companion (in the tenant's own partition) is deleted first.
        The stored provider responses that deleted answers name (their run records)
        are added to ``report``: whole items are read, since a query costs the same
        whatever it projects.
        """
        events = 0
        cursor: Any = None
        owner = keys.parse_partition_key(pk)
        # Erasure destroys keys first (.sealed): the data keys of the lives whose items go
        # are destroyed before their items are deleted, so a purge that dies halfway leaves
        # only ciphertext. ``held``: those keys, kept in memory for this purge's own reads
        # (the provider responses deleted answers name).
        held = self.sealer.hold(owner, [NO_LIFE])
        self.sealer.destroy(owner, [NO_LIFE])
        while True:
            page = self._query(
                pk,
                lower=None,
                upper=None,
                descending=False,
                limit=1000,
                cursor=cursor,
            )
            doomed: list[str] = []
            graves: list[Item] = []
            companions: list[str] = []
            lives = {
                str(item[codec.A_GEN])
                for item in page.items
                if item.get(codec.A_GEN) and item[codec.A_GEN] not in (tomb.gen, *kept, *held)
            }
            held.update(self.sealer.hold(owner, lives))
            self.sealer.destroy(owner, lives)
            for item in page.items:
                sort_key = str(item[codec.A_SK])
                if sort_key == keys.HEAD_SK:
                    continue
                if sort_key.startswith((keys.FORK_REF_PREFIX, keys.ORIGIN_PREFIX)):
                    continue
                if sort_key.startswith(keys.EVENT_PREFIX):
                    try:
                        sequence = keys.sequence_of(sort_key)
                    except ValueError:
                        sequence = 0  # not an event key of any life: garbage
                    read = forks.reads(kept, item.get(codec.A_GEN), sequence)
                    if codec.is_gravestone(item, tomb.updated_at):
                        continue  # it still holds the slot against late turns; TTL removes it
                    if sequence <= tomb.base and not read:
                        events += _events_in(item)
                        # Its stored provider responses: the cursor its head state names
                        # (clear), and those its run records name (sealed: unless the
                        # tenant's erasure destroyed their keys first).
                        report.provider_responses.extend(
                            _cursor_responses(item, owner.conversation_id)
                        )
                        with contextlib.suppress(ContentUnreadable):
                            opened = self.sealer.open(item, held)
                            report.provider_responses.extend(_stored_responses(opened))
                        if codec.keeps_slot(item, tomb.updated_at):
                            # A turn that read before the clear may still target this slot:
                            # a gravestone replaces the item (it is never absent meanwhile).
                            graves.append(codec.bare_gravestone(item, tomb.updated_at))
                        else:
                            doomed.append(sort_key)
                elif item.get(codec.A_GEN) != tomb.gen:
                    doomed.append(sort_key)
                    companion = item.get(codec.A_COMPANION)
                    if isinstance(companion, str) and companion.startswith(keys.SIDE_PREFIX):
                        companions.append(companion)
            if companions:
                tenant = keys.parse_partition_key(pk).tenant
                self._delete_items(keys.partition_key(keys.tenant_items(tenant)), companions)
            if graves:
                self._put_items(graves)
            if doomed:
                self._delete_items(pk, doomed)
            if page.cursor is None:
                return events
            cursor = page.cursor

    def _delete_objects(
        self, key: ConversationKey, *, keep_gen: str | None, kept: dict[str, int]
    ) -> int:
        """Delete ``key``'s objects but those of the life ``keep_gen`` and the event payloads
        forks still read (``kept``)."""
        keep = keys.blob_prefix(key, keep_gen) if keep_gen else None
        doomed: Iterator[str] = (
            k
            for k in self.blobs.list_keys(keys.blob_prefix(key))
            if not (keep is not None and k.startswith(keep)) and not forks.object_read(key, k, kept)
        )
        return self.blobs.delete_keys(doomed)

    # --- forks (store/forks.py) ---------------------------------------------------------

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
        """Create the fork ``head`` at ``target``: its head, its reference in the parent's
        partition and its origin in its own, atomically, whatever the parent's length (no
        event is copied: ``head.fork`` says where the inherited ones are).

        Conditions: ``parent``'s head is still ``parent_head`` (same version and life, no
        clear's fence), and ``target`` has no head (``expected_version`` ``None``) or the
        tombstone of that version whose next life is ``head.gen``.

        Raises:
            ConversationBusy: a condition failed; nothing was written.
            InternalError: ``head`` is not a fork.
        """
        origin = head.fork
        if origin is None:
            raise InternalError("a fork's head names its origin")
        ref = forks.ForkRef(
            parent_gen=parent_head.gen,
            fork_id=target.conversation_id,
            fork_gen=head.gen,
            live=True,
            turn=origin.turn,
            seq=origin.seq,
            keep_through=parent_head.base + origin.seq,
            created_at=now,
        )
        view = self._view_for(keys.partition_key(parent), parent_head.version)
        assert view.head_item is not None  # a version was read: there is a head
        # The parent's next slot as read: a commit on the parent since makes the fork fail.
        slot = {
            **codec.marker_item(parent, parent_head),
            codec.A_VERSION: parent_head.version,
        }
        self._transact_commit(
            self.sealer.seal(codec.encode_head(target, head)),
            codec.expected_head(expected_version, head.gen),
            [],
            head.gen,
            puts=[forks.ref_item(parent, ref), forks.origin_item(target, head.gen, origin)],
            checks=[view.head_item],
            slots=[slot],
        )

    def stored_at(self, key: ConversationKey, head: Head, sequence: int) -> StoredEvent:
        """The stored body of the event at public ``sequence`` of ``head``'s log, wherever
        it is (a fork's ancestor included); its payload may be an offloaded reference.
        One point read.

        Raises:
            CorruptedState: there is no such event, or it cannot be read.
        """
        return self._stored_at(key, head, sequence)[1]

    def event_at(self, key: ConversationKey, head: Head, sequence: int) -> Event:
        """The event at public ``sequence`` of ``head``'s log, payload included.

        Raises:
            CorruptedState: there is no such event, or it cannot be read.
        """
        piece, stored = self._stored_at(key, head, sequence)
        return self._event(piece, piece.base + sequence, stored)

    def _stored_at(
        self, key: ConversationKey, head: Head, sequence: int
    ) -> tuple[_Piece, StoredEvent]:
        piece = next((p for p in _pieces(key, head) if p.first <= sequence <= p.last), None)
        if piece is None:
            raise _gaps(head.base + sequence, head.base + sequence)
        wanted = piece.base + sequence
        # The item holding it: the event item whose key is at or just below its sequence.
        for item in self._item_below(piece, wanted + 1):
            for found, stored, _ in codec.decode_turn_item(self.sealer.open(item), piece.gen):
                if found == wanted:
                    return piece, stored
        raise _gaps(wanted, wanted)

    def fork_refs(
        self, key: ConversationKey, head: Head, *, after: str | None, limit: int
    ) -> tuple[list[forks.ForkRef], bool]:
        """Up to ``limit`` live forks of ``head``'s life, by fork id, after the fork id
        ``after``; and whether more follow."""
        lower, upper = forks.prefix_bounds(keys.fork_refs_prefix(head.gen, keys.FORK_LIVE))
        if after is not None:
            # Past every life of the fork ``after``: its references end ``#<fork gen>``.
            lower = forks.prefix_bounds(f"{lower}{after}#")[1]
        page = self._query(
            keys.partition_key(key),
            lower=lower,
            upper=upper,
            descending=False,
            limit=limit + 1,
            cursor=None,
        )
        refs = [forks.decode_ref(item) for item in page.items]
        return refs[:limit], len(refs) > limit or page.cursor is not None

    def fork_count(self, key: ConversationKey, head: Head) -> int:
        """How many live forks ``head``'s life has (keys only, every page)."""
        lower, upper = forks.prefix_bounds(keys.fork_refs_prefix(head.gen, keys.FORK_LIVE))
        return sum(1 for _ in self._keys_between(keys.partition_key(key), lower, upper))

    def retention(self, key: ConversationKey) -> dict[str, int]:
        """What forks still read of ``key``'s lives: for each life with references to forks,
        the highest storage sequence any of them inherits (consistent read)."""
        lower, upper = forks.prefix_bounds(keys.FORK_REF_PREFIX)
        kept: dict[str, int] = {}
        for item in self._items_between(keys.partition_key(key), lower, upper):
            ref = forks.decode_ref(item)
            kept[ref.parent_gen] = max(kept.get(ref.parent_gen, 0), ref.keep_through)
        return kept

    def release_forks(
        self, key: ConversationKey, *, live_gen: str | None, kept: dict[str, int]
    ) -> PurgeReport:
        """Settle the forks among ``key``'s lives other than ``live_gen``, which are being
        deleted: one that forks still read (``kept``) is marked deleted in its parent's
        list; any other releases its reference, and a parent's life that is gone and
        that no fork reads any more is deleted in turn, up the lineage.

        Returns what the releases deleted in ancestors' partitions.
        """
        report = PurgeReport()
        pk = keys.partition_key(key)
        lower, upper = forks.prefix_bounds(keys.ORIGIN_PREFIX)
        for item in list(self._items_between(pk, lower, upper)):
            gen = str(item.get(codec.A_GEN, ""))
            if gen == live_gen:
                continue
            parent_id, parent_gen = forks.decode_origin(item)
            parent = ConversationKey(tenant=key.tenant, conversation_id=parent_id)
            if gen in kept:
                self._mark_kept(parent, parent_gen, key.conversation_id, gen)
                continue
            report += self._release(parent, parent_gen, key.conversation_id, gen)
            # Only once released: an origin left by a crash costs one small item, a
            # reference left would keep the parent's events for ever.
            self._delete_items(pk, [keys.origin_key(gen)])
        return report

    def _mark_kept(
        self, parent: ConversationKey, parent_gen: str, fork_id: str, fork_gen: str
    ) -> None:
        """Move the fork's reference from the parent's list of live forks to the kept ones."""
        pk = keys.partition_key(parent)
        live = keys.fork_ref_key(parent_gen, keys.FORK_LIVE, fork_id, fork_gen)
        item = self._get_item(pk, live)
        if item is None:
            return
        ref = forks.decode_ref(item)
        self._put_items([forks.ref_item(parent, replace(ref, live=False))])
        self._delete_items(pk, [live])

    def _release(
        self, parent: ConversationKey, parent_gen: str, fork_id: str, fork_gen: str
    ) -> PurgeReport:
        """Drop the reference of a deleted fork to its parent's life, and delete that life
        if it is gone (no head of it stands) and no other fork reads it; then the same for
        its own parent, and so on.

        Safe against the parent's own purge: a purge writes its tombstone before it reads
        the references, so either it sees none left (and deletes everything), or this
        release, deleting the last one after that, finds the life's head gone.
        """
        report = PurgeReport()
        # Origins of reclaimed lives go last, for the reason release_forks gives.
        origins: list[tuple[str, str]] = []
        try:
            self._release_up(parent, parent_gen, fork_id, fork_gen, report, origins)
        finally:
            for pk, sort_key in origins:
                self._delete_items(pk, [sort_key])
        return report

    def _release_up(
        self,
        parent: ConversationKey,
        parent_gen: str,
        fork_id: str,
        fork_gen: str,
        report: PurgeReport,
        origins: list[tuple[str, str]],
    ) -> None:
        for _ in range(MAX_FORK_DEPTH + 1):
            pk = keys.partition_key(parent)
            self._delete_items(
                pk,
                [
                    keys.fork_ref_key(parent_gen, state, fork_id, fork_gen)
                    for state in (keys.FORK_LIVE, keys.FORK_KEPT)
                ],
            )
            head = self._get_item(pk, keys.HEAD_SK)
            if head is not None and head.get(codec.A_GEN) == parent_gen:
                return  # the life stands: its own purge decides
            lower, upper = forks.prefix_bounds(keys.fork_refs_prefix(parent_gen))
            if next(self._keys_between(pk, lower, upper), None) is not None:
                return  # other forks still read it
            report.reclaimed_lives += 1
            self.sealer.destroy(parent, [parent_gen])  # keys first, as a purge does
            report.objects += self.blobs.delete_keys(
                self.blobs.list_keys(keys.blob_prefix(parent, parent_gen))
            )
            report.events += self._delete_life_events(parent, parent_gen)
            self._drop_kept_tombstone(pk)
            origin = self._get_item(pk, keys.origin_key(parent_gen))
            if origin is None:
                return
            origins.append((pk, keys.origin_key(parent_gen)))
            fork_id, fork_gen = parent.conversation_id, parent_gen
            parent_id, parent_gen = forks.decode_origin(origin)
            parent = ConversationKey(tenant=parent.tenant, conversation_id=parent_id)

    def _drop_kept_tombstone(self, pk: str) -> None:
        """Delete the tombstone a purge kept for forks (:meth:`_finish_purge`) once no fork
        reads any event of the partition. Only such a tombstone (no expiry): one whose purge
        is still running must stay until that purge deletes it."""
        if next(self._keys_between(pk, *forks.prefix_bounds(keys.FORK_REF_PREFIX)), None):
            return
        item = self._get_item(pk, keys.HEAD_SK)
        if item is None or codec.A_FENCE in item or codec.A_EXPIRES in item:
            return
        tomb = _tombstone_of(item)
        if tomb is not None:
            self._delete_head(pk, item)

    def _delete_life_events(self, key: ConversationKey, gen: str) -> int:
        """Delete the event items of ``key``'s life ``gen``: a gone life kept for its forks.

        Lives occupy consecutive ranges of storage sequences, so the scan stops at the
        first event of another life after this one's.
        """
        doomed: list[EventStamp] = []
        lower, upper = keys.event_sort_key(0), keys.event_sort_key(10**12 - 1)
        # Lazily, page by page: the reads stop where this life's events end.
        for item in self._keys_between(keys.partition_key(key), lower, upper):
            if item.get(codec.A_GEN) == gen:
                doomed.append(EventStamp(str(item[codec.A_SK]), gen, _events_in(item)))
            elif doomed:
                break
        return sum(stamp.events for stamp in doomed if self.delete_event(key, stamp))

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
        event item's key is a free slot for the life ``gen`` (:func:`.codec.slot_free`
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
        (:func:`.codec.slot_free` with ``marker_version``): one conditional write, the
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

    # --- the run flag (drafts: turnledger/turn/drafts.py) ----------------------------------

    def put_run_flag(
        self, key: ConversationKey, flag: RunFlag, *, expires_at: int | None = None
    ) -> None:
        """Put ``key``'s run flag (``HEAD#run``, replacing the one there): what :meth:`load`
        reads with the head (:attr:`Snapshot.run`). ``expires_at``: its TTL (epoch seconds).
        A purge deletes it with the partition (a flag of another life than the next)."""
        item: Item = {
            codec.A_PK: keys.partition_key(key),
            codec.A_SK: keys.RUN_FLAG_SK,
            _A_RUN_TURN: flag.turn,
            _A_RUN_AT: flag.started_at,
        }
        if flag.gen is not None:
            item[codec.A_GEN] = flag.gen
        if expires_at is not None:
            item[codec.A_EXPIRES] = expires_at
        self._put_items([item])

    # --- side items (drafts: turnledger/turn/drafts.py; api/openai/matching.py) ----------------
    #
    # Items of a conversation's partition beside the transcript (sort keys under
    # ``keys.SIDE_PREFIX``, after ``"HEAD"``), never read by :meth:`load`: a purge deletes
    # them with the rest, and with each its ``companion`` (a side item of the tenant's own
    # partition, ``keys.tenant_items``: the OpenAI face's transcript index). The caller
    # hands data (:class:`.codec.SideItem`); the store owns the item's keys, its TTL
    # attribute, its life attribute and its companion attribute.

    def put_side_item(self, key: ConversationKey, side: SideItem) -> None:
        """Put ``side`` in ``key``'s partition, unconditionally (replacing what was there).

        Raises:
            PayloadTooLarge: the item is over the backend's item size limit.
            InternalError: not a side item's sort key, or a reserved attribute.
        """
        item = self.sealer.seal(codec.encode_side_item(key, side))
        codec.check_item_sizes([item])
        self._put_items([item])

    def get_side_item(self, key: ConversationKey, sort_key: str) -> SideItem | None:
        """The side item at ``sort_key`` of ``key``, read consistently, or ``None``."""
        item = self._get_item(keys.partition_key(key), _side_key(sort_key))
        return None if item is None else codec.decode_side_item(self.sealer.open(item))

    def query_side_items(
        self,
        key: ConversationKey,
        *,
        lower: str,
        upper: str,
        limit: int = 1000,
        consistent: bool = True,
    ) -> list[SideItem]:
        """The side items of ``key`` with ``lower <= sort key <= upper``, in key order (every
        page). ``consistent=False`` may miss the newest writes (half the price on DynamoDB).
        """
        pk = keys.partition_key(key)
        found: list[SideItem] = []
        cursor: Any = None
        while True:
            page = self._query(
                pk,
                lower=_side_key(lower),
                upper=_side_key(upper),
                descending=False,
                limit=limit,
                cursor=cursor,
                consistent=consistent,
            )
            found.extend(codec.decode_side_item(self.sealer.open(item)) for item in page.items)
            if page.cursor is None:
                return found
            cursor = page.cursor

    def _readable(self, item: Item) -> list[Item]:
        """``item`` opened, or nothing when its content is unreadable (erased: a listing
        leaves such an item out rather than failing for every other one)."""
        try:
            return [self.sealer.open(item)]
        except ContentUnreadable:
            return []

    def delete_side_items(self, key: ConversationKey, sort_keys: list[str]) -> None:
        """Delete the side items of ``key`` at ``sort_keys`` (absent ones are fine)."""
        self._delete_items(keys.partition_key(key), [_side_key(sk) for sk in sort_keys])

    @abstractmethod
    def _put_items(self, items: list[Item]) -> None:
        """Put each of ``items`` unconditionally (not atomically as a group)."""

    # --- idempotency records (api/idempotency_records.py: Powertools' persistence layer) --
    #
    # Items ``I#<hash>`` of a conversation's partition (:mod:`.records`), so a purge removes
    # them with the conversation.

    def get_record(self, key: ConversationKey, record_key: str) -> records.Record | None:
        """The idempotency record ``record_key`` of ``key``, read consistently, or ``None``
        (whether or not it has expired: the caller judges that)."""
        item = self._get_item(keys.partition_key(key), _record_key(record_key))
        return None if item is None else records.decode_record(self.sealer.open(item))

    def put_record(
        self, key: ConversationKey, record: records.Record, *, now: float
    ) -> records.Record | None:
        """Put ``record`` unless a live record holds its key at ``now`` (epoch seconds).

        The put condition is Powertools' (:func:`.records.may_replace`): no record, an
        expired one, or one in progress whose in-progress expiry has passed. Atomic: of
        two puts racing for one key, exactly one is written.

        Returns:
            ``None`` when ``record`` was written; else the live record that refused it.

        Raises:
            PayloadTooLarge: the record is over the backend's item size limit.
        """
        item = self.sealer.seal(
            records.record_item(keys.partition_key(key), _checked_record(record))
        )
        codec.check_item_sizes([item])
        stored = self._put_if_replaceable(item, now)
        return None if stored is None else records.decode_record(self.sealer.open(stored))

    def update_record(self, key: ConversationKey, record: records.Record) -> None:
        """Set ``record``'s status, expiry, answer and validation hash (when it has one),
        unconditionally, creating the record if it is absent; its in-progress expiry stays
        as stored.

        Raises:
            PayloadTooLarge: the record would be over the backend's item size limit.
        """
        pk = keys.partition_key(key)
        codec.check_item_sizes([records.record_item(pk, _checked_record(record))])
        attributes = records.update_attributes(record)
        self._set_attributes(
            pk, record.key, self.sealer.seal_attributes(pk, record.key, None, attributes)
        )

    def delete_record(self, key: ConversationKey, record_key: str) -> None:
        """Delete the idempotency record ``record_key`` of ``key`` (absent is fine)."""
        self._delete_items(keys.partition_key(key), [_record_key(record_key)])

    # --- indexes and the sweep cursor ---------------------------------------------------

    #: Index entries a page of :meth:`expiring_in` and :meth:`of_tenant` reads.
    index_page_size: int = INDEX_PAGE_SIZE

    def head_item(self, key: ConversationKey) -> Item | None:
        """The raw head item, read consistently (``None`` when absent); nothing is decoded."""
        return self._get_item(keys.partition_key(key), keys.HEAD_SK)

    def seal_existing(self, key: ConversationKey) -> SealReport:
        """Rewrite sealed every item of ``key``'s partition whose content is still clear
        (written before encryption was on), as a write would seal it (:class:`.sealed.ItemSealer`),
        then the objects of its live life (:meth:`.sealed.SealedBlobStore.seal_existing`):
        the migration's one-off command (``turnledger seal-existing``).

        Each rewrite is conditional on the item being unchanged since it was read, so a
        concurrent commit, clear or erasure is never overwritten. Items of a life being
        purged are left alone: all of them when the head is fenced or absent, those of
        other lives than the tombstone's when it is a tombstone. Idempotent: a second run
        seals nothing.

        Also works on the partitions that hold no head (:func:`.keys.tenant_items`,
        :func:`.keys.memory_items`): their items belong to no life.
        """
        if self.sealer.keyring is None:
            raise InvalidRequest("this store has no keys: content sealing is not configured")
        pk = keys.partition_key(key)
        report = SealReport()
        headless = key.conversation_id == keys.TENANT_ITEMS_ID or key.conversation_id.startswith(
            keys.MEMORY_ITEMS_PREFIX
        )
        head = None if headless else self._get_item(pk, keys.HEAD_SK)
        purging: str | None = None  # the one life whose items may be sealed, if any
        if not headless:
            tomb = None if head is None else _tombstone_of(head)
            if head is None or codec.A_FENCE in head:
                purging = ""  # no life
            elif tomb is not None:
                purging = tomb.gen
        cursor: Any = None
        while True:
            page = self._query(
                pk, lower=None, upper=None, descending=False, limit=1000, cursor=cursor
            )
            for item in page.items:
                sealed = self.sealer.seal(item)
                if sealed is item or sealed == item:
                    report.already_sealed += 1
                elif purging is not None and item.get(codec.A_GEN) != purging:
                    report.skipped += 1
                elif codec.item_size(sealed) > codec.MAX_ITEM_BYTES:
                    report.skipped += 1  # read with its content clear, as it was written
                else:
                    # Only what sealing changes is set, on the condition that it is still
                    # as read: a concurrent writer's change (a fence, a gravestone) stays.
                    changed = {n: v for n, v in sealed.items() if item.get(n) != v}
                    expected = {n: item.get(n) for n in changed}
                    pk_sk = (str(item[codec.A_PK]), str(item[codec.A_SK]))
                    if self._set_if_unchanged(*pk_sk, changed, expected):
                        report.sealed += 1
                    else:
                        report.skipped += 1
            if page.cursor is None:
                break
            cursor = page.cursor
        if head is not None and purging is None and isinstance(self.blobs, SealedBlobStore):
            # The live life's objects, once its items are sealed (so its key exists).
            for object_key in list(self.blobs.list_keys(keys.blob_prefix(key, head[codec.A_GEN]))):
                done = self.blobs.seal_existing(object_key)
                if done is None:
                    report.skipped += 1
                elif done:
                    report.sealed += 1
                else:
                    report.already_sealed += 1
        return report

    def expiring_in(self, bucket: int, shard: int) -> Iterator[ConversationKey]:
        """Conversations whose head is filed under one shard of expiry ``bucket`` (``by-expiry``).

        Pages lazily, so a caller may purge as it goes; the index may lag behind
        the table: re-read the head before acting.
        """
        return self._index_keys(EXPIRY_INDEX, keys.expiry_partition(bucket, shard))

    def waiting_in(self, bucket: int, shard: int) -> Iterator[ConversationKey]:
        """Conversations whose earliest wait (a decision's window, a deferred call's deadline)
        closes in ``bucket`` (``by-wait``).

        Pages lazily; the index may lag behind the table: re-read before acting. A
        conversation is named once even when its head and inbox entries are all filed
        there (entries file their own waits: :mod:`.inbox`).
        """
        seen: set[ConversationKey] = set()
        for key in self._index_keys(WAIT_INDEX, keys.expiry_partition(bucket, shard)):
            if key not in seen:
                seen.add(key)
                yield key

    def of_tenant(self, tenant: str) -> Iterator[ConversationKey]:
        """Every conversation of ``tenant`` that has a head, tombstones included (``by-tenant``).

        Pages lazily, so a caller may clear as it goes; the index may lag behind
        the table.
        """
        return self._index_keys(TENANT_INDEX, tenant)

    def _index_keys(self, index: str, value: str) -> Iterator[ConversationKey]:
        cursor: Any = None
        while True:
            page = self._index_page(index, value, limit=self.index_page_size, cursor=cursor)
            for item in page.items:
                try:
                    yield keys.parse_partition_key(str(item[codec.A_PK]))
                except ValueError:
                    continue  # not a conversation (a foreign item)
            if page.cursor is None:
                return
            cursor = page.cursor

    def event_stamps(self, key: ConversationKey) -> list[EventStamp]:
        """Every event item of ``key``'s partition (sort key and life), ascending, consistently.

        Read whole before it returns (all pages). What reclaiming orphans needs: it
        deletes by life, never by range.
        """
        lower, upper = keys.event_sort_key(0), keys.event_sort_key(10**12 - 1)
        return [
            EventStamp(
                str(item[codec.A_SK]),
                gen if isinstance(gen := item.get(codec.A_GEN), str) else None,
                _events_in(item),
            )
            for item in self._keys_between(keys.partition_key(key), lower, upper)
        ]

    def delete_event(self, key: ConversationKey, stamp: EventStamp) -> bool:
        """Delete the event item at ``stamp.sort_key`` if its life is still ``stamp.gen``.

        Returns whether this call deleted it: ``False`` when it is gone already or
        was overwritten by another life since it was read.
        """
        return self._delete_if_gen(keys.partition_key(key), stamp.sort_key, stamp.gen)

    def read_sweep_cursor(self, of: SweepPass = "expiry") -> int | None:
        """The first bucket the sweep's pass ``of`` has not fully swept (``"expiry"``: of
        ``by-expiry``; ``"waits"``: of ``by-wait``); ``None``: none stored, or of an unknown
        schema version."""
        return cursor_bucket(self._get_item(CURSOR_PK, cursor_sort_key(of)))

    def advance_sweep_cursor(self, bucket: int, of: SweepPass = "expiry") -> bool:
        """Move the cursor of the sweep's pass ``of`` to ``bucket`` if that is forward;
        returns whether it moved.

        Concurrent sweeps may both call this: a cursor never goes back, and one of an
        unknown schema version is never overwritten.
        """
        return self._advance_cursor(cursor_item(bucket, of))

    # --- the approval inbox --------------------------------------------------------------

    #: Index queries one inbox page may take when filters or expiries skip entries.
    inbox_rounds: int = 8

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
        """Up to ``limit`` calls of ``tenant`` waiting for a person, oldest request first.

        Calls whose window closed by ``now`` are left out (the next request on their
        conversation, or the sweep, records the expiry and removes the entry), as are
        entries not matching ``tool`` or ``conversation_id``: reading goes on past them
        for at most :attr:`inbox_rounds` index queries, so a filter that matches little
        costs a bounded time per request. A page may then hold fewer than ``limit``
        calls and still name where the next one starts.
        """
        partition = inbox.inbox_partition(tenant)
        filtering = tool is not None or conversation_id is not None
        chosen: list[tuple[inbox.InboxEntry, EntryKey]] = []
        position = after
        for _ in range(self.inbox_rounds):
            wanted = limit - len(chosen) + 1  # one more than needed: is there a next page?
            page = self._inbox_query(
                partition,
                after=position,
                limit=max(wanted, inbox.FILTERED_READ) if filtering else wanted,
            )
            for item in page.items:
                chosen.extend(
                    inbox.select(
                        self._readable(item), now=now, tool=tool, conversation_id=conversation_id
                    )
                )
                if len(chosen) > limit:
                    # The next page starts right after the last call shown.
                    return inbox.InboxPage([e for e, _ in chosen[:limit]], chosen[limit - 1][1])
            if page.cursor is None:
                return inbox.InboxPage([e for e, _ in chosen], None)
            # Everything read so far was shown or skipped: go on after the last item read.
            position = page.cursor
            if len(chosen) == limit:
                break
        return inbox.InboxPage([e for e, _ in chosen], position)

    # --- imports: all or nothing over several commits ------------------------------------

    #: How long an import's hidden staging head lives: past this, the sweep (or DynamoDB's
    #: TTL) treats it as a dead purge and removes what the import had written.
    import_staging_seconds: int = 900
    #: Item bytes one staging write holds at most (DynamoDB's transactions take 4 MB).
    import_chunk_bytes: int = 3_000_000

    def import_conversation(
        self, key: ConversationKey, head: Head, events: Sequence[Event], now: datetime
    ) -> Head:
        """Create ``key`` as ``head`` with ``events`` (public sequences 1..n), all or nothing.

        ``head`` gives the conversation's state; its ``gen``, ``version``, ``base`` and
        ``seq`` are chosen here. The events go in commits of at most
        ``MAX_EVENTS_PER_COMMIT``, each under a *staging head*: a tombstone (which
        every reader sees as absent) whose ``base`` covers everything staged so far,
        naming a next life other than the one the events are written in. The final
        write replaces the staging head with ``head``, conditionally, so the
        conversation appears whole or not at all. A failure purges the staging head;
        a crash leaves it, and since it is a tombstone due in
        ``import_staging_seconds``, clear, sweep and TTL remove it with every event
        and object it covers, like a purge that died. A turn sent meanwhile starts its
        life above the staged events and makes the import fail ``ConversationBusy``.

        Returns:
            The head as written.

        Raises:
            ConversationExists: the id holds a live (or unreadable) conversation.
            ConversationBusy: a clear is in flight, or the head changed during the import.
            PayloadTooLarge: an event is over what the backend holds.
        """
        pk = keys.partition_key(key)
        item = self._get_item(pk, keys.HEAD_SK)
        if item is not None and codec.A_FENCE in item:
            raise ConversationBusy("the conversation is being cleared; retry")
        previous: Head | None = None
        if item is not None:
            try:
                previous = codec.decode_head(codec.without_content(item))
            except StateError as exc:
                raise ConversationExists(
                    f"conversation {key.conversation_id!r} exists (its head cannot be read)"
                ) from exc
            if previous.status is not ConversationStatus.CLEARED:
                raise ConversationExists(f"conversation {key.conversation_id!r} exists")
        # Above every item of the partition, so nothing staged ever overwrites an old one.
        base = max(previous.seq if previous else 0, self._highest_event_sequence(pk))
        final = head.model_copy(update={"gen": new_generation(), "base": base})
        staging_gen = new_generation()
        expected = item  # the stored head each step is conditional on
        version = previous.version if previous else 0
        written = 0
        attempt = secrets.token_hex(4)
        try:
            for chunk in self._import_chunks(key, final, events, attempt):
                staging = Head(
                    gen=staging_gen,
                    version=version + 1,
                    base=base + written + len(chunk),
                    seq=base + written + len(chunk),
                    turn=0,
                    status=ConversationStatus.CLEARED,
                    created_at=now,
                    updated_at=now,
                    ttl_seconds=0,
                    expires_at=int(now.timestamp()) + self.import_staging_seconds,
                )
                staging_item = codec.encode_head(key, staging)
                stored_gen = str(expected.get(codec.A_GEN, "")) if expected is not None else ""
                try:
                    self._transact_commit(
                        staging_item,
                        None if expected is None else codec.expected_head(version, stored_gen),
                        [event_item for event_item, _ in chunk],
                        stored_gen,
                    )
                except BaseException:
                    self._discard([ref for _, ref in chunk if ref is not None])
                    raise
                expected, version, written = staging_item, staging.version, written + len(chunk)
            final = final.model_copy(update={"version": version + 1, "seq": base + written})
            if not self._replace_head(self.sealer.seal(codec.encode_head(key, final)), expected):
                raise ConversationBusy("the conversation changed during the import; retry")
        except TurnledgerError:
            if written:
                # Best effort: what is left is a due tombstone that the sweep finishes.
                with contextlib.suppress(Exception):
                    self._purge(key, expected, now)
            raise
        return final

    def _import_chunks(
        self, key: ConversationKey, head: Head, events: Sequence[Event], attempt: str
    ) -> Iterator[list[tuple[Item, str | None]]]:
        """``events`` as items of ``head``'s life (payloads offloaded as a commit would), in
        chunks of at most ``MAX_EVENTS_PER_COMMIT`` items and ``import_chunk_bytes``."""
        chunk: list[tuple[Item, str | None]] = []
        size = 0
        for event in events:
            payload = codec.stored_payload(event)
            ref = self._offload(key, head, event.sequence, payload, attempt)
            event_item = self.sealer.seal(
                codec.encode_event(key, head, event, ref, payload=payload)
            )
            item_bytes = codec.item_size(event_item)
            if chunk and (
                len(chunk) >= MAX_EVENTS_PER_COMMIT or size + item_bytes > self.import_chunk_bytes
            ):
                yield chunk
                chunk, size = [], 0
            chunk.append((event_item, ref.key if ref else None))
            size += item_bytes
        if chunk:
            yield chunk
