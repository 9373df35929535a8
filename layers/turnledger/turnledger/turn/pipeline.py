"""The turn service: every entry that acts on a conversation (turn, approve, append,
compact, cancel, fork, settle a callback, expire waits).

:class:`Conversations` is the service behind every route: it takes the request's
:class:`~turnledger.core.models.ConversationKey`, its actor and a domain command
(:mod:`turnledger.turn.commands`), and answers a domain result
(:mod:`turnledger.turn.results`); HTTP bodies are the edge's (:mod:`turnledger.api`).
Every status and move is the turn's owner's (:mod:`turnledger.turn.lifecycle`). Each
entry is admitted once (:mod:`.admission`) and driven by one runner (:mod:`.runner`), the
only place that commits; the model call (:mod:`.model_call`), the memory step
(:mod:`.memory_step`) and provider selection (:mod:`.selection`) are mixed in. A turn
runs: edge -> drafted run (:mod:`.longturns`) -> :meth:`Conversations.turn` ->
:class:`~.runner.TurnRunner` -> :class:`~.session.Session` -> store. Its invariants:

* **A turn lands whole or not at all.** A plain turn is one commit at the end; a
  provider failure before anything ran leaves no trace.
* **Intent before action.** Tool calls are recorded (``tool_call_requested``,
  with an idempotency key) and committed *before* they run; results are
  recorded before the model sees them. A request that dies between two steps
  is resumed from the log by the next request: a call with a request and no
  result runs again under the same key; a recorded result never runs again.
* **Approvals are exact.** A decision records who, when and the hash of the
  exact arguments; execution re-checks the hash.
* **The context is built to a budget** (:mod:`turnledger.context.assembly`), compacted
  into a ``context_compacted`` event in the turn's own commit when older turns
  no longer fit, and every model call is explained by the run record on its
  ``assistant_message``.
* **A failed model call is recorded, never sent.** A ``turn_failed`` event
  (with nothing else of the turn, unless tools already acted) is committed and
  the error answered; the caller simply sends again.
* **A failure nobody foresaw holds nothing.** Whatever a turn, an approval or a
  callback raises (a bug: a ``500``), the conversation is left as the request's last
  commit left it, and a lease that commit holds is released at once
  (:meth:`.runner.TurnRunner.guarded`): the next request resumes the run as it would a
  crashed one's (:mod:`turnledger.turn.execution`), without waiting out the lease.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import cached_property

from ..context.policy import DataPolicy
from ..context.redaction import Redactor
from ..core.config import Settings
from ..core.exceptions import (
    ApprovalPending,
    CallbackInvalid,
    ConversationBusy,
    ConversationNotFound,
    DataPolicyUnsatisfied,
    InvalidRequest,
    NotAwaitingApproval,
    UnknownToolCall,
)
from ..core.models import (
    STORED_HASH_CHARS,
    ApprovalResolved,
    AssistantMessage,
    CancelRequest,
    ConversationKey,
    Event,
    ToolResult,
    TurnOptions,
    UserMessage,
)
from ..providers.base import Provider
from ..providers.embeddings import Embedder
from ..store.base import ContextBudget, ConversationStore
from ..tools.approval import arguments_sha256
from ..tools.executors import ToolRunner
from ..tools.registry import ToolRegistry, client_tool
from . import compaction, drafts, policy_gate
from .admission import Rules, admit
from .approval_edits import check_edits, check_four_eyes
from .callbacks import CallbackClaims, callback_output, created_stamp
from .commands import CallbackOutcome, Decisions, TurnCommand
from .drafts import DraftSink
from .execution import ToolCalls, TurnWork, decided_in_turn, turn_actor
from .forks import create_fork
from .lifecycle import (
    AWAITING_DECISION,
    SETTLED_BY_APPROVER,
    CallMove,
    check_settler,
    is_running,
    lapsed,
    public_status,
    require_settled,
    waiting,
)
from .mcp_refresh import refuse_invalidated
from .model_call import ModelCall
from .results import (
    CallbackResult,
    CancelResult,
    ContextReport,
    ConversationState,
    TurnResult,
)
from .runner import TurnRunner
from .session import Clock, CommitHook, Session, utc_now


class Conversations(ModelCall):
    """The service: turns, approvals, cancels, callbacks, and the reads and clear of
    :class:`~.reads.Reads`, for one deployment; domain commands in, domain results out."""

    def __init__(
        self,
        *,
        store: ConversationStore,
        provider: Provider,
        settings: Settings,
        tools: ToolRegistry | Callable[[], ToolRegistry] | None = None,
        runner: ToolRunner | None = None,
        clock: Clock = utc_now,
        redactor: Redactor | Callable[[], Redactor | None] | None = None,
        summarizer: Provider | None = None,
        providers: Callable[[str], Provider] | None = None,
        embedder: Embedder | Callable[[], Embedder | None] | None = None,
        data_policy: DataPolicy | Callable[[], DataPolicy | None] | None = None,
    ) -> None:
        super().__init__(store=store, settings=settings, clock=clock)
        #: Ranks memory records by embeddings (``None``: by keywords and recency).
        self._embedder = embedder
        #: The deployment's default provider; others it allows are built by ``providers``.
        self.provider = provider
        self._build_provider = providers
        self._providers: dict[str, Provider] = {provider.name or settings.provider: provider}
        #: Writes context summaries (``None``: the turn's own provider).
        self.summarizer = summarizer
        self._redactor = redactor
        #: The deployment's data policy (``turnledger.context.policy``; ``None``: none).
        self._data_policy, self._tenant_policies = data_policy, {}
        # The registry may come from SSM: it is read on the first request that needs
        # it, so routes that never touch tools (reads, clear) never need its permission.
        self._tools = tools if tools is not None else ToolRegistry.empty()
        self.runner = runner
        self.calls = ToolCalls(
            registry=lambda: self.tools, runner=runner, settings=settings, clock=clock, policy=self
        )
        self.budget = ContextBudget(
            max_events=settings.context_max_events, max_chars=settings.context_max_chars
        )
        #: Told of every commit that landed (notifications, :mod:`turnledger.ops.notifications`).
        self.on_commit: CommitHook | None = None

    @cached_property
    def tools(self) -> ToolRegistry:
        """The tool registry (loaded on first use)."""
        return self._tools if isinstance(self._tools, ToolRegistry) else self._tools()

    def turn(
        self,
        key: ConversationKey,
        actor: str,
        command: TurnCommand,
        *,
        sink: DraftSink | None = None,
    ) -> TurnResult:
        """Run one turn (``POST .../turns``) of ``key`` for ``actor``.

        ``sink``: the turn's draft (:class:`.drafts.DraftSink`). It is begun by the turn's
        admission, once the turn's load is read and its input fits, before anything of the
        turn runs or is written but an expired conversation's purge, so the turn's load is
        the request's one read; the model's answer streams into it.

        A request that finds the turn it began interrupted (its run died holding the
        tool lease, e.g. a Lambda timeout) is recognised by the hash of its command kept
        in the turn's options: the turn is resumed and answered, never begun a second time.

        Raises:
            ApprovalPending: calls of this conversation await approval.
            UnknownTool: the request names an unregistered tool.
            UnknownToolCall: a ``function_call_output`` names no pending client call.
            ApproverScopeMissing: it names a human-input or deferred call, and the caller
                holds no approver scope (:func:`.lifecycle.check_settler`).
            ConversationBusy: another request on this conversation committed first.
            UnknownProvider, UnknownModel: the request names one the deployment does not allow.
            ProviderError, ProviderTimeout: the model failed; the failure is recorded
                (``turn_failed``), with the results of tools that already acted.
        """
        run = TurnRunner(self, sink)
        return run.guarded(lambda: self._turn(run, key, actor, command))

    def _turn(
        self, run: TurnRunner, key: ConversationKey, actor: str, command: TurnCommand
    ) -> TurnResult:
        self.provider_for(command.provider)
        self.check_model(command.model)
        self.tools.select(command.tools)
        for name in command.require_approval:
            self.tools.get(name)  # an unknown name is an error, never silently ignored
        policy = self.data_policy(key.tenant)
        messages, outputs = command.messages, command.outputs
        session, loaded = run.load(key)
        check_settler(
            session.machine.pending, [o.call_id for o in outputs], command.approver_claims
        )
        raised = policy_gate.check_turn(policy, session, command, self.settings, self._provider_of)
        self.check_input_fits(command, session.token_scale, session.pins)
        budget = self.settings.conversation_budget_for(key.tenant)
        rules = Rules(budget=budget, undecided=command.starts_turn)
        try:
            run.admit(session, rules, loaded)
        except ApprovalPending:
            # A refreshed MCP listing may have invalidated what waits (committed then).
            if not self.calls.invalidate_refreshed(self._work(session), run):
                raise
            run.admit(session, rules, loaded)
        resuming = session.resuming()
        work = self._work(session)
        self.calls.expire_due(session)
        awaiting = [p for p in session.machine.pending if p.state in AWAITING_DECISION]
        # Who began a turn: its command, Idempotency-Key included, hashed as approvals hash
        # arguments. Kept with the turn's options, so a retry knows the turn as its own.
        # The caller's claims say who may settle, not what was asked: not part of it.
        asked = command.model_dump(mode="json", exclude={"approver_claims"})
        identity = arguments_sha256(asked)[:STORED_HASH_CHARS]
        began = (session.options.request_sha256 or "")[:STORED_HASH_CHARS]
        retried = resuming and bool(messages) and began == identity
        if resuming or not awaiting:
            # Finish what an earlier request left half done (expired or rejected calls,
            # calls recorded but never run) in *its* turn, before anything of this one is
            # staged: old results must precede the new input, and a failure of this
            # turn's model call must not take them down with it. Calls approved while
            # others still await a decision wait for the last decision instead.
            self.calls.settle_rejected(work)
            self.calls.run_ready(work, run)
            # A cancel the run's lease renewal took in stops that turn here, as it
            # would have stopped the request it asked.
            if not run.stop_cancelled(session):
                session.machine.release_lease()
                if session.staged:
                    run.commit(session)
            work.executed = False
            # A resumed run may have handed calls to a human (their outcome is unknown).
            awaiting = [p for p in session.machine.pending if p.state in AWAITING_DECISION]
        if retried:
            return self._answer_retried(work, run)
        # Outputs alone (no new message) settle their own calls whatever else waits:
        # each wait of a turn is settled on its own, the model is called after the last.
        if awaiting and messages:
            raise ApprovalPending(
                "tool calls of this conversation await approval; decide them first",
                pending=awaiting,
            )
        # Outputs of human-input (and deferred) calls settle them by id; the rest are
        # client results. A new message while such a call still waits is refused.
        waiting_output = {p.id for p in session.machine.pending if p.state in SETTLED_BY_APPROVER}
        given = {o.call_id: o.output for o in outputs if o.call_id in waiting_output}
        if messages:
            require_settled(session.machine.pending, answered=given)
        self.calls.provide_outputs(session, given, actor=actor, via="turn")
        outputs = [o for o in outputs if o.call_id not in given]
        # Client results belong to the turn of their calls (a context window never
        # splits a call from its result); only new messages start a new turn. Outputs
        # alone continue the waiting turn, as a final approval does.
        self.calls.apply_client_outputs(work, outputs, closing=bool(messages))
        # No message, no output and nothing pending: the client recorded the input itself
        # (the OpenAI face's history), and asks the model to answer the transcript as it
        # stands, in its latest turn, with this request's options.
        answer_now = (
            not messages
            and not command.outputs
            and not session.machine.pending
            and session.turn > 0
        )
        if messages or answer_now:
            if messages:
                session.begin_turn()
            session.options = TurnOptions(
                provider=command.provider,
                response_format=command.response_format,
                model=command.model,
                tools=command.tools,
                require_approval=command.require_approval,
                client_tools=command.client_tools,
                request_sha256=identity,
                memory_user=self._memory_user(actor, command, session),
            )
            work = self._work(session)
        for content in messages:
            session.add(UserMessage(content=content, metadata=command.metadata), actor=actor)
        if raised is not None and policy is not None:
            self.forget_provider_state(policy_gate.apply_rise(session, policy, raised, actor=actor))
        if not messages and session.machine.awaiting():
            run.commit(session)
            return self._response(work)
        run.advance(work)
        return self._response(work)

    def append(
        self,
        key: ConversationKey,
        actor: str,
        items: list[UserMessage | AssistantMessage | ToolResult],
    ) -> int:
        """Record transcript items the client gives (the OpenAI face's history and its
        ``POST .../items``) without calling a model, in one commit; a conversation not
        stored yet is created by it, even with no item. A user message that follows
        another kind of item (or opens the conversation) begins a turn. Assistant items
        must say ``source="client"``: nothing here is this service's model output. User
        messages are ``actor``'s; the rest is recorded as the client's (actor ``client``).

        Returns:
            The conversation's turn number after the items.

        Raises:
            InvalidRequest: calls of the conversation still wait (decide or answer them).
            ConversationBusy: another request on this conversation committed first.
        """
        if any(isinstance(i, AssistantMessage) and i.source != "client" for i in items):
            raise InvalidRequest("appended assistant items are the client's")
        run = TurnRunner(self)
        session = run.open(key)
        run.admit(session, Rules(settled=True))
        if session.machine.pending:
            raise InvalidRequest(
                "calls of this conversation wait for their output; answer them first"
            )
        follows_user = False
        for item in items:
            if isinstance(item, UserMessage) and not follows_user:
                session.begin_turn()
            follows_user = isinstance(item, UserMessage)
            # The client's own assistant items and outputs, as a function_call_output is.
            session.add(item, actor=actor if isinstance(item, UserMessage) else "client")
        run.commit(session)
        return session.turn

    def _answer_retried(self, work: TurnWork, run: TurnRunner) -> TurnResult:
        """Answer the turn this request began before its run died: the calls it left were
        just resumed (under their own keys); the model answers their results unless they
        now wait for someone. Its input is never appended again."""
        if not work.session.machine.awaiting():
            run.advance(work)
        return self._response(work)

    def approve(
        self,
        key: ConversationKey,
        actor: str,
        decisions: Decisions,
        *,
        sink: DraftSink | None = None,
    ) -> TurnResult:
        """Decide pending calls of ``key`` as ``actor`` (``POST .../approvals``); continue
        the turn when none is left.

        Raises:
            ConversationNotFound: no live conversation.
            NotAwaitingApproval: nothing awaits approval.
            UnknownToolCall: a decision names a call that is not pending approval.
            ApproverScopeMissing: ``outputs`` come without approver claims
                (:func:`.lifecycle.check_settler`).
            ConversationBusy: another request on this conversation committed first.
        """
        run = TurnRunner(self, sink)
        return run.guarded(lambda: self._approve(run, key, actor, decisions))

    def _approve(
        self, run: TurnRunner, key: ConversationKey, actor: str, decisions: Decisions
    ) -> TurnResult:
        snapshot = self.store.load(key, self.budget)
        head = snapshot.head
        if head is None or not head.is_visible(self.clock()):
            raise ConversationNotFound(f"conversation {key.conversation_id!r} not found")
        session = run.session(key, head, snapshot.events)
        check_settler(session.machine.pending, decisions.outputs, decisions.approver_claims)
        run.admit(session, Rules())
        # The check of the definitions below reuses a listing this decision reads.
        begun = self.calls.tools.mcp.now()
        work = self._work(session)
        deciding = {p.id for p in session.machine.pending if p.state in AWAITING_DECISION}
        expired = [i for i in self.calls.expire_due(session) if i in deciding]
        self.calls.invalidate_refreshed(work, run)
        rejections = decisions.rejections
        approvals = decisions.approvals
        named = [*approvals, *rejections]
        if decisions.outputs:
            self.calls.provide_outputs(
                session, dict(decisions.outputs), actor=actor, via="approvals"
            )
            if not named:
                # Outputs only: the turn goes on once nothing else is awaited.
                if session.machine.awaiting():
                    self.calls.settle_rejected(work)
                    run.commit(session)
                    return self._response(work)
                run.advance(work)
                return self._response(work)
        undecided = {p.id: p for p in session.machine.pending if p.state in AWAITING_DECISION}
        if not undecided and not expired and is_running(session.head):
            # A retry after a crash: the decisions were recorded; finish the turn. Only
            # decisions of this turn may resume it, so a stray id is still an error.
            unknown = [i for i in named if i not in decided_in_turn(session)]
            if unknown:
                raise UnknownToolCall(
                    "these call ids are not pending approval",
                    details={"unknown": unknown, "pending": []},
                )
            run.advance(work)
            return self._response(work)
        refuse_invalidated(self.calls.tools, session, named, undecided)
        if not undecided and not expired:
            raise NotAwaitingApproval("nothing in this conversation awaits approval")
        if not undecided:
            # Every decision came after the approval window closed: record the expiry
            # (the model gets the calls' errors with the next turn) and say so.
            self.calls.settle_rejected(work)
            self.calls.run_ready(work, run)
            if not run.stop_cancelled(session):
                session.machine.release_lease()
                run.commit(session)
            raise NotAwaitingApproval(
                "the pending approvals expired before this decision",
                details={"expired": expired},
            )
        unknown = [i for i in named if i not in undecided]
        if unknown:
            raise UnknownToolCall(
                "these call ids are not pending approval",
                details={"unknown": unknown, "pending": sorted(undecided), "expired": expired},
            )
        check_four_eyes(
            self.calls.tools,
            undecided,
            approvals,
            actor,
            always=self.settings.approval_four_eyes,
            requester=turn_actor(session),
        )
        self.calls.refuse_changed_definitions(work, undecided, set(approvals), run, begun)
        edits = check_edits(self.calls.tools, undecided, approvals)
        for call_id in named:
            pending = undecided[call_id]
            approved = call_id in approvals
            edited = edits.get(call_id)
            session.add(
                ApprovalResolved(
                    call_id=call_id,
                    decision="approved" if approved else "rejected",
                    reason=None if approved else rejections.get(call_id),
                    approver=actor,
                    arguments_sha256=pending.arguments_sha256,
                    approved_arguments=edited[0] if edited else None,
                    approved_arguments_sha256=edited[1] if edited else None,
                    approver_claims=dict(decisions.approver_claims) or None,
                ),
                actor=actor,
            )
            if edited:
                session.machine.change(
                    pending, CallMove.EDIT, arguments=edited[0], arguments_sha256=edited[1]
                )
            elif approved:
                session.machine.change(pending, CallMove.APPROVE, reason=None)
            else:
                why = rejections.get(call_id)
                session.machine.change(
                    pending,
                    CallMove.REJECT,
                    reason=f"rejected by {actor}" + (f": {why}" if why else ""),
                )
        if any(p.state in AWAITING_DECISION for p in session.machine.pending):
            run.commit(session)
            return self._response(work)
        run.advance(work)
        return self._response(work)

    def expire_waits(self, key: ConversationKey) -> list[str]:
        """Record the waits of ``key`` whose window closed, for a conversation nobody
        touches (the sweep): ``approval_expired``, the rejection, and the error result the
        model sees with the next turn, in one commit that also takes them out of the inbox.

        Returns:
            The ids of the calls expired (none: nothing was due, or the conversation is
            gone).

        Raises:
            ConversationBusy: a run holds the conversation's lease, or another request
                committed first: the sweep's next pass retries (its cursor waits).
        """
        snapshot = self.store.load(key, self.budget)
        head = snapshot.head
        now = self.clock()
        if head is None or not head.is_visible(now):
            return []
        admit(head, now, Rules())
        run = TurnRunner(self)
        session = run.session(key, head, snapshot.events)
        expired = self.calls.expire_due(session)
        if not expired:
            return []
        # Only the session is used: no tool registry or model is needed (or loaded).
        idle = TurnWork(session=session, tools=[], model="", provider=self.provider)
        self.calls.settle_rejected(idle)
        if any(p.state == "ready" for p in session.machine.pending):
            return []  # approved calls must run first: the next turn or decision does that
        run.commit(session)
        return expired

    def fork(self, key: ConversationKey, to: str, after_turn: int | None) -> ConversationState:
        """Fork ``key`` after ``after_turn`` (default: the latest turn) as the new
        conversation ``to`` (``POST .../fork``): see :mod:`.forks`.

        Raises:
            ConversationNotFound, ConversationExists, InvalidForkPoint, ForkPointOpen,
            ForkTooDeep, ConversationBusy: as :func:`.forks.create_fork` says.
        """
        target = ConversationKey(tenant=key.tenant, conversation_id=to)
        create_fork(
            self.store,
            key,
            target,
            after_turn=after_turn,
            ttl_seconds=self.settings.ttl_for(key.tenant),
            clock=self.clock,
            visible_head=self._visible_head,
        )
        return self.get(target)

    def compact(
        self,
        key: ConversationKey,
        actor: str,
        *,
        provider: str | None = None,
        model: str | None = None,
    ) -> Event:
        """Write the newest summary again over the same range, from the log, with the
        summarizer ``provider``/``model`` (default: the deployment's), recorded as
        ``actor``'s (``POST .../compact``; :meth:`compact_again`). Later turns use it;
        nothing is deleted. With no summary yet, compact now: every turn but the newest
        (:meth:`compact_now`). The summarizer is routed by the data class, as every
        model call is.

        Returns:
            The new ``context_compacted`` event.

        Raises:
            UnknownProvider, UnknownModel: the deployment does not allow the one named.
            ConversationNotFound: absent, expired, cleared, or another tenant's.
            ConversationBusy: another request holds the conversation, or its turn waits
                for client results or running tools.
            ApprovalPending, InputPending: its turn waits for a person or a job.
            DataPolicyUnsatisfied: no model the conversation's data class allows may
                summarize it.
            NothingToCompact: no summary yet, and no turn to summarize but the newest.
            CorruptedState: the newest summary fails its content hash.
            ProviderError: the summarizer failed or answered nothing; nothing was stored.
        """
        chosen = self.provider_for(provider) if provider is not None else None
        self.check_model(model)
        run = TurnRunner(self)
        session = run.open(key)
        head = session.head
        if head is None or not head.is_visible(self.clock()):
            raise ConversationNotFound(f"conversation {key.conversation_id!r} not found")
        run.admit(session, Rules(settled=True))
        if session.machine.pending:
            raise ConversationBusy("the conversation's turn waits for its calls; retry after")
        work = self._work(session)
        routed = self.route_side_call(
            session,
            model or self.settings.summarizer_model or work.model,
            chosen or self._summarizer(work),
            "summary",
        )
        if routed is None:
            raise DataPolicyUnsatisfied(
                "no model the conversation's data class allows may write its summary; "
                "nothing was stored",
                details={"class": session.data_class},
            )
        summarizer = compaction.Summarizer(routed[1], routed[0])
        if session.summary is None:
            event = self.compact_now(work, summarizer, actor)
        else:
            event = self.compact_again(work, summarizer, actor)
        run.commit(session)
        return event

    def cancel(self, key: ConversationKey, actor: str, reason: str | None = None) -> CancelResult:
        """Stop the current turn of ``key`` for ``actor`` (``POST .../cancel``).

        A waiting turn is stopped here: its pending calls are recorded as cancelled
        with a ``turn_interrupted`` event, and the conversation is ready. A running
        turn (a live lease) gets a cancel request on its head; its request stops at
        the next step boundary and records the same. Nothing to stop: answered as is.

        Raises:
            ConversationNotFound: absent, expired, cleared, or another tenant's.
            ConversationBusy: other requests kept committing first (three times); nothing
                was stored.
        """
        for _ in range(2):
            # Lost to a concurrent commit (a callback, a decision): read again and stop
            # what is left, so a cancel is not refused because something else moved.
            try:
                return self._cancel_once(actor, key, reason)
            except ConversationBusy:
                continue
        return self._cancel_once(actor, key, reason)

    def _cancel_once(self, actor: str, key: ConversationKey, reason: str | None) -> CancelResult:
        """One attempt of :meth:`cancel` on the head as read now."""
        conversation_id = key.conversation_id
        snapshot = self.store.load(key, self.budget)
        head = snapshot.head
        now = self.clock()
        if head is None or not head.is_visible(now):
            # A conversation's first turn, running long, has a draft and no head yet.
            draft = self._cancel_streaming(actor, key, 0, reason, now) if head is None else None
            if draft is not None:
                return CancelResult(
                    conversation_id=conversation_id,
                    turn=draft.turn,
                    status=draft.status,
                    cancel_requested=True,
                )
            raise ConversationNotFound(f"conversation {conversation_id!r} not found")
        run = TurnRunner(self)
        session = run.session(key, head, snapshot.events)
        lease = head.live_lease(now)
        if lease is not None:
            session.machine.request_cancel(
                lease, CancelRequest(requested_by=actor, requested_at=now, reason=reason)
            )
            head = run.commit(session)
            return CancelResult(
                conversation_id=conversation_id,
                turn=session.turn,
                status=public_status(head, now),
                cancel_requested=True,
            )
        cancelled: list[str] = []
        if session.machine.pending or is_running(head):
            cancelled = session.cancel_turn(by=actor, reason=reason)
            run.commit(session)
        elif (draft := self._cancel_streaming(actor, key, head.turn, reason, now)) is not None:
            return CancelResult(
                conversation_id=conversation_id,
                turn=draft.turn,
                status=draft.status,
                cancel_requested=True,
            )
        return CancelResult(
            conversation_id=conversation_id,
            turn=session.turn,
            status=public_status(session.head, now) if session.head else "complete",
            cancelled_call_ids=cancelled,
        )

    def _cancel_streaming(
        self,
        actor: str,
        key: ConversationKey,
        head_turn: int,
        reason: str | None,
        now: datetime,
    ) -> drafts.DraftState | None:
        """Ask a long turn whose answer is being written (its draft in progress, no tools
        running) to stop at its next chunk; returns its draft when there was one."""
        running = drafts.running_turn(self.store, key, head_turn)
        if running is None:
            return None
        asked = drafts.request_cancel(
            self.store,
            key,
            running.turn,
            now=now,
            ttl_seconds=self.settings.ttl_for(key.tenant),
            by=actor,
            reason=reason,
        )
        return running if asked else None

    def settle_callback(self, claims: CallbackClaims, outcome: CallbackOutcome) -> CallbackResult:
        """Settle the deferred call a verified callback token names (``POST /v1/callbacks``).

        Single use: the settle is a conditional commit on the call still being
        ``deferred`` in this life of the conversation; a second use, a settled or
        timed-out call, or a cleared conversation finds nothing to settle.

        Raises:
            CallbackInvalid: nothing to settle; nothing was stored.
            ConversationBusy: a request runs the conversation's tools right now.
        """
        run = TurnRunner(self)
        return run.guarded(lambda: self._settle_callback(run, claims, outcome))

    def _settle_callback(
        self, run: TurnRunner, claims: CallbackClaims, outcome: CallbackOutcome
    ) -> CallbackResult:
        key = ConversationKey(tenant=claims.tenant, conversation_id=claims.conversation_id)
        output = callback_output(outcome.output)
        for _ in range(3):
            snapshot = self.store.load(key, self.budget)
            head = snapshot.head
            now = self.clock()
            if (
                head is None
                or not head.is_visible(now)
                or created_stamp(head.created_at) != claims.created_at
            ):
                raise CallbackInvalid("this callback token is not valid (forged, expired or used)")
            pending = next(
                (
                    p
                    for p in head.pending
                    if p.id == claims.call_id
                    and p.state == "deferred"
                    and p.idempotency_key == claims.idempotency_key
                    and not lapsed(p, now)
                ),
                None,
            )
            if pending is None:
                raise CallbackInvalid("this callback token is not valid (forged, expired or used)")
            session = run.session(key, head, snapshot.events)
            run.admit(session, Rules())
            work = self._work(session)
            self.calls.settle_deferred(
                session,
                pending,
                outcome.status,
                output,
                via="callback",
                actor=f"tool:{pending.name}",
            )
            continued = outcome.continue_turn and not session.machine.awaiting()
            try:
                if continued:
                    run.advance(work)
                else:
                    run.commit(session)
            except ConversationBusy:
                if session.head is not head:
                    raise  # the settle itself was committed; only a later step lost
                continue  # nothing stored: read again (the call may be settled now)
            return CallbackResult(
                conversation_id=claims.conversation_id,
                call_id=claims.call_id,
                settled=outcome.status,
                status=public_status(session.head, self.clock()) if session.head else "complete",
                awaiting=session.machine.awaiting(),
                continued=continued,
            )
        raise ConversationBusy("the conversation keeps changing; retry the callback")

    def _work(self, session: Session) -> TurnWork:
        """The work of a request on the turn ``session`` is in, with that turn's options.

        Stored options may name tools the registry no longer has (removed since, or named
        by an imported head): those are not offered, never an error. A conversation never
        depends on a tool that is gone; a request naming one is refused before (:meth:`turn`).
        """
        options = session.options
        registered = (
            None if options.tools is None else [n for n in options.tools if n in self.tools]
        )
        return TurnWork(
            session=session,
            tools=[*self.tools.select(registered), *map(client_tool, options.client_tools)],
            model=options.model or self.settings.model,
            provider=self._provider_of(options.provider),
            response_format=options.response_format,
            extra_approval=set(options.require_approval),
        )

    def _response(self, work: TurnWork) -> TurnResult:
        session = work.session
        return TurnResult(
            conversation_id=session.key.conversation_id,
            turn=session.turn,
            status=session.machine.answer_status(),
            status_reason=work.status_reason,
            output_text=work.output_text,
            output_json=work.output_json,
            output=list(work.output),
            waiting=waiting(session.machine.pending),
            awaiting=session.machine.awaiting(),
            usage=work.usage,
            context=ContextReport(
                messages_sent=work.messages_sent,
                provider_state=work.provider_state,
                tokens_estimated=work.tokens_estimated,
                budget_tokens=work.budget_tokens or self.settings.context_budget(work.model),
                summary_through=work.summary_through,
            ),
        )
