"""The turn's state machine: what one request's turn holds, and what it does next.

:class:`TurnMachine` (one per :class:`~turnledger.turn.session.Session`, as
``session.machine``) owns the run's state: the pending calls, the run's phase
(:class:`~turnledger.turn.lifecycle.RunPhase`), the lease this request holds and
a cancel request. Every change is a move checked against the tables of
:mod:`turnledger.turn.lifecycle` (:data:`~turnledger.turn.lifecycle.CALL_MOVES`,
:data:`~turnledger.turn.lifecycle.RUN_MOVES`); :meth:`TurnMachine.written` is
what the next commit writes (status, lease, cancel) and
:meth:`TurnMachine.next_step` what the request does next (:class:`Step`).

It touches no store, provider or tool: the session commits what it says and
stages the events it returns (:meth:`TurnMachine.cancel_turn`), so it is tested
as a table of state x move -> state and next step (``tests/unit/test_turn_machine.py``),
the way a workflow's decisions are replayed with nothing of the world.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from ..core.models import (
    ApprovalResolved,
    CancelRequest,
    ConversationStatus,
    Head,
    Lease,
    Payload,
    PendingCall,
    ToolCallSettled,
    ToolResult,
    TurnInterrupted,
)
from .lifecycle import (
    AWAITING_DECISION,
    RUN_MOVES,
    CallMove,
    IllegalTransition,
    New,
    RunMove,
    RunPhase,
    Wait,
    answer_status,
    awaiting,
    call_target,
    move,
    moved,
    status_for,
)


class Step(StrEnum):
    """What a request does next with its turn (:meth:`TurnMachine.next_step`)."""

    #: A cancel asks the run this request holds to stop: cancel the turn and commit.
    STOP = "stop"
    #: Calls are cleared to run (``ready``) or refused (``rejected``): record their results.
    RUN_TOOLS = "run_tools"
    #: A person, the client or a job acts first (:attr:`NextStep.waiting_for`): commit, end.
    WAIT = "wait"
    #: Nothing is pending and the model owes an answer (to the input, or to the results).
    CALL_MODEL = "call_model"
    #: Nothing more for this request: the model answered in text, or another request
    #: runs the turn and this one asked it to stop. Commit and end.
    FINISH = "finish"


@dataclass(frozen=True)
class NextStep:
    """The next step, and for :attr:`Step.WAIT` what the turn waits for, by priority."""

    step: Step
    waiting_for: tuple[Wait, ...] = ()


@dataclass(frozen=True)
class Cancelled:
    """What a cancel did: the calls it cancelled (in pending order) and the events that
    record it, in the order the session stages them."""

    call_ids: list[str]
    events: list[Payload]


@dataclass
class TurnMachine:
    """One request's turn: its pending calls, its run's phase, lease and cancel.

    Every change of a pending call or of the run is a method here, checked against
    :data:`~turnledger.turn.lifecycle.CALL_MOVES` or
    :data:`~turnledger.turn.lifecycle.RUN_MOVES`.
    """

    #: The calls of the turn not settled yet (what the head's ``pending`` becomes).
    pending: list[PendingCall] = field(default_factory=list)
    phase: RunPhase = RunPhase.IDLE
    #: Held while this request runs tools (taken, renewed and released here).
    lease: Lease | None = None
    #: A cancel request for the running turn (asked here, or taken in from the head).
    cancel: CancelRequest | None = None
    #: The turn is over: the model answered in text since a call was last recorded or
    #: settled. (A cancelled turn leaves the conversation ready: the next input goes to
    #: the model.)
    done: bool = False

    @classmethod
    def of(cls, head: Head | None) -> TurnMachine:
        """The machine of a request that opened ``head`` (``None``: a new life): its
        pending calls; the run is this request's own to take."""
        return cls(pending=list(head.pending) if head is not None else [])

    def reset(self, pending: Iterable[PendingCall]) -> None:
        """Back to the last commit (``pending`` as it wrote them): nothing of this
        request's run is left (a head committed mid-run is resumed by whoever opens it)."""
        self.pending = list(pending)
        self.phase = RunPhase.IDLE
        self.lease = None
        self.cancel = None
        self.done = False

    # --- what the next commit writes, and what the request does next ------------------------

    def status(self) -> ConversationStatus:
        """The status the next commit writes: ``running_tools`` mid-run (held, interrupted
        or asked to stop), else what the pending calls wait for."""
        if self.phase is not RunPhase.IDLE:
            return ConversationStatus.RUNNING_TOOLS
        return status_for(self.pending)

    def written(self) -> tuple[ConversationStatus, Lease | None, CancelRequest | None]:
        """What the next commit writes: the status, and the lease and cancel request
        (only mid-run)."""
        status = self.status()
        if status is not ConversationStatus.RUNNING_TOOLS:
            return status, None, None
        return status, self.lease, self.cancel

    def next_step(self) -> NextStep:
        """What this request does next, in the order the turn loop asks: stop for a
        cancel of its own run; record the results of calls cleared or refused; wait for
        whoever must act; else call the model, unless the turn is over."""
        if self.cancel is not None and self.phase in (RunPhase.RUNNING, RunPhase.INTERRUPTED):
            return NextStep(Step.STOP)
        if self.phase is RunPhase.CANCEL_REQUESTED:
            return NextStep(Step.FINISH)
        if any(p.state in ("ready", "rejected") for p in self.pending):
            return NextStep(Step.RUN_TOOLS)
        waits = self.awaiting()
        if waits:
            return NextStep(Step.WAIT, tuple(waits))
        return NextStep(Step.FINISH if self.done else Step.CALL_MODEL)

    def awaiting(self) -> list[Wait]:
        """What the turn still waits for, by priority."""
        return awaiting(self.pending)

    def answer_status(self) -> str:
        """The status this request's answer shows."""
        return answer_status(self.pending)

    # --- the model --------------------------------------------------------------------------

    def answer(self) -> None:
        """The model answered in text and requested no call: the turn is over."""
        self.done = True

    # --- calls ------------------------------------------------------------------------------

    def open_call(self, pending: PendingCall, how: CallMove) -> None:
        """Add a call the model just requested, in the state ``how`` leads to (the model
        owes an answer to its result)."""
        target = call_target(New, how)
        if target != pending.state:
            raise IllegalTransition(
                f"{how.value} records a call as {target}, not {pending.state}",
                details={"move": how.value, "state": pending.state},
            )
        self.pending.append(pending)
        self.done = False

    def change(self, pending: PendingCall, how: CallMove, **changes: object) -> PendingCall:
        """Make ``how`` on the pending call with ``pending``'s id; returns it as it is now."""
        current = self._current(pending.id)
        updated = move(current, how, **changes)
        self.pending = [updated if p.id == updated.id else p for p in self.pending]
        return updated

    def settle(self, call_ids: Iterable[str], how: CallMove = CallMove.SETTLE) -> None:
        """Take the calls out of the pending list: their results are recorded (the model
        owes an answer to them)."""
        ids = set(call_ids)
        for pending in self.pending:
            if pending.id in ids:
                call_target(pending.state, how)
        self.pending = [p for p in self.pending if p.id not in ids]
        self.done = False

    def _current(self, call_id: str) -> PendingCall:
        for pending in self.pending:
            if pending.id == call_id:
                return pending
        raise IllegalTransition(f"no pending call {call_id}", details={"call_id": call_id})

    # --- the run ----------------------------------------------------------------------------

    def run_move(self, how: RunMove) -> None:
        """Make ``how`` on the run, by :data:`~turnledger.turn.lifecycle.RUN_MOVES`.

        Raises:
            IllegalTransition: ``how`` cannot be made from the run's phase.
        """
        self.phase = moved(RUN_MOVES, self.phase, how, "a run")

    def take_lease(self, owner: str, now: datetime, seconds: float) -> Lease:
        """This request starts running the turn's tools until ``now + seconds`` at most;
        a request already running (its next step) renews its own lease instead."""
        if self.phase is RunPhase.RUNNING:
            return self.renew_lease(now, seconds)
        self.run_move(RunMove.TAKE_LEASE)
        self.lease = Lease(owner=owner, expires_at=now + timedelta(seconds=seconds))
        return self.lease

    def renew_lease(self, now: datetime, seconds: float) -> Lease:
        """The holder extends its own lease (a conditional commit: it fails if it lost it)."""
        self.run_move(RunMove.RENEW_LEASE)
        assert self.lease is not None  # held while running
        self.lease = Lease(owner=self.lease.owner, expires_at=now + timedelta(seconds=seconds))
        return self.lease

    def release_lease(self) -> None:
        """The run's step is over: the next commit writes what the turn waits for."""
        self.run_move(RunMove.RELEASE_LEASE)
        self.lease = None

    def interrupt(self) -> None:
        """Tools acted but the turn cannot finish now (the model failed): the next request
        may resume it at once (no lease)."""
        self.run_move(RunMove.INTERRUPT)
        self.lease = None

    def request_cancel(self, lease: Lease, request: CancelRequest) -> None:
        """Ask the request holding ``lease`` to stop at its next step boundary."""
        self.run_move(RunMove.REQUEST_CANCEL)
        self.lease = lease
        self.cancel = request

    def take_cancel(self, request: CancelRequest | None) -> None:
        """Keep a cancel written on the head meanwhile, so the next commit keeps it."""
        self.cancel = request

    def cancel_turn(self, *, by: str, reason: str | None = None) -> Cancelled:
        """Stop the current turn: every pending call is recorded as cancelled (a deferred
        one also as settled, an undecided approval also as rejected by the canceller),
        then one ``turn_interrupted`` event; results recorded before stay. The events
        are returned for the session to stage, with ``by`` as their actor.
        """
        cancelled: list[str] = []
        events: list[Payload] = []
        why = f" was cancelled by {by}" + (f": {reason}" if reason else "")
        for pending in list(self.pending):
            if pending.state in AWAITING_DECISION:
                # A decision nobody made: the cancel decides it (rejected), so every
                # approval_requested keeps its approval_resolved.
                pending = self.change(pending, CallMove.REJECT)
                events.append(
                    ApprovalResolved(
                        call_id=pending.id,
                        decision="rejected",
                        reason=f"cancelled by {by}" + (f": {reason}" if reason else ""),
                        approver=by,
                        arguments_sha256=pending.arguments_sha256,
                    )
                )
            if pending.state == "deferred":
                events.append(
                    ToolCallSettled(
                        call_id=pending.id,
                        name=pending.name,
                        status="cancelled",
                        via="cancel",
                        task_id=pending.task_id,
                    )
                )
            output = f"tool call {pending.name}{why}"
            if pending.state == "ready":
                # Its request died while it ran (interrupted): the side effect may be real.
                output += " (it may have run before its request ended)"
            events.append(
                ToolResult(call_id=pending.id, name=pending.name, output=output, is_error=True)
            )
            self.settle([pending.id], CallMove.CANCEL)
            cancelled.append(pending.id)
        events.append(
            TurnInterrupted(interrupted_by=by, cancelled_call_ids=cancelled, reason=reason)
        )
        self.run_move(RunMove.CANCEL)
        self.lease = None
        self.cancel = None
        return Cancelled(call_ids=cancelled, events=events)
