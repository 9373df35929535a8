"""A fake OpenAI-compatible server on 127.0.0.1, for tests that speak real HTTP.

It records every request and answers ``POST /v1/chat/completions`` and
``POST /v1/responses`` with scripted replies, first in first out; when the
script is empty it answers ``default`` (a reply, or a function of the
request), and without one a ``418`` that names the problem (not retried, so a
test fails fast and clearly)::

    with FakeOpenAI() as fake:
        fake.script(error_reply(429, "slow down", headers={"Retry-After": "1"}),
                    text_reply("Hello!"))
        provider = OpenAIChatProvider(base_url=fake.base_url, ...)
        ...
        assert len(fake.requests) == 2

A reply with a ``delay`` waits that long before answering, or until the server
is closed, whichever comes first: a timeout test never waits for it to end.

``/v1/responses`` keeps state the way OpenAI does: a successful answer gets a
fresh id ``resp_fake_N`` (whatever id the scripted body had); with ``"store":
true`` the fake keeps the response's whole context (the items it was given,
after the stored ones of its ``previous_response_id``, plus its output items),
and a request naming a ``previous_response_id`` it does not keep is answered
as OpenAI answers it (``400 previous_response_not_found``), before any
scripted reply is used. :attr:`FakeOpenAI.contexts` holds, per request, the
context the model saw; :meth:`FakeOpenAI.lose_responses` drops the stored
state. ``DELETE /v1/responses/{id}`` deletes a kept response (``404`` when
unknown), unless :meth:`FakeOpenAI.script_deletes` queued other answers.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, ClassVar, Self

#: The path the OpenAI client posts to when its base URL is ``FakeOpenAI.base_url``.
CHAT_PATH = "/v1/chat/completions"
#: The Responses API's path, under the same base URL.
RESPONSES_PATH = "/v1/responses"


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


def previous_response_not_found(response_id: str) -> Scripted:
    """OpenAI's answer to a ``previous_response_id`` it does not keep (verbatim shape)."""
    body = {
        "error": {
            "message": f"Previous response with id '{response_id}' not found.",
            "type": "invalid_request_error",
            "param": "previous_response_id",
            "code": "previous_response_not_found",
        }
    }
    return json_reply(body, status=400)


def response_body(
    text: str | None = None,
    calls: list[dict[str, Any]] | None = None,
    *,
    model: str = "fake-model",
    input_tokens: int = 0,
    output_tokens: int = 0,
    status: str = "completed",
) -> dict[str, Any]:
    """A Responses API response body, shaped like OpenAI's (the fake sets its ``id``)."""
    output: list[dict[str, Any]] = []
    if text is not None:
        output.append(
            {
                "type": "message",
                "id": "msg_fake",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    output.extend(calls or [])
    return {
        "id": "resp_unset",
        "object": "response",
        "created_at": 1_700_000_000,
        "status": status,
        "model": model,
        "output": output,
        "usage": {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        },
        "error": None,
    }


def function_call_item(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """One ``function_call`` output item; ``arguments`` is the JSON *text*."""
    return {
        "type": "function_call",
        "id": f"fc_{call_id}",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }


def response_reply(text: str | None = None, *calls: dict[str, Any], **kwargs: Any) -> Scripted:
    """A Responses API answer: ``text`` and/or ``calls`` (built with :func:`function_call_item`)."""
    return json_reply(response_body(text, list(calls), **kwargs))


def raw_reply(
    body: bytes | str, status: int = 200, content_type: str = "application/json"
) -> Scripted:
    """Answer ``body`` as it is (broken JSON, HTML error pages)."""
    data = body.encode() if isinstance(body, str) else body
    return Scripted(status=status, body=data, content_type=content_type)


def delayed(reply: Scripted, seconds: float) -> Scripted:
    """``reply``, sent after ``seconds`` (or when the server closes, if sooner)."""
    return Scripted(reply.status, reply.body, reply.headers, reply.content_type, seconds)


def _wants_stream(request: RecordedRequest) -> bool:
    try:
        body = request.json()
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("stream") is True


def _sse(events: list[tuple[str | None, Any]]) -> bytes:
    lines: list[str] = []
    for event, data in events:
        if event is not None:
            lines.append(f"event: {event}")
        lines += [f"data: {data if isinstance(data, str) else json.dumps(data)}", ""]
    return ("\n".join(lines) + "\n").encode()


def _pieces(text: str) -> list[str]:
    """``text`` in word-sized deltas that join to exactly it."""
    words = text.split(" ")
    return [word if i == 0 else " " + word for i, word in enumerate(words)]


def streamed(reply: Scripted, *, responses: bool) -> Scripted:
    """A JSON answer as OpenAI streams it (``stream: true``); SSE answers stay as they are.

    Chat Completions: ``chat.completion.chunk`` events (text word by word, each tool
    call's name then its arguments in two pieces), the usage in a last chunk, ``[DONE]``.
    Responses: ``response.created``, ``response.output_text.delta`` per word, then
    ``response.completed`` with the whole response (``response.failed`` for a failed one).
    """
    if reply.content_type != "application/json":
        return reply
    body = json.loads(reply.body)
    events: list[tuple[str | None, Any]] = []
    if responses:
        events.append(("response.created", {"type": "response.created", "response": body}))
        for item in body.get("output", []):
            for part in item.get("content") or []:
                if part.get("type") == "output_text":
                    for piece in _pieces(part.get("text") or ""):
                        delta = {"type": "response.output_text.delta", "delta": piece}
                        events.append(("response.output_text.delta", delta))
        done = "response.failed" if body.get("status") == "failed" else "response.completed"
        events.append((done, {"type": done, "response": body}))
    else:
        message = body["choices"][0]["message"]
        base = {"id": body.get("id"), "object": "chat.completion.chunk", "model": body["model"]}

        def chunk(delta: dict[str, Any]) -> dict[str, Any]:
            return {**base, "choices": [{"index": 0, "delta": delta}]}

        events.append((None, chunk({"role": "assistant", "content": ""})))
        for piece in _pieces(message.get("content") or "") if message.get("content") else []:
            events.append((None, chunk({"content": piece})))
        for index, call in enumerate(message.get("tool_calls") or []):
            arguments = call["function"]["arguments"]
            half = len(arguments) // 2
            head = {"index": index, "id": call["id"], "type": "function"}
            events.append(
                (
                    None,
                    chunk(
                        {
                            "tool_calls": [
                                {
                                    **head,
                                    "function": {
                                        "name": call["function"]["name"],
                                        "arguments": arguments[:half],
                                    },
                                }
                            ]
                        }
                    ),
                )
            )
            events.append(
                (
                    None,
                    chunk(
                        {
                            "tool_calls": [
                                {"index": index, "function": {"arguments": arguments[half:]}}
                            ]
                        }
                    ),
                )
            )
        events.append((None, {**base, "choices": [], "usage": body.get("usage")}))
        events.append((None, "[DONE]"))
    return Scripted(reply.status, _sse(events), reply.headers, "text/event-stream")


def broken_stream(*texts: str) -> Scripted:
    """A chat stream that sends ``texts`` as deltas and then ends without ``[DONE]``."""
    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": "fake-model"}
    events: list[tuple[str | None, Any]] = [
        (None, {**base, "choices": [{"index": 0, "delta": {"content": text}}]}) for text in texts
    ]
    return Scripted(200, _sse(events), {}, "text/event-stream")


#: Answer nothing until the server closes: every client attempt times out.
HANG = delayed(error_reply(503, "the fake server was closed while hanging"), 60.0)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, fake: ScriptedFake, handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.fake = fake


class RecordingHandler(BaseHTTPRequestHandler):
    """Records each ``POST`` and sends what the fake answers it."""

    server: _Server

    def do_POST(self) -> None:
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


class _Handler(RecordingHandler):
    def do_GET(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()


class ScriptedFake:
    """A scripted HTTP server on ``127.0.0.1`` (a free port), serving from a thread until
    closed: it records every request and answers what :meth:`_answer` returns, from the
    queued script first, then ``default``. Each fake service is one subclass."""

    #: How the server reads requests (a subclass adds methods or HTTP/1.1).
    handler: ClassVar[type[BaseHTTPRequestHandler]] = RecordingHandler

    def __init__(self, default: Responder | None = None) -> None:
        self.default = default
        self._script: deque[Responder] = deque()
        self._requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._server = _Server(self, self.handler)
        # A short poll interval keeps close() (and so each test's teardown) quick.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()

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

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _answer(self, request: RecordedRequest) -> Scripted:
        """Record ``request`` and choose its answer (called from the server's threads)."""
        raise NotImplementedError


class FakeOpenAI(ScriptedFake):
    """A scripted OpenAI-compatible HTTP server on ``127.0.0.1`` (a free port)."""

    handler = _Handler

    def __init__(self, default: Responder | None = None) -> None:
        self._delete_script: deque[Responder] = deque()
        #: Stored responses: id -> the whole context the response holds (input and output items).
        self.stored: dict[str, list[dict[str, Any]]] = {}
        self._contexts: list[list[dict[str, Any]]] = []
        self._next_id = 0
        super().__init__(default)

    @property
    def base_url(self) -> str:
        """The API root to give a client, ending in ``/v1``."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    @property
    def contexts(self) -> list[list[dict[str, Any]]]:
        """Per ``/responses`` request that reached the model: the whole context it saw."""
        with self._lock:
            return [list(context) for context in self._contexts]

    def lose_responses(self) -> None:
        """Forget every stored response (as if they expired)."""
        with self._lock:
            self.stored.clear()

    def script_deletes(self, *replies: Responder) -> None:
        """Queue answers to ``DELETE /v1/responses/{id}``, used before the built-in behaviour."""
        with self._lock:
            self._delete_script.extend(replies)

    def _answer(self, request: RecordedRequest) -> Scripted:
        with self._lock:
            self._requests.append(request)
            route = (request.method, request.path)
            context: list[dict[str, Any]] = []
            if request.method == "DELETE" and request.path.startswith(RESPONSES_PATH + "/"):
                return self._delete(request.path.removeprefix(RESPONSES_PATH + "/"))
            if route == ("POST", RESPONSES_PATH):
                seen = self._context_of(request)
                if isinstance(seen, Scripted):
                    return seen
                context = seen
            elif route != ("POST", CHAT_PATH):
                return error_reply(
                    404, f"FakeOpenAI serves only POST {CHAT_PATH} and {RESPONSES_PATH}"
                )
            responder = self._script.popleft() if self._script else self.default
        if responder is None:
            return error_reply(418, "FakeOpenAI has no scripted reply left for this request")
        reply = responder(request) if callable(responder) else responder
        if reply.delay:
            self._closed.wait(reply.delay)
        if route == ("POST", RESPONSES_PATH) and 200 <= reply.status < 300:
            reply = self._keep(request, reply, context)
        if _wants_stream(request) and 200 <= reply.status < 300:
            return streamed(reply, responses=route == ("POST", RESPONSES_PATH))
        return reply

    def _context_of(self, request: RecordedRequest) -> list[dict[str, Any]] | Scripted:
        """The context a ``/responses`` request gives the model, or the error it gets."""
        body = request.json()
        items = body.get("input", [])
        if isinstance(items, str):
            items = [{"type": "message", "role": "user", "content": items}]
        previous = body.get("previous_response_id")
        context: list[dict[str, Any]] = []
        if previous is not None:
            if previous not in self.stored:
                return previous_response_not_found(previous)
            context = list(self.stored[previous])
        context.extend(items)
        self._contexts.append(context)
        return context

    def _keep(
        self, request: RecordedRequest, reply: Scripted, context: list[dict[str, Any]]
    ) -> Scripted:
        """Give a successful ``/responses`` answer its id, and keep it when asked to.

        A body that is no JSON object (a test of broken answers) is sent as it is.
        """
        try:
            body = json.loads(reply.body)
        except ValueError:
            return reply
        if not isinstance(body, dict):
            return reply
        with self._lock:
            self._next_id += 1
            body["id"] = f"resp_fake_{self._next_id}"
            if request.json().get("store", True):
                self.stored[body["id"]] = [*context, *body.get("output", [])]
        return Scripted(reply.status, json.dumps(body).encode(), reply.headers, reply.content_type)

    def _delete(self, response_id: str) -> Scripted:
        if self._delete_script:
            responder = self._delete_script.popleft()
            return responder(self._requests[-1]) if callable(responder) else responder
        if self.stored.pop(response_id, None) is None:
            body = {
                "error": {
                    "message": f"Response with id '{response_id}' not found.",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": None,
                }
            }
            return json_reply(body, status=404)
        return json_reply({"id": response_id, "object": "response", "deleted": True})
