"""Reading turns: any turn's draft while it runs, its answer or error, and a history page.

Readers (:func:`read_any_turn`, :func:`follow`) read the draft items
(:mod:`.draft_items`): any process can follow any turn, from any chunk; a finished turn
whose draft keeps no answer is rebuilt from the log (:mod:`.turn_log`), as are the turns
of a history page (:func:`list_turns`). Running turns is :mod:`.longturns`'s: this module
loads none of it, so the read function's init loads no run code
(``tests/unit/test_cold_import.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING

from ..core.exceptions import ConversationNotFound, TurnledgerError
from ..core.models import ConversationKey, Event, Head
from . import draft_items as drafts
from . import turn_log
from .draft_items import DraftState
from .lifecycle import DraftMove, draft_move, is_running, logged_status
from .turn_log import LoggedTurn

if TYPE_CHECKING:
    from .reads import Reads

#: At most this long a stream request waits for something new (API Gateway's 30 s, less margin).
MAX_WAIT_SECONDS = 20
#: A draft ``in_progress`` for longer than the worker's longest run (15 minutes) is dead.
STALE_AFTER_SECONDS = 900
#: Lambda's limit of an asynchronous invocation's event (256 KiB), which carries the input.
#: Between two reads of a draft while a stream request waits.
POLL_SECONDS = 0.2


class TurnNotFound(TurnledgerError):
    """The conversation has no such turn, or the turn has no draft to read."""

    status = 404
    code = "turn_not_found"


@dataclass(frozen=True)
class DraftRead:
    """What a reader of a turn's draft got: chunks after a point, and the draft's state."""

    chunks: list[drafts.Chunk]
    #: Read on after this (the last chunk's seq, or where the read started if none came).
    next_after: int
    state: DraftState


def visible_head(service: Reads, key: ConversationKey) -> Head | None:
    head = service.store.get_head(key)
    return head if head is not None and head.is_visible(service.clock()) else None


def run_going(state: DraftState | None, now: datetime) -> bool:
    """Whether a draft state says a run is still going (not over, not stale)."""
    if state is None or state.done:
        return False
    try:
        started = datetime.fromisoformat(state.started_at)
    except ValueError:
        return False
    return (now - started).total_seconds() < STALE_AFTER_SECONDS


def overtaken(state: DraftState, head: Head | None, now: datetime) -> bool:
    """Whether an ``in_progress`` draft's run is over though its end was never written:
    the conversation was committed after the run began and no run holds its lease (a
    run that committed its turn and then failed to write the draft's end)."""
    if state.done or head is None or head.live_lease(now) is not None:
        return False
    try:
        started = datetime.fromisoformat(state.started_at)
    except ValueError:
        return False
    return head.updated_at > started


# --- reading ------------------------------------------------------------------------------


def _effective(state: DraftState, now: datetime) -> DraftState:
    """``state``, or ``interrupted`` (``worker_lost``) when its run went stale.

    A worker that died without a word (its timeout, or retries spent into the
    dead-letter queue) must not leave readers waiting for ever.
    """
    if state.done or run_going(state, now):
        return state
    error = TurnledgerError("the turn's worker stopped before the turn ended")
    body = error.to_body()
    body["error"]["status"] = error.status
    status = draft_move(state.status, DraftMove.INTERRUPT)
    return replace(state, status=status, reason="worker_lost", result=body)


def _draft(service: Reads, key: ConversationKey, head: Head | None, turn: int) -> DraftState | None:
    """``turn``'s draft state in this life of the conversation (``interrupted`` once its
    run went stale), or ``None``."""
    state = drafts.read_state(service.store, key, turn)
    if state is not None and head is not None and state.gen and state.gen != head.gen:
        # Written to another life of the conversation: a leftover of a cleared one (a run
        # that went on writing after the clear). Purges delete drafts with the partition.
        state = None
    if state is None:
        return None
    now = service.clock()
    if overtaken(state, head, now) and _log_tells(service, key, head, turn):
        return None  # its run committed the turn: the log tells the rest
    return _effective(state, now)


def _log_tells(service: Reads, key: ConversationKey, head: Head | None, turn: int) -> bool:
    """Whether the log holds ``turn`` (it is the head's, or the failure after it)."""
    return head is not None and (
        turn <= head.turn
        or (turn == head.turn + 1 and bool(turn_log.turn_events(service.store, key, head, turn)))
    )


def _readable(service: Reads, key: ConversationKey, turn: int) -> DraftState:
    """The draft state of a turn of ``key``.

    Raises:
        ConversationNotFound: no such conversation (and no draft of a first turn).
        TurnNotFound: the turn has no draft.
    """
    head = visible_head(service, key)
    state = _draft(service, key, head, turn)
    if state is None:
        if head is None:
            raise ConversationNotFound(f"conversation {key.conversation_id!r} not found")
        raise TurnNotFound(
            f"turn {turn} of this conversation has no draft to read",
            details={"turn": turn, "turns": head.turn},
        )
    return state


@dataclass(frozen=True)
class TurnRead:
    """What a read of one turn found: a draft that tells (its run going on, its error, or
    the answer it kept), or the turn rebuilt from the log."""

    state: DraftState | None
    #: The draft's text so far (empty once a kept answer holds it).
    text: str = ""
    logged: LoggedTurn | None = None
    #: A request runs the turn's tools under a live lease (no draft tells more).
    running: bool = False


def read_any_turn(service: Reads, key: ConversationKey, turn: int, *, wait: float = 0) -> TurnRead:
    """Any turn of ``key``: its draft while it runs (waiting up to ``wait`` s for it to
    end), its error, or its answer; a turn whose draft keeps no answer (a synchronous
    turn, or one from before drafts) is rebuilt from the log (:mod:`.turn_log`).

    Reads: the head and the draft's state (2 reads), then the turn's events as
    :func:`turnledger.turn.turn_log.turn_events` says.

    Raises:
        ConversationNotFound: no such conversation (and no draft of a first turn).
        TurnNotFound: no draft and no event of that turn.
    """
    deadline = time.monotonic() + max(min(wait, MAX_WAIT_SECONDS), 0)
    head = visible_head(service, key)
    state = _draft(service, key, head, turn)
    if state is not None and not state.done and wait > 0:
        state = follow(service, key, turn, after=0, wait=wait, gather=True).state
        head = visible_head(service, key)
    if state is not None and (
        not state.done or state.result is not None or state.status == "interrupted"
    ):
        if state.status == "done":
            return TurnRead(state=state)
        text = "".join(c.text for c in drafts.read(service.store, key, turn).chunks)
        return TurnRead(state=state, text=text)
    if head is None:
        raise ConversationNotFound(f"conversation {key.conversation_id!r} not found")
    while turn_log.running_now(head, turn, service.clock()) and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
        head = visible_head(service, key)
        if head is None:
            raise ConversationNotFound(f"conversation {key.conversation_id!r} not found")
    if turn_log.running_now(head, turn, service.clock()):
        return TurnRead(state=None, running=True)
    events = turn_log.turn_events(service.store, key, head, turn) if turn <= head.turn + 1 else []
    if not events:
        raise TurnNotFound(
            f"turn {turn} of this conversation does not exist",
            details={"turn": turn, "turns": head.turn},
        )
    return TurnRead(state=None, logged=logged_turn(service, key, head, turn, events))


def logged_turn(
    service: Reads, key: ConversationKey, head: Head, turn: int, events: list[Event]
) -> LoggedTurn:
    """``turn`` of ``head`` rebuilt from its ``events``; the head's latest turn shows the
    head's pending calls, and a run that died holding its lease shows ``interrupted``."""
    settings = service.settings
    logged = turn_log.rebuild(
        key.conversation_id,
        turn,
        events,
        pending=list(head.pending) if turn == head.turn else None,
        default_budget=settings.context_budget(head.options.model or settings.model),
        max_tool_steps=max(settings.max_tool_steps, 1),
    )
    if logged.answer is not None and turn == head.turn and is_running(head):
        # Only a run that died holding its lease is read here (a live one is in progress).
        shown = logged_status(logged.answer.status, in_progress=False, lease_lost=True)
        return replace(logged, answer=replace(logged.answer, status=shown))
    return logged


def follow(
    service: Reads,
    key: ConversationKey,
    turn: int,
    *,
    after: int,
    wait: float,
    gather: bool = False,
) -> DraftRead:
    """A long turn's chunks after ``after``, waiting up to ``wait`` s for some.

    Returns as soon as there is something (``gather=False``: long poll) or, with
    ``gather``, once the draft is over or the wait is spent (one SSE response).
    Waiting reads are eventually consistent (half price); a draft seen over is read
    once more consistently, so no last chunk is missed.

    Raises:
        ConversationNotFound, TurnNotFound: see :func:`_readable`.
    """
    state = _readable(service, key, turn)
    deadline = time.monotonic() + max(min(wait, MAX_WAIT_SECONDS), 0)
    chunks: list[drafts.Chunk] = []
    cursor = after
    consistent = True
    while True:
        read = drafts.read(service.store, key, turn, after=cursor, consistent=consistent)
        current = _effective(read.state, service.clock()) if read.state else state
        if current.done and not consistent:
            consistent = True
            continue  # the last chunks may lag an eventually consistent read
        chunks.extend(read.chunks)
        if read.chunks:
            cursor = read.chunks[-1].seq
        if current.done or (chunks and not gather) or time.monotonic() >= deadline:
            break
        consistent = False
        time.sleep(POLL_SECONDS)
    return DraftRead(chunks=chunks, next_after=cursor, state=current)


# --- turns as a history ---------------------------------------------------------------------


@dataclass(frozen=True)
class TurnEntry:
    """One turn of a history page: the log's account of it, and whether it runs now."""

    turn: int
    #: ``None`` only for a turn whose run has written no event yet (its draft says it runs).
    logged: LoggedTurn | None
    in_progress: bool = False
    #: When its running draft began, for a turn with no event yet.
    draft_started_at: datetime | None = None


@dataclass(frozen=True)
class TurnsListing:
    """A page of a conversation's turns, oldest first."""

    entries: list[TurnEntry]
    #: The turn number to read on after; ``None`` when this page reached the latest turn.
    next_after: int | None


def list_turns(service: Reads, key: ConversationKey, *, after: int, limit: int) -> TurnsListing:
    """Turns ``after + 1 ..`` of ``key`` (at most ``limit``), rebuilt from the log.

    Reads: the head, the last event, a binary search for the first turn's first event,
    the page's events, and (on the page that reaches the latest turn) the next turn's
    draft state, which says whether a run is going on.

    Raises:
        ConversationNotFound: absent, expired, cleared, or another tenant's.
    """
    head = visible_head(service, key)
    if head is None:
        raise ConversationNotFound(f"conversation {key.conversation_id!r} not found")
    store, now = service.store, service.clock()
    latest = turn_log.latest_turn(store, key, head)
    last = min(after + limit, latest)
    by_turn = turn_log.turns_range(store, key, head, after + 1, last) if last > after else {}
    entries = [
        TurnEntry(
            turn=n,
            logged=logged_turn(service, key, head, n, events),
            in_progress=turn_log.running_now(head, n, now),
        )
        for n, events in sorted(by_turn.items())
    ]
    if last < latest:
        return TurnsListing(entries=entries, next_after=last)
    upcoming = head.turn + 1
    draft = _draft(service, key, head, upcoming) if upcoming > after else None
    running = draft is not None and not draft.done
    fits = len(entries) < limit or bool(entries and entries[-1].turn == upcoming)
    if draft is not None and running and fits:
        started = datetime.fromisoformat(draft.started_at)
        entries = [e for e in entries if e.turn != upcoming]
        mine = by_turn.get(upcoming)
        entries.append(
            TurnEntry(
                turn=upcoming,
                logged=logged_turn(service, key, head, upcoming, mine) if mine else None,
                in_progress=True,
                draft_started_at=started,
            )
        )
    return TurnsListing(entries=entries, next_after=None)
