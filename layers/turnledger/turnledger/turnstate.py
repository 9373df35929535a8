"""The one state machine of a turn's tool calls and of the conversation's status.

A pending call (:class:`~turnledger.models.PendingCall`) moves only along
:data:`CALL_TRANSITIONS`; ``settled`` means it left the pending list with its
result recorded. The conversation's status follows from what its pending calls
wait for (:func:`status_for`): when several waits coexist, the one a person
must act on first is shown, in :data:`WAIT_PRIORITY` order, and ``awaiting``
lists every wait still open.

Every route asks this module, never its own copy of the rules: what a status
is, which calls wait for a person (the inbox), which are due (expiry of
approvals and of deferred calls), and how a turn is cancelled.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Literal

from .exceptions import ApprovalPending, InputPending, InternalError
from .models import (
    ApprovalResolved,
    CallState,
    ConversationStatus,
    Head,
    PendingCall,
    ToolCallSettled,
    ToolResult,
    TurnInterrupted,
)

if TYPE_CHECKING:
    from .session import Session

#: Where a call may go from each state (``None``: a call being recorded). ``settled``:
#: its result is recorded and it leaves the pending list.
CALL_TRANSITIONS: dict[str | None, frozenset[str]] = {
    None: frozenset({"ready", "awaiting_approval", "awaiting_client", "awaiting_input", "settled"}),
    "awaiting_approval": frozenset({"ready", "rejected"}),
    "outcome_unknown": frozenset({"ready", "rejected"}),
    "ready": frozenset({"settled", "deferred", "outcome_unknown", "rejected"}),
    "deferred": frozenset({"settled"}),
    "awaiting_input": frozenset({"settled"}),
    "awaiting_client": frozenset({"settled"}),
    "rejected": frozenset({"settled"}),
}

#: States of calls that wait for a human decision on the approvals route.
AWAITING_DECISION = frozenset({"awaiting_approval", "outcome_unknown"})

Wait = Literal["approval", "input", "client", "async"]
#: What each waiting state waits for.
WAIT_OF_STATE: dict[str, Wait] = {
    "awaiting_approval": "approval",
    "outcome_unknown": "approval",
    "awaiting_input": "input",
    "awaiting_client": "client",
    "deferred": "async",
}
#: Waits in the order the status shows them: a person's decision first, then a
#: person's input, then the client, then jobs running elsewhere.
WAIT_PRIORITY: tuple[tuple[Wait, ConversationStatus], ...] = (
    ("approval", ConversationStatus.AWAITING_APPROVAL),
    ("input", ConversationStatus.AWAITING_HITL),
    ("client", ConversationStatus.AWAITING_CLIENT_TOOLS),
    ("async", ConversationStatus.AWAITING_ASYNC_TOOLS),
)


class IllegalTransition(InternalError):
    """A call was asked to move where :data:`CALL_TRANSITIONS` does not allow (a bug)."""


def check_move(current: str | None, target: str) -> None:
    """Refuse a move the table does not allow.

    Raises:
        IllegalTransition: ``current`` -> ``target`` is not in :data:`CALL_TRANSITIONS`.
    """
    if target not in CALL_TRANSITIONS.get(current, frozenset()):
        raise IllegalTransition(
            f"a tool call cannot move from {current or 'new'} to {target}",
            details={"from": current, "to": target},
        )


def move(pending: PendingCall, target: CallState, **changes: object) -> PendingCall:
    """``pending`` in state ``target`` (with ``changes``), checked against the table.

    Raises:
        IllegalTransition: the move is not allowed.
    """
    check_move(pending.state, target)
    return pending.model_copy(update={"state": target, **changes})


def awaiting(pending: Iterable[PendingCall]) -> list[Wait]:
    """What the pending calls still wait for, in :data:`WAIT_PRIORITY` order."""
    open_waits = {WAIT_OF_STATE[p.state] for p in pending if p.state in WAIT_OF_STATE}
    return [wait for wait, _ in WAIT_PRIORITY if wait in open_waits]


def status_for(pending: Iterable[PendingCall]) -> ConversationStatus:
    """The head status pending calls call for: the first open wait by priority;
    ``running_tools`` for calls recorded but not yet run; else ``complete``."""
    calls = list(pending)
    waits = awaiting(calls)
    if waits:
        return dict(WAIT_PRIORITY)[waits[0]]
    return ConversationStatus.RUNNING_TOOLS if calls else ConversationStatus.COMPLETE


def status_of(session: Session) -> ConversationStatus:
    """The head status the session's pending calls call for."""
    return status_for(session.pending)


#: States whose wait has a deadline: a decision's window, a deferred call's callback.
EXPIRING = AWAITING_DECISION | {"deferred"}


def lapsed(pending: PendingCall, now: datetime) -> bool:
    """Whether ``pending`` waits for something whose deadline passed by ``now`` (shown
    as expired at once; recorded by the next request or the sweep's expiry pass)."""
    return (
        pending.state in EXPIRING and pending.expires_at is not None and pending.expires_at <= now
    )


def waits_for_person(pending: PendingCall) -> Literal["approval", "input"] | None:
    """Whether a person acts on this call: a decision (``approval``), its output
    (``input``, a human-input tool), or neither. The inbox lists the first two."""
    if pending.state in AWAITING_DECISION:
        return "approval"
    if pending.state == "awaiting_input":
        return "input"
    return None


def require_settled(session: Session, *, answered: Iterable[str] = ()) -> None:
    """Refuse a new turn while calls of the current one still need a person or a job.

    Client calls never block: a new message closes them (API.md). ``answered``
    names calls this very request supplies outputs for.

    Raises:
        ApprovalPending: calls await a decision.
        InputPending: human-input or deferred calls wait for their output.
    """
    given = set(answered)
    decisions = [p for p in session.pending if p.state in AWAITING_DECISION]
    if decisions:
        raise ApprovalPending(
            "tool calls of this conversation await approval; decide them first",
            pending=decisions,
        )
    inputs = [
        p
        for p in session.pending
        if p.state in ("awaiting_input", "deferred") and p.id not in given
    ]
    if inputs:
        raise InputPending(
            "tool calls of this conversation wait for their output; send it first "
            "(outputs on the approvals route, or function_call_output items)",
            pending=inputs,
        )


def cancel_requested(head: Head | None) -> bool:
    """Whether a cancel asks the request running ``head``'s turn to stop."""
    return (
        head is not None
        and head.status is ConversationStatus.RUNNING_TOOLS
        and head.cancel is not None
    )


def cancel_turn(session: Session, *, by: str, reason: str | None = None) -> list[str]:
    """Stop the current turn: every pending call is recorded as cancelled (a deferred
    one also as settled, an undecided approval also as rejected by the canceller), then
    one ``turn_interrupted`` event; results recorded before stay. The caller commits
    ``complete``.

    Returns:
        The ids of the calls cancelled, in pending order.
    """
    cancelled: list[str] = []
    why = f" was cancelled by {by}" + (f": {reason}" if reason else "")
    for pending in session.pending:
        if pending.state in AWAITING_DECISION:
            # A decision nobody made: the cancel decides it (rejected), so every
            # approval_requested keeps its approval_resolved.
            check_move(pending.state, "rejected")
            session.add(
                ApprovalResolved(
                    call_id=pending.id,
                    decision="rejected",
                    reason=f"cancelled by {by}" + (f": {reason}" if reason else ""),
                    approver=by,
                    arguments_sha256=pending.arguments_sha256,
                ),
                actor=by,
            )
        elif pending.state != "ready":
            # A ready call (recorded, not run: the turn's process died) is cancelled too.
            check_move(pending.state, "settled")
        if pending.state == "deferred":
            session.add(
                ToolCallSettled(
                    call_id=pending.id,
                    name=pending.name,
                    status="cancelled",
                    via="cancel",
                    task_id=pending.task_id,
                ),
                actor=by,
            )
        output = f"tool call {pending.name}{why}"
        if pending.state == "ready":
            # Its request died while it ran (interrupted): the side effect may be real.
            output += " (it may have run before its request ended)"
        session.add(
            ToolResult(call_id=pending.id, name=pending.name, output=output, is_error=True),
            actor=by,
        )
        cancelled.append(pending.id)
    session.pending = []
    session.add(
        TurnInterrupted(interrupted_by=by, cancelled_call_ids=cancelled, reason=reason), actor=by
    )
    session.lease = None
    session.cancel = None
    return cancelled
