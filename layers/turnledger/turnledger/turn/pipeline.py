"""The turn pipeline: load, append, call the model, run or pause tools, persist, answer.

:class:`Conversations` is the service behind every route: it takes the request's
:class:`~turnledger.core.models.ConversationKey`, its actor and a domain command
(:mod:`turnledger.turn.commands`), and answers a domain result
(:mod:`turnledger.turn.results`); HTTP bodies are the edge's (:mod:`turnledger.api`).
Every status and move is the turn's owner's (:mod:`turnledger.turn.lifecycle`). Its
invariants:

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
  (:func:`_lets_go_on_failure`): the next request resumes the run as it would a
  crashed one's (:mod:`turnledger.turn.execution`), without waiting out the lease.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from collections.abc import Callable
from contextvars import ContextVar
from datetime import datetime
from functools import cached_property
from typing import Any

from ..context.assembly import (
    MESSAGE_OVERHEAD_TOKENS,
    Assembly,
    Estimator,
    assemble,
    latest_summary,
    messages_through,
    split_turns,
    turns_to_compact,
)
from ..context.memory import (
    Provenance,
    Recall,
    extraction_request,
    parse_facts,
    plan_writes,
    rank,
    recall_block,
)
from ..context.redaction import Redactor
from ..core import deadline
from ..core.config import Settings
from ..core.exceptions import (
    ApprovalPending,
    CallbackInvalid,
    ContextLengthExceeded,
    ConversationBusy,
    ConversationNotFound,
    InvalidRequest,
    NotAwaitingApproval,
    NothingToCompact,
    ProviderError,
    TurnledgerError,
    UnknownModel,
    UnknownProvider,
    UnknownToolCall,
)
from ..core.models import (
    STORED_HASH_CHARS,
    ApprovalResolved,
    AssistantMessage,
    CancelRequest,
    ConversationKey,
    Event,
    EventKind,
    Head,
    ProviderCursor,
    RunRecord,
    SummaryRef,
    ToolCall,
    ToolResult,
    TurnFailed,
    TurnInterrupted,
    TurnOptions,
    Usage,
    UserMessage,
)
from ..core.observability import logger, timed
from ..core.strict_json import BodyError, parse
from ..providers.base import (
    Continuation,
    Message,
    ModelReply,
    ModelRequest,
    Provider,
    ResponseFormat,
    ToolSpec,
)
from ..providers.embeddings import Embedder, decode_vector, encode_vector
from ..store.base import ContextBudget, ConversationStore, Snapshot
from ..store.memories import MemoryBook, MemoryRecord
from ..tools.approval import arguments_sha256
from ..tools.executors import ToolRunner
from ..tools.registry import ToolRegistry, client_tool
from . import compaction, drafts
from .approval_edits import check_edits, check_four_eyes
from .callbacks import CallbackClaims, created_stamp
from .commands import CallbackOutcome, Decisions, TurnCommand
from .drafts import TurnCancelled, model_reply
from .execution import ToolCalls, TurnWork, decided_in_turn, turn_actor
from .forks import create_fork
from .lifecycle import (
    AWAITING_DECISION,
    SETTLED_BY_APPROVER,
    CallMove,
    cancel_requested,
    check_settler,
    holds_lease,
    is_running,
    is_tombstone,
    lapsed,
    public_status,
    refuse_if_running,
    require_settled,
    waiting,
)
from .machine import Step
from .reads import Reads
from .results import (
    CallbackResult,
    CancelResult,
    ContextReport,
    ConversationState,
    OutputText,
    TurnResult,
)
from .session import Clock, CommitHook, Session, utc_now

#: The sessions the running request opened, each with the head it was opened on
#: (``None`` outside a method under :func:`_lets_go_on_failure`).
_opened: ContextVar[list[tuple[Session, Head | None]] | None] = ContextVar(
    "turnledger_opened_sessions", default=None
)


def _lets_go_on_failure[**P, R](method: Callable[P, R]) -> Callable[P, R]:
    """Make whatever ``method`` raises leave no conversation held: each session it
    opened and committed while holding a lease is let go (:func:`_let_go`) before the
    error goes on (a domain error as it was, anything else as a ``500``)."""

    @functools.wraps(method)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        opened: list[tuple[Session, Head | None]] = []
        token = _opened.set(opened)
        try:
            return method(*args, **kwargs)
        except Exception:
            for session, head in opened:
                _let_go(session, head)
            raise
        finally:
            _opened.reset(token)

    return run


def _let_go(session: Session, opened_on: Head | None) -> None:
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
        # A cancel asked meanwhile: the next request honours it.
        session.machine.take_cancel(stored.cancel)
        session.machine.interrupt()
        session.commit()
    except Exception as exc:
        logger.warning(
            "could not release the lease of a failed request; it runs out instead",
            extra={"error_type": type(exc).__name__},
        )


class Conversations(Reads):
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
        # The registry may come from SSM: it is read on the first request that needs
        # it, so routes that never touch tools (reads, clear) never need its permission.
        self._tools = tools if tools is not None else ToolRegistry.empty()
        self.runner = runner
        self.calls = ToolCalls(
            registry=lambda: self.tools, runner=runner, settings=settings, clock=clock
        )
        self.budget = ContextBudget(
            max_events=settings.context_max_events, max_chars=settings.context_max_chars
        )
        #: Told of every commit that landed (notifications, :mod:`turnledger.ops.notifications`).
        self.on_commit: CommitHook | None = None

    @cached_property
    def embedder(self) -> Embedder | None:
        """What ranks memory records by embeddings (built on first use), or ``None``."""
        if self._embedder is None or isinstance(self._embedder, Embedder):
            return self._embedder
        return self._embedder()

    @cached_property
    def tools(self) -> ToolRegistry:
        """The tool registry (loaded on first use)."""
        return self._tools if isinstance(self._tools, ToolRegistry) else self._tools()

    def provider_for(self, name: str | None) -> Provider:
        """The provider a turn names (``None``: the default one).

        Raises:
            UnknownProvider: the deployment does not enable that provider.
        """
        if name is None or name == self.provider.name:
            return self.provider
        if name not in self.settings.allowed_providers or self._build_provider is None:
            raise UnknownProvider(
                f"provider {name!r} is not enabled in this deployment",
                details={"provider": name, "allowed": list(self.settings.allowed_providers)},
            )
        if name not in self._providers:
            self._providers[name] = self._build_provider(name)
        return self._providers[name]

    def check_model(self, name: str | None) -> None:
        """Refuse a model the deployment does not allow a turn to name (``None``: the default).

        Raises:
            UnknownModel: ``name`` is not in :attr:`Settings.models_allowed`.
        """
        allowed = self.settings.models_allowed
        if name is not None and allowed is not None and name not in allowed:
            raise UnknownModel(
                f"model {name!r} is not allowed in this deployment",
                details={"model": name, "allowed": sorted(allowed)},
            )

    def forget_provider_state(self, responses: list[tuple[str, str]]) -> int:
        """Delete stored provider responses, best effort; returns how many were deleted.

        Never raises: a clear or a sweep is never blocked by a provider.
        """
        deleted = 0
        by_provider: dict[str, list[str]] = {}
        for name, response_id in dict.fromkeys(responses):
            by_provider.setdefault(name, []).append(response_id)
        for name, ids in by_provider.items():
            try:
                deleted += self.provider_for(name).delete_state(ids)
            except Exception as exc:  # a provider no longer enabled, or a bug: never blocks
                logger.warning(
                    "could not delete provider state",
                    extra={"provider": name, "error": type(exc).__name__},
                )
        return deleted

    @property
    def redactor(self) -> Redactor | None:
        """The redaction rule set in force (a source such as SSM is asked each time; it caches)."""
        if self._redactor is None or isinstance(self._redactor, Redactor):
            return self._redactor
        return self._redactor()

    # --- routes ---------------------------------------------------------------------------

    @_lets_go_on_failure
    def turn(
        self,
        key: ConversationKey,
        actor: str,
        command: TurnCommand,
        *,
        admitted: Callable[[Head | None, Snapshot], None] | None = None,
    ) -> TurnResult:
        """Run one turn (``POST .../turns``) of ``key`` for ``actor``.

        ``admitted(head, loaded)`` is called once the turn's load is read and its input
        fits, before anything of the turn runs or is written but an expired conversation's
        purge (``head``: the live head loaded, ``None`` for a new life; ``loaded``: what the
        load read, its run flag included); what it raises ends the turn there. The
        synchronous route's draft (:func:`turnledger.turn.longturns.run_drafted`) checks
        and begins from it, so the turn's load is the request's one read.

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
            ProviderError, ProviderTimeout: the model failed; nothing of the turn was stored.
        """
        self.provider_for(command.provider)
        self.check_model(command.model)
        self.tools.select(command.tools)
        for name in command.require_approval:
            self.tools.get(name)  # an unknown name is an error, never silently ignored
        messages, outputs = command.messages, command.outputs
        session, loaded = self._opened(key)
        check_settler(
            session.machine.pending, [o.call_id for o in outputs], command.approver_claims
        )
        self.check_input_fits(command, session.token_scale)
        if admitted is not None:
            admitted(session.head, loaded)
        session.admit(self.clock(), budget=self.settings.conversation_budget_for(key.tenant))
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
            self.calls.run_ready(work)
            # A cancel the run's lease renewal took in stops that turn here, as it
            # would have stopped the request it asked.
            if not session.honour_cancel():
                session.machine.release_lease()
                if session.staged:
                    session.commit()
            work.executed = False
            # A resumed run may have handed calls to a human (their outcome is unknown).
            awaiting = [p for p in session.machine.pending if p.state in AWAITING_DECISION]
        if retried:
            return self._answer_retried(work)
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
        if not messages and session.machine.awaiting():
            session.commit()
            return self._response(work)
        self._advance(work)
        return self._response(work)

    def check_input_fits(self, command: TurnCommand, token_scale: float | None) -> None:
        """Refuse, before anything is stored, new messages that cannot fit the context
        budget even alone (with the system prompt), counted with the conversation's
        estimate scale: the current turn is always sent whole, so no summary could make
        room for them.

        Raises:
            ContextLengthExceeded: with the budget (``limit``) and the input's estimate.
        """
        if not command.messages:
            return
        model = command.model or self.settings.model
        estimator = self._estimator(self.provider_for(command.provider), token_scale)
        redactor = self.redactor
        sent = [
            Message(role="user", content=redactor.text(m) if redactor is not None else m)
            for m in command.messages
        ]
        if self.settings.system_prompt:
            sent.insert(0, Message(role="system", content=self.settings.system_prompt))
        tokens = estimator.tokens(sent)
        limit = self.settings.context_budget(model)
        if tokens > limit:
            raise ContextLengthExceeded(
                f"the input is about {tokens} tokens; the context of {model} holds {limit}",
                details={"limit": limit, "tokens": tokens, "model": model},
            )

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
        session = self._open(key)
        session.admit(self.clock())
        require_settled(session.machine.pending)
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
        session.commit()
        return session.turn

    def _answer_retried(self, work: TurnWork) -> TurnResult:
        """Answer the turn this request began before its run died: the calls it left were
        just resumed (under their own keys); the model answers their results unless they
        now wait for someone. Its input is never appended again."""
        if not work.session.machine.awaiting():
            self._advance(work)
        return self._response(work)

    @_lets_go_on_failure
    def approve(self, key: ConversationKey, actor: str, decisions: Decisions) -> TurnResult:
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
        snapshot = self.store.load(key, self.budget)
        head = snapshot.head
        if head is None or not head.is_visible(self.clock()):
            raise ConversationNotFound(f"conversation {key.conversation_id!r} not found")
        session = self._session(key, head, snapshot.events)
        check_settler(session.machine.pending, decisions.outputs, decisions.approver_claims)
        session.admit(self.clock())
        work = self._work(session)
        deciding = {p.id for p in session.machine.pending if p.state in AWAITING_DECISION}
        expired = [i for i in self.calls.expire_due(session) if i in deciding]
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
                    session.commit()
                    return self._response(work)
                self._advance(work)
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
            self._advance(work)
            return self._response(work)
        if not undecided and not expired:
            raise NotAwaitingApproval("nothing in this conversation awaits approval")
        if not undecided:
            # Every decision came after the approval window closed: record the expiry
            # (the model gets the calls' errors with the next turn) and say so.
            self.calls.settle_rejected(work)
            self.calls.run_ready(work)
            if not session.honour_cancel():
                session.machine.release_lease()
                session.commit()
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
            session.commit()
            return self._response(work)
        self._advance(work)
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
        refuse_if_running(head, now)
        session = self._session(key, head, snapshot.events)
        expired = self.calls.expire_due(session)
        if not expired:
            return []
        # Only the session is used: no tool registry or model is needed (or loaded).
        idle = TurnWork(session=session, tools=[], model="", provider=self.provider)
        self.calls.settle_rejected(idle)
        if any(p.state == "ready" for p in session.machine.pending):
            return []  # approved calls must run first: the next turn or decision does that
        session.commit()
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
        ``actor``'s (``POST .../compact``). Later turns use it; nothing is deleted.

        Returns:
            The new ``context_compacted`` event.

        Raises:
            UnknownProvider, UnknownModel: the deployment does not allow the one named.
            ConversationNotFound: absent, expired, cleared, or another tenant's.
            ConversationBusy: another request holds the conversation, or its turn waits
                for client results or running tools.
            ApprovalPending, InputPending: its turn waits for a person or a job.
            NothingToCompact: the conversation has no summary yet.
            CorruptedState: the newest summary fails its content hash.
            ProviderError: the summarizer failed or answered nothing; nothing was stored.
        """
        chosen = self.provider_for(provider) if provider is not None else None
        self.check_model(model)
        session = self._open(key)
        head = session.head
        if head is None or not head.is_visible(self.clock()):
            raise ConversationNotFound(f"conversation {key.conversation_id!r} not found")
        session.admit(self.clock())
        require_settled(session.machine.pending)
        if session.machine.pending:
            raise ConversationBusy("the conversation's turn waits for its calls; retry after")
        if session.summary is None:
            raise NothingToCompact("the conversation has no summary yet")
        newest = latest_summary(
            self.store.read_events(key, head, after=session.summary.sequence - 1, limit=1)
        )
        assert newest is not None  # the head names that event
        old = newest.body
        covered = self.store.read_events(
            key, head, after=old.from_sequence - 1, limit=old.to_sequence - old.from_sequence + 1
        )
        work = self._work(session)
        summarizer = compaction.Summarizer(
            chosen or self._summarizer(work), model or self.settings.summarizer_model or work.model
        )
        estimator = self._estimator(work.provider, session.token_scale)
        turns = split_turns(
            covered, after=old.from_sequence - 1, estimator=estimator, redactor=self.redactor
        )
        written = compaction.summarize(
            summarizer,
            compaction.Compaction(
                turns=turns,
                from_sequence=old.from_sequence,
                from_turn=old.from_turn or (turns[0].number if turns else None),
                through=old.to_sequence,
                previous=None,
                trigger="manual",
                replaces=newest.sequence,
            ),
            estimator=estimator,
            limit=self._summary_limit(summarizer.model),
        )
        if written is None:
            raise ProviderError(
                "the summarizer wrote no summary; nothing was stored",
                details={"provider": summarizer.provider.name, "model": summarizer.model},
            )
        event = self._stage_summary(session, written, actor=actor)
        session.commit()
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
        session = self._session(key, head, snapshot.events)
        lease = head.live_lease(now)
        if lease is not None:
            session.machine.request_cancel(
                lease, CancelRequest(requested_by=actor, requested_at=now, reason=reason)
            )
            head = session.commit()
            return CancelResult(
                conversation_id=conversation_id,
                turn=session.turn,
                status=public_status(head, now),
                cancel_requested=True,
            )
        cancelled: list[str] = []
        if session.machine.pending or is_running(head):
            cancelled = session.cancel_turn(by=actor, reason=reason)
            session.commit()
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

    @_lets_go_on_failure
    def settle_callback(self, claims: CallbackClaims, outcome: CallbackOutcome) -> CallbackResult:
        """Settle the deferred call a verified callback token names (``POST /v1/callbacks``).

        Single use: the settle is a conditional commit on the call still being
        ``deferred`` in this life of the conversation; a second use, a settled or
        timed-out call, or a cleared conversation finds nothing to settle.

        Raises:
            CallbackInvalid: nothing to settle; nothing was stored.
            ConversationBusy: a request runs the conversation's tools right now.
        """
        key = ConversationKey(tenant=claims.tenant, conversation_id=claims.conversation_id)
        output = _callback_output(outcome.output)
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
            session = self._session(key, head, snapshot.events)
            session.admit(now)
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
                    self._advance(work)
                else:
                    session.commit()
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

    # --- the loop ---------------------------------------------------------------------------

    def _advance(self, work: TurnWork) -> None:
        """Drive the turn until the model answers in text, or it waits for someone."""
        session = work.session
        while True:
            if self._stopped(work):
                return
            self.calls.settle_rejected(work)
            self.calls.run_ready(work)
            # A step boundary: tools ran; a cancel sent meanwhile stops the turn here.
            if self._stopped(work):
                return
            if session.machine.next_step().step is not Step.CALL_MODEL:
                # Something waits (a person, the client, a job): the step ends here.
                self._commit(work)
                return
            if work.model_calls >= max(self.settings.max_tool_steps, 1):
                work.status_reason = "max_tool_steps"
                self._commit(work)
                return
            limit = self.settings.turn_budget_for(session.key.tenant)
            if limit and work.model_calls and _turn_usage(session) >= limit:
                work.status_reason = "turn_budget"
                self._commit(work)
                return
            reply, run = self._call_model(work)
            if not reply.tool_calls:
                run = self._extract_memory(work, run)
            session.usage = session.usage + reply.usage
            session.cost_usd += run.cost_usd
            work.usage = work.usage + reply.usage
            # The recorded message must carry the ids its results answer: a provider
            # that repeats an id in one reply would otherwise leave an invalid history.
            calls = _unique_ids(reply.tool_calls)
            value = _json_answer(reply) if work.response_format and not calls else None
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
            self._keep_cursor(work, reply, answer.sequence)
            if reply.text:
                work.output.append(OutputText(content=reply.text))
                work.output_text = reply.text
                work.output_json = value
            if not calls:
                session.machine.answer()
                self._commit(work)
                self._write_memory(work)
                return
            self.calls.request(work, calls)

    # --- stopping a running turn (POST .../cancel) ----------------------------------------

    def _adopt_cancel(self, work: TurnWork) -> bool:
        """Whether a cancel was written on the head this request runs; if so the session
        takes that head (the cancel changed nothing else), so it can commit the stop."""
        if not holds_lease(work.session.head, work.owner):
            return False
        session = work.session
        assert session.head is not None
        if cancel_requested(session.head):
            return True  # taken in already: a lease renewal met it between two rounds
        return session.adopt_cancel(self.store.get_head(session.key), work.owner)

    def _finish_cancel(self, work: TurnWork) -> None:
        """Record the cancel the running request found and leave the conversation ready."""
        session = work.session
        assert session.head is not None and session.head.cancel is not None
        cancel = session.head.cancel
        session.cancel_turn(by=cancel.requested_by, reason=cancel.reason)
        work.status_reason = "cancelled"
        session.commit()

    def _stopped(self, work: TurnWork) -> bool:
        """At a step boundary: stop here if a cancel asks this request to (one read of
        the head, only while this request holds the lease)."""
        if self._adopt_cancel(work):
            self._finish_cancel(work)
            return True
        return False

    def _commit(self, work: TurnWork) -> None:
        """End the run's step (its lease released) and commit it; if a cancel was written
        meanwhile, keep what the step recorded and stop the turn instead.

        Raises:
            ConversationBusy: another request (not a cancel) committed first.
        """
        work.session.machine.release_lease()
        try:
            work.session.commit()
        except ConversationBusy:
            if not self._adopt_cancel(work):
                raise
            self._finish_cancel(work)

    def _call_model(self, work: TurnWork) -> tuple[ModelReply, RunRecord]:
        """Build the context to its budget (compacting first when older turns no longer
        fit), call the model, and describe the call in a run record.

        Raises:
            ProviderError, ProviderTimeout: the model failed; the failure is recorded
                (``turn_failed``) before this raises.
        """
        session = work.session
        provider = work.provider
        redactor = self.redactor
        estimator = self._estimator(provider, session.token_scale)
        budget = self.settings.context_budget(work.model)

        recall = self._recall(work, budget, estimator)
        # What the history read left out; its newest summary, if the read missed that
        # too, stays in the context until a new one covers the rest.
        left_out = compaction.unread(self.store, session)
        missed = [e for e in left_out if e.kind is EventKind.CONTEXT_COMPACTED][-1:]

        def build() -> Assembly:
            return assemble(
                [*missed, *session.events],
                budget=budget,
                estimator=estimator,
                system_prompt=self.settings.system_prompt,
                redactor=redactor,
                memory=recall.message if recall is not None else None,
            )

        assembly = build()
        if self._compact(work, assembly, estimator, left_out):
            assembly = build()  # with the summary just staged
        specs = [tool.spec() for tool in work.tools]
        continuation = self._continuation(work, assembly, specs, redactor)
        work.budget_tokens = budget
        work.summary_through = assembly.summary_through
        work.model_calls += 1
        started = time.perf_counter()
        try:
            with timed("ModelLatency"):
                reply = model_reply(
                    provider,
                    ModelRequest(
                        model=work.model,
                        messages=assembly.messages,
                        tools=specs,
                        response_format=ResponseFormat.model_validate(
                            work.response_format.model_dump(by_alias=True)
                        )
                        if work.response_format
                        else None,
                        continuation=continuation,
                        store=provider.stateful,
                    ),
                )
            if work.response_format and not reply.tool_calls:
                _json_answer(reply)  # an answer that is not JSON is the provider's failure
        except ProviderError as exc:
            self._record_failure(work, exc)
            raise
        latency_ms = int((time.perf_counter() - started) * 1000)
        work.provider_state = reply.provider_state
        # What was sent: only the new messages when the stored state was used.
        sent = assembly.messages
        if reply.provider_state == "continued" and continuation is not None:
            sent = assembly.messages[continuation.new_from :]
        work.messages_sent = len(sent)
        work.tokens_estimated = estimator.tokens(sent)
        self._calibrate(provider, session, assembly, estimator, reply)
        model = reply.model or work.model
        # The recalled block, when it fitted in the context (the run record names it).
        carried = recall if recall is not None and recall.message in assembly.messages else None
        return reply, RunRecord(
            model=model,
            provider=provider.name,
            provider_state=reply.provider_state,
            latency_ms=latency_ms,
            usage=reply.usage,
            tokens_estimated=work.tokens_estimated,
            budget_tokens=budget,
            messages_sent=work.messages_sent,
            redaction_version=redactor.version if redactor is not None else None,
            summary_through=assembly.summary_through,
            context_from=assembly.context_from,
            context_sha256=assembly.sha256,
            token_scale=estimator.scale,
            response_id=reply.response_id,
            made_with=_cursor_sha256(self.settings, specs, redactor)
            if reply.response_id is not None
            else None,
            cost_usd=self.settings.model_spec(model).cost(reply.usage),
            memory_ids=carried.ids if carried is not None else [],
            memory_user=carried.user if carried is not None else None,
        )

    def _continuation(
        self,
        work: TurnWork,
        assembly: Assembly,
        specs: list[ToolSpec],
        redactor: Redactor | None,
    ) -> Continuation | None:
        """Use the provider's stored response when it is still a faithful cache of the log.

        The cursor must have been made by this tenant, provider and model, with the same
        system prompt, tools and redaction rules, and no summary may have been added since
        (a summary changes what the model should see). Otherwise the call is ``fresh``.
        """
        cursor = work.session.provider_cursor
        provider = work.provider
        if cursor is None or not provider.stateful:
            return None
        summary = work.session.summary
        age = (self.clock() - cursor.created_at).total_seconds()
        if (
            cursor.provider != provider.name
            or cursor.model != work.model
            or cursor.tenant != work.session.key.tenant
            or cursor.context_sha256 != _cursor_sha256(self.settings, specs, redactor)
            or (summary is not None and summary.sequence > cursor.sequence)
            or age > self.settings.provider_state_retention_seconds
        ):
            return None
        new_from = messages_through(assembly, cursor.sequence, redactor)
        if new_from is None or new_from >= len(assembly.messages):
            return None
        return Continuation(previous_response_id=cursor.response_id, new_from=new_from)

    def _keep_cursor(self, work: TurnWork, reply: ModelReply, sequence: int) -> None:
        """Point the conversation's provider cursor at this answer (or drop it).

        Only a successful answer moves it, and it is saved in the turn's own commit.
        """
        session = work.session
        if not work.provider.stateful:
            return
        if reply.response_id is None:
            session.provider_cursor = None
            return
        session.provider_cursor = ProviderCursor(
            provider=work.provider.name,
            api="responses",
            model=work.model,
            response_id=reply.response_id,
            created_at=self.clock(),
            tenant=session.key.tenant,
            context_sha256=_cursor_sha256(
                self.settings, [tool.spec() for tool in work.tools], self.redactor
            ),
            sequence=sequence,
            conversation_id=session.key.conversation_id,
        )

    @staticmethod
    def _estimator(provider: Provider, scale: float | None) -> Estimator:
        """How tokens are counted for ``provider``, scaled by the conversation's ``scale``."""
        if provider.estimate_is_exact:
            return Estimator(count=provider.estimate_tokens)
        return Estimator(
            count=provider.estimate_tokens,
            scale=scale or 1.0,
            per_message=MESSAGE_OVERHEAD_TOKENS,
        )

    @staticmethod
    def _calibrate(
        provider: Provider,
        session: Session,
        assembly: Assembly,
        estimator: Estimator,
        reply: ModelReply,
    ) -> None:
        """Scale later estimates by what the provider reported for this whole context.

        Only a ``fresh`` call reports usage for exactly what was sent. The scale is
        rounded up and kept within 0.5-3x, so one odd report cannot make the
        estimate reckless.
        """
        if provider.estimate_is_exact or reply.provider_state != "fresh":
            return
        raw = estimator.raw(assembly.messages)
        if raw <= 0 or reply.usage.input_tokens <= 0:
            return
        scale = min(max(reply.usage.input_tokens / raw * _CALIBRATION_MARGIN, 0.5), 3.0)
        session.token_scale = round(scale + 0.0005, 3)

    def _compact(
        self, work: TurnWork, assembly: Assembly, estimator: Estimator, left_out: list[Event]
    ) -> bool:
        """Summarize what the context leaves out into a ``context_compacted`` event: the
        turns the read window did not reach (``left_out``, :func:`.compaction.unread`),
        then the older turns that no longer fit the budget.

        Returns whether a summary was staged. A summarizer failure is not the turn's:
        the turn goes on with the previous summary, and the next turn tries again.
        """
        session = work.session
        turns = turns_to_compact(assembly)
        trigger: compaction.Trigger = "budget"
        previous = assembly.summary
        through = turns[-1].last_sequence if turns else 0
        if left_out:
            trigger = "read_window"
            after = previous.body.to_sequence if previous is not None else 0
            missed = split_turns(left_out, after=after, estimator=estimator, redactor=self.redactor)
            turns = [*missed, *turns]
            through = max(through, left_out[-1].sequence)
        if not turns:
            return False
        summarizer = compaction.Summarizer(
            self._summarizer(work), self.settings.summarizer_model or work.model
        )
        written = compaction.summarize(
            summarizer,
            compaction.covering(turns, previous, through, trigger),
            estimator=estimator,
            limit=self._summary_limit(summarizer.model),
            later=[e for e in session.events if e.sequence > through],
            pending=[p.id for p in session.machine.pending],
        )
        if written is None:
            return False
        self._stage_summary(session, written, actor=f"summarizer:{written.model}")
        return True

    def _summary_limit(self, model: str) -> int:
        """Tokens of turns one summarizer call is sent: half the summarizer model's room
        (window less answer reserve), leaving the rest to its prompt and previous summary."""
        spec = self.settings.model_spec(model)
        return (spec.context_window - spec.answer_reserve) // 2

    def _stage_summary(self, session: Session, written: compaction.Written, actor: str) -> Event:
        """Stage a summary; later contexts (and loads) start from it."""
        event = session.add(written.payload, actor=actor)
        session.summary = SummaryRef(sequence=event.sequence, through=written.payload.to_sequence)
        session.usage = session.usage + written.usage
        session.cost_usd += self.settings.model_spec(written.model).cost(written.usage)
        return event

    def _summarizer(self, work: TurnWork) -> Provider:
        """Who writes summaries: the one given, ``SUMMARIZER_PROVIDER``, or the turn's own."""
        if self.summarizer is not None:
            return self.summarizer
        name = self.settings.summarizer_provider
        if not name or name == work.provider.name or self._build_provider is None:
            return work.provider
        if name not in self._providers:
            # Configured by the deployment itself: no need to be a provider turns may name.
            self._providers[name] = self._build_provider(name)
        return self._providers[name]

    # --- long-term memory (context/memory.py, store/memories.py) ---------------------------

    def _memory_user(self, actor: str, command: TurnCommand, session: Session) -> str | None:
        """Whose memory a turn uses: the user a trusted caller named, else the actor;
        ``None`` when memory is off for the deployment or the conversation (a turn's
        ``memory`` opts the conversation out, or in again, from that turn on), or nobody
        is named."""
        if command.memory is not None:
            session.memory_off = not command.memory
        if not self.settings.memory_enabled or session.memory_off:
            return None
        user = command.memory_user or actor
        return None if user in ANONYMOUS_ACTORS else user

    def _recall(self, work: TurnWork, budget: int, estimator: Estimator) -> Recall | None:
        """Read the turn's user's records once per request and pick the block its context
        carries. A failure to read is logged: the turn goes on without memory."""
        user = work.session.options.memory_user
        if user is None:
            return None
        if work.recall is not None and work.recall.user == user:
            return work.recall
        session = work.session
        query = " ".join(
            body.content
            for event in session.events
            if event.turn == session.turn and isinstance(body := event.body(), UserMessage)
        )
        complete = True
        try:
            # Eventually consistent: half the price, and a record written a moment ago
            # by another conversation may wait for the next turn.
            records = MemoryBook(self.store, session.key.tenant, user).records(consistent=False)
        except Exception:
            logger.exception("could not read the user's memory; the turn goes on without it")
            records, complete = [], False
        query_vector = self._embed(query) if records and self.embedder is not None else None
        ranked = rank(records, query, query_vector=query_vector, vector_of=_vector_of)
        message, ids = recall_block(
            ranked,
            budget=budget,
            share=self.settings.memory_context_share,
            estimator=estimator,
        )
        redactor = self.redactor
        if message is not None and redactor is not None:
            # Everything a model sees is redacted; records added by hand never were.
            message = Message(role="system", content=redactor.text(message.content or ""))
        work.recall = Recall(
            user=user, records=records, message=message, ids=ids, complete=complete
        )
        return work.recall

    def _extract_memory(self, work: TurnWork, run: RunRecord) -> RunRecord:
        """Ask the summarizer for the facts the user stated in this turn and plan their
        writes (done after the commit); the call's usage is the head's and the run
        record's (``memory_usage``). A failure is logged and never fails the turn."""
        session = work.session
        user = session.options.memory_user
        if user is None or work.recall is None or not work.recall.complete:
            return run
        said = [
            (event.sequence, body.content)
            for event in session.events
            if event.turn == session.turn and isinstance(body := event.body(), UserMessage)
        ]
        if not said:
            return run
        left = deadline.remaining()
        if left is not None and left < _MEMORY_MIN_SECONDS:
            # The answer must still be committed: no extraction in the request's last seconds.
            logger.warning("no time left for memory extraction", extra={"seconds_left": left})
            return run
        redactor = self.redactor
        texts = [redactor.text(text) if redactor is not None else text for _, text in said]
        model = self.settings.summarizer_model or work.model
        summarizer: Provider | None = None
        try:
            summarizer = self._summarizer(work)
            with timed("MemoryExtractionLatency"):
                reply = summarizer.complete(extraction_request(model, texts, work.recall.records))
            session.usage = session.usage + reply.usage
            session.cost_usd += self.settings.model_spec(reply.model or model).cost(reply.usage)
            run = run.model_copy(update={"memory_usage": reply.usage})
            facts = parse_facts(reply.text or "")
            work.memory_plan = plan_writes(
                work.recall.records,
                facts,
                now=self.clock(),
                source=Provenance(
                    conversation_id=session.key.conversation_id,
                    from_sequence=said[0][0],
                    to_sequence=said[-1][0],
                ),
                cap=max(self.settings.memory_max_records, 1),
                embed=self._embedded if self.embedder is not None else None,
            )
        except Exception as exc:
            logger.warning(
                "memory extraction failed; the turn is answered without it",
                extra={
                    "error": type(exc).__name__,
                    "summarizer": summarizer.name if summarizer else None,
                },
            )
        return run

    def _embed(self, text: str) -> list[float] | None:
        """The embedding of ``text``, or ``None`` (logged) when the embedder fails."""
        embedder = self.embedder
        if embedder is None or not text.strip():
            return None
        try:
            with timed("EmbeddingLatency"):
                return embedder.embed([text])[0]
        except ProviderError as exc:
            logger.warning(
                "embedding failed; memory is ranked by keywords",
                extra={"code": exc.code, "embedder": embedder.name},
            )
            return None

    def _embedded(self, text: str) -> str | None:
        vector = self._embed(text)
        return None if vector is None else encode_vector(vector)

    def _write_memory(self, work: TurnWork) -> None:
        """Write what extraction planned, once the turn is committed (a cancelled turn
        writes nothing). A failure is logged: the turn's answer stands."""
        plan, recall = work.memory_plan, work.recall
        work.memory_plan = None
        if plan is None or recall is None or work.status_reason == "cancelled":
            return
        book = MemoryBook(self.store, work.session.key.tenant, recall.user)
        try:
            for index, record in enumerate(plan.puts):
                book.put(record, first=index == 0 and not recall.records)
            book.delete(plan.deletes)
        except Exception:
            logger.exception("could not write the user's memory; the turn's answer stands")

    def _record_failure(self, work: TurnWork, exc: ProviderError) -> None:
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
            session.commit()
        except TurnledgerError as error:
            logger.warning("could not record a failed turn", extra={"code": error.code})

    # --- helpers --------------------------------------------------------------------------

    def _open(self, key: ConversationKey) -> Session:
        """Load a session for a turn: expired conversations are purged and start fresh."""
        return self._opened(key)[0]

    def _opened(self, key: ConversationKey) -> tuple[Session, Snapshot]:
        """:meth:`_open`, and the snapshot the session was opened from."""
        snapshot = self.store.load(key, self.budget)
        head = snapshot.head
        if head is not None and not is_tombstone(head) and head.is_expired(self.clock()):
            if self.store.purge_if_unchanged(key, head, self.clock()) is None:
                raise ConversationBusy("the conversation changed while it expired; retry")
            return self._opened(key)
        return self._session(key, head, snapshot.events), snapshot

    def _session(self, key: ConversationKey, head: Head | None, events: list[Event]) -> Session:
        session = Session.open(
            self.store,
            key,
            head=head,
            history=events,
            clock=self.clock,
            ttl_seconds=self.settings.ttl_for(key.tenant),
        )
        session.on_commit = self.on_commit
        opened = _opened.get()
        if opened is not None:
            opened.append((session, session.head))
        return session

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

    def _provider_of(self, name: str | None) -> Provider:
        # A turn continued later uses its own provider, even if the deployment dropped it
        # from the allowed list meanwhile: the turn was accepted with it.
        try:
            return self.provider_for(name)
        except UnknownProvider:
            return self.provider

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


def _vector_of(record: MemoryRecord) -> list[float] | None:
    """A record's stored embedding (``None``: none, or unreadable)."""
    if record.embedding is None:
        return None
    try:
        return decode_vector(record.embedding)
    except ValueError:
        return None


#: Seconds a request must have left for model calls to run the memory extraction.
_MEMORY_MIN_SECONDS = 3.0

#: Actors that name nobody in particular (no ``sub`` claim): they have no memory.
ANONYMOUS_ACTORS = frozenset({"anonymous"})

#: Estimates are scaled to the reported usage and then 5 % over it: conservative.
_CALIBRATION_MARGIN = 1.05


def _cursor_sha256(settings: Settings, specs: list[ToolSpec], redactor: Redactor | None) -> str:
    """What a stored provider response was made with: system prompt, tools, redaction."""
    made_with = {
        "system": settings.system_prompt,
        "tools": [spec.model_dump(mode="json") for spec in specs],
        "redaction": redactor.version if redactor is not None else None,
    }
    return hashlib.sha256(json.dumps(made_with, sort_keys=True).encode()).hexdigest()


def _json_answer(reply: ModelReply) -> Any:
    """A JSON-mode answer as a JSON value.

    Raises:
        ProviderError: the answer is not JSON the ledger keeps (the strict parser's: no
            lone surrogate, no nesting past its limit, no key twice).
    """
    try:
        return parse(reply.text or "", "the answer")
    except BodyError:
        raise ProviderError(
            "the model's answer in JSON mode is not JSON",
            details={"reason": "invalid_json"},
        ) from None


def _turn_usage(session: Session) -> int:
    """Input + output tokens of the current turn's model calls so far."""
    total = Usage()
    for event in session.events:
        if event.turn == session.turn and isinstance(body := event.body(), AssistantMessage):
            total = total + body.usage
    return total.input_tokens + total.output_tokens


def _callback_output(value: Any) -> str:
    """A callback's ``output`` as the call's result text: a string as itself, nothing as
    empty, any other JSON value as compact JSON (as an http tool's answer is kept)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _unique_ids(calls: list[ToolCall]) -> list[ToolCall]:
    """Calls with ids unique within one reply (a provider may repeat an id)."""
    seen: set[str] = set()
    unique = []
    for index, call in enumerate(calls):
        call_id = call.id if call.id not in seen else f"{call.id}_{index + 1}"
        seen.add(call_id)
        unique.append(call if call_id == call.id else call.model_copy(update={"id": call_id}))
    return unique
