"""The turn pipeline: load, append, call the model, run or pause tools, persist, answer.

:class:`Conversations` is the service behind every route. Its invariants:

* **A turn lands whole or not at all.** A plain turn is one commit at the end; a
  provider failure before anything ran leaves no trace.
* **Intent before action.** Tool calls are recorded (``tool_call_requested``,
  with an idempotency key) and committed *before* they run; results are
  recorded before the model sees them. A request that dies between two steps
  is resumed from the log by the next request: a call with a request and no
  result runs again under the same key; a recorded result never runs again.
* **Approvals are exact.** A decision records who, when and the hash of the
  exact arguments; execution re-checks the hash.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property

from .config import Settings
from .context import build_messages
from .exceptions import (
    ApprovalPending,
    ConversationBusy,
    ConversationNotFound,
    InternalError,
    NotAwaitingApproval,
    ProviderError,
    UnknownToolCall,
)
from .models import (
    ApprovalRequested,
    ApprovalResolved,
    AssistantMessage,
    ConversationKey,
    ConversationStatus,
    Event,
    Head,
    PendingCall,
    ToolCall,
    ToolCallRequested,
    ToolResult,
    TurnOptions,
    Usage,
    UserMessage,
    validate_conversation_id,
)
from .observability import timed
from .providers.base import ModelReply, ModelRequest, Provider
from .schemas import (
    ApprovalRequest,
    ContextInfo,
    ConversationView,
    EventsPage,
    EventView,
    FunctionCallOutput,
    InputMessage,
    OutputFunctionCall,
    OutputMessage,
    PendingToolCallView,
    TurnRequest,
    TurnResponse,
)
from .session import Clock, Session, utc_now
from .store.base import ContextBudget, ConversationStore, PurgeReport
from .tools.approval import arguments_sha256, requirement
from .tools.executors import ToolInvocation, ToolRunner, idempotency_key
from .tools.registry import ToolDefinition, ToolRegistry

#: The public statuses of a head (``running_tools`` is shown as itself on GET).
_PUBLIC_STATUS = {
    ConversationStatus.COMPLETE: "complete",
    ConversationStatus.AWAITING_APPROVAL: "awaiting_approval",
    ConversationStatus.AWAITING_CLIENT_TOOLS: "awaiting_client_tools",
    ConversationStatus.RUNNING_TOOLS: "complete",
}


@dataclass(frozen=True)
class Caller:
    """The verified identity of a request."""

    tenant: str
    actor: str


@dataclass
class _Turn:
    """What one request did, for its response."""

    session: Session
    tools: list[ToolDefinition]
    model: str
    extra_approval: set[str] = field(default_factory=set)
    output: list[OutputMessage | OutputFunctionCall] = field(default_factory=list)
    output_text: str | None = None
    messages_sent: int = 0
    model_calls: int = 0
    usage: Usage = field(default_factory=Usage)
    status_reason: str | None = None
    #: True once a tool ran in this request: its results must be recorded even if
    #: the model then fails.
    executed: bool = False


class Conversations:
    """The service: turns, approvals, reads and clear, for one deployment."""

    def __init__(
        self,
        *,
        store: ConversationStore,
        provider: Provider,
        settings: Settings,
        tools: ToolRegistry | Callable[[], ToolRegistry] | None = None,
        runner: ToolRunner | None = None,
        clock: Clock = utc_now,
    ) -> None:
        self.store = store
        self.provider = provider
        self.settings = settings
        # The registry may come from SSM: it is read on the first request that needs
        # it, so routes that never touch tools (reads, clear) never need its permission.
        self._tools = tools if tools is not None else ToolRegistry.empty()
        self.runner = runner
        self.clock = clock
        self.budget = ContextBudget(
            max_events=settings.context_max_events, max_chars=settings.context_max_chars
        )

    @cached_property
    def tools(self) -> ToolRegistry:
        """The tool registry (loaded on first use)."""
        return self._tools if isinstance(self._tools, ToolRegistry) else self._tools()

    # --- routes ---------------------------------------------------------------------------

    def turn(self, caller: Caller, conversation_id: str, request: TurnRequest) -> TurnResponse:
        """Run one turn (``POST .../turns``).

        Raises:
            ApprovalPending: calls of this conversation await approval.
            UnknownTool: the request names an unregistered tool.
            UnknownToolCall: a ``function_call_output`` names no pending client call.
            ConversationBusy: another request on this conversation committed first.
            ProviderError, ProviderTimeout: the model failed; nothing of the turn was stored.
        """
        key = self._key(caller, conversation_id)
        self.tools.select(request.tools)
        for name in request.require_approval:
            self.tools.get(name)  # an unknown name is an error, never silently ignored
        if isinstance(request.input, str):
            messages, outputs = [request.input], []
        else:
            messages = [i.content for i in request.input if isinstance(i, InputMessage)]
            outputs = [i for i in request.input if isinstance(i, FunctionCallOutput)]
        session = self._open(key)
        work = self._work(session)
        self._expire_approvals(session)
        awaiting = [p for p in session.pending if p.state == "awaiting_approval"]
        interrupted = session.head is not None and (
            session.head.status is ConversationStatus.RUNNING_TOOLS
        )
        if interrupted or not awaiting:
            # Finish what an earlier request left half done (expired or rejected calls,
            # calls recorded but never run) in *its* turn, before anything of this one is
            # staged: old results must precede the new input, and a failure of this
            # turn's model call must not take them down with it. Calls approved while
            # others still await a decision wait for the last decision instead.
            self._settle_rejected(work)
            self._run_ready(work)
            if session.staged:
                session.commit(self._status_of(session))
            work.executed = False
        if awaiting:
            raise ApprovalPending(
                "tool calls of this conversation await approval; decide them first",
                details={
                    "pending_tool_calls": [
                        self._pending_view(p).model_dump(mode="json") for p in awaiting
                    ]
                },
            )
        # Client results belong to the turn of their calls (a context window never
        # splits a call from its result); only new messages start a new turn. Outputs
        # alone continue the waiting turn, as a final approval does.
        self._apply_client_outputs(work, outputs, closing=bool(messages))
        if messages:
            session.begin_turn()
            session.options = TurnOptions(
                model=request.model,
                tools=request.tools,
                require_approval=request.require_approval,
            )
            work = self._work(session)
        for content in messages:
            session.add(UserMessage(content=content, metadata=request.metadata), actor=caller.actor)
        if not messages and any(p.state == "awaiting_client" for p in session.pending):
            session.commit(ConversationStatus.AWAITING_CLIENT_TOOLS)
            return self._response(work)
        self._advance(work)
        return self._response(work)

    def approve(
        self, caller: Caller, conversation_id: str, request: ApprovalRequest
    ) -> TurnResponse:
        """Decide pending calls (``POST .../approvals``); continue the turn when none is left.

        Raises:
            ConversationNotFound: no live conversation.
            NotAwaitingApproval: nothing awaits approval.
            UnknownToolCall: a decision names a call that is not pending approval.
            ConversationBusy: another request on this conversation committed first.
        """
        key = self._key(caller, conversation_id)
        snapshot = self.store.load(key, self.budget)
        head = snapshot.head
        if head is None or not head.is_visible(self.clock()):
            raise ConversationNotFound(f"conversation {conversation_id!r} not found")
        session = self._session(key, head, snapshot.events)
        work = self._work(session)
        expired = self._expire_approvals(session)
        awaiting = {p.id: p for p in session.pending if p.state == "awaiting_approval"}
        rejections = request.rejections()
        named = [*request.approve, *rejections]
        if not awaiting and not expired and head.status is ConversationStatus.RUNNING_TOOLS:
            # A retry after a crash: the decisions were recorded; finish the turn. Only
            # decisions of this turn may resume it, so a stray id is still an error.
            unknown = [i for i in named if i not in self._decided_in_turn(session)]
            if unknown:
                raise UnknownToolCall(
                    "these call ids are not pending approval",
                    details={"unknown": unknown, "pending": []},
                )
            self._advance(work)
            return self._response(work)
        if not awaiting and not expired:
            raise NotAwaitingApproval("nothing in this conversation awaits approval")
        if not awaiting:
            # Every decision came after the approval window closed: record the expiry
            # (the model gets the calls' errors with the next turn) and say so.
            self._settle_rejected(work)
            self._run_ready(work)
            session.commit(self._status_of(session))
            raise NotAwaitingApproval(
                "the pending approvals expired before this decision",
                details={"expired": expired},
            )
        unknown = [i for i in named if i not in awaiting]
        if unknown:
            raise UnknownToolCall(
                "these call ids are not pending approval",
                details={"unknown": unknown, "pending": sorted(awaiting), "expired": expired},
            )
        for call_id in [*request.approve, *rejections]:
            pending = awaiting[call_id]
            approved = call_id in request.approve
            session.add(
                ApprovalResolved(
                    call_id=call_id,
                    decision="approved" if approved else "rejected",
                    reason=None if approved else rejections.get(call_id),
                    approver=caller.actor,
                    arguments_sha256=pending.arguments_sha256,
                ),
                actor=caller.actor,
            )
            self._replace_pending(
                session,
                pending.model_copy(
                    update={
                        "state": "ready" if approved else "rejected",
                        "reason": None
                        if approved
                        else f"rejected by {caller.actor}"
                        + (f": {rejections[call_id]}" if rejections.get(call_id) else ""),
                    }
                ),
            )
        if any(p.state == "awaiting_approval" for p in session.pending):
            session.commit(ConversationStatus.AWAITING_APPROVAL)
            return self._response(work)
        self._advance(work)
        return self._response(work)

    def get(self, caller: Caller, conversation_id: str) -> ConversationView:
        """The head (``GET /v1/conversations/{id}``).

        Raises:
            ConversationNotFound: absent, expired, cleared, or another tenant's.
        """
        key = self._key(caller, conversation_id)
        head = self._visible_head(key)
        return ConversationView(
            conversation_id=conversation_id,
            # The head shows a turn whose tools are running as such; a turn's answer
            # reports it complete (the request that ran them is over).
            status="running_tools"
            if head.status is ConversationStatus.RUNNING_TOOLS
            else _PUBLIC_STATUS[head.status],
            turns=head.turn,
            events=head.event_count,
            created_at=head.created_at,
            updated_at=head.updated_at,
            expires_at=datetime.fromtimestamp(head.expires_at, tz=head.created_at.tzinfo)
            if head.expires_at is not None
            else None,
            ttl_seconds=head.ttl_seconds,
            pending_tool_calls=self._waiting(head.pending),
            usage=head.usage,
        )

    def events(self, caller: Caller, conversation_id: str, *, after: int, limit: int) -> EventsPage:
        """A page of the transcript (``GET .../events``).

        Raises:
            ConversationNotFound: absent, expired, cleared, or another tenant's.
        """
        key = self._key(caller, conversation_id)
        head = self._visible_head(key)
        events = self.store.read_events(key, head, after=after, limit=limit)
        last = events[-1].sequence if events else after
        return EventsPage(
            conversation_id=conversation_id,
            events=[EventView.model_validate(e.model_dump()) for e in events],
            next_after=last if last < head.event_count else None,
        )

    def clear(self, caller: Caller, conversation_id: str) -> PurgeReport:
        """Delete the conversation, its events and its objects (``DELETE``); absent is fine."""
        return self.store.clear(self._key(caller, conversation_id), self.clock())

    # --- the loop ---------------------------------------------------------------------------

    def _advance(self, work: _Turn) -> None:
        """Drive the turn until the model answers in text, or it waits for someone."""
        session = work.session
        while True:
            self._settle_rejected(work)
            self._run_ready(work)
            status = self._status_of(session)
            if status is not ConversationStatus.COMPLETE:
                session.commit(status)
                return
            if work.model_calls >= max(self.settings.max_tool_steps, 1):
                work.status_reason = "max_tool_steps"
                session.commit(ConversationStatus.COMPLETE)
                return
            reply = self._call_model(work)
            session.usage = session.usage + reply.usage
            work.usage = work.usage + reply.usage
            # The recorded message must carry the ids its results answer: a provider
            # that repeats an id in one reply would otherwise leave an invalid history.
            calls = _unique_ids(reply.tool_calls)
            session.add(
                AssistantMessage(
                    content=reply.text,
                    tool_calls=calls,
                    model=reply.model or work.model,
                    usage=reply.usage,
                ),
                actor=f"model:{reply.model or work.model}",
            )
            if reply.text:
                work.output.append(OutputMessage(content=reply.text))
                work.output_text = reply.text
            if not calls:
                session.commit(ConversationStatus.COMPLETE)
                return
            self._request_tools(work, calls)

    def _call_model(self, work: _Turn) -> ModelReply:
        session = work.session
        messages = build_messages(session.events, system_prompt=self.settings.system_prompt)
        specs = [tool.spec() for tool in work.tools]
        work.messages_sent = len(messages)
        work.model_calls += 1
        try:
            with timed("ModelLatency"):
                return self.provider.complete(
                    ModelRequest(model=work.model, messages=messages, tools=specs)
                )
        except ProviderError:
            if work.executed:
                # Tools already acted: their results are facts and must be kept.
                session.commit(ConversationStatus.RUNNING_TOOLS)
            raise

    def _request_tools(self, work: _Turn, calls: list[ToolCall]) -> None:
        session = work.session
        offered = {t.name: t for t in work.tools}
        now = self.clock()
        for call in calls:
            work.output.append(
                OutputFunctionCall(call_id=call.id, name=call.name, arguments=call.arguments)
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
            state = {"none": "ready", "approval": "awaiting_approval", "client": "awaiting_client"}
            expires_at = None
            if needs == "approval":
                expires_at = self._approval_deadline(session, now)
                session.add(
                    ApprovalRequested(
                        call_id=call.id,
                        arguments_sha256=arguments_sha256(call.arguments),
                        expires_at=expires_at,
                    ),
                    actor="system",
                )
            session.pending.append(
                PendingCall(
                    id=call.id,
                    name=call.name,
                    arguments=call.arguments,
                    requires=needs,
                    state=state[needs],
                    idempotency_key=key,
                    arguments_sha256=arguments_sha256(call.arguments),
                    expires_at=expires_at,
                )
            )

    def _run_ready(self, work: _Turn) -> None:
        """Run every call that is recorded and cleared to run, then record the results."""
        session = work.session
        ready = [p for p in session.pending if p.state == "ready"]
        if not ready:
            return
        if self.runner is None:
            raise InternalError("tool calls are ready but no tool runner is configured")
        # Checked before the intent is committed: arguments that no longer match what
        # was approved must leave no decision behind that would run them later.
        for pending in ready:
            if arguments_sha256(pending.arguments) != pending.arguments_sha256:
                raise InternalError(f"arguments of call {pending.id} changed after approval")
        # Intent first: what is about to run is committed before it runs.
        if (
            session.staged
            or session.head is None
            or (session.head.status is not ConversationStatus.RUNNING_TOOLS)
        ):
            session.commit(ConversationStatus.RUNNING_TOOLS)
        invocations = []
        for pending in ready:
            invocations.append(
                ToolInvocation(
                    tool=self.tools.get(pending.name),
                    call=ToolCall(id=pending.id, name=pending.name, arguments=pending.arguments),
                    tenant=session.key.tenant,
                    conversation_id=session.key.conversation_id,
                    idempotency_key=pending.idempotency_key,
                )
            )
        outcomes = self.runner.run(invocations)
        work.executed = True
        done = {p.id for p in ready}
        for pending, outcome in zip(ready, outcomes, strict=True):
            session.add(
                ToolResult(
                    call_id=pending.id,
                    name=pending.name,
                    output=outcome.output,
                    is_error=outcome.is_error,
                ),
                actor=f"tool:{pending.name}",
            )
        session.pending = [p for p in session.pending if p.id not in done]

    def _settle_rejected(self, work: _Turn) -> None:
        session = work.session
        for pending in [p for p in session.pending if p.state == "rejected"]:
            session.add(
                ToolResult(
                    call_id=pending.id,
                    name=pending.name,
                    output=f"tool call {pending.name} was not run: {pending.reason or 'rejected'}",
                    is_error=True,
                ),
                actor="system",
            )
        session.pending = [p for p in session.pending if p.state != "rejected"]

    def _apply_client_outputs(
        self, work: _Turn, outputs: list[FunctionCallOutput], *, closing: bool
    ) -> None:
        """Record client tool results; a new message closes the calls left unanswered."""
        session = work.session
        waiting = {p.id: p for p in session.pending if p.state == "awaiting_client"}
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
        answered = {o.call_id for o in outputs}
        session.pending = [
            p
            for p in session.pending
            if p.state != "awaiting_client" or (p.id in waiting and p.id not in answered)
        ]

    def _expire_approvals(self, session: Session) -> list[str]:
        """Resolve approvals whose window closed as rejected (``approval expired``)."""
        now = self.clock()
        expired = [
            p
            for p in session.pending
            if p.state == "awaiting_approval" and p.expires_at is not None and p.expires_at <= now
        ]
        for pending in expired:
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
            self._replace_pending(
                session,
                pending.model_copy(update={"state": "rejected", "reason": "approval expired"}),
            )
        return [p.id for p in expired]

    # --- helpers --------------------------------------------------------------------------

    def _key(self, caller: Caller, conversation_id: str) -> ConversationKey:
        return ConversationKey(
            tenant=caller.tenant, conversation_id=validate_conversation_id(conversation_id)
        )

    def _open(self, key: ConversationKey) -> Session:
        """Load a session for a turn: expired conversations are purged and start fresh."""
        snapshot = self.store.load(key, self.budget)
        head = snapshot.head
        if (
            head is not None
            and head.status is not ConversationStatus.CLEARED
            and head.is_expired(self.clock())
        ):
            if self.store.purge_if_unchanged(key, head, self.clock()) is None:
                raise ConversationBusy("the conversation changed while it expired; retry")
            return self._open(key)
        return self._session(key, head, snapshot.events)

    def _session(self, key: ConversationKey, head: Head | None, events: list[Event]) -> Session:
        return Session.open(
            self.store,
            key,
            head=head,
            history=events,
            clock=self.clock,
            ttl_seconds=self.settings.ttl_for(key.tenant),
        )

    def _visible_head(self, key: ConversationKey) -> Head:
        head = self.store.get_head(key)
        if head is None or not head.is_visible(self.clock()):
            raise ConversationNotFound(f"conversation {key.conversation_id!r} not found")
        return head

    def _approval_deadline(self, session: Session, now: datetime) -> datetime:
        window = self.settings.approval_ttl_seconds
        if session.ttl_seconds:
            window = min(window, session.ttl_seconds)
        return now + timedelta(seconds=window)

    def _work(self, session: Session) -> _Turn:
        """The work of a request on the turn ``session`` is in, with that turn's options."""
        options = session.options
        return _Turn(
            session=session,
            tools=self.tools.select(options.tools),
            model=options.model or self.settings.model,
            extra_approval=set(options.require_approval),
        )

    @staticmethod
    def _decided_in_turn(session: Session) -> set[str]:
        """Ids of the calls decided (approved, rejected or expired) in the current turn."""
        return {
            body.call_id
            for event in session.events
            if event.turn == session.turn and isinstance(body := event.body(), ApprovalResolved)
        }

    @staticmethod
    def _replace_pending(session: Session, updated: PendingCall) -> None:
        session.pending = [updated if p.id == updated.id else p for p in session.pending]

    @staticmethod
    def _status_of(session: Session) -> ConversationStatus:
        states = {p.state for p in session.pending}
        if "awaiting_approval" in states:
            return ConversationStatus.AWAITING_APPROVAL
        if "awaiting_client" in states:
            return ConversationStatus.AWAITING_CLIENT_TOOLS
        if states:
            return ConversationStatus.RUNNING_TOOLS
        return ConversationStatus.COMPLETE

    @classmethod
    def _waiting(cls, pending: list[PendingCall]) -> list[PendingToolCallView]:
        """The calls that wait for a human or for the client, as the API shows them."""
        return [
            cls._pending_view(p)
            for p in pending
            if p.state in ("awaiting_approval", "awaiting_client")
        ]

    @staticmethod
    def _pending_view(pending: PendingCall) -> PendingToolCallView:
        return PendingToolCallView(
            id=pending.id,
            name=pending.name,
            arguments=pending.arguments,
            requires="client" if pending.requires == "client" else "approval",
            expires_at=pending.expires_at,
        )

    def _response(self, work: _Turn) -> TurnResponse:
        session = work.session
        status = self._status_of(session)
        return TurnResponse(
            conversation_id=session.key.conversation_id,
            turn=session.turn,
            status=_PUBLIC_STATUS[status],
            status_reason=work.status_reason,
            output_text=work.output_text,
            output=work.output,
            pending_tool_calls=self._waiting(session.pending),
            usage=work.usage,
            context=ContextInfo(
                messages_sent=work.messages_sent, provider_state=self.provider.provider_state
            ),
        )


def _unique_ids(calls: list[ToolCall]) -> list[ToolCall]:
    """Calls with ids unique within one reply (a provider may repeat an id)."""
    seen: set[str] = set()
    unique = []
    for index, call in enumerate(calls):
        call_id = call.id if call.id not in seen else f"{call.id}_{index + 1}"
        seen.add(call_id)
        unique.append(call if call_id == call.id else call.model_copy(update={"id": call_id}))
    return unique
