"""One request's work on one conversation: staged events, pending calls, commits.

A :class:`Session` starts from what the store returned (head and context
events), stages new events in sequence order and commits them with the new
head in one atomic write. The head's status, lease and cancel are what the turn's
owner (``session.life``, :class:`~turnledger.turn.lifecycle.TurnLife`) says; the
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
from datetime import UTC, datetime

from aws_lambda_powertools.metrics import MetricUnit

from ..core.models import (
    KIND_OF_PAYLOAD,
    CancelRequest,
    ConversationKey,
    Event,
    Head,
    Lease,
    Payload,
    PendingCall,
    ProviderCursor,
    SummaryRef,
    TurnOptions,
    Usage,
)
from ..core.observability import metrics
from ..store import keys
from ..store.base import ConversationStore, new_generation
from .lifecycle import TurnLife, head_wait_deadline, inbox_changes, is_tombstone

Clock = Callable[[], datetime]
#: Told of each commit that landed: the key, the pending calls before it, the head it
#: wrote and its events (notifications; must not raise).
CommitHook = Callable[[ConversationKey, list[PendingCall], Head, list[Event]], None]


def utc_now() -> datetime:
    """The wall clock, tz-aware."""
    return datetime.now(UTC)


def new_event_id() -> str:
    """A unique, roughly time-ordered event id."""
    return f"ev_{int(utc_now().timestamp() * 1000):x}{secrets.token_hex(5)}"


@dataclass
class Session:
    """Mutable state of one request on one conversation."""

    store: ConversationStore
    key: ConversationKey
    clock: Clock
    ttl_seconds: int
    #: The last committed head of this life, or ``None`` before the first commit.
    head: Head | None
    #: Where a new life starts: the tombstone it replaces (``None``: nothing stored).
    predecessor: Head | None = None
    #: Committed events the context needs, oldest first.
    history: list[Event] = field(default_factory=list)
    staged: list[Event] = field(default_factory=list)
    pending: list[PendingCall] = field(default_factory=list)
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
    #: Held while this request runs tools (taken and released by :attr:`life`).
    lease: Lease | None = None
    #: A cancel request for the running turn (written by :attr:`life`).
    cancel: CancelRequest | None = None
    #: The life this session writes: the head's, the tombstone's successor, or a new one.
    gen: str = field(default_factory=new_generation)
    on_commit: CommitHook | None = None
    #: The turn's owner: every move of its calls and run, and the status commits write.
    life: TurnLife = field(init=False)

    def __post_init__(self) -> None:
        previous = self.head or self.predecessor
        if previous is not None:
            self.gen = previous.gen
        self.life = TurnLife(self)

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
            pending=list(head.pending),
            turn=head.turn,
            usage=head.usage,
            options=head.options,
            summary=head.summary,
            failed_turns=head.failed_turns,
            cost_usd=head.cost_usd,
            token_scale=head.token_scale,
            provider_cursor=head.provider_cursor,
            memory_off=head.memory_off,
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
        self.pending = list(head.pending) if head else []
        self.turn = head.turn if head else 0
        self.usage = head.usage if head else Usage()
        self.options = head.options if head else TurnOptions()
        self.summary = head.summary if head else None
        self.failed_turns = head.failed_turns if head else 0
        self.cost_usd = head.cost_usd if head else 0.0
        self.token_scale = head.token_scale if head else None
        self.provider_cursor = head.provider_cursor if head else None
        self.memory_off = head.memory_off if head else False
        self.lease = None
        self.cancel = None
        self.life.rolled_back()

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

    def commit(self) -> Head:
        """Write the staged events and the new head atomically, with the status the
        turn's owner (:attr:`life`) derives: no caller chooses a status.

        Raises:
            ConversationBusy: another request committed on this conversation first.
        """
        now = self.clock()
        status, lease, cancel = self.life.written()
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
            pending=self.pending,
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
        )
        changes = inbox_changes(self.key, previous, head)
        head = head.model_copy(update={"wait_deadline": head_wait_deadline(self.pending, changes)})
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
        self.predecessor = None
        if self.on_commit is not None:
            self.on_commit(self.key, list(previous.pending) if previous else [], head, committed)
        return head
