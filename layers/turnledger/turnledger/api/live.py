"""Streamed answers at the edge: a route writes its response as it is made.

API Gateway's HTTP API buffers a Lambda's answer whole; Lambda streams one only through a
function URL in ``RESPONSE_STREAM`` mode (deployed through the Lambda Web Adapter:
docs/DEPLOY.md). The streaming function's handler (:func:`streaming`) runs the ordinary
resolver in a thread of its own with a :class:`Channel` current (:func:`channel`); a route
that streams opens it (status and headers) once it knows the request is good, then writes
its body piece by piece while it runs. The handler hands the caller the head and then each
piece as it comes. A route that never opens the channel (a refusal, a route that does not
stream) answers as it always does, in one piece. The local runner invokes the same handler
and writes the pieces to its client as they come (``turnledger_local.workers``).

Only :func:`wants_stream` requests go to the streaming function (the local runner asks it,
as the deployed client chooses the function URL): a turn with ``Accept:
text/event-stream`` and the face's ``stream: true``.

A client that hangs up does not stop the route: the pieces are dropped and the turn runs to
its end (its draft tells any reader how it went; ``POST .../cancel`` stops it).
"""

from __future__ import annotations

import base64
import contextvars
import json
import queue
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Channel",
    "Head",
    "StreamingHandler",
    "channel",
    "streaming",
    "wants_stream",
]

EVENT_STREAM = "text/event-stream"
#: The turn route (the template's path) and the face's responses route.
_TURN_PATH = re.compile(r"/v1/conversations/[^/]+/turns")
_RESPONSES_PATH = "/openai/v1/responses"

Handler = Callable[[dict[str, Any], Any], dict[str, Any]]


@dataclass(frozen=True)
class Head:
    """What a streamed answer starts with: its status and headers."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)

    def prelude(self) -> dict[str, Any]:
        """The head as Lambda's HTTP integration response prelude (a function URL's)."""
        return {"statusCode": self.status, "headers": self.headers}


#: The end of a channel's body (the route's thread is done).
_END = object()


class Channel:
    """Where a route writes a streamed answer: :meth:`open` once, then :meth:`write`.

    Written from the route's thread, read by the handler's (:func:`streaming`); writing
    never blocks, so a slow or gone client never holds the turn.
    """

    def __init__(self) -> None:
        self._pieces: queue.SimpleQueue[bytes | object] = queue.SimpleQueue()
        self._opened = threading.Event()
        self.head: Head | None = None

    @property
    def opened(self) -> bool:
        """Whether the route began its streamed answer."""
        return self.head is not None

    def open(self, status: int = 200, headers: Mapping[str, str] | None = None) -> None:
        """Begin the answer with ``status`` and ``headers`` (sent at once).

        Raises:
            RuntimeError: the channel was opened already.
        """
        if self.head is not None:
            raise RuntimeError("a streamed answer has one head")
        self.head = Head(status, dict(headers or {}))
        self._pieces.put(self.head)
        self._opened.set()

    def write(self, piece: bytes) -> None:
        """Send ``piece`` of the body (after :meth:`open`)."""
        if piece:
            self._pieces.put(piece)

    def _end(self) -> None:
        self._pieces.put(_END)

    def _drain(self) -> Iterator[Head | bytes]:
        """The head and the body's pieces as the route writes them, until its thread ends."""
        while True:
            piece = self._pieces.get()
            if piece is _END:
                return
            if isinstance(piece, Head | bytes):
                yield piece


_current: contextvars.ContextVar[Channel | None] = contextvars.ContextVar(
    "turnledger_live_channel", default=None
)


def channel() -> Channel | None:
    """The current request's channel when its answer may stream (``None``: it is buffered,
    as behind API Gateway)."""
    return _current.get()


#: A streamed invocation: the head, then the body's pieces as they come.
Streamed = Iterator[Head | bytes]


class StreamingHandler:
    """The streaming form of the API's handler (:func:`streaming`)."""

    #: Marks a handler whose answer is a stream (the local runner's workers ask).
    streams = True

    def __init__(self, handler: Handler) -> None:
        self.handler = handler

    def __call__(self, event: dict[str, Any], context: Any) -> Streamed:
        """The head, then each piece of the body as the route writes it.

        A route that does not open the channel answers the handler's whole result: its
        status, headers and body as one piece.
        """
        live = Channel()
        result: dict[str, Any] = {}

        def run() -> None:
            _current.set(live)
            try:
                result.update(self.handler(event, context))
            finally:
                live._end()

        thread = threading.Thread(
            target=contextvars.copy_context().run, args=(run,), name="turnledger-stream"
        )
        thread.start()
        ended = False
        try:
            yield from live._drain()  # the head first: open() queues it before any piece
            ended = True
            if live.head is None:
                yield from _whole(result)
        finally:
            if not ended:
                # The environment serves its next event only once this one is over
                # (Lambda's too): a client gone mid-answer still waits out the turn here.
                for _ in live._drain():
                    pass
            thread.join()


def streaming(handler: Handler) -> StreamingHandler:
    """The streaming form of the API's ``handler`` (the streaming function's entry point)."""
    return StreamingHandler(handler)


def _whole(result: Mapping[str, Any]) -> Iterator[Head | bytes]:
    """An API Gateway answer (payload 2.0) as a streamed one: its head, then its body."""
    headers = {str(k): str(v) for k, v in (result.get("headers") or {}).items()}
    cookies = result.get("cookies") or []
    if cookies:
        headers["set-cookie"] = ", ".join(str(c) for c in cookies)
    yield Head(int(result.get("statusCode") or 500), headers)
    body = result.get("body") or ""
    raw = base64.b64decode(body) if result.get("isBase64Encoded") else str(body).encode()
    if raw:
        yield raw


def wants_stream(method: str, path: str, headers: Mapping[str, str], body: bytes) -> bool:
    """Whether a request is one the streaming function answers: ``POST`` of a turn with
    ``Accept: text/event-stream`` (not ``Prefer: respond-async``), or of a face response
    with ``"stream": true``. ``headers``' names are lower case."""
    if method.upper() != "POST":
        return False
    if _TURN_PATH.fullmatch(path):
        prefer = headers.get("prefer") or ""
        return EVENT_STREAM in (headers.get("accept") or "") and "respond-async" not in prefer
    if path == _RESPONSES_PATH:
        try:
            parsed = json.loads(body or b"{}")
        except ValueError:
            return False  # the route answers the bad body, buffered
        return isinstance(parsed, dict) and parsed.get("stream") is True
    return False
