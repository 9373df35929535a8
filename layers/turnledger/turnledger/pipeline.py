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
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property

from .config import Settings
from .context import build_messages
from .exceptions import (
    ApprovalPending,
    ConversationBusy,
    ConversationNotFound,
    NotAwaitingApproval,
    ProviderError,
    UnknownToolCall,
)
from .execution import ToolCalls, TurnWork, decided_in_turn, replace_pending, status_of
from .models import (
    ApprovalResolved,
    AssistantMessage,
    ConversationKey,
    ConversationStatus,
    Event,
    Head,
    PendingCall,
    ToolCall,
    TurnOptions,
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
    OutputMessage,
    PendingToolCallView,
    TurnRequest,
    TurnResponse,
)
from .session import Clock, Session, utc_now
from .store.base import ContextBudget, ConversationStore, PurgeReport
from .tools.executors import ToolRunner
from .tools.registry import ToolRegistry

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
        self.calls = ToolCalls(
            registry=lambda: self.tools, runner=runner, settings=settings, clock=clock
        )
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
        self.calls.expire_approvals(session)
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
            self.calls.settle_rejected(work)
            self.calls.run_ready(work)
            if session.staged:
                session.commit(status_of(session))
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
        self.calls.apply_client_outputs(work, outputs, closing=bool(messages))
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
        expired = self.calls.expire_approvals(session)
        awaiting = {p.id: p for p in session.pending if p.state == "awaiting_approval"}
        rejections = request.rejections()
        named = [*request.approve, *rejections]
        if not awaiting and not expired and head.status is ConversationStatus.RUNNING_TOOLS:
            # A retry after a crash: the decisions were recorded; finish the turn. Only
            # decisions of this turn may resume it, so a stray id is still an error.
            unknown = [i for i in named if i not in decided_in_turn(session)]
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
            self.calls.settle_rejected(work)
            self.calls.run_ready(work)
            session.commit(status_of(session))
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
            replace_pending(
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

    def _advance(self, work: TurnWork) -> None:
        """Drive the turn until the model answers in text, or it waits for someone."""
        session = work.session
        while True:
            self.calls.settle_rejected(work)
            self.calls.run_ready(work)
            status = status_of(session)
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
            self.calls.request(work, calls)

    def _call_model(self, work: TurnWork) -> ModelReply:
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

    def _work(self, session: Session) -> TurnWork:
        """The work of a request on the turn ``session`` is in, with that turn's options."""
        options = session.options
        return TurnWork(
            session=session,
            tools=self.tools.select(options.tools),
            model=options.model or self.settings.model,
            extra_approval=set(options.require_approval),
        )

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

    def _response(self, work: TurnWork) -> TurnResponse:
        session = work.session
        status = status_of(session)
        return TurnResponse(
            conversation_id=session.key.conversation_id,
            turn=session.turn,
            status=_PUBLIC_STATUS[status],
            status_reason=work.status_reason,
            output_text=work.output_text,
            output=work.output,
            pending_tool_calls=self._waiting(session.pending),
            usage=work.usage,
            context=ContextInfo(messages_sent=work.messages_sent, provider_state="fresh"),
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
