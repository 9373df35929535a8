"""Long turns at the edge: ``Prefer: respond-async``, the ``202``, and a turn's reads as
HTTP bodies and server-sent events.

The logic is :mod:`turnledger.turn.longturns` (running) and :mod:`turnledger.turn.turn_reads`
(reading: all the read function loads); this module binds it to the current
request (identity, ``Idempotency-Key``), answers ``202`` with ``Location``, and
shapes what the reads return.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Literal

from aws_lambda_powertools.event_handler import Response, content_types
from aws_lambda_powertools.event_handler.openapi.types import (
    OpenAPIResponse,
    OpenAPIResponseContentSchema,
)
from pydantic import ConfigDict, Field

from ..core.models import ConversationKey, Deferred
from ..runtime import get_runtime
from ..turn import turn_reads
from ..turn.commands import Decisions, TurnCommand
from ..turn.lifecycle import logged_turn_draft_status
from .idempotency import idempotent
from .resolver import Caller, idempotency_key
from .schemas import ApprovalRequest, TurnRequest, TurnResponse
from .views import turn_response

if TYPE_CHECKING:
    from ..turn.reads import Reads

__all__ = ["ASYNC_ANSWER", "AsyncTurnAccepted", "accept_async", "prefers_async", "streamed"]


class AsyncTurnAccepted(Deferred):
    """The ``202`` answer of an accepted long turn."""

    model_config = ConfigDict(extra="forbid")

    conversation_id: str
    turn: int
    status: Literal["in_progress"] = "in_progress"
    stream_url: str


class TurnProgress(Deferred):
    """``GET .../turns/{n}`` while the turn runs."""

    model_config = ConfigDict(extra="forbid")

    conversation_id: str
    turn: int
    status: Literal["in_progress"] = "in_progress"
    draft_text: str


class ChunkView(Deferred):
    """One chunk of a draft."""

    seq: int
    text: str


class StreamPage(Deferred):
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


#: The ``202`` answer of the turn routes, for the OpenAPI document.
def streamed(answers: dict[int, OpenAPIResponse]) -> dict[int, OpenAPIResponse]:
    """``answers`` whose ``200`` may also come as server-sent events (``Accept:
    text/event-stream``: the events of ``GET .../turns/{n}/stream``, written as the model
    writes them)."""
    ok = answers[200]
    events: OpenAPIResponseContentSchema = {
        "schema": {"type": "string", "description": "server-sent events: chunk, then done"}
    }
    content = {**ok.get("content", {}), "text/event-stream": events}
    return {**answers, 200: {**ok, "content": content}}


ASYNC_ANSWER: dict[int, OpenAPIResponse] = {
    202: {
        "description": "Accepted (Prefer: respond-async): the turn runs on; read it at Location",
        "content": {"application/json": {"model": AsyncTurnAccepted}},
    }
}


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


def accept_async(
    who: Caller,
    key: ConversationKey,
    request: TurnRequest | ApprovalRequest,
    command: TurnCommand | Decisions,
) -> Response[TurnResponse | AsyncTurnAccepted]:
    """Accept the current request as a long turn: ``202``, ``Location`` of the turn.

    Under an ``Idempotency-Key`` a retry answers the same ``202`` and starts nothing.
    """
    runtime = get_runtime()
    service = runtime.conversations_for(key.tenant)
    function = runtime.settings.turn_worker_function or ""
    endpoint = runtime.settings.turn_worker_endpoint
    kind = "turn" if isinstance(command, TurnCommand) else "approval"

    def accept() -> AsyncTurnAccepted:
        from ..turn import longturns  # run code: only the routes that start a turn load it

        turn = longturns.accept(
            service,
            key,
            who.actor,
            command,
            invoke=lambda payload: longturns.invoke_worker(function, payload, endpoint),
        )
        return AsyncTurnAccepted(
            conversation_id=key.conversation_id,
            turn=turn,
            stream_url=turn_url(key.conversation_id, turn) + "/stream",
        )

    accepted = idempotent(
        key=idempotency_key(),
        conversation=key,
        # Not the synchronous route's records: the same key answers in its own shape.
        route=f"{kind}s-async",
        body=request.model_dump(mode="json"),
        run=accept,
        parse=AsyncTurnAccepted.model_validate,
    )
    return Response[TurnResponse | AsyncTurnAccepted](
        status_code=202,
        content_type=content_types.APPLICATION_JSON,
        body=accepted,
        headers={
            "Location": turn_url(key.conversation_id, accepted.turn),
            "Preference-Applied": "respond-async",
        },
    )


def turn_view(
    service: Reads, key: ConversationKey, turn: int, *, wait: float = 0
) -> tuple[int, dict[str, Any]]:
    """``GET .../turns/{n}``: ``(status code, body)`` of any turn.

    In progress: ``200`` :class:`TurnProgress` (after waiting up to ``wait`` s for the
    end). Done: ``200`` and the turn's response, as the turn route answered it (kept by a
    long turn's draft, else rebuilt from the log). Failed or interrupted: the error the
    turn's request answered, its ``details`` adding ``turn``, and for a drafted run
    ``draft_status`` and the ``draft_text`` written so far.
    """
    read = turn_reads.read_any_turn(service, key, turn, wait=wait)
    state = read.state
    if read.logged is not None:
        logged = read.logged
        if logged.failure is not None:
            return logged.failure.status, logged.failure.body()
        assert logged.answer is not None
        return 200, turn_response(logged.answer).model_dump(mode="json")
    if state is not None and state.status == "done" and state.result is not None:
        return 200, state.result
    if state is not None and state.status == "interrupted":
        body = json.loads(json.dumps(state.result or {})) or {
            "error": {"code": state.reason or "internal_error", "message": "", "details": {}}
        }
        error = body["error"]
        status = int(error.pop("status", 500))
        error.setdefault("details", {}).update(
            {"turn": turn, "draft_status": "interrupted", "draft_text": read.text}
        )
        return status, body
    progress = TurnProgress(conversation_id=key.conversation_id, turn=turn, draft_text=read.text)
    return 200, progress.model_dump(mode="json")


def stream_page(
    service: Reads,
    key: ConversationKey,
    turn: int,
    *,
    after: int,
    wait: float,
    gather: bool = False,
) -> StreamPage:
    """``GET .../turns/{n}/stream``: the chunks after ``after``, waiting up to ``wait`` s
    (see :func:`turnledger.turn.turn_reads.follow`). A turn that wrote no draft (a
    synchronous turn over within ``SYNC_DRAFT_AFTER_MS``) reads as a stream already done,
    its result rebuilt from the log.

    Raises:
        ConversationNotFound, TurnNotFound: no draft, and the log holds no answer of it.
    """
    try:
        read = turn_reads.follow(service, key, turn, after=after, wait=wait, gather=gather)
    except turn_reads.TurnNotFound:
        answered = turn_reads.read_any_turn(service, key, turn).logged
        if answered is None or answered.answer is None:
            raise
        return StreamPage(
            conversation_id=key.conversation_id,
            turn=turn,
            chunks=[],
            next_after=after,
            done=True,
            status=logged_turn_draft_status(),
            reason=None,
            result=turn_response(answered.answer).model_dump(mode="json"),
        )
    state = read.state
    result = state.result if state.done else None
    if state.status == "done" and result is None:
        # A synchronous turn's draft keeps no copy of its answer: rebuilt from the log.
        _, result = turn_view(service, key, turn)
    return StreamPage(
        conversation_id=key.conversation_id,
        turn=turn,
        chunks=[ChunkView(seq=c.seq, text=c.text) for c in read.chunks],
        next_after=read.next_after,
        done=state.done,
        status=state.status,
        reason=state.reason,
        result=result,
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
