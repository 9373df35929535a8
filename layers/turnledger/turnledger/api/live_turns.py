"""``POST /v1/conversations/{id}/turns`` with ``Accept: text/event-stream``: the turn's
answer as server-sent events, written as the model writes it.

The events are the stream route's (``GET .../turns/{n}/stream``): ``chunk`` events
``{"seq", "text"}``, one per piece the model wrote (``seq``: the draft chunk that holds the
piece; several pieces share one), then ``done`` ``{"status", "reason", "result"}``
(``result``: the synchronous turn's response, or the error body with its ``status``). An
event carries ``id: <seq>`` once chunk ``seq`` is stored with every piece sent before it,
so a client that reconnects to the stream route with ``Last-Event-ID`` gets each later
piece once. ``Content-Location`` names that stream route.

Behind a buffering front (API Gateway) the same events arrive at once, at the end
(:func:`.live.channel` is ``None``). A refusal before the turn begins (busy, budget, a bad
body) is the synchronous route's JSON error.
"""

from __future__ import annotations

import json
from typing import Any

from aws_lambda_powertools.event_handler import Response

from ..core.exceptions import TurnledgerError
from ..core.models import ConversationKey
from ..core.observability import logger
from ..runtime import get_runtime
from ..turn import longturns
from ..turn.commands import TurnCommand
from ..turn.live import Delta
from .idempotency import idempotent
from .live import EVENT_STREAM, Channel, channel
from .resolver import idempotency_key
from .schemas import TurnRequest, TurnResponse
from .streaming import turn_url
from .views import turn_response

#: The ``retry`` the stream tells clients (milliseconds before reconnecting).
RETRY_MS = 1000


class _Writer:
    """Where the events go: the live channel, or a buffer answered at the end."""

    def __init__(self, live: Channel | None) -> None:
        self.live = live
        self.buffered: list[bytes] = []
        self.headers: dict[str, str] = {}

    @property
    def opened(self) -> bool:
        return bool(self.headers)

    def open(self, headers: dict[str, str]) -> None:
        self.headers = headers
        if self.live is not None:
            self.live.open(200, headers)

    def write(self, piece: bytes) -> None:
        if self.live is not None:
            self.live.write(piece)
        else:
            self.buffered.append(piece)


class NativeEvents:
    """The turn's events, written as the turn goes (a :class:`~turnledger.turn.live.Listener`)."""

    def __init__(self, key: ConversationKey, writer: _Writer) -> None:
        self.key = key
        self.writer = writer
        #: The last chunk a piece went to (its id is sent once it is stored).
        self.last_chunk: int | None = None
        self._retry = f"retry: {RETRY_MS}\n"

    def started(self, turn: int) -> None:
        self.writer.open(
            {
                "content-type": EVENT_STREAM,
                "cache-control": "no-cache",
                "content-location": turn_url(self.key.conversation_id, turn) + "/stream",
            }
        )

    def delta(self, delta: Delta) -> None:
        self.last_chunk = delta.chunk
        data = json.dumps({"seq": delta.chunk, "text": delta.text})
        self._event("chunk", data, delta.chunk if delta.stored else None)

    def done(self, status: str, reason: str | None, result: dict[str, Any]) -> None:
        """The last event: how the turn ended (its draft is stored through it)."""
        data = json.dumps({"status": status, "reason": reason, "result": result})
        self._event("done", data, self.last_chunk)

    def _event(self, kind: str, data: str, seq: int | None) -> None:
        lines = self._retry + (f"id: {seq}\n" if seq is not None else "")
        self._retry = ""  # rides on the first event only
        self.writer.write(f"{lines}event: {kind}\ndata: {data}\n\n".encode())


def stream_turn(
    who_actor: str, key: ConversationKey, request: TurnRequest, command: TurnCommand
) -> Response[str]:
    """Run the turn, its events written as it goes (see the module docstring).

    Raises:
        TurnledgerError: the turn was refused before it began (answered as JSON).
    """
    service = get_runtime().conversations_for(key.tenant)
    writer = _Writer(channel())
    events = NativeEvents(key, writer)

    def run() -> TurnResponse:
        result, _ = longturns.run_drafted(
            service,
            key,
            who_actor,
            command,
            # The draft keeps the response: a reader resuming mid-answer gets the stored
            # rest of it as chunks (not only from the log), then this.
            answer=lambda result: turn_response(result).model_dump(mode="json"),
            read_back=False,
            listener=events,
        )
        return turn_response(result)

    try:
        answer = idempotent(
            key=idempotency_key(),
            conversation=key,
            route="turns",  # the synchronous route's records: a retry answers either way
            body=request.model_dump(mode="json"),
            run=run,
            parse=TurnResponse.model_validate,
        )
    except Exception as exc:
        if not writer.opened:
            raise  # refused before the turn began: the route's JSON error
        if not isinstance(exc, TurnledgerError):
            logger.exception("a streamed turn failed")
        error = exc if isinstance(exc, TurnledgerError) else TurnledgerError("internal error")
        body = error.to_body()
        body["error"]["status"] = error.status
        events.done("interrupted", error.code, body)
    else:
        if not writer.opened:
            # A retry answered from the idempotency record: the turn ran before.
            events.started(answer.turn)
        events.done("done", None, answer.model_dump(mode="json"))
    return Response(
        status_code=200,
        content_type=EVENT_STREAM,
        body=b"".join(writer.buffered).decode(),
        headers={k: v for k, v in writer.headers.items() if k != "content-type"},
    )
