"""Forks: a conversation continued separately from the end of any of its turns.

A fork is a conversation of its own (turns, tools, approvals, TTL, export...) whose log
begins with its parent's events up to the fork point. Nothing is copied: the fork's head
names where those events are (:class:`~turnledger.core.models.ForkOrigin`), and public
sequence numbers are the same in every conversation of a lineage, so each inherited event
keeps its number. The store keeps what forks read when a parent is deleted or expires, and
reclaims it when the last fork that reads it goes (:mod:`turnledger.store.forks`).

What a fork takes from its parent at the fork point:

* the history (read through, never copied) and the summary, when the parent's newest one
  is at or before the fork point (an older one is found in the history, as any turn does);
* the provider cursor, when the answer ending the fork point is a stored response the
  provider can continue from (the Responses API: the run record names its id and what it
  was made with); else the fork's first call is ``fresh``;
* the token calibration. Usage and cost count the fork's own model calls only;
* the pins in force at the fork point (:func:`inherited_pins`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from ..context.pins import pins_before
from ..core.exceptions import (
    ConversationBusy,
    ConversationExists,
    ForkPointOpen,
    ForkTooDeep,
    InvalidForkPoint,
)
from ..core.models import (
    MAX_FORK_DEPTH,
    AssistantMessage,
    ConversationKey,
    Event,
    EventKind,
    ForkOrigin,
    ForkSegment,
    Head,
    Pin,
    ProviderCursor,
)
from ..store import keys
from ..store.base import ConversationStore, new_generation
from ..store.reads import stored_at
from .lifecycle import fork_refusal, fork_status, is_tombstone

#: Times a fork is tried again when its parent changed between its read and its write.
FORK_ATTEMPTS = 3


@dataclass(frozen=True)
class ForkPoint:
    """Where a fork begins: after ``turn``, whose last event is public sequence ``seq``."""

    turn: int
    seq: int


def fork_point(store: ConversationStore, key: ConversationKey, head: Head, turn: int) -> ForkPoint:
    """The end of ``turn`` in ``head``'s log: its last event's public sequence.

    The latest turn ends at the head; an earlier one is found by bisection over the log
    (turn numbers never decrease along it), one point read per step.

    Raises:
        InvalidForkPoint: the conversation has no turn ``turn``.
    """
    if not 0 <= turn <= head.turn:
        raise InvalidForkPoint(
            f"after_turn must be between 0 and the latest turn ({head.turn})",
            details={"after_turn": turn, "turns": head.turn},
        )
    if turn == head.turn:
        return ForkPoint(turn=turn, seq=head.event_count)
    low, high = 0, head.event_count  # the answer is in low..high; sequence 0 is "before all"
    while low < high:
        middle = (low + high + 1) // 2
        if stored_at(store, key, head, middle).turn <= turn:
            low = middle
        else:
            high = middle - 1
    return ForkPoint(turn=turn, seq=low)


def lineage(parent: ConversationKey, head: Head, point: ForkPoint) -> list[ForkSegment]:
    """Where a fork of ``head`` at ``point`` finds its inherited events, oldest first.

    Raises:
        ForkTooDeep: more than :data:`MAX_FORK_DEPTH` conversations would be read.
    """
    segments: list[ForkSegment] = []
    inherited = head.fork.segments if head.fork is not None else []
    for segment in inherited:
        if segment.through >= point.seq:
            segments.append(segment.model_copy(update={"through": point.seq}))
            break
        segments.append(segment)
    own_from = head.fork.seq if head.fork is not None else 0
    if point.seq > own_from:
        segments.append(
            ForkSegment(
                conversation_id=parent.conversation_id,
                gen=head.gen,
                base=head.base,
                through=point.seq,
            )
        )
    if len(segments) > MAX_FORK_DEPTH:
        raise ForkTooDeep(
            f"a fork reads at most {MAX_FORK_DEPTH} conversations; fork an earlier one instead",
            details={"depth": len(segments), "max_depth": MAX_FORK_DEPTH},
        )
    return segments


#: Events read per store query while a fork looks for pins removed after its point.
_PAGE = 1000


def inherited_pins(
    store: ConversationStore, key: ConversationKey, head: Head, point: ForkPoint
) -> list[Pin]:
    """The pins in force at ``point``: the parent's active pins added by then, and those
    removed since that were (read from the events after ``point``; none at the head)."""
    later: list[Event] = []
    while point.seq + len(later) < head.event_count:
        page = store.read_events(key, head, after=point.seq + len(later), limit=_PAGE)
        if not page:
            break
        later.extend(page)
    return pins_before(head.pins, later, point.seq)


def inherited_cursor(
    store: ConversationStore, key: ConversationKey, head: Head, point: ForkPoint
) -> ProviderCursor | None:
    """The provider cursor a fork at ``point`` may continue from, or ``None`` (``fresh``).

    The parent's own cursor when it covers exactly the fork point; else the stored response
    the answer ending the fork point names, when its run record says what it was made with.
    """
    cursor = head.provider_cursor
    if cursor is not None and cursor.sequence == point.seq:
        # Still the parent's (or its own parent's): deleting the fork never deletes it.
        if cursor.conversation_id is None:
            return cursor.model_copy(update={"conversation_id": key.conversation_id})
        return cursor
    if point.seq == 0:
        return None
    event = store.event_at(key, head, point.seq)
    if event.kind is not EventKind.ASSISTANT_MESSAGE:
        return None
    answer = event.body()
    assert isinstance(answer, AssistantMessage)
    run = answer.run
    if run is None or run.response_id is None or run.made_with is None:
        return None
    return ProviderCursor(
        provider=run.provider,
        api="responses",
        model=run.model,
        response_id=run.response_id,
        created_at=event.occurred_at,
        tenant=key.tenant,
        context_sha256=run.made_with,
        sequence=point.seq,
        conversation_id=key.conversation_id,
    )


def create_fork(
    store: ConversationStore,
    parent: ConversationKey,
    target: ConversationKey,
    *,
    after_turn: int | None,
    ttl_seconds: int,
    clock: Callable[[], datetime],
    visible_head: Callable[[ConversationKey], Head],
) -> Head:
    """Fork ``parent`` after ``after_turn`` (default: its latest turn) as ``target``.

    Writes a constant number of items whatever the parent's length (:meth:`.fork`).

    Raises:
        ConversationNotFound: the parent is absent, expired, cleared or another tenant's.
        ConversationExists: ``target`` is a live conversation.
        InvalidForkPoint: ``after_turn`` names no turn of the parent.
        ForkPointOpen: the parent's latest turn is the fork point and it still waits.
        ForkTooDeep: the fork's lineage would be too long.
        ConversationBusy: the parent kept changing while the fork was written.
    """
    for _ in range(FORK_ATTEMPTS):
        head = visible_head(parent)
        now = clock()
        turn = head.turn if after_turn is None else after_turn
        if turn == head.turn:
            reason = fork_refusal(head, now)
            if reason is not None:
                raise ForkPointOpen(
                    f"turn {turn} is not settled ({reason}): fork after it once it is, or "
                    "after an earlier turn",
                    details={"status": reason, "turn": turn},
                )
        point = fork_point(store, parent, head, turn)
        previous = _target_head(store, target, now)
        expires_at = int(now.timestamp()) + ttl_seconds if ttl_seconds else None
        base = previous.base if previous is not None else 0
        fork = Head(
            gen=previous.gen if previous is not None else new_generation(),
            version=previous.version + 1 if previous is not None else 1,
            base=base,
            seq=base + point.seq,
            turn=point.turn,
            status=fork_status(),
            created_at=now,
            updated_at=now,
            ttl_seconds=ttl_seconds,
            expires_at=expires_at,
            expiry_bucket=keys.bucket_of(expires_at) if expires_at is not None else None,
            summary=head.summary
            if head.summary is not None and head.summary.sequence <= point.seq
            else None,
            token_scale=head.token_scale,
            memory_off=head.memory_off,
            data_class=head.data_class,
            pins=inherited_pins(store, parent, head, point),
            provider_cursor=inherited_cursor(store, parent, head, point),
            fork=ForkOrigin(
                conversation_id=parent.conversation_id,
                gen=head.gen,
                turn=point.turn,
                seq=point.seq,
                segments=lineage(parent, head, point),
            ),
        )
        try:
            store.fork(
                parent,
                head,
                target,
                fork,
                expected_version=previous.version if previous is not None else None,
                now=now,
            )
        except ConversationBusy:
            _target_head(store, target, now)  # ConversationExists when it was taken meanwhile
            continue  # the parent changed (or a purge of the target ended): read again
        return fork
    raise ConversationBusy("the conversation kept changing while it was being forked; retry")


def _target_head(store: ConversationStore, target: ConversationKey, now: datetime) -> Head | None:
    """The tombstone a fork at ``target`` starts its life on, or ``None`` for no head.

    Raises:
        ConversationExists: ``target`` is a live conversation.
    """
    head = store.get_head(target)
    if head is not None and not is_tombstone(head) and head.is_expired(now):
        # Expired: purged first, as a turn on it would.
        store.purge_if_unchanged(target, head, now)
        head = store.get_head(target)
    if head is None or is_tombstone(head):
        return head
    raise ConversationExists(
        f"conversation {target.conversation_id!r} already exists",
        details={"conversation_id": target.conversation_id},
    )
