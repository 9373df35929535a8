"""Every status a conversation, a call or a draft can take, and every move: the tables.

The turn's state machine (:class:`~turnledger.turn.machine.TurnMachine`, one per
:class:`~turnledger.turn.session.Session` as ``session.machine``) makes its moves by
these tables; three say what may happen:

* :data:`CALL_MOVES`: a tool call's moves (request, ask a person, decide, edit,
  expire, defer, settle, mark ``outcome_unknown``, cancel). ``settled`` means
  it left the pending list with its result recorded.
* :data:`RUN_MOVES`: the run's moves (lease taken, renewed, released; a cancel
  requested of a live run; interrupted; cancelled).
* :data:`DRAFT_MOVES`: a long turn's draft (begun, done, interrupted).

An illegal move raises :class:`IllegalTransition`. Nobody passes a status:
:func:`status_for` derives the head's status from the pending calls (the machine
adds the run's phase), and :meth:`Session.commit <turnledger.turn.session.Session.commit>`
writes what the machine says. When several waits coexist the status shows the one a
person must act on first (:data:`WAIT_PRIORITY`); ``awaiting`` lists them all.

The module also answers the questions every route asks, so none keeps its own
copy: may a request start now (:func:`refuse_if_running`, :func:`refuse_if_spent`,
:func:`refuse_new_turn`, :func:`require_settled`; the session's ``admit`` asks them),
which calls wait for a person (the inbox), which waits are due (:func:`lapsed`),
and what status the API shows (:func:`public_status`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from enum import StrEnum
from typing import Literal

from ..core.exceptions import (
    ApprovalPending,
    ApproverScopeMissing,
    BudgetExceeded,
    ConversationBusy,
    InputPending,
    InternalError,
)
from ..core.models import (
    CallState,
    ConversationKey,
    ConversationStatus,
    Head,
    PendingCall,
    Usage,
)
from ..store.inbox import InboxChanges, InboxEntry

# --- tool calls -----------------------------------------------------------------------------

#: Where a call is before it is recorded (``None`` in the tables) and once its result is.
New = None
Settled = Literal["settled"]
CallPlace = CallState | Settled | None


class CallMove(StrEnum):
    """Every move a tool call can make. A call refused at once (an unknown tool, invalid
    arguments) gets its error result when it is recorded and never becomes pending."""

    #: Recorded, cleared to run (no approval needed).
    REQUEST = "request"
    #: Recorded, waiting for a person's decision.
    ASK_APPROVAL = "ask_approval"
    #: Recorded, waiting for a person's output (a human-input tool).
    ASK_INPUT = "ask_input"
    #: Recorded, waiting for the client's output (a client tool).
    AWAIT_CLIENT = "await_client"
    #: A person approved it as asked.
    APPROVE = "approve"
    #: A person approved it with edited arguments.
    EDIT = "edit"
    #: A person (or a rule) rejected it: it gets an error result without running.
    REJECT = "reject"
    #: Its decision window closed: rejected as expired.
    EXPIRE = "expire"
    #: Its run was interrupted and its tool ignores idempotency keys: a person decides.
    MARK_UNKNOWN = "mark_unknown"
    #: Its tool accepted it to finish elsewhere (202): it waits for its callback.
    DEFER = "defer"
    #: Its tool asked a person for input mid-call (an MCP elicitation): it waits for it.
    ELICIT = "elicit"
    #: A person answered its tool's question: it is sent again with the answer.
    ANSWER = "answer"
    #: Its result is recorded (a run, an output, a callback, a timeout, an error).
    SETTLE = "settle"
    #: The turn was cancelled: an error result says so.
    CANCEL = "cancel"


_DECIDING: frozenset[CallPlace] = frozenset({"awaiting_approval", "outcome_unknown"})
_WAITING: frozenset[CallPlace] = frozenset(
    {"awaiting_approval", "outcome_unknown", "awaiting_input", "awaiting_client", "deferred"}
)

#: Each move: the places a call may take it from, and where it goes.
CALL_MOVES: dict[CallMove, tuple[frozenset[CallPlace], CallPlace]] = {
    CallMove.REQUEST: (frozenset({New}), "ready"),
    CallMove.ASK_APPROVAL: (frozenset({New}), "awaiting_approval"),
    CallMove.ASK_INPUT: (frozenset({New}), "awaiting_input"),
    CallMove.AWAIT_CLIENT: (frozenset({New}), "awaiting_client"),
    CallMove.APPROVE: (_DECIDING, "ready"),
    CallMove.EDIT: (_DECIDING, "ready"),
    CallMove.REJECT: (_DECIDING, "rejected"),
    CallMove.EXPIRE: (_DECIDING, "rejected"),
    CallMove.MARK_UNKNOWN: (frozenset({"ready"}), "outcome_unknown"),
    CallMove.DEFER: (frozenset({"ready"}), "deferred"),
    CallMove.ELICIT: (frozenset({"ready"}), "awaiting_input"),
    CallMove.ANSWER: (frozenset({"awaiting_input"}), "ready"),
    CallMove.SETTLE: (
        frozenset({"ready", "deferred", "awaiting_input", "awaiting_client", "rejected"}),
        "settled",
    ),
    CallMove.CANCEL: (_WAITING | {"ready", "rejected"}, "settled"),
}

#: Where a call may go from each place (derived from :data:`CALL_MOVES`).
CALL_TRANSITIONS: dict[CallPlace, frozenset[CallPlace]] = {}
for _sources, _target in CALL_MOVES.values():
    for _source in _sources:
        CALL_TRANSITIONS[_source] = CALL_TRANSITIONS.get(_source, frozenset()) | {_target}

#: States of calls that wait for a human decision on the approvals route.
AWAITING_DECISION: frozenset[str] = frozenset({"awaiting_approval", "outcome_unknown"})

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

#: States whose wait has a deadline: a decision's window, a deferred call's callback.
EXPIRING: frozenset[str] = AWAITING_DECISION | {"deferred"}


class IllegalTransition(InternalError):
    """A call, a run or a draft was asked to make a move its table does not allow (a bug)."""


def moved[M: StrEnum, S, T](
    table: Mapping[M, tuple[frozenset[S], T]], current: S, how: M, what: str
) -> T:
    """Where ``how`` takes ``what`` (a call, a run, a draft) from ``current``, by ``table``.

    Raises:
        IllegalTransition: ``how`` cannot be made from ``current``.
    """
    sources, target = table[how]
    if current not in sources:
        raise IllegalTransition(
            f"{what} cannot {how.value} from {current or 'new'}",
            details={"from": current, "move": how.value, "to": target},
        )
    return target


def call_target(current: CallPlace, how: CallMove) -> CallPlace:
    """Where ``how`` takes a call that is at ``current``.

    Raises:
        IllegalTransition: ``how`` cannot be made from ``current``.
    """
    return moved(CALL_MOVES, current, how, "a tool call")


def move(pending: PendingCall, how: CallMove, **changes: object) -> PendingCall:
    """``pending`` after ``how`` (with ``changes``), checked against :data:`CALL_MOVES`.

    Raises:
        IllegalTransition: the move is not allowed from the call's state, or it settles
            the call (settled calls leave the pending list:
            :meth:`~turnledger.turn.machine.TurnMachine.settle`).
    """
    target = call_target(pending.state, how)
    if target == "settled":
        raise IllegalTransition(
            f"{how.value} settles a call: it leaves the pending list, it has no state",
            details={"move": how.value},
        )
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


def shown_reason(pending: PendingCall) -> str | None:
    """The reason a person is shown for deciding ``pending``: only an ``outcome_unknown``
    call has one (its run may have happened already)."""
    return pending.reason if pending.state == "outcome_unknown" else None


def waiting(pending: Iterable[PendingCall]) -> list[PendingCall]:
    """The calls that wait for someone: a decision, an output, the client, a callback."""
    return [p for p in pending if p.state in WAIT_OF_STATE]


def wait_deadline(pending: Iterable[PendingCall]) -> datetime | None:
    """The earliest deadline among ``pending``'s waits that have one (a decision's window,
    a deferred call's deadline): the head carries it (:attr:`Head.wait_deadline`) and
    the store files the head under its hour for the sweep's expiry pass."""
    due = [p.expires_at for p in pending if p.expires_at is not None and p.state in EXPIRING]
    return min(due) if due else None


def head_wait_deadline(pending: Iterable[PendingCall], changes: InboxChanges) -> datetime | None:
    """The wait deadline a commit's head carries (``HEAD`` is filed on ``by-wait`` under its
    hour): :func:`wait_deadline` of ``pending`` but the calls whose inbox entry the commit
    puts (``changes``) with a window, as such an entry files its own wait. So the commit
    that starts a person's wait does not rewrite ``HEAD`` (docs/STORAGE.md). A wait whose
    entry an earlier commit wrote stays on ``HEAD``'s deadline: an entry of an older build
    carries no filing of its own."""
    filed = {entry.call_id for entry in changes.puts if entry.expires_at is not None}
    return wait_deadline(p for p in pending if p.id not in filed)


def inbox_changes(key: ConversationKey, before: Head | None, after: Head) -> InboxChanges:
    """The inbox entries a commit replacing ``before`` by ``after`` writes, and those it
    deletes (the store writes them in the commit's transaction).

    A call waiting in both keeps its entry (nothing is rewritten); one that waits only
    after gets one; one that waited only before (decided, expired, settled, cancelled)
    loses it. A commit of a new life (``before`` of another ``gen``) starts from nothing:
    the old life's entries went with its purge.
    """
    old = (
        {p.id for p in before.pending if waits_for_person(p)}
        if before is not None and before.gen == after.gen
        else set()
    )
    puts = []
    for call in after.pending:
        kind = waits_for_person(call)
        if kind is None or call.id in old:
            continue
        puts.append(
            InboxEntry(
                kind=kind,
                conversation_id=key.conversation_id,
                call_id=call.id,
                tool=call.name,
                arguments=call.arguments,
                requested_by=call.requested_by,
                requested_at=call.requested_at or after.updated_at,
                expires_at=call.expires_at,
                reason=shown_reason(call),
                message=call.elicitation.message if call.elicitation else None,
                requested_schema=call.elicitation.requested_schema if call.elicitation else None,
            )
        )
    waiting = {p.id for p in after.pending if waits_for_person(p)}
    return InboxChanges(puts=puts, deletes=sorted(old - waiting))


# --- the run --------------------------------------------------------------------------------


class RunPhase(StrEnum):
    """Where the current turn's run is, as this request sees it."""

    #: Nothing runs: the status is what the pending calls wait for.
    IDLE = "idle"
    #: This request holds the lease and runs the turn's tools (or the model after them).
    RUNNING = "running"
    #: Tools acted but the turn did not finish (the model failed): the next request resumes.
    INTERRUPTED = "interrupted"
    #: Another request holds a live lease and this one asked it to stop.
    CANCEL_REQUESTED = "cancel_requested"


class RunMove(StrEnum):
    """Every move of a turn's run."""

    TAKE_LEASE = "take_lease"
    RENEW_LEASE = "renew_lease"
    RELEASE_LEASE = "release_lease"
    INTERRUPT = "interrupt"
    REQUEST_CANCEL = "request_cancel"
    CANCEL = "cancel"


#: Each move: the phases it may be made from, and the phase it leads to.
RUN_MOVES: dict[RunMove, tuple[frozenset[RunPhase], RunPhase]] = {
    RunMove.TAKE_LEASE: (frozenset({RunPhase.IDLE, RunPhase.INTERRUPTED}), RunPhase.RUNNING),
    RunMove.RENEW_LEASE: (frozenset({RunPhase.RUNNING}), RunPhase.RUNNING),
    # Releasing when nothing ran is allowed: a step ends the same way whether it ran tools.
    RunMove.RELEASE_LEASE: (frozenset({RunPhase.RUNNING, RunPhase.IDLE}), RunPhase.IDLE),
    RunMove.INTERRUPT: (frozenset({RunPhase.RUNNING, RunPhase.IDLE}), RunPhase.INTERRUPTED),
    RunMove.REQUEST_CANCEL: (frozenset({RunPhase.IDLE}), RunPhase.CANCEL_REQUESTED),
    RunMove.CANCEL: (frozenset(RunPhase), RunPhase.IDLE),
}

# --- drafts ---------------------------------------------------------------------------------

DraftStatus = Literal["in_progress", "done", "interrupted"]


class DraftMove(StrEnum):
    """Every move of a long turn's draft."""

    #: The answer starts (or a continued turn goes on) being written.
    BEGIN = "begin"
    #: The answer was committed whole.
    FINISH = "finish"
    #: The turn failed or was cancelled mid-answer (or its worker was lost).
    INTERRUPT = "interrupt"


#: Each move: the statuses a draft may take it from (``None``: no draft yet), and where.
DRAFT_MOVES: dict[DraftMove, tuple[frozenset[DraftStatus | None], DraftStatus]] = {
    DraftMove.BEGIN: (frozenset({None, "in_progress", "done", "interrupted"}), "in_progress"),
    DraftMove.FINISH: (frozenset({"in_progress"}), "done"),
    DraftMove.INTERRUPT: (frozenset({"in_progress"}), "interrupted"),
}


def logged_turn_draft_status() -> DraftStatus:
    """What the stream of a turn that wrote no draft shows once the log holds its answer
    (a synchronous turn over within ``SYNC_DRAFT_AFTER_MS``): a draft that finished."""
    return DRAFT_MOVES[DraftMove.FINISH][1]


def draft_move(current: DraftStatus | None, how: DraftMove) -> DraftStatus:
    """The draft's status after ``how``.

    Raises:
        IllegalTransition: ``how`` cannot be made from ``current``.
    """
    return moved(DRAFT_MOVES, current, how, "a draft")


# --- the public status ----------------------------------------------------------------------

#: The public statuses of a committed head; ``running_tools`` is resolved by
#: :func:`public_status` (a turn's own answer never shows it: its request is over).
_PUBLIC_STATUS: dict[ConversationStatus, str] = {
    ConversationStatus.COMPLETE: "complete",
    ConversationStatus.AWAITING_APPROVAL: "awaiting_approval",
    ConversationStatus.AWAITING_CLIENT_TOOLS: "awaiting_client_tools",
    ConversationStatus.RUNNING_TOOLS: "complete",
    ConversationStatus.AWAITING_HITL: "awaiting_hitl",
    ConversationStatus.AWAITING_ASYNC_TOOLS: "awaiting_async_tools",
    ConversationStatus.INTERRUPTED: "interrupted",
}


#: The statuses of a head that waits for someone (:data:`WAIT_PRIORITY`).
_WAITING_STATUSES: frozenset[ConversationStatus] = frozenset(s for _, s in WAIT_PRIORITY)


def public_status(head: Head, now: datetime) -> str:
    """A head's status as ``GET`` shows it: a run with a live lease is ``running_tools``;
    one whose lease lapsed died mid-way and is ``interrupted`` (the next request resumes it).

    A wait whose deadline passed (:func:`lapsed`) is shown expired at once, before the next
    request or the sweep records it: the status is what the calls still open wait for, and
    ``complete`` (ready for a new turn) when none is.
    """
    if head.status is ConversationStatus.RUNNING_TOOLS:
        return "running_tools" if head.live_lease(now) else "interrupted"
    if head.status in _WAITING_STATUSES:
        return answer_status(p for p in head.pending if not lapsed(p, now))
    return _PUBLIC_STATUS[head.status]


def answer_status(pending: Iterable[PendingCall]) -> str:
    """The status a request's own answer shows: what the turn waits for, else ``complete``."""
    return _PUBLIC_STATUS[status_for(pending)]


def fork_refusal(head: Head, now: datetime) -> str | None:
    """Why the end of ``head``'s current turn is no fork point (its public status: it waits
    for someone, or runs tools), or ``None`` when the turn is settled and it is one."""
    if head.status is ConversationStatus.COMPLETE:
        return None
    # The recorded status: a lapsed wait is not recorded yet, so the turn is not settled.
    if head.status is ConversationStatus.RUNNING_TOOLS:
        return public_status(head, now)
    return _PUBLIC_STATUS[head.status]


def fork_status() -> ConversationStatus:
    """A fork's first head: it begins at a settled turn boundary, so it waits for nothing."""
    return ConversationStatus.COMPLETE


def logged_status(answered: str | None, *, in_progress: bool, lease_lost: bool) -> str:
    """A turn's status as a read of the log shows it (``GET .../turns``): ``in_progress``
    while a run goes on, ``failed`` when its last request failed (``answered`` is
    ``None``), ``interrupted`` when its run died holding the lease, else what its last
    request answered."""
    if in_progress:
        return "in_progress"
    if answered is None:
        return "failed"
    return _PUBLIC_STATUS[ConversationStatus.INTERRUPTED] if lease_lost else answered


def is_running(head: Head | None) -> bool:
    """Whether ``head`` was committed mid-run (its tools running, or a run that died)."""
    return head is not None and head.status is ConversationStatus.RUNNING_TOOLS


def is_tombstone(head: Head | None) -> bool:
    """Whether ``head`` is a cleared conversation's tombstone."""
    return head is not None and head.status is ConversationStatus.CLEARED


def awaits_decision(head: Head) -> bool:
    """Whether a long turn's approval may continue ``head``: it waits for a decision, or
    a run that died after its decisions were recorded."""
    return head.status in (ConversationStatus.AWAITING_APPROVAL, ConversationStatus.RUNNING_TOOLS)


def cancel_requested(head: Head | None) -> bool:
    """Whether a cancel asks the request running ``head``'s turn to stop."""
    return is_running(head) and head is not None and head.cancel is not None


def holds_lease(head: Head | None, owner: str) -> bool:
    """Whether ``owner``'s lease is the one written on ``head`` (live or not)."""
    return (
        is_running(head)
        and head is not None
        and head.lease is not None
        and (head.lease.owner == owner)
    )


# --- may a request start? ------------------------------------------------------------------


def refuse_if_running(head: Head | None, now: datetime) -> None:
    """Refuse to act while another request runs the conversation's tools.

    Raises:
        ConversationBusy: ``head`` holds a live lease; ``retry_after_seconds`` says when it
            ends at the latest.
    """
    lease = head.live_lease(now) if head is not None else None
    if lease is not None:
        wait = max(int((lease.expires_at - now).total_seconds() + 0.999), 1)
        raise ConversationBusy(
            "another request is running this conversation's tools; nothing was stored",
            details={"retry_after_seconds": wait},
        )


def refuse_if_spent(usage: Usage, budget: int) -> None:
    """Refuse a turn once the conversation's token budget (``0``: none) is spent.

    Raises:
        BudgetExceeded: input + output tokens so far reached ``budget``.
    """
    used = usage.input_tokens + usage.output_tokens
    if budget and used >= budget:
        raise BudgetExceeded(
            "this conversation's token budget is spent",
            details={"limit": budget, "used": used},
        )


def refuse_new_turn(head: Head | None, now: datetime, *, budget: int) -> None:
    """What a turn request refuses before it is accepted to run later (``202``): a live
    lease, a spent budget, approvals still undecided (an expired one no longer blocks:
    the turn itself records its expiry).

    Raises:
        ConversationBusy, BudgetExceeded, ApprovalPending: as a turn would at once.
    """
    if head is None:
        return
    refuse_if_running(head, now)
    refuse_if_spent(head.usage, budget)
    require_settled(
        [p for p in head.pending if p.state in AWAITING_DECISION and not lapsed(p, now)]
    )


#: Waits whose output only a caller with the approver scope may give (or, deferred, the
#: job's signed callback): a person's input, as a person's decision, and a job's result.
#: A client call's output is its turn's caller's to give.
SETTLED_BY_APPROVER: frozenset[str] = frozenset({"awaiting_input", "deferred"})


def check_settler(
    pending: Iterable[PendingCall], outputs: Iterable[str], approver_claims: Mapping[str, str]
) -> None:
    """The one rule of who gives a waiting call its output, on every entry that takes one
    (``function_call_output`` on a turn or the OpenAI face, ``outputs`` on the approvals
    route, a long turn's acceptance): a call of :data:`SETTLED_BY_APPROVER` only by a
    caller holding the approver scope (``approver_claims``, empty when it does not);
    checked before anything of the request is staged, so a refusal records nothing.
    Ids of other calls are left to the checks that follow (client calls, unknown ids).

    Raises:
        ApproverScopeMissing: an output names such a call and the caller holds no
            approver scope.
    """
    if approver_claims:
        return
    guarded = {p.id for p in pending if p.state in SETTLED_BY_APPROVER}
    named = sorted({call_id for call_id in outputs if call_id in guarded})
    if named:
        raise ApproverScopeMissing(
            "the output of a human-input or deferred call is given only by a caller with the "
            "approver scope (APPROVER_SCOPE in the APPROVER_CLAIM claim), or by the job's "
            "signed callback",
            details={"calls": named},
        )


def require_settled(pending: Iterable[PendingCall], *, answered: Iterable[str] = ()) -> None:
    """Refuse a new message while calls of the current turn still need a person or a job.

    Client calls never block: a new message closes them (API.md). ``answered`` names
    calls this very request supplies outputs for.

    Raises:
        ApprovalPending: calls await a decision.
        InputPending: human-input or deferred calls wait for their output.
    """
    calls = list(pending)
    given = set(answered)
    decisions = [p for p in calls if p.state in AWAITING_DECISION]
    if decisions:
        raise ApprovalPending(
            "tool calls of this conversation await approval; decide them first",
            pending=decisions,
        )
    inputs = [p for p in calls if p.state in ("awaiting_input", "deferred") and p.id not in given]
    if inputs:
        raise InputPending(
            "tool calls of this conversation wait for their output; send it first "
            "(outputs on the approvals route, or function_call_output items)",
            pending=inputs,
        )
