"""One request's work on one conversation: the head it read, staged events, commits.

A :class:`Session` starts from what the store returned (head and context
events), stages new events in sequence order and commits them with the new
head in one atomic write. The turn's pending calls, lease and cancel belong to its
state machine (``session.machine``, :class:`~turnledger.turn.machine.TurnMachine`):
the head's status, pending calls, lease and cancel are what it says; the
commit also hands the store the head's wait deadline and the inbox entries to write
or delete (:func:`~turnledger.turn.lifecycle.inbox_changes`), then tells the commit
hook (notifications) what landed. A request may commit more than once (a tool turn
records its intent before running anything); each commit expects the version
the previous one wrote, so a concurrent request on the same conversation
loses with ``conversation_busy`` instead of interleaving.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from aws_lambda_powertools.metrics import MetricUnit

from ..core.models import (
    KIND_OF_PAYLOAD,
    ConversationKey,
    Event,
    Head,
    Payload,
    PendingCall,
    Pin,
    ProviderCursor,
    SummaryRef,
    TurnOptions,
    Usage,
)
from ..core.observability import metrics
from ..store import keys
from ..store.base import ConversationStore, new_generation
from .lifecycle import (
    cancel_requested,
    head_wait_deadline,
    holds_lease,
    inbox_changes,
    is_running,
    is_tombstone,
)
from .machine import TurnMachine

Clock = Callable[[], datetime]
#: Told of each commit that landed: the key, the pending calls before it, the head it
#: wrote and its events (notifications; must not raise).
CommitHook = Callable[[ConversationKey, list[PendingCall], Head, list[Event]], None]
#: The retention in seconds of a data class by name (``None``: it keeps its content).
RetentionOf = Callable[[str], int | None]


def utc_now() -> datetime:
    """The wall clock, tz-aware."""
    return datetime.now(UTC)


def new_event_id() -> str:
    """A unique, roughly time-ordered event id."""
    return f"ev_{int(utc_now().timestamp() * 1000):x}{secrets.token_hex(5)}"


@dataclass
class Session:
    """Mutable state of one request on one conversation: the head it read, what it
    stages for the next commit (events and the head's fields), and its turn's machine."""

    store: ConversationStore
    key: ConversationKey
    clock: Clock
    ttl_seconds: int
    #: The last committed head of this life (generation), or ``None`` before the first commit.
    head: Head | None
    #: Where a new life starts: the tombstone it replaces (``None``: nothing stored).
    predecessor: Head | None = None
    #: Committed events the context needs, oldest first.
    history: list[Event] = field(default_factory=list)
    staged: list[Event] = field(default_factory=list)
    turn: int = 0
    usage: Usage = field(default_factory=Usage)
    options: TurnOptions = field(default_factory=TurnOptions)
    summary: SummaryRef | None = None
    failed_turns: int = 0
    cost_usd: float = 0.0
    token_scale: float | None = None
    provider_cursor: ProviderCursor | None = None
    #: The conversation opted out of long-term memory (:attr:`Head.memory_off`).
    memory_off: bool = False
    #: The conversation's data class (:attr:`Head.data_class`): it only rises.
    data_class: str | None = None
    #: When retained content falls due (:attr:`Head.retention_due`): as read; a commit
    #: sets it when none is (:meth:`_retention_due`), the sweep moves it.
    retention_due: datetime | None = None
    #: The retention of a class of the tenant's policy (``None``: no policy).
    retention_of: RetentionOf | None = None
    #: The active pins (:attr:`Head.pins`), oldest first.
    pins: list[Pin] = field(default_factory=list)
    #: The life (generation) this session writes: the head's, the tombstone's successor,
    #: or a new one.
    gen: str = field(default_factory=new_generation)
    on_commit: CommitHook | None = None
    #: The turn's state machine: its pending calls, run, lease and cancel, every move of
    #: them, the status commits write and the next step.
    machine: TurnMachine = field(init=False)

    def __post_init__(self) -> None:
        previous = self.head or self.predecessor
        if previous is not None:
            self.gen = previous.gen
        self.machine = TurnMachine.of(self.head)

    @classmethod
    def open(
        cls,
        store: ConversationStore,
        key: ConversationKey,
        *,
        head: Head | None,
        history: list[Event],
        clock: Clock,
        ttl_seconds: int,
    ) -> Session:
        """A session over a live head, or a new life over nothing or a tombstone."""
        if is_tombstone(head):
            return cls(store, key, clock, ttl_seconds, head=None, predecessor=head)
        if head is None:
            return cls(store, key, clock, ttl_seconds, head=None)
        return cls(
            store,
            key,
            clock,
            ttl_seconds,
            head=head,
            history=list(history),
            turn=head.turn,
            usage=head.usage,
            options=head.options,
            summary=head.summary,
            failed_turns=head.failed_turns,
            cost_usd=head.cost_usd,
            token_scale=head.token_scale,
            provider_cursor=head.provider_cursor,
            memory_off=head.memory_off,
            data_class=head.data_class,
            retention_due=head.retention_due,
            pins=list(head.pins),
        )

    @property
    def next_sequence(self) -> int:
        """The public sequence the next staged event gets."""
        return self._last_sequence + 1

    @property
    def _last_sequence(self) -> int:
        if self.staged:
            return self.staged[-1].sequence
        return self.head.seq - self.head.base if self.head else 0

    @property
    def events(self) -> list[Event]:
        """Context events: committed history plus what this request staged."""
        return [*self.history, *self.staged]

    def begin_turn(self) -> int:
        """Start a new turn number for the events staged next."""
        self.turn += 1
        return self.turn

    def rollback(self) -> None:
        """Drop everything staged since the last commit and the state it changed."""
        self.staged = []
        head = self.head
        self.turn = head.turn if head else 0
        self.usage = head.usage if head else Usage()
        self.options = head.options if head else TurnOptions()
        self.summary = head.summary if head else None
        self.failed_turns = head.failed_turns if head else 0
        self.cost_usd = head.cost_usd if head else 0.0
        self.token_scale = head.token_scale if head else None
        self.provider_cursor = head.provider_cursor if head else None
        self.memory_off = head.memory_off if head else False
        self.data_class = head.data_class if head else None
        self.retention_due = head.retention_due if head else None
        self.pins = list(head.pins) if head else []
        self.machine.reset(head.pending if head else [])

    def add(self, payload: Payload, *, actor: str, turn: int | None = None) -> Event:
        """Stage one event of the current turn (or of ``turn``)."""
        event = Event(
            event_id=new_event_id(),
            conversation_id=self.key.conversation_id,
            sequence=self._last_sequence + 1,
            turn=turn if turn is not None else max(self.turn, 1),
            kind=KIND_OF_PAYLOAD[type(payload)],
            actor=actor,
            occurred_at=self.clock(),
            payload=payload.model_dump(mode="json", exclude_defaults=False),
        )
        self.staged.append(event)
        return event

    def stage(self, payloads: list[Payload], *, actor: str) -> list[Event]:
        """Stage ``payloads`` in order, as events of the current turn."""
        return [self.add(payload, actor=actor) for payload in payloads]

    # --- the turn's run against the head read ----------------------------------------------

    def resuming(self) -> bool:
        """Whether this request picks up a run that died (its head mid-run, nothing staged)."""
        return is_running(self.head) and not self.staged

    def honour_cancel(self) -> bool:
        """Stop the turn a cancel asked to stop, if the head read carries one (a run that
        then died, or one this request took in while renewing its lease): its calls are
        cancelled and the stop staged (the runner commits it,
        :meth:`.runner.TurnRunner.stop_cancelled`). Returns whether it did.
        """
        head = self.head
        if head is None or not cancel_requested(head) or head.cancel is None:
            return False
        self.cancel_turn(by=head.cancel.requested_by, reason=head.cancel.reason)
        return True

    def adopt_cancel(self, fresh: Head | None, owner: str) -> bool:
        """Whether ``fresh`` (the head as stored now) differs from the one read only by a
        cancel asking ``owner``'s run to stop; if so the session takes it, cancel and all,
        so its next commit keeps the cancel instead of losing to it."""
        mine = self.head
        if (
            mine is None
            or fresh is None
            or fresh.gen != mine.gen
            or fresh.seq != mine.seq
            or fresh.pending != mine.pending
            or not cancel_requested(fresh)
            or not holds_lease(fresh, owner)
        ):
            return False
        self.head = fresh
        self.machine.take_cancel(fresh.cancel)
        return True

    def cancel_turn(self, *, by: str, reason: str | None = None) -> list[str]:
        """Stop the current turn (:meth:`TurnMachine.cancel_turn`) and stage what records
        it, with ``by`` as the actor. Returns the ids of the calls cancelled."""
        cancelled = self.machine.cancel_turn(by=by, reason=reason)
        self.stage(cancelled.events, actor=by)
        return cancelled.call_ids

    def _bucket(self, expires_at: int | None, now: datetime) -> int | None:
        """Keep this life's expiry-index bucket while it is still ahead of the sweep
        and not after the expiry; otherwise file the head under its expiry's bucket."""
        if expires_at is None:
            return None
        due = keys.bucket_of(expires_at)
        filed = self.head.expiry_bucket if self.head is not None else None
        if filed is not None and keys.bucket_of(int(now.timestamp())) <= filed <= due:
            return filed
        return due

    def _retention_due(self, now: datetime) -> datetime | None:
        """When the content a commit at ``now`` leaves falls due: as read when set and the
        class is the one read (the sweep that removes it moves it, so a plain turn writes
        no ``HEAD``); else, for a class with a retention, the life's start plus the
        retention, or ``now`` if that has passed, or the time read if earlier (early is
        safe: the sweep removes nothing not due, then files the head under the true
        time). A class that rose writes ``HEAD`` anyway. A conversation with no class asks
        for no policy."""
        read = self.retention_due
        risen = self.head is None or self.head.data_class != self.data_class
        if (read is not None and not risen) or self.data_class is None:
            return read
        if self.retention_of is None:
            return read
        seconds = self.retention_of(self.data_class)
        if seconds is None:
            return read
        start = self.head.created_at if self.head is not None else now
        due = max(start + timedelta(seconds=seconds), now)
        return due if read is None else min(read, due)

    def commit(self) -> Head:
        """Write the staged events and the new head atomically, with the status the
        turn's state machine (:attr:`machine`) derives: no caller chooses a status.

        Raises:
            ConversationBusy: another request committed on this conversation first.
        """
        now = self.clock()
        status, lease, cancel = self.machine.written()
        previous = self.head or self.predecessor
        base = previous.base if previous else 0
        expires_at = int(now.timestamp()) + self.ttl_seconds if self.ttl_seconds else None
        head = Head(
            gen=self.gen,
            version=(previous.version + 1) if previous else 1,
            base=base,
            seq=base + self._last_sequence,
            turn=self.turn,
            status=status,
            created_at=self.head.created_at if self.head else now,
            updated_at=now,
            ttl_seconds=self.ttl_seconds,
            expires_at=expires_at,
            expiry_bucket=self._bucket(expires_at, now),
            pending=self.machine.pending,
            usage=self.usage,
            options=self.options,
            summary=self.summary,
            failed_turns=self.failed_turns,
            cost_usd=self.cost_usd,
            token_scale=self.token_scale,
            provider_cursor=self.provider_cursor,
            lease=lease,
            cancel=cancel,
            fork=self.head.fork if self.head else None,
            memory_off=self.memory_off,
            data_class=self.data_class,
            retention_due=self._retention_due(now),
            pins=self.pins,
        )
        changes = inbox_changes(self.key, previous, head)
        head = head.model_copy(
            update={"wait_deadline": head_wait_deadline(self.machine.pending, changes)}
        )
        written = self.store.commit(
            self.key,
            expected_version=previous.version if previous else None,
            head=head,
            events=self.staged,
            inbox_changes=changes,
        )
        metrics.add_metric("BytesWritten", MetricUnit.Bytes, written)
        committed = self.staged
        self.history.extend(self.staged)
        self.staged = []
        self.head = head
        self.retention_due = head.retention_due
        self.predecessor = None
        if self.on_commit is not None:
            self.on_commit(self.key, list(previous.pending) if previous else [], head, committed)
        return head
