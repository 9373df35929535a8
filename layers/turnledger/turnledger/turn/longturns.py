"""Running turns through their drafts: ``Prefer: respond-async``, the turn worker, a drafted run.

A turn (or an approval that continues one) sent with ``Prefer: respond-async``
is *accepted*: the request checks what it can at once (identity, body, tools,
provider, pending approvals, budget, a turn already running), marks the turn's
draft ``in_progress`` and invokes the turn worker function asynchronously
(Lambda ``InvocationType=Event``), then answers ``202``. The worker runs the
turn exactly as a synchronous request would (:class:`Conversations`, same
commit protocol), with its model calls streaming into the draft
(:mod:`turnledger.turn.drafts`), and stores the final response (or the error) in
the draft's state.

Why an asynchronous invocation and not a queue: Lambda's own event queue
gives retries (2) and an on-failure destination without a queue to run,
poll or pay for; a turn is one message with no ordering needs beyond the
conversation's own optimistic lock.

Synchronous turns run through their draft too (:func:`run_drafted`, keeping no copy of
the answer), so any turn can be followed while it runs. Reading turns (following a
draft, a history page) is :mod:`.turn_reads`'s, which loads none of this. The HTTP
bodies of all this (the ``202``, progress, stream pages and their SSE framing) are the
edge's (:mod:`turnledger.api.streaming`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from ..core.exceptions import (
    ConversationBusy,
    ConversationNotFound,
    NotAwaitingApproval,
    PayloadTooLarge,
    ProviderError,
    ServiceUnavailable,
    TurnledgerError,
)
from ..core.models import ConversationKey, Head
from ..core.observability import logger
from . import drafts
from .admission import Rules, admit
from .approval_edits import check_four_eyes
from .commands import Decisions, TurnCommand
from .drafts import DraftSink, DraftWriter
from .lifecycle import awaits_decision, check_settler, is_tombstone
from .live import Listener, LiveDraft
from .results import TurnResult
from .turn_reads import overtaken, run_going, visible_head

if TYPE_CHECKING:
    from ..store.base import Snapshot
    from .pipeline import Conversations

#: The worker's event marks itself, so a stray event is refused, not run.
WORKER_EVENT = "turnledger.async_turn"
#: Lambda's limit of an asynchronous invocation's event (256 KiB), which carries the input.
MAX_EVENT_BYTES = 256 * 1024

RouteKind = Literal["turn", "approval"]


class AsyncTurnsUnavailable(TurnledgerError):
    """This deployment has no turn worker: ``Prefer: respond-async`` cannot be honoured."""

    status = 501
    code = "async_unavailable"


class TurnSuperseded(TurnledgerError):
    """The accepted turn's number was taken before its worker ran: by another request's
    turn, or by an earlier run of the same worker invocation that committed and died
    before it could say so. Nothing of this run was stored; the transcript is the record."""

    status = 409
    code = "turn_superseded"


# --- accepting ----------------------------------------------------------------------------


class DraftedRun:
    """The draft sink (:class:`.drafts.DraftSink`) of a run in this request or in the
    worker, writing into ``writer``. A turn run here (``command``) has its draft begun by
    the turn's admission (:meth:`begin`), numbered from the head its load read; any other
    run's draft was begun before the run (``begin`` does nothing)."""

    def __init__(
        self,
        service: Conversations,
        key: ConversationKey,
        writer: DraftWriter,
        *,
        command: TurnCommand | None = None,
        after_ms: int = 0,
    ) -> None:
        self.service = service
        self.key = key
        self.writer = writer
        self.command = command
        self.after_ms = after_ms
        #: Whether the writer is aimed at the run's turn (a turn's: once admitted).
        self.aimed = command is None

    def begin(self, head: Head | None, loaded: Snapshot | None) -> None:
        if self.command is None:
            return
        _begin_draft(
            self.service,
            self.key,
            _turn_of(head, self.command),
            "turn",
            head,
            after_ms=self.after_ms,
            writer=self.writer,
            loaded=loaded,
        )
        self.aimed = True

    def add(self, text: str) -> None:
        self.writer.add(text)

    def finish(self, result: dict[str, Any] | None) -> None:
        self.writer.finish(result)

    def interrupt(self, reason: str, result: dict[str, Any] | None) -> None:
        self.writer.interrupt(reason, result)


def _check_command(service: Conversations, command: TurnCommand) -> None:
    """What a turn request refuses of its own options, as the turn would.

    Raises:
        UnknownTool, UnknownProvider, UnknownModel: the request names one the deployment
            does not have or allow.
    """
    service.provider_for(command.provider)
    service.check_model(command.model)
    service.tools.select(command.tools)
    for name in command.require_approval:
        service.tools.get(name)


def _begin_draft(
    service: Conversations,
    key: ConversationKey,
    turn: int,
    kind: str,
    head: Head | None,
    *,
    after_ms: int = 0,
    writer: DraftWriter | None = None,
    loaded: Snapshot | None = None,
) -> DraftWriter:
    """The begun draft of ``turn``, run in this request or by the worker (``after_ms``: begun
    only if the run goes on that long, :meth:`~.drafts.DraftWriter.begin_after`); ``head``
    is the conversation's as just read. ``writer``: the one to begin (aimed at ``turn``
    here), else a new one. ``loaded``: the turn's load, whose run flag may tell that no
    run of ``turn`` is going (then the draft's state is not read: the busy check is free).

    Raises:
        ConversationBusy: a run of that turn is still going.
    """
    checked = loaded is None or _may_run(loaded, turn)
    state = drafts.read_state(service.store, key, turn) if checked else None
    now = service.clock()
    if (
        state is not None
        and run_going(state, now)
        and not overtaken(state, service.store.get_head(key), now)
    ):
        raise ConversationBusy(
            "a turn of this conversation is running; follow it or wait for it",
            details={"turn": turn, "retry_after_seconds": 1},
        )
    if writer is None:
        writer = _writer(service, key, turn, kind, head)
    else:
        _aim(writer, service, key, turn, head)
    # Unread (the flag said no run): the state an earlier run left is read if the draft begins.
    later = not checked
    if after_ms > 0:
        writer.begin_after(after_ms, state, known=checked, read_later=later)
        return writer
    try:
        writer.begin(state, known=checked, read_later=later)
    except Exception:
        # The begin may have landed though its answer was lost: undo it (best effort),
        # or the turn would read as running until the draft goes stale.
        _quietly(writer.restore)
        raise
    return writer


def _may_run(loaded: Snapshot, turn: int) -> bool:
    """Whether a run of ``turn`` may be going, as the run flag read by the load says: every
    turn's draft puts the flag, naming its turn, before its state, so a flag that names
    another turn (or none) says none is. A store that did not read the flag says nothing."""
    return not loaded.run_read or (loaded.run is not None and loaded.run.turn == turn)


def _quietly(step: Callable[[], None]) -> None:
    """Run a draft's bookkeeping ``step``; a failure is logged, never raised (the request's
    own outcome is what its caller must see)."""
    try:
        step()
    except Exception:
        logger.exception("could not write a turn's draft state")


def _turn_of(head: Head | None, command: TurnCommand) -> int:
    """The number of the turn ``command`` runs on a conversation whose visible head is
    ``head``: the next one when it starts a turn, else the head's (at least 1)."""
    current = head.turn if head is not None else 0
    return max(current + (1 if command.starts_turn else 0), 1)


def _aim_late(
    writer: DraftWriter, service: Conversations, key: ConversationKey, command: TurnCommand
) -> None:
    """Aim ``writer`` at the turn ``command`` would have run, from the head as read now."""
    head = visible_head(service, key)
    _aim(writer, service, key, _turn_of(head, command), head)


def _writer(
    service: Conversations, key: ConversationKey, turn: int, kind: str, head: Head | None
) -> DraftWriter:
    """A draft writer of ``turn``, for the conversation whose head was just read as ``head``."""
    writer = DraftWriter(
        store=service.store,
        key=key,
        turn=turn,
        expires_at=None,
        now=service.clock,
        kind=kind,
        flush_ms=service.settings.draft_flush_ms,
        flush_chars=service.settings.draft_flush_chars,
    )
    _aim(writer, service, key, turn, head)
    return writer


def _aim(
    writer: DraftWriter, service: Conversations, key: ConversationKey, turn: int, head: Head | None
) -> None:
    """Point ``writer`` at ``turn`` of the life ``head`` (just read) is of, its items expiring
    no sooner than the conversation."""
    ttl = service.settings.ttl_for(key.tenant)
    expires_at = head.expires_at if head is not None else None
    if expires_at is None and ttl:
        expires_at = int(service.clock().timestamp()) + ttl
    if expires_at is not None and ttl:
        # A turn renews the conversation's expiry; the draft must outlive this run.
        expires_at = max(expires_at, int(service.clock().timestamp()) + ttl)
    writer.turn = turn
    writer.expires_at = expires_at
    writer.gen = head.gen if head is not None and not is_tombstone(head) else None


def accept(
    service: Conversations,
    key: ConversationKey,
    actor: str,
    command: TurnCommand | Decisions,
    invoke: Callable[[dict[str, Any]], None],
) -> int:
    """Accept a long turn: check it, mark its draft in progress, start the worker.

    ``invoke(payload)`` starts the worker asynchronously (:func:`invoke_worker`).

    Returns:
        The number of the turn the worker runs (or continues).

    Raises:
        AsyncTurnsUnavailable: no worker function is configured.
        ConversationBusy: a turn of this conversation is already running.
        ConversationNotFound, NotAwaitingApproval: an approval with nothing to decide.
        ApproverScopeMissing: outputs of human-input or deferred calls from a caller
            without the approver scope (:func:`.lifecycle.check_settler`).
        ApprovalPending, BudgetExceeded, UnknownTool, UnknownProvider, UnknownModel,
            ContextLengthExceeded: as a turn would.
        ServiceUnavailable: the worker could not be started (the draft says so).
    """
    if not service.settings.turn_worker_function:
        raise AsyncTurnsUnavailable(
            "this deployment runs no turn worker; send the request without Prefer: respond-async",
        )
    conversation_id = key.conversation_id
    head = visible_head(service, key)
    kind: RouteKind
    if isinstance(command, TurnCommand):
        kind = "turn"
        _check_command(service, command)
        if head is not None:
            outputs = [o.call_id for o in command.outputs]
            check_settler(head.pending, outputs, command.approver_claims)
        service.check_input_fits(command, head.token_scale if head is not None else None)
        admit(
            head,
            service.clock(),
            Rules(budget=service.settings.conversation_budget_for(key.tenant), undecided=True),
        )
        turn = (head.turn if head is not None else 0) + (1 if command.starts_turn else 0)
        if turn == 0:
            raise ConversationNotFound(f"conversation {conversation_id!r} not found")
    else:
        kind = "approval"
        if head is None:
            raise ConversationNotFound(f"conversation {conversation_id!r} not found")
        check_settler(head.pending, command.outputs, command.approver_claims)
        if not awaits_decision(head):
            raise NotAwaitingApproval("nothing in this conversation awaits approval")
        admit(head, service.clock(), Rules())
        # Refused here, not later in the worker, when the head already says who asked.
        check_four_eyes(
            service.tools,
            {p.id: p for p in head.pending},
            command.approvals,
            actor,
            always=service.settings.approval_four_eyes,
        )
        turn = head.turn
    payload = {
        "kind": WORKER_EVENT,
        "route": kind,
        "tenant": key.tenant,
        "actor": actor,
        "conversation_id": conversation_id,
        "turn": turn,
        "command": command.model_dump(mode="json"),
    }
    size = len(json.dumps(payload).encode())
    if size > MAX_EVENT_BYTES:
        # The input travels in the worker's event, and Lambda caps asynchronous events:
        # refused before anything is stored (a retry would fail the same way).
        raise PayloadTooLarge(
            f"a long turn's request may be at most {MAX_EVENT_BYTES} bytes (it is carried "
            "in the turn worker's event); send it synchronously",
            details={"limit": MAX_EVENT_BYTES, "size": size},
        )
    writer = _begin_draft(service, key, turn, kind, head)
    try:
        invoke(payload)
    except Exception as exc:
        logger.exception("could not start the turn worker")
        error = ServiceUnavailable(
            "the turn worker could not be started; nothing of the turn was stored",
            details={"retry_after_seconds": 1},
        )
        writer.interrupt("worker_unavailable", error.to_body())
        raise error from exc
    return turn


def invoke_worker(
    function_name: str, payload: dict[str, Any], endpoint_url: str | None = None
) -> None:
    """Start the turn worker with ``payload``, asynchronously (Lambda ``Event`` invocation).

    ``endpoint_url``: another Lambda endpoint (``TURN_WORKER_ENDPOINT``: the local
    runner serves Lambda's Invoke API for its functions).

    Raises:
        botocore.exceptions.BotoCoreError, ClientError: Lambda refused or was unreachable.
    """
    import boto3

    client = boto3.client("lambda", endpoint_url=endpoint_url)
    client.invoke(
        FunctionName=function_name,
        InvocationType="Event",
        Payload=json.dumps(payload).encode(),
    )


# --- the worker ---------------------------------------------------------------------------


def _error_body(error: TurnledgerError) -> dict[str, Any]:
    return error.to_body()


def run_worker(
    service: Conversations,
    event: dict[str, Any],
    *,
    answer: Callable[[TurnResult], dict[str, Any]],
    error_body: Callable[[TurnledgerError], dict[str, Any]] = _error_body,
) -> dict[str, Any]:
    """Run one accepted long turn (the turn worker's event); returns a summary for the logs.

    Never raises for the turn's own failures: they are recorded in the draft (and the
    transcript, as a synchronous turn records them). A retried invocation of a run that
    already ended does nothing. The draft keeps ``answer(result)`` once the turn is
    done, or ``error_body(error)`` (with the error's ``status``) when it failed: the
    bodies the synchronous request would have answered.

    Raises:
        ValueError: the event is not a turn worker event.
    """
    if event.get("kind") != WORKER_EVENT:
        raise ValueError("not a turn worker event")
    actor = str(event["actor"])
    turn = int(event["turn"])
    kind: RouteKind = "approval" if event.get("route") == "approval" else "turn"
    key = ConversationKey(
        tenant=str(event["tenant"]), conversation_id=str(event["conversation_id"])
    )
    state = drafts.read_state(service.store, key, turn)
    if state is not None and state.done:
        return {"turn": turn, "status": state.status, "skipped": True}
    writer = _writer(service, key, turn, kind, service.store.get_head(key))
    writer.begin()
    try:
        if kind == "turn":
            command = TurnCommand.model_validate(event["command"])
            head = visible_head(service, key)
            expected = turn - 1 if command.starts_turn else turn
            current = head.turn if head is not None else 0
            if current != expected:
                # Another turn landed after this one was accepted, or a retried invocation
                # comes after its own commit: never run the input a second time.
                raise TurnSuperseded(
                    f"turn {turn} was taken before this run began; nothing of it was stored "
                    "(the conversation's events say what happened)",
                    details={"turn": turn, "turns": current},
                )
            result = service.turn(key, actor, command, sink=DraftedRun(service, key, writer))
        else:
            decisions = Decisions.model_validate(event["command"])
            result = service.approve(key, actor, decisions, sink=DraftedRun(service, key, writer))
    except TurnledgerError as exc:
        body = error_body(exc)
        body["error"]["status"] = exc.status
        writer.interrupt(exc.code, body)
        logger.info("long turn interrupted", extra={"code": exc.code, "turn": turn})
        return {"turn": turn, "status": writer.status, "reason": exc.code}
    except Exception:
        logger.exception("long turn failed")
        error = TurnledgerError(
            "internal error; the conversation is as the turn's last commit left it, and not held"
        )
        body = error_body(error)
        body["error"]["status"] = error.status
        writer.interrupt(error.code, body)
        return {"turn": turn, "status": writer.status, "reason": error.code}
    head = service.store.get_head(key)
    if head is not None:
        writer.gen = head.gen  # a first turn created the conversation's life just now
    writer.finish(answer(result))
    return {"turn": turn, "status": writer.status}


def run_synchronously(
    service: Conversations, key: ConversationKey, actor: str, command: TurnCommand | Decisions
) -> TurnResult:
    """Run a synchronous turn (or decisions) through the turn's draft: any client can
    follow it while it runs (``GET .../turns/{n}``), even if this request's client is gone.
    The draft keeps no copy of the answer: a read rebuilds it from the log. It is begun
    only once the turn has run ``SYNC_DRAFT_AFTER_MS``: a quicker turn writes none (its
    busy check still refuses a second turn while a longer one runs: the run flag its
    load reads names the longer one's turn, whose draft's state is then read). Without
    ``SYNC_TURN_DRAFTS`` the turn runs as it is, writing no draft."""
    if not service.settings.sync_turn_drafts:
        if isinstance(command, TurnCommand):
            return service.turn(key, actor, command)
        return service.approve(key, actor, command)
    result, _ = run_drafted(
        service,
        key,
        actor,
        command,
        answer=None,
        read_back=False,
        draft_after_ms=service.settings.sync_draft_after_ms,
    )
    return result


def run_drafted(
    service: Conversations,
    key: ConversationKey,
    actor: str,
    command: TurnCommand | Decisions,
    *,
    answer: Callable[[TurnResult], dict[str, Any]] | None,
    read_back: bool = True,
    draft_after_ms: int = 0,
    listener: Listener | None = None,
) -> tuple[TurnResult, list[str]]:
    """Run a turn (or decisions) in this request, its model calls streaming into the turn's
    draft exactly as the worker's do, so any reader follows it (``GET .../turns/{n}/stream``);
    the draft keeps ``answer(result)`` once the turn is committed (``answer=None``: only that
    it is done; readers rebuild the answer from the log, :mod:`.turn_log`), or the error.

    A new turn that would be refused at once (calls await a decision, a run holds the
    lease, the budget is spent) is refused before its draft is written. ``draft_after_ms``:
    the draft is begun only if the run goes on that long (a quicker one writes none).
    ``listener``: told when the turn begins and given the answer as the model writes it
    (:class:`.live.LiveDraft`), for a client that streams it live.

    Returns:
        The result, and the draft's chunks' texts, read back after the commit (none
        without ``read_back``).

    Raises:
        ConversationBusy: a turn of this conversation is running.
        TurnledgerError: whatever the turn or the decisions raise (recorded in the draft).
    """
    kind: RouteKind = "turn" if isinstance(command, TurnCommand) else "approval"
    sink: DraftedRun
    if isinstance(command, TurnCommand):
        # The turn's own load is the one read: its head numbers the draft, begun by the
        # turn's admission (after the lease, budget and approvals are asked) and before
        # anything is written.
        sink = DraftedRun(
            service,
            key,
            _writer(service, key, 0, kind, None),
            command=command,
            after_ms=draft_after_ms,
        )
    else:
        head = visible_head(service, key)
        writer = _begin_draft(
            service,
            key,
            max(head.turn if head is not None else 0, 1),
            kind,
            head,
            after_ms=draft_after_ms,
        )
        sink = DraftedRun(service, key, writer)
    writer = sink.writer
    run: DraftSink = sink if listener is None else LiveDraft(sink, listener)
    try:
        if isinstance(command, TurnCommand):
            result = service.turn(key, actor, command, sink=run)
        else:
            result = service.approve(key, actor, command, sink=run)
    except Exception as exc:
        failure = exc if isinstance(exc, TurnledgerError) else TurnledgerError("internal error")
        if isinstance(failure, ProviderError) or failure.status >= 500:
            body = failure.to_body()
            body["error"]["status"] = failure.status
            if not sink.aimed and isinstance(command, TurnCommand):
                # Failed before its load was done (the store's own failure): the turn it
                # would have been is read now, so its draft still tells how it ended.
                _quietly(lambda: _aim_late(writer, service, key, command))
            _quietly(lambda: writer.interrupt(failure.code, body))
        else:
            # Refused (a stale decision, an unknown call, a lost race): the turn is as it
            # was, and so is its draft; the caller has the error.
            _quietly(writer.restore)
        raise
    turn = writer.turn
    # A continued turn's draft numbers on after its earlier runs: read back from there.
    first = writer.previous.next_seq if writer.previous is not None else 1
    try:
        # A run whose draft never began writes nothing more: no need of the life either.
        written = service.store.get_head(key) if writer.begun else None
        if written is not None:
            writer.gen = written.gen  # a first turn created the conversation's life just now
        writer.finish(answer(result) if answer is not None else None)
    except Exception:
        # The turn is committed: its answer stands. Readers see the draft overtaken by
        # the commit (:func:`overtaken`) and rebuild the answer from the log.
        logger.exception("could not write the end of a turn's draft")
        return result, []
    if not read_back:
        return result, []
    chunks = drafts.read(service.store, key, turn, after=first - 1).chunks
    return result, [chunk.text for chunk in chunks]
