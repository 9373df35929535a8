"""A fake OpenAI-compatible server on 127.0.0.1, for tests that speak real HTTP.

It records every request and answers ``POST /v1/chat/completions`` with
scripted replies, first in first out; when the script is empty it answers
``default`` (a reply, or a function of the request), and without one a
``418`` that names the problem (not retried, so a test fails fast and clearly)::

    with FakeOpenAI() as fake:
        fake.script(error_reply(429, "slow down", headers={"Retry-After": "1"}),
                    text_reply("Hello!"))
        provider = OpenAIChatProvider(base_url=fake.base_url, ...)
        ...
        assert len(fake.requests) == 2

A reply with a ``delay`` waits that long before answering, or until the server
is closed, whichever comes first: a timeout test never waits for it to end.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

#: The path the OpenAI client posts to when its base URL is ``FakeOpenAI.base_url``.
CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class RecordedRequest:
    """One request the fake received; header names are lower case."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)


@dataclass(frozen=True)
class Scripted:
    """One answer of the fake: status, headers, body, and how long to wait first."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json"
    delay: float = 0.0


Responder = Scripted | Callable[[RecordedRequest], Scripted]


def completion(
    text: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    *,
    model: str = "fake-model",
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
) -> dict[str, Any]:
    """A Chat Completions response body, shaped like OpenAI's."""
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls" if tool_calls else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def json_reply(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Scripted:
    """Answer ``payload`` as JSON."""
    return Scripted(status=status, body=json.dumps(payload).encode(), headers=headers or {})


def text_reply(text: str, **kwargs: Any) -> Scripted:
    """A completion whose message is ``text``; ``kwargs`` go to :func:`completion`."""
    return json_reply(completion(text, **kwargs))


def tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """One tool call of a reply message; ``arguments`` is the JSON *text*, as OpenAI sends it."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_calls_reply(*calls: dict[str, Any], text: str | None = None, **kwargs: Any) -> Scripted:
    """A completion asking for ``calls`` (built with :func:`tool_call`)."""
    return json_reply(completion(text, list(calls), **kwargs))


def error_reply(status: int, message: str, headers: dict[str, str] | None = None) -> Scripted:
    """An error in OpenAI's shape: ``{"error": {"message", "type", "code"}}``."""
    body = {"error": {"message": message, "type": "fake_error", "param": None, "code": None}}
    return json_reply(body, status=status, headers=headers)


def raw_reply(
    body: bytes | str, status: int = 200, content_type: str = "application/json"
) -> Scripted:
    """Answer ``body`` as it is (broken JSON, HTML error pages)."""
    data = body.encode() if isinstance(body, str) else body
    return Scripted(status=status, body=data, content_type=content_type)


def delayed(reply: Scripted, seconds: float) -> Scripted:
    """``reply``, sent after ``seconds`` (or when the server closes, if sooner)."""
    return Scripted(reply.status, reply.body, reply.headers, reply.content_type, seconds)


#: Answer nothing until the server closes: every client attempt times out.
HANG = delayed(error_reply(503, "the fake server was closed while hanging"), 60.0)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, fake: FakeOpenAI) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.fake = fake


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        self._serve()

    def do_GET(self) -> None:
        self._serve()

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        request = RecordedRequest(
            method=self.command,
            path=self.path,
            headers={name.lower(): value for name, value in self.headers.items()},
            body=self.rfile.read(length),
        )
        reply = self.server.fake._answer(request)
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.body)))
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(reply.body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up first (a timeout test): nothing to answer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean


class FakeOpenAI:
    """A scripted OpenAI-compatible HTTP server on ``127.0.0.1`` (a free port)."""

    def __init__(self, default: Responder | None = None) -> None:
        self.default = default
        self._script: deque[Responder] = deque()
        self._requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._server = _Server(self)
        # A short poll interval keeps close() (and so each test's teardown) quick.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()

    @property
    def base_url(self) -> str:
        """The API root to give a client, ending in ``/v1``."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    @property
    def requests(self) -> list[RecordedRequest]:
        """The requests received so far, oldest first."""
        with self._lock:
            return list(self._requests)

    def script(self, *replies: Responder) -> None:
        """Queue ``replies``, answered one per request in this order."""
        with self._lock:
            self._script.extend(replies)

    def close(self) -> None:
        """Release any delayed reply and stop the server."""
        self._closed.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeOpenAI:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _answer(self, request: RecordedRequest) -> Scripted:
        with self._lock:
            self._requests.append(request)
            if request.method != "POST" or request.path != CHAT_PATH:
                return error_reply(404, f"FakeOpenAI serves only POST {CHAT_PATH}")
            responder = self._script.popleft() if self._script else self.default
        if responder is None:
            return error_reply(418, "FakeOpenAI has no scripted reply left for this request")
        reply = responder(request) if callable(responder) else responder
        if reply.delay:
            self._closed.wait(reply.delay)
        return reply
