"""The runner: one object per request drives a turn's steps, and is the only place in
:mod:`turnledger.turn` that commits (``tests/unit/test_turn_shape.py`` checks it).

A step is: stop if a cancel asks to, settle rejected calls, run ready ones, end the
step when something waits, else call the model (:mod:`.model_call`) and record its
answer; a text answer ends the turn. The runner also opens the request's sessions,
admits the request (:mod:`.admission`), records a failed model call, and lets go of a
lease the request holds when it fails (:meth:`TurnRunner.guarded`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..core import telemetry
from ..core.exceptions import ConversationBusy, ProviderError, TurnledgerError
from ..core.models import (
    AssistantMessage,
    ConversationKey,
    Event,
    Head,
    ToolCall,
    TurnFailed,
    TurnInterrupted,
    Usage,
)
from ..core.observability import logger
from ..store.base import Snapshot
from . import admission, traces
from .drafts import DraftSink, TurnCancelled
from .execution import TurnWork
from .lifecycle import cancel_requested, holds_lease, is_running, is_tombstone
from .machine import Step
from .model_call import json_answer
from .policy_gate import retention_seconds
from .results import OutputText
from .session import Session

if TYPE_CHECKING:
    from .pipeline import Conversations


class TurnRunner:
    """Drives one request's turn: its sessions, its admission, its steps and every commit."""

    def __init__(self, service: Conversations, sink: DraftSink | None = None) -> None:
        self.service = service
        #: Where the model's answer streams (the turn's draft), if anywhere.
        self.sink = sink
        #: The sessions this request opened, each with the head it was opened on.
        self.opened: list[tuple[Session, Head | None]] = []

    def commit(self, session: Session) -> Head:
        """Commit what ``session`` staged: the one commit site of the turn layer.

        Raises:
            ConversationBusy: another request on this conversation committed first.
        """
        traces.committing(session)
        return session.commit()

    def guarded[R](self, step: Callable[[], R]) -> R:
        """Run ``step``; whatever it raises leaves no conversation held: each session it
        opened and committed while holding a lease is let go (:meth:`let_go`) before the
        error goes on (a domain error as it was, anything else as a ``500``). The request's
        telemetry span (``invoke_agent``) covers it."""
        with telemetry.agent_run():
            try:
                return step()
            except Exception:
                for session, head in self.opened:
                    self.let_go(session, head)
                raise

    def let_go(self, session: Session, opened_on: Head | None) -> None:
        """After ``session``'s request failed: if the stored head holds a lease this request
        took (its run did not reach the end of its step), release it with a commit of that
        head and nothing else, marked interrupted. What the failed step staged is dropped:
        the next request resumes the run from the log under the same idempotency keys, and
        a call of a tool that cannot deduplicate becomes ``outcome_unknown`` (it may have
        run), as after a crash.

        The head is read again: a commit may have landed and still raised (an answer lost
        on the way back). A lease this request never took (a crashed run's, found on
        ``opened_on``) is left to run out. Never raises: when the release itself fails, the
        lease runs out as a crashed run's would.
        """
        head = session.head
        taken = [
            session.machine.lease,
            head.lease if head is not None and head is not opened_on else None,
        ]
        mine = {lease.owner for lease in taken if lease is not None}
        if not mine:
            return
        try:
            stored = session.store.get_head(session.key)
            if (
                stored is None
                or not is_running(stored)
                or stored.lease is None
                or stored.lease.owner not in mine
            ):
                return
            session.head = stored
            session.rollback()
            session.machine.take_cancel(
                stored.cancel
            )  # asked meanwhile: the next request honours it
            session.machine.interrupt()
            self.commit(session)
        except Exception as exc:
            logger.warning(
                "could not release the lease of a failed request; it runs out instead",
                extra={"error_type": type(exc).__name__},
            )

    def admit(
        self, session: Session, rules: admission.Rules, loaded: Snapshot | None = None
    ) -> None:
        """Admit this request on ``session`` (:func:`.admission.admit`, once per request):
        the draft sink begins the turn's draft (``loaded``: the turn's load, whose run flag
        it reads), and a cancel that asked a run which then died is stopped and committed.

        Raises:
            ConversationBusy, BudgetExceeded, ApprovalPending, InputPending: see
                :func:`.admission.admit`.
        """
        now = self.service.clock()
        head = session.head
        visible = head if head is not None and head.is_visible(now) else None
        sink = self.sink
        admission.admit(
            visible,
            now,
            rules,
            run_flag=(lambda: sink.begin(visible, loaded))
            if sink is not None and loaded is not None
            else None,
            stop=lambda: self.stop_cancelled(session),
        )

    def stop_cancelled(self, session: Session) -> bool:
        """Stop the turn a cancel asked to stop, if ``session``'s head carries one; the stop is
        committed. Returns whether it did."""
        if not session.honour_cancel():
            return False
        self.commit(session)
        return True

    def advance(self, work: TurnWork) -> None:
        """Drive the turn until the model answers in text, or it waits for someone."""
        session = work.session
        while True:
            if self.stopped(work):
                return
            self.service.calls.settle_rejected(work)
            self.service.calls.run_ready(work, self)
            # A step boundary: tools ran; a cancel sent meanwhile stops the turn here.
            if self.stopped(work):
                return
            if session.machine.next_step().step is not Step.CALL_MODEL:
                # Something waits (a person, the client, a job): the step ends here.
                self.end_step(work)
                return
            if work.model_calls >= max(self.service.settings.max_tool_steps, 1):
                work.status_reason = "max_tool_steps"
                self.end_step(work)
                return
            limit = self.service.settings.turn_budget_for(session.key.tenant)
            if limit and work.model_calls and _turn_usage(session) >= limit:
                work.status_reason = "turn_budget"
                self.end_step(work)
                return
            try:
                reply, run = self.service.call_model(work, self.sink)
            except ProviderError as exc:
                self.record_failure(work, exc)
                raise
            if not reply.tool_calls:
                run = self.service.extract_memory(work, run)
            session.usage = session.usage + reply.usage
            session.cost_usd += run.cost_usd
            work.usage = work.usage + reply.usage
            # The recorded message must carry the ids its results answer: a provider
            # that repeats an id in one reply would otherwise leave an invalid history.
            calls = _unique_ids(reply.tool_calls)
            value = json_answer(reply) if work.response_format and not calls else None
            answer = session.add(
                AssistantMessage(
                    content=reply.text if value is None else None,
                    content_json=value,
                    tool_calls=calls,
                    model=run.model,
                    usage=reply.usage,
                    run=run,
                ),
                actor=f"model:{run.model}",
            )
            self.service.keep_cursor(work, reply, answer.sequence)
            if reply.text:
                work.output.append(OutputText(content=reply.text))
                work.output_text = reply.text
                work.output_json = value
            if not calls:
                session.machine.answer()
                self.end_step(work)
                self.service.write_memory(work)
                return
            self.service.calls.request(work, calls)

    def adopt_cancel(self, work: TurnWork) -> bool:
        """Whether a cancel was written on the head this request runs; if so the session
        takes that head (the cancel changed nothing else), so it can commit the stop."""
        if not holds_lease(work.session.head, work.owner):
            return False
        session = work.session
        assert session.head is not None
        if cancel_requested(session.head):
            return True  # taken in already: a lease renewal met it between two rounds
        return session.adopt_cancel(self.service.store.get_head(session.key), work.owner)

    def finish_cancel(self, work: TurnWork) -> None:
        """Record the cancel the running request found and leave the conversation ready."""
        session = work.session
        assert session.head is not None and session.head.cancel is not None
        cancel = session.head.cancel
        session.cancel_turn(by=cancel.requested_by, reason=cancel.reason)
        work.status_reason = "cancelled"
        self.commit(session)

    def stopped(self, work: TurnWork) -> bool:
        """At a step boundary: stop here if a cancel asks this request to (one read of
        the head, only while this request holds the lease)."""
        if self.adopt_cancel(work):
            self.finish_cancel(work)
            return True
        return False

    def end_step(self, work: TurnWork) -> None:
        """End the run's step (its lease released) and commit it; if a cancel was written
        meanwhile, keep what the step recorded and stop the turn instead.

        Raises:
            ConversationBusy: another request (not a cancel) committed first.
        """
        work.session.machine.release_lease()
        try:
            self.commit(work.session)
        except ConversationBusy:
            if not self.adopt_cancel(work):
                raise
            self.finish_cancel(work)

    def record_failure(self, work: TurnWork, exc: ProviderError) -> None:
        """Commit a ``turn_failed`` event for a failed model call (``turn_interrupted``
        for one a cancel stopped while its answer streamed).

        Results of tools that already acted are facts and are kept with it (the turn
        is resumed by the next request); otherwise nothing of the turn is stored, and
        the caller sends its input again. Never raises: the provider's error is what
        the caller must see.
        """
        session = work.session
        failing_turn = max(session.turn, 1)
        if work.executed:
            # Nothing runs any more: the next request may resume at once (``interrupted``).
            session.machine.interrupt()
        else:
            session.rollback()
        if isinstance(exc, TurnCancelled):
            # Stopped mid-answer by ``POST .../cancel``: an interruption, not a failure.
            by = str(exc.details.get("interrupted_by") or "system")
            reason = exc.details.get("reason")
            session.add(
                TurnInterrupted(
                    interrupted_by=by, reason=str(reason) if reason is not None else None
                ),
                actor=by,
                turn=failing_turn,
            )
        else:
            session.add(
                TurnFailed(
                    code=exc.code,
                    status=exc.status,
                    attempts=max(int(exc.details.get("attempts", 1) or 1), 1),
                    message=str(exc.details.get("provider_message") or exc.message)[:500],
                ),
                actor="system",
                turn=failing_turn,
            )
            session.failed_turns += 1
        try:
            self.commit(session)
        except TurnledgerError as error:
            logger.warning("could not record a failed turn", extra={"code": error.code})

    def open(self, key: ConversationKey) -> Session:
        """Load a session for a turn: expired conversations are purged and start fresh."""
        return self.load(key)[0]

    def load(self, key: ConversationKey) -> tuple[Session, Snapshot]:
        """:meth:`open`, and the snapshot the session was opened from."""
        snapshot = self.service.store.load(key, self.service.budget)
        head = snapshot.head
        if head is not None and not is_tombstone(head) and head.is_expired(self.service.clock()):
            if self.service.store.purge_if_unchanged(key, head, self.service.clock()) is None:
                raise ConversationBusy("the conversation changed while it expired; retry")
            return self.load(key)
        return self.session(key, head, snapshot.events), snapshot

    def session(self, key: ConversationKey, head: Head | None, events: list[Event]) -> Session:
        session = Session.open(
            self.service.store,
            key,
            head=head,
            history=events,
            clock=self.service.clock,
            ttl_seconds=self.service.settings.ttl_for(key.tenant),
        )
        session.on_commit = self.service.on_commit
        session.retention_of = lambda name: retention_seconds(
            self.service.data_policy(key.tenant), name
        )
        self.opened.append((session, session.head))
        traces.opened(session)
        return session


def _turn_usage(session: Session) -> int:
    """Input + output tokens of the current turn's model calls so far."""
    total = Usage()
    for event in session.events:
        if event.turn == session.turn and isinstance(body := event.body(), AssistantMessage):
            total = total + body.usage
    return total.input_tokens + total.output_tokens


def _unique_ids(calls: list[ToolCall]) -> list[ToolCall]:
    """Calls with ids unique within one reply (a provider may repeat an id)."""
    seen: set[str] = set()
    unique = []
    for index, call in enumerate(calls):
        call_id = call.id if call.id not in seen else f"{call.id}_{index + 1}"
        seen.add(call_id)
        unique.append(call if call_id == call.id else call.model_copy(update={"id": call_id}))
    return unique
