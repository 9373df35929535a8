"""The turn's state machine (turnledger.turn.machine) as a table: state x move -> state, and
the next step, with no store, provider or tool; then whole turns replayed move by move, the
way a workflow's decisions are replayed from its history."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from turnledger.core.models import CancelRequest, ConversationStatus, Lease, PendingCall
from turnledger.turn.lifecycle import RUN_MOVES, CallMove, IllegalTransition, RunMove, RunPhase
from turnledger.turn.machine import NextStep, Step, TurnMachine

NOW = datetime(2099, 1, 15, 12, 0, tzinfo=UTC)
LEASE = Lease(owner="me", expires_at=NOW + timedelta(seconds=30))
THEIRS = Lease(owner="them", expires_at=NOW + timedelta(seconds=30))
CANCEL = CancelRequest(requested_by="ops", requested_at=NOW, reason="stop")


def call(state: str, call_id: str = "c1", **extra: Any) -> PendingCall:
    return PendingCall.model_validate(
        {
            "id": call_id,
            "name": "tool",
            "arguments": {},
            "requires": "none",
            "state": state,
            "idempotency_key": "k" * 32,
            "arguments_sha256": "0" * 64,
            **extra,
        }
    )


@dataclass(frozen=True)
class State:
    """A machine's state in a table row: its calls' states (ids c1, c2, ... in order), its
    run's phase, whether it holds a lease and a cancel, whether the model answered."""

    calls: tuple[str, ...] = ()
    phase: RunPhase = RunPhase.IDLE
    lease: bool = False
    cancel: bool = False
    done: bool = False

    def machine(self) -> TurnMachine:
        return TurnMachine(
            pending=[call(s, f"c{i}") for i, s in enumerate(self.calls, 1)],
            phase=self.phase,
            lease=LEASE if self.lease else None,
            cancel=CANCEL if self.cancel else None,
            done=self.done,
        )

    @classmethod
    def of(cls, machine: TurnMachine) -> State:
        return cls(
            calls=tuple(p.state for p in machine.pending),
            phase=machine.phase,
            lease=machine.lease is not None,
            cancel=machine.cancel is not None,
            done=machine.done,
        )


def _opens(how: CallMove, state: str) -> Callable[[TurnMachine], object]:
    def open_call(m: TurnMachine) -> None:
        m.open_call(call(state, f"c{len(m.pending) + 1}"), how)

    return open_call


#: The moves of the table, by name; a call move is made on the first pending call.
MOVES: dict[str, Callable[[TurnMachine], object]] = {
    "request": _opens(CallMove.REQUEST, "ready"),
    "ask approval": _opens(CallMove.ASK_APPROVAL, "awaiting_approval"),
    "ask input": _opens(CallMove.ASK_INPUT, "awaiting_input"),
    "await client": _opens(CallMove.AWAIT_CLIENT, "awaiting_client"),
    "approve": lambda m: m.change(m.pending[0], CallMove.APPROVE),
    "reject": lambda m: m.change(m.pending[0], CallMove.REJECT),
    "expire": lambda m: m.change(m.pending[0], CallMove.EXPIRE),
    "defer": lambda m: m.change(m.pending[0], CallMove.DEFER, task_id="t"),
    "mark unknown": lambda m: m.change(m.pending[0], CallMove.MARK_UNKNOWN),
    "settle": lambda m: m.settle([m.pending[0].id]),
    "answer": lambda m: m.answer(),
    "take lease": lambda m: m.take_lease("me", NOW, 30),
    "renew": lambda m: m.renew_lease(NOW, 30),
    "release lease": lambda m: m.release_lease(),
    "interrupt": lambda m: m.interrupt(),
    "request cancel": lambda m: m.request_cancel(THEIRS, CANCEL),
    "take cancel": lambda m: m.take_cancel(CANCEL),
    "cancel turn": lambda m: m.cancel_turn(by="ops"),
}

IDLE = State()
RUNNING = RunPhase.RUNNING
INTERRUPTED = RunPhase.INTERRUPTED
ASKED = RunPhase.CANCEL_REQUESTED
Illegal = IllegalTransition

#: state x move -> the state after, and the next step it says (or the move is illegal).
TABLE: list[tuple[State, str, State | type[IllegalTransition], NextStep | None]] = [
    # A new turn: the model is called; its calls are recorded as what they need.
    (IDLE, "request", State(("ready",)), NextStep(Step.RUN_TOOLS)),
    (IDLE, "ask approval", State(("awaiting_approval",)), NextStep(Step.WAIT, ("approval",))),
    (IDLE, "ask input", State(("awaiting_input",)), NextStep(Step.WAIT, ("input",))),
    (IDLE, "await client", State(("awaiting_client",)), NextStep(Step.WAIT, ("client",))),
    (IDLE, "answer", State(done=True), NextStep(Step.FINISH)),
    (State(("ready",)), "approve", Illegal, None),
    (IDLE, "take lease", State(phase=RUNNING, lease=True), NextStep(Step.CALL_MODEL)),
    (IDLE, "release lease", IDLE, NextStep(Step.CALL_MODEL)),
    (IDLE, "interrupt", State(phase=INTERRUPTED), NextStep(Step.CALL_MODEL)),
    (IDLE, "request cancel", State(phase=ASKED, lease=True, cancel=True), NextStep(Step.FINISH)),
    # After an answer: a new call makes the model owe an answer again; no lease to renew.
    (State(done=True), "request", State(("ready",)), NextStep(Step.RUN_TOOLS)),
    (State(done=True), "renew", Illegal, None),
    # A person decides; a decision refused or expired is recorded as an error result.
    (
        State(("awaiting_approval", "awaiting_client")),
        "approve",
        State(("ready", "awaiting_client")),
        NextStep(Step.RUN_TOOLS),
    ),
    (State(("awaiting_approval",)), "reject", State(("rejected",)), NextStep(Step.RUN_TOOLS)),
    (State(("awaiting_approval",)), "expire", State(("rejected",)), NextStep(Step.RUN_TOOLS)),
    (State(("outcome_unknown",)), "approve", State(("ready",)), NextStep(Step.RUN_TOOLS)),
    (State(("awaiting_approval",)), "defer", Illegal, None),
    (State(("awaiting_approval",)), "settle", Illegal, None),
    (State(("awaiting_input",)), "approve", Illegal, None),
    (State(("rejected",)), "settle", IDLE, NextStep(Step.CALL_MODEL)),
    # Running: the lease is held; results are recorded, or a call goes elsewhere.
    (
        State(("ready",)),
        "take lease",
        State(("ready",), RUNNING, lease=True),
        NextStep(Step.RUN_TOOLS),
    ),
    (
        State(("ready",), RUNNING, lease=True),
        "take lease",
        State(("ready",), RUNNING, lease=True),
        NextStep(Step.RUN_TOOLS),
    ),
    (
        State(("ready",), RUNNING, lease=True),
        "settle",
        State((), RUNNING, lease=True),
        NextStep(Step.CALL_MODEL),
    ),
    (
        State(("ready",), RUNNING, lease=True),
        "defer",
        State(("deferred",), RUNNING, lease=True),
        NextStep(Step.WAIT, ("async",)),
    ),
    (
        State(("ready",), INTERRUPTED),
        "mark unknown",
        State(("outcome_unknown",), INTERRUPTED),
        NextStep(Step.WAIT, ("approval",)),
    ),
    (
        State(("deferred",), RUNNING, lease=True),
        "release lease",
        State(("deferred",)),
        NextStep(Step.WAIT, ("async",)),
    ),
    (
        State((), RUNNING, lease=True),
        "interrupt",
        State((), INTERRUPTED),
        NextStep(Step.CALL_MODEL),
    ),
    (State(("ready",), RUNNING, lease=True), "request cancel", Illegal, None),
    (State(("ready",), INTERRUPTED), "release lease", Illegal, None),
    # A cancel: taken in by the run it asks, which stops at its next step boundary.
    (
        State(("ready",), RUNNING, lease=True),
        "take cancel",
        State(("ready",), RUNNING, lease=True, cancel=True),
        NextStep(Step.STOP),
    ),
    (
        State(("ready",), INTERRUPTED),
        "take cancel",
        State(("ready",), INTERRUPTED, cancel=True),
        NextStep(Step.STOP),
    ),
    (
        State(("awaiting_approval",)),
        "take cancel",
        State(("awaiting_approval",), cancel=True),
        NextStep(Step.WAIT, ("approval",)),
    ),
    (
        State(("ready", "awaiting_approval", "deferred"), RUNNING, lease=True, cancel=True),
        "cancel turn",
        IDLE,
        NextStep(Step.CALL_MODEL),
    ),
    (State(phase=ASKED, lease=True, cancel=True), "cancel turn", IDLE, NextStep(Step.CALL_MODEL)),
    (State(phase=ASKED, lease=True, cancel=True), "take lease", Illegal, None),
]


def _row_id(row: tuple[State, str, object, object]) -> str:
    state, how, _, _ = row
    return f"{state.phase.value}{list(state.calls)}{'+cancel' if state.cancel else ''}-{how}"


@pytest.mark.parametrize(("state", "how", "after", "step"), TABLE, ids=map(_row_id, TABLE))
def test_every_move_of_the_table(
    state: State, how: str, after: State | type[IllegalTransition], step: NextStep | None
) -> None:
    machine = state.machine()
    if after is IllegalTransition:
        with pytest.raises(IllegalTransition):
            MOVES[how](machine)
        assert State.of(machine) == state  # a refused move changes nothing
        return
    MOVES[how](machine)
    assert State.of(machine) == after
    assert machine.next_step() == step


@pytest.mark.parametrize(("phase", "how"), list(itertools.product(list(RunPhase), RUN_MOVES)))
def test_every_run_move_from_every_phase_follows_the_table(phase: RunPhase, how: RunMove) -> None:
    machine = TurnMachine(phase=phase)
    sources, target = RUN_MOVES[how]
    if phase in sources:
        machine.run_move(how)
        assert machine.phase is target
    else:
        with pytest.raises(IllegalTransition):
            machine.run_move(how)
        assert machine.phase is phase


@pytest.mark.parametrize(
    ("state", "written"),
    [
        (State(("awaiting_client", "awaiting_approval")), ConversationStatus.AWAITING_APPROVAL),
        (State(("deferred",)), ConversationStatus.AWAITING_ASYNC_TOOLS),
        (State(("ready",)), ConversationStatus.RUNNING_TOOLS),
        (State(), ConversationStatus.COMPLETE),
        (State((), RUNNING, lease=True), ConversationStatus.RUNNING_TOOLS),
        (State(("awaiting_approval",), INTERRUPTED), ConversationStatus.RUNNING_TOOLS),
        (State((), ASKED, lease=True, cancel=True), ConversationStatus.RUNNING_TOOLS),
    ],
)
def test_a_commit_writes_the_status_the_machine_derives(
    state: State, written: ConversationStatus
) -> None:
    machine = state.machine()
    # The lease and the cancel are written only mid-run; the waits show once it ends.
    mid_run = state.phase is not RunPhase.IDLE
    assert machine.written() == (
        written,
        machine.lease if mid_run else None,
        machine.cancel if mid_run else None,
    )


#: Whole turns, move by move, with the step the machine says after each.
HISTORIES: dict[str, list[tuple[str, Step]]] = {
    "a tool turn": [
        ("request", Step.RUN_TOOLS),
        ("take lease", Step.RUN_TOOLS),
        ("settle", Step.CALL_MODEL),
        ("answer", Step.FINISH),
        ("release lease", Step.FINISH),
    ],
    "an approval": [
        ("ask approval", Step.WAIT),
        ("approve", Step.RUN_TOOLS),
        ("take lease", Step.RUN_TOOLS),
        ("settle", Step.CALL_MODEL),
        ("request", Step.RUN_TOOLS),
        ("settle", Step.CALL_MODEL),
        ("answer", Step.FINISH),
    ],
    "a deferred job": [
        ("request", Step.RUN_TOOLS),
        ("take lease", Step.RUN_TOOLS),
        ("defer", Step.WAIT),
        ("release lease", Step.WAIT),
        ("settle", Step.CALL_MODEL),
    ],
    "a cancel mid-run": [
        ("request", Step.RUN_TOOLS),
        ("take lease", Step.RUN_TOOLS),
        ("take cancel", Step.STOP),
        ("cancel turn", Step.CALL_MODEL),
    ],
    "a model that fails after tools": [
        ("request", Step.RUN_TOOLS),
        ("take lease", Step.RUN_TOOLS),
        ("settle", Step.CALL_MODEL),
        ("interrupt", Step.CALL_MODEL),
        ("take lease", Step.CALL_MODEL),
        ("answer", Step.FINISH),
    ],
}


@pytest.mark.parametrize("name", sorted(HISTORIES))
def test_a_turn_replays_to_the_steps_it_took(name: str) -> None:
    machine = TurnMachine()
    assert machine.next_step() == NextStep(Step.CALL_MODEL)
    steps = []
    for how, _ in HISTORIES[name]:
        MOVES[how](machine)
        steps.append(machine.next_step().step)
    assert steps == [step for _, step in HISTORIES[name]]


def test_a_cancel_settles_every_pending_call_and_ends_the_run() -> None:
    machine = State(("awaiting_approval", "deferred", "ready"), INTERRUPTED, cancel=True).machine()
    machine.pending[1] = machine.pending[1].model_copy(update={"task_id": "t"})
    cancelled = machine.cancel_turn(by="ops", reason="stop")
    assert cancelled.call_ids == ["c1", "c2", "c3"]
    assert State.of(machine) == IDLE and machine.status() is ConversationStatus.COMPLETE
    assert [type(p).__name__ for p in cancelled.events] == [
        "ApprovalResolved",
        "ToolResult",
        "ToolCallSettled",
        "ToolResult",
        "ToolResult",
        "TurnInterrupted",
    ]


def test_a_settle_is_checked_against_the_table() -> None:
    machine = State(("ready",)).machine()
    with pytest.raises(IllegalTransition):
        machine.settle(["c1"], CallMove.REJECT)  # a call that runs is not decided
    with pytest.raises(IllegalTransition):
        machine.change(call("ready", "c9"), CallMove.DEFER)  # no such pending call
    assert State.of(machine) == State(("ready",))


def test_a_reset_goes_back_to_the_last_commit() -> None:
    machine = State(("ready",), RUNNING, lease=True, cancel=True, done=True).machine()
    machine.reset([call("awaiting_approval")])
    assert State.of(machine) == State(("awaiting_approval",))
