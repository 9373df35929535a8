"""Long turns: ``Prefer: respond-async``, the turn worker, and reading a turn as it is written.

A turn (or an approval that continues one) sent with ``Prefer: respond-async``
is *accepted*: the request checks what it can at once (identity, body, tools,
provider, pending approvals, budget, a turn already running), marks the turn's
draft ``in_progress`` and invokes the turn worker function asynchronously
(Lambda ``InvocationType=Event``), then answers ``202``. The worker runs the
turn exactly as a synchronous request would (:class:`Conversations`, same
commit protocol), with its model calls streaming into the draft
(:mod:`turnledger.drafts`), and stores the final response (or the error) in
the draft's state.

Why an asynchronous invocation and not a queue: Lambda's own event queue
gives retries (2) and an on-failure destination without a queue to run,
poll or pay for; a turn is one message with no ordering needs beyond the
conversation's own optimistic lock.

Readers (:func:`turn_view`, :func:`stream_page`) read the draft items only:
any process can follow any turn, from any chunk.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from . import drafts
from .drafts import DraftState, DraftWriter
from .exceptions import (
    ApprovalPending,
    BudgetExceeded,
    ConversationBusy,
    ConversationNotFound,
    NotAwaitingApproval,
    PayloadTooLarge,
    ServiceUnavailable,
    TurnledgerError,
)
from .execution import AWAITING_DECISION
from .models import ConversationKey, ConversationStatus, Head, validate_conversation_id
from .observability import logger
from .pipeline import Caller, Conversations
from .api.schemas import ApprovalRequest, InputMessage, TurnRequest

#: The worker's event marks itself, so a stray event is refused, not run.
WORKER_EVENT = "turnledger.async_turn"
#: At most this long a stream request waits for something new (API Gateway's 30 s, less margin).
MAX_WAIT_SECONDS = 20
#: A draft ``in_progress`` for longer than the worker's longest run (15 minutes) is dead.
STALE_AFTER_SECONDS = 900
#: Lambda's limit of an asynchronous invocation's event (256 KiB), which carries the input.
MAX_EVENT_BYTES = 256 * 1024
#: Between two reads of a draft while a stream request waits.
POLL_SECONDS = 0.2

RouteKind = Literal["turn", "approval"]


class AsyncTurnsUnavailable(TurnledgerError):
    """This deployment has no turn worker: ``Prefer: respond-async`` cannot be honoured."""

    status = 501
    code = "async_unavailable"


class TurnNotFound(TurnledgerError):
    """The conversation has no such turn, or the turn has no draft to read."""

    status = 404
    code = "turn_not_found"


class TurnSuperseded(TurnledgerError):
    """The accepted turn's number was taken before its worker ran: by another request's
    turn, or by an earlier run of the same worker invocation that committed and died
    before it could say so. Nothing of this run was stored; the transcript is the record."""

    status = 409
    code = "turn_superseded"


class AsyncTurnAccepted(BaseModel):
    """The ``202`` answer of an accepted long turn."""

    model_config = ConfigDict(extra="forbid")

    conversation_id: str
    turn: int
    status: Literal["in_progress"] = "in_progress"
    stream_url: str


class TurnProgress(BaseModel):
    """``GET .../turns/{n}`` while the turn runs."""

    model_config = ConfigDict(extra="forbid")

    conversation_id: str
    turn: int
    status: Literal["in_progress"] = "in_progress"
    draft_text: str


class ChunkView(BaseModel):
    """One chunk of a draft."""

    seq: int
    text: str


class StreamPage(BaseModel):
    """``GET .../turns/{n}/stream``: chunks after ``after``; ``result`` once ``done``."""

    model_config = ConfigDict(extra="forbid")

    conversation_id: str
    turn: int
    chunks: list[ChunkView] = Field(default_factory=list)
    #: Pass as ``after`` to read on (the last chunk's seq, or ``after`` if none came).
    next_after: int
    done: bool
    #: ``in_progress``, ``done``, or ``interrupted`` (failed or cancelled: see ``reason``).
    status: str
    reason: str | None = None
    #: Once done: the turn's response (a synchronous turn's shape), or its error body.
    result: dict[str, Any] | None = None


def prefers_async(prefer: str | None) -> bool:
    """Whether a ``Prefer`` header (RFC 7240) asks for ``respond-async``."""
    if not prefer:
        return False
    for preference in prefer.split(","):
        token = preference.split(";", 1)[0].strip().lower()
        if token == "respond-async":
            return True
    return False


def turn_url(conversation_id: str, turn: int) -> str:
    """Where a turn's progress or final response is read (the ``Location`` of a ``202``)."""
    return f"/v1/conversations/{conversation_id}/turns/{turn}"


# --- accepting ----------------------------------------------------------------------------


def _visible(service: Conversations, key: ConversationKey) -> Head | None:
    head = service.store.get_head(key)
    return head if head is not None and head.is_visible(service.clock()) else None


def _check_startable(service: Conversations, head: Head | None, key: ConversationKey) -> None:
    """What a turn request would refuse at once, refused before ``202``.

    Raises:
        ConversationBusy: tools of the conversation are running under a lease.
        BudgetExceeded: the conversation's token budget is spent.
        ApprovalPending: calls await approval (not yet expired).
    """
    if head is None:
        return
    now = service.clock()
    lease = head.live_lease(now)
    if lease is not None:
        wait = max(int((lease.expires_at - now).total_seconds() + 0.999), 1)
        raise ConversationBusy(
            "another request is running this conversation's tools; nothing was stored",
            details={"retry_after_seconds": wait},
        )
    limit = service.settings.conversation_budget_for(key.tenant)
    used = head.usage.input_tokens + head.usage.output_tokens
    if limit and used >= limit:
        raise BudgetExceeded(
            "this conversation's token budget is spent", details={"limit": limit, "used": used}
        )
    awaiting = [
        p
        for p in head.pending
        if p.state in AWAITING_DECISION and (p.expires_at is None or p.expires_at > now)
    ]
    if awaiting:
        raise ApprovalPending(
            "tool calls of this conversation await approval; decide them first",
            details={
                "pending_tool_calls": [
                    service._pending_view(p).model_dump(mode="json") for p in awaiting
                ]
            },
        )


def _running(state: DraftState | None, now: datetime) -> bool:
    """Whether a draft state says a run is still going (not over, not stale)."""
    if state is None or state.done:
        return False
    try:
        started = datetime.fromisoformat(state.started_at)
    except ValueError:
        return False
    return (now - started).total_seconds() < STALE_AFTER_SECONDS


def _writer(service: Conversations, key: ConversationKey, turn: int, kind: str) -> DraftWriter:
    head = service.store.get_head(key)
    ttl = service.settings.ttl_for(key.tenant)
    expires_at = head.expires_at if head is not None else None
    if expires_at is None and ttl:
        expires_at = int(service.clock().timestamp()) + ttl
    if expires_at is not None and ttl:
        # A turn renews the conversation's expiry; the draft must outlive this run.
        expires_at = max(expires_at, int(service.clock().timestamp()) + ttl)
    return DraftWriter(
        store=service.store,
        key=key,
        turn=turn,
        expires_at=expires_at,
        now=service.clock,
        kind=kind,
        gen=head.gen
        if head is not None and head.status is not ConversationStatus.CLEARED
        else None,
        flush_ms=service.settings.draft_flush_ms,
        flush_chars=service.settings.draft_flush_chars,
    )


def accept(
    service: Conversations,
    caller: Caller,
    conversation_id: str,
    kind: RouteKind,
    request: TurnRequest | ApprovalRequest,
    invoke: Callable[[dict[str, Any]], None],
) -> AsyncTurnAccepted:
    """Accept a long turn: check it, mark its draft in progress, start the worker.

    ``invoke(payload)`` starts the worker asynchronously (:func:`invoke_worker`).

    Raises:
        AsyncTurnsUnavailable: no worker function is configured.
        ConversationBusy: a turn of this conversation is already running.
        ConversationNotFound, NotAwaitingApproval: an approval with nothing to decide.
        ApprovalPending, BudgetExceeded, UnknownTool, UnknownProvider: as a turn would.
        ServiceUnavailable: the worker could not be started (the draft says so).
    """
    if not service.settings.turn_worker_function:
        raise AsyncTurnsUnavailable(
            "this deployment runs no turn worker; send the request without Prefer: respond-async",
        )
    key = ConversationKey(
        tenant=caller.tenant, conversation_id=validate_conversation_id(conversation_id)
    )
    head = _visible(service, key)
    if isinstance(request, TurnRequest):
        service.provider_for(request.provider)
        service.tools.select(request.tools)
        for name in request.require_approval:
            service.tools.get(name)
        _check_startable(service, head, key)
        new_turn = isinstance(request.input, str) or any(
            isinstance(i, InputMessage) for i in request.input
        )
        turn = (head.turn if head is not None else 0) + (1 if new_turn else 0)
        if turn == 0:
            raise ConversationNotFound(f"conversation {conversation_id!r} not found")
    else:
        if head is None:
            raise ConversationNotFound(f"conversation {conversation_id!r} not found")
        if head.status not in (
            ConversationStatus.AWAITING_APPROVAL,
            ConversationStatus.RUNNING_TOOLS,
        ):
            raise NotAwaitingApproval("nothing in this conversation awaits approval")
        turn = head.turn
    payload = {
        "kind": WORKER_EVENT,
        "route": kind,
        "tenant": caller.tenant,
        "actor": caller.actor,
        "conversation_id": conversation_id,
        "turn": turn,
        "body": request.model_dump(mode="json"),
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
    if _running(drafts.read_state(service.store, key, turn), service.clock()):
        raise ConversationBusy(
            "a turn of this conversation is running; follow it or wait for it",
            details={"turn": turn, "retry_after_seconds": 1},
        )
    writer = _writer(service, key, turn, kind)
    writer.begin()
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
    return AsyncTurnAccepted(
        conversation_id=conversation_id,
        turn=turn,
        stream_url=turn_url(conversation_id, turn) + "/stream",
    )


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


def run_worker(service: Conversations, event: dict[str, Any]) -> dict[str, Any]:
    """Run one accepted long turn (the turn worker's event); returns a summary for the logs.

    Never raises for the turn's own failures: they are recorded in the draft (and the
    transcript, as a synchronous turn records them). A retried invocation of a run that
    already ended does nothing.

    Raises:
        ValueError: the event is not a turn worker event.
    """
    if event.get("kind") != WORKER_EVENT:
        raise ValueError("not a turn worker event")
    caller = Caller(tenant=str(event["tenant"]), actor=str(event["actor"]))
    conversation_id = str(event["conversation_id"])
    turn = int(event["turn"])
    kind: RouteKind = "approval" if event.get("route") == "approval" else "turn"
    key = ConversationKey(tenant=caller.tenant, conversation_id=conversation_id)
    state = drafts.read_state(service.store, key, turn)
    if state is not None and state.done:
        return {"turn": turn, "status": state.status, "skipped": True}
    writer = _writer(service, key, turn, kind)
    writer.begin()
    try:
        if kind == "turn":
            request = TurnRequest.model_validate(event["body"])
            head = _visible(service, key)
            new_turn = isinstance(request.input, str) or any(
                isinstance(i, InputMessage) for i in request.input
            )
            expected = turn - 1 if new_turn else turn
            current = head.turn if head is not None else 0
            if current != expected:
                # Another turn landed after this one was accepted, or a retried invocation
                # comes after its own commit: never run the input a second time.
                raise TurnSuperseded(
                    f"turn {turn} was taken before this run began; nothing of it was stored "
                    "(the conversation's events say what happened)",
                    details={"turn": turn, "turns": current},
                )
            with drafts.streaming_into(writer):
                response = service.turn(caller, conversation_id, request)
        else:
            decisions = ApprovalRequest.model_validate(event["body"])
            with drafts.streaming_into(writer):
                response = service.approve(caller, conversation_id, decisions)
    except TurnledgerError as exc:
        body = exc.to_body()
        body["error"]["status"] = exc.status
        writer.interrupt(exc.code, body)
        logger.info("long turn interrupted", extra={"code": exc.code, "turn": turn})
        return {"turn": turn, "status": "interrupted", "reason": exc.code}
    except Exception:
        logger.exception("long turn failed")
        error = TurnledgerError("internal error; the turn left no partial state")
        body = error.to_body()
        body["error"]["status"] = error.status
        writer.interrupt(error.code, body)
        return {"turn": turn, "status": "interrupted", "reason": error.code}
    head = service.store.get_head(key)
    if head is not None:
        writer.gen = head.gen  # a first turn created the conversation's life just now
    writer.finish(response.model_dump(mode="json"))
    return {"turn": turn, "status": "done"}


# --- reading ------------------------------------------------------------------------------


def _effective(state: DraftState, now: datetime) -> DraftState:
    """``state``, or ``interrupted`` (``worker_lost``) when its run went stale.

    A worker that died without a word (its timeout, or retries spent into the
    dead-letter queue) must not leave readers waiting for ever.
    """
    if state.done or _running(state, now):
        return state
    error = TurnledgerError("the turn's worker stopped before the turn ended")
    body = error.to_body()
    body["error"]["status"] = error.status
    return replace(state, status="interrupted", reason="worker_lost", result=body)


def _readable(
    service: Conversations, caller: Caller, conversation_id: str, turn: int
) -> tuple[ConversationKey, DraftState]:
    """The key and draft state of a turn the caller may read.

    Raises:
        ConversationNotFound: no such conversation (and no draft of a first turn).
        TurnNotFound: the turn has no draft (it ran synchronously, or does not exist).
    """
    key = ConversationKey(
        tenant=caller.tenant, conversation_id=validate_conversation_id(conversation_id)
    )
    head = _visible(service, key)
    state = drafts.read_state(service.store, key, turn)
    if state is not None and head is not None and state.gen and state.gen != head.gen:
        # Written to another life of the conversation: a leftover of a cleared one (a run
        # that went on writing after the clear). Purges delete drafts with the partition.
        state = None
    if state is not None:
        state = _effective(state, service.clock())
    if state is None:
        if head is None:
            raise ConversationNotFound(f"conversation {conversation_id!r} not found")
        raise TurnNotFound(
            f"turn {turn} of this conversation has no draft to read (only turns sent "
            "with Prefer: respond-async have one)",
            details={"turn": turn, "turns": head.turn},
        )
    return key, state


def turn_view(
    service: Conversations, caller: Caller, conversation_id: str, turn: int
) -> tuple[int, dict[str, Any]]:
    """``GET .../turns/{n}``: ``(status code, body)``.

    In progress: ``200`` :class:`TurnProgress`. Done: ``200`` and the turn's response.
    Interrupted: the error the synchronous turn would have answered, its ``details``
    adding ``turn``, ``draft_status`` and the ``draft_text`` written so far.
    """
    key, state = _readable(service, caller, conversation_id, turn)
    if state.status == "done" and state.result is not None:
        return 200, state.result
    text = "".join(c.text for c in drafts.read(service.store, key, turn).chunks)
    if state.status == "interrupted":
        body = json.loads(json.dumps(state.result or {})) or {
            "error": {"code": state.reason or "internal_error", "message": "", "details": {}}
        }
        error = body["error"]
        status = int(error.pop("status", 500))
        error.setdefault("details", {}).update(
            {"turn": turn, "draft_status": "interrupted", "draft_text": text}
        )
        return status, body
    progress = TurnProgress(conversation_id=conversation_id, turn=turn, draft_text=text)
    return 200, progress.model_dump(mode="json")


def stream_page(
    service: Conversations,
    caller: Caller,
    conversation_id: str,
    turn: int,
    *,
    after: int,
    wait: float,
    gather: bool = False,
) -> StreamPage:
    """``GET .../turns/{n}/stream``: the chunks after ``after``, waiting up to ``wait`` s.

    Returns as soon as there is something (``gather=False``: long poll) or, with
    ``gather``, once the draft is over or the wait is spent (one SSE response).
    Waiting reads are eventually consistent (half price); a draft seen over is read
    once more consistently, so no last chunk is missed.

    Raises:
        ConversationNotFound, TurnNotFound: see :func:`_readable`.
    """
    key, state = _readable(service, caller, conversation_id, turn)
    deadline = time.monotonic() + max(min(wait, MAX_WAIT_SECONDS), 0)
    chunks: list[drafts.Chunk] = []
    cursor = after
    consistent = True
    while True:
        read = drafts.read(service.store, key, turn, after=cursor, consistent=consistent)
        current = _effective(read.state, service.clock()) if read.state else state
        if current.done and not consistent:
            consistent = True
            continue  # the last chunks may lag an eventually consistent read
        chunks.extend(read.chunks)
        if read.chunks:
            cursor = read.chunks[-1].seq
        if current.done or (chunks and not gather) or time.monotonic() >= deadline:
            break
        consistent = False
        time.sleep(POLL_SECONDS)
    return StreamPage(
        conversation_id=conversation_id,
        turn=turn,
        chunks=[ChunkView(seq=c.seq, text=c.text) for c in chunks],
        next_after=cursor,
        done=current.done,
        status=current.status,
        reason=current.reason,
        result=current.result if current.done else None,
    )


def sse_text(page: StreamPage, *, retry_ms: int = 1000) -> str:
    """A :class:`StreamPage` as server-sent events.

    Each chunk is an event ``chunk`` whose ``id`` is its seq (a reconnecting
    ``EventSource`` sends it back as ``Last-Event-ID``); the end is an event ``done``
    carrying the status, reason and result. ``retry`` tells the client when to reconnect.
    """
    events: list[list[str]] = []
    for chunk in page.chunks:
        data = json.dumps({"seq": chunk.seq, "text": chunk.text})
        events.append([f"id: {chunk.seq}", "event: chunk", f"data: {data}"])
    if page.done:
        data = json.dumps({"status": page.status, "reason": page.reason, "result": page.result})
        events.append([f"id: {page.next_after}", "event: done", f"data: {data}"])
    if not events:
        # Nothing new within the wait: a comment, so the client just reconnects.
        events.append([": no new chunks yet"])
    # ``retry`` rides on the first event: a block of its own reaches some clients as
    # an empty message.
    events[0].insert(0, f"retry: {retry_ms}")
    return "".join("\n".join(lines) + "\n\n" for lines in events)


def worker_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The turn worker function's Lambda entry point (see :func:`run_worker`).

    The turn's deadline is the invocation's remaining time, so a provider call never
    outlives the function (the worker's timeout is minutes, not API Gateway's 30 s).
    """
    from .deadline import request_deadline
    from .runtime import get_runtime

    logger.append_keys(tenant=event.get("tenant"), conversation_id=event.get("conversation_id"))
    remaining_ms = getattr(context, "get_remaining_time_in_millis", None)
    service = get_runtime().conversations_for(str(event.get("tenant", "")))
    with request_deadline(remaining_ms() / 1000 if callable(remaining_ms) else None):
        return run_worker(service, event)
