"""The execution state of a turn: tool calls requested, decided, run and settled.

:class:`ToolCalls` holds the steps the turn loop (:mod:`turnledger.turn.pipeline`)
takes on a turn's calls. Every step stages canonical events on the
:class:`~turnledger.turn.session.Session` and moves its pending calls through the
turn's state machine (``session.machine``, :class:`~turnledger.turn.machine.TurnMachine`)
in step with them; the loop decides when to commit, with one rule here: what is about to run
is committed before it runs (:meth:`ToolCalls.run_ready`), so a request that
dies midway is resumed from the log under the same idempotency keys.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from math import ceil
from typing import Any, Literal, Protocol

from ..context.memory import Recall, WritePlan
from ..context.policy import DataPolicy
from ..core import deadline
from ..core.config import Settings
from ..core.exceptions import (
    ConversationBusy,
    InternalError,
    ToolDefinitionChanged,
    UnknownToolCall,
)
from ..core.models import (
    ApprovalExpired,
    ApprovalRequested,
    ApprovalResolved,
    ConversationKey,
    EventKind,
    Head,
    JsonObjectFormat,
    JsonSchemaFormat,
    PendingCall,
    ToolCall,
    ToolCallDeferred,
    ToolCallRequested,
    ToolCallSettled,
    ToolInputProvided,
    ToolResult,
    Usage,
)
from ..core.observability import logger
from ..providers.base import Provider
from ..providers.retry import Backoff
from ..tools.approval import arguments_sha256
from ..tools.executors import ToolInvocation, ToolOutcome, ToolRunner, idempotency_key
from ..tools.registry import (
    HttpExecutorConfig,
    McpExecutorConfig,
    ToolDefinition,
    ToolRegistry,
    requirement,
)
from . import callbacks, elicitations, policy_gate
from .approval_edits import check_definitions
from .commands import ClientOutput
from .lifecycle import AWAITING_DECISION, CallMove, call_target, lapsed
from .mcp_listings import record_listings
from .mcp_refresh import invalidate, stale_approvals
from .results import OutputCall, OutputText
from .session import Clock, Session

__all__ = ["ToolCalls", "TurnWork"]

#: The move that records a call, by what it needs.
_OPENING_MOVE = {
    "none": CallMove.REQUEST,
    "approval": CallMove.ASK_APPROVAL,
    "client": CallMove.AWAIT_CLIENT,
    "input": CallMove.ASK_INPUT,
}


class PolicySource(Protocol):
    """Where the tool steps read a tenant's data policy: the service."""

    def data_policy(self, tenant: str) -> DataPolicy | None: ...

    def forget_provider_state(self, responses: list[tuple[str, str]]) -> int: ...

    def token_secret(self, key: ConversationKey, gen: str, *, create: bool = False) -> bytes: ...


class Committer(Protocol):
    """What commits a session's staged step: the request's runner (:mod:`.runner`)."""

    def commit(self, session: Session) -> Head: ...


class Runner(Committer, Protocol):
    """The request's runner (:mod:`.runner`), as a step that stops for a cancel uses it."""

    def stop_cancelled(self, session: Session) -> bool: ...


@dataclass
class TurnWork:
    """One request's work on the current turn: its options, and what it did (for its answer)."""

    session: Session
    tools: list[ToolDefinition]
    model: str
    provider: Provider
    #: Names this request as the holder of the conversation's lease.
    owner: str = field(default_factory=lambda: secrets.token_hex(8))
    response_format: JsonObjectFormat | JsonSchemaFormat | None = None
    extra_approval: set[str] = field(default_factory=set)
    output: list[OutputText | OutputCall] = field(default_factory=list)
    output_text: str | None = None
    output_json: Any = None
    messages_sent: int = 0
    model_calls: int = 0
    usage: Usage = field(default_factory=Usage)
    status_reason: str | None = None
    #: True once a tool ran in this request: its results must be recorded even if
    #: the model then fails.
    executed: bool = False
    #: How the last model call's context was built and sent (the answer's ``context``).
    provider_state: Literal["fresh", "continued", "fallback"] = "fresh"
    tokens_estimated: int = 0
    budget_tokens: int = 0
    summary_through: int | None = None
    #: The user's memory as this request read it and what the turn recalled (``None``:
    #: not read yet); what write-back changes once the turn is committed.
    recall: Recall | None = None
    memory_plan: WritePlan | None = None


#: Seconds a lease outlasts the longest thing its holder may still do, so a slow but
#: live run is never taken for a crashed one.
LEASE_MARGIN_SECONDS = 5


def decided_in_turn(session: Session) -> set[str]:
    """Ids of the calls decided (approved, rejected or expired) in the current turn."""
    return {
        body.call_id
        for event in session.events
        if event.turn == session.turn and isinstance(body := event.body(), ApprovalResolved)
    }


def turn_actor(session: Session) -> str | None:
    """Who sent the current turn's input: the actor of its newest user message."""
    for event in reversed(session.events):
        if event.turn != session.turn:
            break
        if event.kind is EventKind.USER_MESSAGE:
            return event.actor
    return None


class ToolCalls:
    """The steps of a turn's tool calls, for one deployment's registry and runner."""

    def __init__(
        self,
        *,
        registry: Callable[[], ToolRegistry],
        runner: ToolRunner | None,
        settings: Settings,
        clock: Clock,
        policy: PolicySource | None = None,
    ) -> None:
        self._registry = registry
        #: The tenants' data policies, and what deletes provider state (the service).
        self._policy_source = policy
        self.runner = runner
        self.settings = settings
        self.clock = clock

    @property
    def tools(self) -> ToolRegistry:
        """The tool registry (loaded by its owner on first use)."""
        return self._registry()

    def request(self, work: TurnWork, calls: list[ToolCall]) -> None:
        """Record the model's calls: each one's intent and key, and what it waits for.

        Invalid or unknown calls get their error as the result at once (nothing runs);
        the rest become pending: ``ready``, ``awaiting_approval`` or ``awaiting_client``.
        """
        session = work.session
        offered = {t.name: t for t in work.tools}
        now = self.clock()
        for call in calls:
            work.output.append(
                OutputCall(call_id=call.id, name=call.name, arguments=call.arguments)
            )
            tool = offered.get(call.name)
            error = f"unknown tool {call.name!r}" if tool is None else tool.validate_call(call)
            needs = (
                "none"
                if tool is None
                else requirement(tool, call.arguments, extra_approval=work.extra_approval)
            )
            # The key names the request's place in the log, so it is unique per call
            # and a resumed request reads the same key back from the head.
            key = idempotency_key(
                session.key.tenant,
                session.key.conversation_id,
                session.gen,
                call.id,
                session.next_sequence,
            )
            session.add(
                ToolCallRequested(
                    call_id=call.id,
                    name=call.name,
                    arguments=call.arguments,
                    requires=needs,
                    idempotency_key=key,
                ),
                actor=f"model:{work.model}",
            )
            if error is not None:
                session.add(
                    ToolResult(call_id=call.id, name=call.name, output=error, is_error=True),
                    actor="system",
                )
                continue
            how = _OPENING_MOVE[needs]
            expires_at = None
            # An MCP call is bound to the definition it was asked under.
            definition = (
                tool.executor.definition_sha256
                if tool is not None and isinstance(tool.executor, McpExecutorConfig)
                else None
            )
            if needs == "approval":
                expires_at = self._approval_deadline(session, now)
                session.add(
                    ApprovalRequested(
                        call_id=call.id,
                        arguments_sha256=arguments_sha256(call.arguments),
                        expires_at=expires_at,
                        definition_sha256=definition,
                    ),
                    actor="system",
                )
            session.machine.open_call(
                PendingCall(
                    id=call.id,
                    name=call.name,
                    arguments=call.arguments,
                    requires=needs,
                    state=call_target(None, how),
                    idempotency_key=key,
                    arguments_sha256=arguments_sha256(call.arguments),
                    expires_at=expires_at,
                    requested_at=now,
                    requested_by=turn_actor(session),
                    definition_sha256=definition,
                ),
                how,
            )
        called = [offered[c.name] for c in calls if c.name in offered]
        if any(isinstance(t.executor, McpExecutorConfig) for t in called):
            record_listings(session, self.tools, called)

    def run_ready(self, work: TurnWork, committer: Committer) -> None:
        """Run every call that is recorded and cleared to run, then record the results.

        What is about to run is committed first, with a lease on the conversation:
        while it is live nobody else runs these calls. They run in rounds of the
        runner's parallel limit; before every round after the first the lease is
        renewed (:meth:`_renew`), and a request that lost it stops there. A run
        resumed after a crash (the head still ``running_tools``, its lease expired)
        repeats idempotent calls under their keys, and hands calls of tools that do
        not honour keys to a human (``outcome_unknown``): they may have run already.
        """
        session = work.session
        ready = [p for p in session.machine.pending if p.state == "ready"]
        if not ready:
            return
        if self.runner is None:
            raise InternalError("tool calls are ready but no tool runner is configured")
        # Checked before the intent is committed: arguments that no longer match what
        # was approved must leave no decision behind that would run them later.
        for pending in ready:
            if arguments_sha256(pending.arguments) != pending.arguments_sha256:
                raise InternalError(f"arguments of call {pending.id} changed after approval")
        gone = [p for p in ready if p.name not in self.tools]
        if gone:
            # Approved (or resumed) after its tool left the registry: nothing can run it,
            # and refusing the decision would leave the call waiting for ever.
            self._settle_unregistered(session, gone)
            ready = [p for p in ready if p not in gone]
            if not ready:
                return
        if session.resuming():
            unsure = [p for p in ready if not self._tool(p.name).idempotent]
            for pending in unsure:
                self._ask_about(session, pending)
            ready = [p for p in ready if p not in unsure]
            if not ready:
                return
        now = self.clock()
        session.machine.take_lease(work.owner, now, self._lease_seconds(ready))
        committer.commit(session)
        assert session.head is not None  # just committed
        deadlines = {p.id: self._deferred_deadline(session, p, now) for p in ready}
        invocations = []
        for pending in ready:
            invocations.append(
                ToolInvocation(
                    tool=self._tool(pending.name),
                    call=ToolCall(
                        id=pending.id,
                        name=pending.name,
                        arguments=self._arguments(session, pending),
                    ),
                    tenant=session.key.tenant,
                    conversation_id=session.key.conversation_id,
                    idempotency_key=pending.idempotency_key,
                    callback_url=self._callback_url(session, pending, deadlines[pending.id])
                    if self._defers(pending)
                    else None,
                    approval="approved" if pending.requires == "approval" else None,
                    elicitation=pending.elicitation,
                )
            )
        outcomes = self._run_in_rounds(work, ready, invocations, committer)
        work.executed = True
        done = set()
        for pending, outcome in zip(ready, outcomes, strict=True):
            if outcome.elicitation is not None:  # its tool asks a person first
                elicitations.ask(session, pending, outcome.elicitation)
                continue
            if outcome.task_id is not None:
                # Accepted to finish elsewhere: it waits for its callback (or deadline).
                session.add(
                    ToolCallDeferred(
                        call_id=pending.id,
                        name=pending.name,
                        task_id=outcome.task_id,
                        expires_at=deadlines[pending.id],
                    ),
                    actor=f"tool:{pending.name}",
                )
                session.machine.change(
                    pending,
                    CallMove.DEFER,
                    requires="async",
                    task_id=outcome.task_id,
                    expires_at=deadlines[pending.id],
                )
                continue
            done.add(pending.id)
            session.add(
                ToolResult(
                    call_id=pending.id,
                    name=pending.name,
                    output=outcome.output,
                    is_error=outcome.is_error,
                ),
                actor=f"tool:{pending.name}",
            )
            self._classify(session, pending.name, outcome.output)
        session.machine.settle(done)

    def _policy(self, session: Session) -> DataPolicy | None:
        source = self._policy_source
        return source.data_policy(session.key.tenant) if source is not None else None

    def _arguments(self, session: Session, pending: PendingCall) -> dict[str, Any]:
        """What the tool is sent: in a conversation with a data class, the values only a
        tool its class authorizes may receive (:func:`.policy_gate.tool_arguments`)."""
        policy = self._policy(session)
        source = self._policy_source
        if policy is None or source is None or session.data_class is None:
            return pending.arguments
        secret = source.token_secret(session.key, session.gen, create=True)
        return policy_gate.tool_arguments(policy, session, secret, pending.name, pending.arguments)

    def _classify(self, session: Session, tool: str, output: str) -> None:
        """Raise the conversation's class by the tool's ``result_class`` and by what the
        detectors find in its result."""
        policy = self._policy(session)
        if policy is None:
            return
        raised = policy_gate.rise(
            policy,
            session.data_class,
            named=self._tool(tool).result_class if tool in self.tools else None,
            texts=[output],
            source=f"tool:{tool}",
        )
        if raised is not None:
            forget = policy_gate.apply_rise(session, policy, raised, actor=f"tool:{tool}")
            if forget and self._policy_source is not None:
                self._policy_source.forget_provider_state(forget)

    def _ask_about(self, session: Session, pending: PendingCall) -> None:
        """Hand a call whose run may have happened to a human: approve runs it again
        (under its key), reject records it as failed."""
        expires_at = self._approval_deadline(session, self.clock())
        session.add(
            ApprovalRequested(
                call_id=pending.id,
                arguments_sha256=pending.arguments_sha256,
                expires_at=expires_at,
            ),
            actor="system",
        )
        session.machine.change(
            pending,
            CallMove.MARK_UNKNOWN,
            expires_at=expires_at,
            requested_at=self.clock(),
            reason="its request ended while it ran: it may have run already",
        )

    @staticmethod
    def _settle_unregistered(session: Session, gone: list[PendingCall]) -> None:
        """Answer calls whose tool is no longer registered with an error result; nothing
        runs (the model sees why with the turn's next step)."""
        for pending in gone:
            session.add(
                ToolResult(
                    call_id=pending.id,
                    name=pending.name,
                    output=f"tool call {pending.name} was not run: the tool "
                    f"{pending.name!r} is no longer registered",
                    is_error=True,
                ),
                actor="system",
            )
        session.machine.settle(p.id for p in gone)

    def _tool(self, name: str) -> ToolDefinition:
        return self.tools.get(name)

    def _defers(self, pending: PendingCall) -> bool:
        """Whether ``pending``'s tool may defer it: an ``http`` tool declared ``deferred``,
        the only kind sent a ``callback_url``."""
        executor = self._tool(pending.name).executor
        return isinstance(executor, HttpExecutorConfig) and executor.deferred

    def _deferred_deadline(self, session: Session, pending: PendingCall, now: datetime) -> datetime:
        """Until when a call, if its tool defers it, may wait for its callback (and its
        token lives): the tool's ``deferred_ttl_seconds`` (else
        :data:`~turnledger.turn.callbacks.DEFAULT_DEFERRED_SECONDS`), never past the
        conversation's TTL."""
        executor = self._tool(pending.name).executor
        window = (
            executor.deferred_ttl_seconds
            if isinstance(executor, HttpExecutorConfig) and executor.deferred_ttl_seconds
            else callbacks.DEFAULT_DEFERRED_SECONDS
        )
        if session.ttl_seconds:
            window = min(window, session.ttl_seconds)
        return now + timedelta(seconds=window)

    @staticmethod
    def _callback_url(session: Session, pending: PendingCall, deadline: datetime) -> str | None:
        """The signed callback URL of ``pending`` (``None``: none configured)."""
        assert session.head is not None
        return callbacks.callback_url(
            callbacks.CallbackClaims(
                tenant=session.key.tenant,
                conversation_id=session.key.conversation_id,
                created_at=callbacks.created_stamp(session.head.created_at),
                call_id=pending.id,
                idempotency_key=pending.idempotency_key,
                deadline=int(deadline.timestamp()),
            )
        )

    def _run_in_rounds(
        self,
        work: TurnWork,
        ready: list[PendingCall],
        invocations: list[ToolInvocation],
        committer: Committer,
    ) -> list[ToolOutcome]:
        """Run the calls at most the runner's parallel limit at a time, in call order,
        renewing the lease before every round after the first.

        Raises:
            ConversationBusy: the lease was lost between two rounds (nothing of this
                run is recorded: the request that took it over runs the calls).
        """
        assert self.runner is not None  # checked by the caller
        limit = self.runner.max_workers
        outcomes: list[ToolOutcome] = []
        for start in range(0, len(invocations), limit):
            if start:
                self._renew(work, ready[start:], committer)
            outcomes.extend(self.runner.run(invocations[start : start + limit]))
        return outcomes

    def _renew(self, work: TurnWork, rest: list[PendingCall], committer: Committer) -> None:
        """Extend this request's lease over the rounds still to run (``rest``): a commit
        of the head that expects the version this request wrote last.

        A cancel written meanwhile (it keeps the lease) is taken in and kept on the
        head; the turn stops at its next step boundary as it would have.

        Raises:
            ConversationBusy: anything else was committed since (a request that found
                the lease expired took the run over, or a clear): the lease is lost
                and this request must not run anything more.
        """
        session = work.session
        session.machine.renew_lease(self.clock(), self._lease_seconds(rest))
        try:
            committer.commit(session)
            return
        except ConversationBusy:
            if not session.adopt_cancel(session.store.get_head(session.key), work.owner):
                logger.warning(
                    "a tool run lost its lease; it stops before its next round",
                    extra={"calls_not_run": len(rest)},
                )
                raise
        committer.commit(session)

    def _lease_seconds(self, rest: list[PendingCall]) -> float:
        """How long the run of ``rest`` and the rest of its step may take, plus a margin.

        The calls run in ``ceil(n / parallel limit)`` rounds, each as long as the slowest
        call's timeout at most; then comes the step's model work: a context summary and
        the model call, each with every attempt and the longest backoff between them.
        Within a request with a deadline this is cut to the time the function has left
        (:func:`turnledger.core.deadline.life_left`): a run never outlives its function, so a
        longer lease would only keep a crashed run from being resumed. The margin
        (:data:`LEASE_MARGIN_SECONDS`) is added last either way.
        """
        settings = self.settings
        limit = self.runner.max_workers if self.runner is not None else 1
        slowest = max(
            getattr(self._tool(p.name).executor, "timeout_seconds", None)
            or settings.tool_timeout_seconds
            for p in rest
        )
        retries = settings.provider_max_retries
        model_call = (
            settings.provider_timeout_seconds * (retries + 1)
            + Backoff.max_backoff_seconds * retries
        )
        step = ceil(len(rest) / limit) * float(slowest) + 2 * model_call
        left = deadline.life_left()
        if left is not None:
            step = min(step, left)
        return step + LEASE_MARGIN_SECONDS

    def settle_rejected(self, work: TurnWork) -> None:
        """Answer rejected (or expired) calls with an error result saying why; nothing runs."""
        session = work.session
        rejected = [p for p in session.machine.pending if p.state == "rejected"]
        for pending in rejected:
            session.add(
                ToolResult(
                    call_id=pending.id,
                    name=pending.name,
                    output=f"tool call {pending.name} was not run: {pending.reason or 'rejected'}",
                    is_error=True,
                ),
                actor="system",
            )
        session.machine.settle(p.id for p in rejected)

    def apply_client_outputs(
        self, work: TurnWork, outputs: list[ClientOutput], *, closing: bool
    ) -> None:
        """Record client tool results; a new message closes the calls left unanswered."""
        session = work.session
        waiting = {p.id: p for p in session.machine.pending if p.state == "awaiting_client"}
        unknown = [o.call_id for o in outputs if o.call_id not in waiting]
        if unknown:
            raise UnknownToolCall(
                "function_call_output names a call that is not awaiting the client",
                details={"unknown": unknown, "pending": sorted(waiting)},
            )
        for output in outputs:
            pending = waiting.pop(output.call_id)
            session.add(
                ToolResult(call_id=pending.id, name=pending.name, output=output.output),
                actor="client",
            )
        if closing:
            for pending in waiting.values():
                session.add(
                    ToolResult(
                        call_id=pending.id,
                        name=pending.name,
                        output=f"tool call {pending.name} was not run: "
                        "unresolved (the client sent a new message instead of its result)",
                        is_error=True,
                    ),
                    actor="system",
                )
            waiting.clear()
        session.machine.settle(
            p.id
            for p in session.machine.pending
            if p.state == "awaiting_client" and p.id not in waiting
        )

    def refuse_changed_definitions(
        self,
        work: TurnWork,
        undecided: Mapping[str, PendingCall],
        approving: Collection[str],
        run: Runner,
        read_since: float,
    ) -> None:
        """Before a decision: invalidate the waiting MCP calls whose tool definition changed
        (:func:`.approval_edits.check_definitions`, on listings read since ``read_since``),
        whether or not the decision names them,
        record that (with what it lets run, as after expired approvals), and refuse.

        Raises:
            ToolDefinitionChanged: such calls wait; their invalidation is committed.
        """
        try:
            check_definitions(self.tools, undecided, approving, read_since=read_since)
        except ToolDefinitionChanged as exc:
            session = work.session
            invalidate(session, [c["id"] for c in exc.details["calls"]])
            self.settle_rejected(work)
            self.run_ready(work, run)
            if not run.stop_cancelled(session):
                session.machine.release_lease()
                run.commit(session)
            raise

    def invalidate_refreshed(self, work: TurnWork, run: Runner) -> list[str]:
        """Invalidate the waiting MCP calls whose tool's definition the listing read now
        (:func:`.mcp_refresh.stale_approvals`) changed, record that listing in the
        conversation and commit, with what the invalidation lets run (as after expired
        approvals). Returns the invalidated ids (usually none: nothing is written then).
        """
        session = work.session
        waiting = [p for p in session.machine.pending if p.state in AWAITING_DECISION]
        stale = stale_approvals(self.tools, waiting)
        if not stale:
            return []
        invalidate(session, ids := [pending.id for pending, _ in stale])
        listed = [self.tools.get(p.name) for p, now in stale if now is not None]
        record_listings(session, self.tools, listed)
        self.settle_rejected(work)
        self.run_ready(work, run)
        if not run.stop_cancelled(session):
            session.machine.release_lease()
            run.commit(session)
        return ids

    def expire_approvals(self, session: Session) -> list[str]:
        """Resolve approvals whose window closed as rejected (``approval expired``)."""
        now = self.clock()
        expired = [
            p for p in session.machine.pending if p.state in AWAITING_DECISION and lapsed(p, now)
        ]
        for pending in expired:
            assert pending.expires_at is not None  # selected above on its expiry
            session.add(
                ApprovalExpired(
                    call_id=pending.id,
                    arguments_sha256=pending.arguments_sha256,
                    expires_at=pending.expires_at,
                ),
                actor="system",
            )
            session.add(
                ApprovalResolved(
                    call_id=pending.id,
                    decision="rejected",
                    reason="approval expired",
                    approver="system",
                    arguments_sha256=pending.arguments_sha256,
                ),
                actor="system",
            )
            session.machine.change(pending, CallMove.EXPIRE, reason="approval expired")
        return [p.id for p in expired]

    def provide_outputs(
        self,
        session: Session,
        outputs: dict[str, str],
        *,
        actor: str,
        via: Literal["approvals", "turn"],
    ) -> None:
        """Record outputs a person (or the application) supplied for human-input calls,
        or for deferred calls it settles itself, and answers to what a running call's tool
        asked (:mod:`.elicitations`). Every id must name such a call.

        Raises:
            UnknownToolCall: an id names no call that waits for its output.
            RequestValidationFailed: an answer does not fit the tool's question.
        """
        waiting = {
            p.id: p for p in session.machine.pending if p.state in ("awaiting_input", "deferred")
        }
        unknown = [call_id for call_id in outputs if call_id not in waiting]
        if unknown:
            raise UnknownToolCall(
                "these call ids do not wait for an output",
                details={"unknown": unknown, "pending": sorted(waiting)},
            )
        answers = elicitations.check_answers(waiting, outputs)  # all checked, then recorded
        for call_id, output in outputs.items():
            pending = waiting[call_id]
            if call_id in answers:
                elicitations.answer(session, pending, answers[call_id], actor=actor, via=via)
                continue
            if pending.state == "deferred":
                self.settle_deferred(session, pending, "succeeded", output, via=via, actor=actor)
                continue
            session.add(
                ToolInputProvided(call_id=call_id, name=pending.name, provided_by=actor, via=via),
                actor=actor,
            )
            session.add(ToolResult(call_id=call_id, name=pending.name, output=output), actor=actor)
            session.machine.settle([call_id])

    def settle_deferred(
        self,
        session: Session,
        pending: PendingCall,
        status: Literal["succeeded", "failed", "cancelled"],
        output: str,
        *,
        via: Literal["callback", "approvals", "turn", "timeout", "cancel"],
        actor: str,
    ) -> None:
        """Record a deferred call's outcome (``tool_call_settled`` and its result)."""
        call_target(pending.state, CallMove.SETTLE)
        session.add(
            ToolCallSettled(
                call_id=pending.id,
                name=pending.name,
                status=status,
                via=via,
                task_id=pending.task_id,
            ),
            actor=actor,
        )
        text = output
        if status == "failed":
            text = (
                f"tool {pending.name} failed: {output}" if output else f"tool {pending.name} failed"
            )
        elif status == "cancelled":
            text = f"tool call {pending.name} was cancelled" + (f": {output}" if output else "")
        session.add(
            ToolResult(
                call_id=pending.id,
                name=pending.name,
                output=text,
                is_error=status != "succeeded",
            ),
            actor=actor,
        )
        session.machine.settle([pending.id])

    def expire_due(self, session: Session) -> list[str]:
        """Settle what is due now: approvals whose window closed are rejected
        (:meth:`expire_approvals`), deferred calls past their deadline fail ("timed out").

        Returns:
            The ids of the calls settled, approvals first.
        """
        expired = self.expire_approvals(session)
        now = self.clock()
        for pending in [
            p for p in session.machine.pending if p.state == "deferred" and lapsed(p, now)
        ]:
            self.settle_deferred(
                session,
                pending,
                "failed",
                "timed out (no callback before its deadline)",
                via="timeout",
                actor="system",
            )
            expired.append(pending.id)
        return expired

    def _approval_deadline(self, session: Session, now: datetime) -> datetime:
        window = self.settings.approval_ttl_seconds
        if session.ttl_seconds:
            window = min(window, session.ttl_seconds)
        return now + timedelta(seconds=window)
