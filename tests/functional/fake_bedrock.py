"""A fake Amazon Bedrock runtime on 127.0.0.1: boto3 pointed at it with ``endpoint_url``.

It speaks Converse's REST-JSON protocol (``POST /model/{modelId}/converse``),
records every request, and answers scripted replies first in first out, then
``default`` (a reply or a function of the request), then a ``418``. Errors are
sent as Bedrock sends them (the ``x-amzn-ErrorType`` header and a ``message``),
so botocore raises the same ``ClientError`` it raises for the real service::

    with FakeBedrock() as fake:
        fake.script(bedrock_error(429, "ThrottlingException", "slow down"),
                    converse_reply("Hello!"))
        provider = BedrockConverseProvider(endpoint_url=fake.url, region="us-east-1")
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from tests.functional.fake_openai import (
    RecordedRequest,
    RecordingHandler,
    Scripted,
    ScriptedFake,
    json_reply,
)

Responder = Scripted | Callable[[RecordedRequest], Scripted]


def model_id(request: RecordedRequest) -> str:
    """The model id of a ``/model/{id}/converse`` (or ``/converse-stream``) request."""
    path = request.path.removeprefix("/model/").removesuffix("/converse-stream")
    return unquote(path.removesuffix("/converse"))


#: ``ConverseStream``'s path suffix; its answer is an AWS event stream.
STREAM_SUFFIX = "/converse-stream"
EVENT_STREAM = "application/vnd.amazon.eventstream"


def _header(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    return (
        struct.pack("B", len(raw_name))
        + raw_name
        + struct.pack("!BH", 7, len(raw_value))  # 7: a string value
        + raw_value
    )


def event_message(event_type: str, payload: dict[str, Any], *, exception: bool = False) -> bytes:
    """One message of the AWS event stream encoding (what botocore decodes)."""
    kind = "exception" if exception else "event"
    headers = (
        _header(":event-type" if not exception else ":exception-type", event_type)
        + _header(":content-type", "application/json")
        + _header(":message-type", kind)
    )
    body = json.dumps(payload).encode()
    total = 12 + len(headers) + len(body) + 4
    prelude = struct.pack("!II", total, len(headers))
    prelude += struct.pack("!I", zlib.crc32(prelude))
    message = prelude + headers + body
    return message + struct.pack("!I", zlib.crc32(message))


def stream_events(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The ``ConverseStream`` events a ``converse`` answer is streamed as: text word by
    word, each tool's input JSON in two pieces, then the stop reason and the usage."""
    events: list[tuple[str, dict[str, Any]]] = [("messageStart", {"role": "assistant"})]
    for index, block in enumerate(body["output"]["message"]["content"]):
        if "text" in block:
            words = block["text"].split(" ")
            for i, word in enumerate(words):
                delta = {"text": word if i == 0 else " " + word}
                events.append(("contentBlockDelta", {"contentBlockIndex": index, "delta": delta}))
        else:
            use = block["toolUse"]
            start = {"toolUse": {"toolUseId": use["toolUseId"], "name": use["name"]}}
            events.append(("contentBlockStart", {"contentBlockIndex": index, "start": start}))
            raw = json.dumps(use["input"])
            for piece in (raw[: len(raw) // 2], raw[len(raw) // 2 :]):
                delta = {"toolUse": {"input": piece}}
                events.append(("contentBlockDelta", {"contentBlockIndex": index, "delta": delta}))
        events.append(("contentBlockStop", {"contentBlockIndex": index}))
    events.append(("messageStop", {"stopReason": body["stopReason"]}))
    events.append(("metadata", {"usage": body["usage"], "metrics": {"latencyMs": 1}}))
    return events


def streamed(reply: Scripted) -> Scripted:
    """A JSON ``converse`` answer as ``ConverseStream`` sends it; others stay as they are."""
    if reply.content_type != "application/json" or not 200 <= reply.status < 300:
        return reply
    messages = b"".join(
        event_message(kind, payload) for kind, payload in stream_events(json.loads(reply.body))
    )
    return Scripted(reply.status, messages, reply.headers, EVENT_STREAM)


def failing_stream(text: str, code: str = "internalServerException") -> Scripted:
    """A stream that writes ``text`` and then sends an exception event, as Bedrock does
    when the model fails mid-answer."""
    messages = event_message("messageStart", {"role": "assistant"}) + event_message(
        "contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": text}}
    )
    messages += event_message(code, {"message": "the model failed mid-answer"}, exception=True)
    return Scripted(200, messages, {}, EVENT_STREAM)


def converse_body(
    text: str | None = None,
    tool_uses: list[dict[str, Any]] | None = None,
    *,
    input_tokens: int = 0,
    output_tokens: int = 0,
    stop_reason: str | None = None,
) -> dict[str, Any]:
    """A Converse response body, shaped like Bedrock's."""
    content: list[dict[str, Any]] = []
    if text is not None:
        content.append({"text": text})
    content.extend({"toolUse": use} for use in tool_uses or [])
    return {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": stop_reason or ("tool_use" if tool_uses else "end_turn"),
        "usage": {
            "inputTokens": input_tokens,
            "outputTokens": output_tokens,
            "totalTokens": input_tokens + output_tokens,
        },
        "metrics": {"latencyMs": 1},
    }


def tool_use(tool_use_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """One ``toolUse`` block of a reply; ``arguments`` is the JSON *value*, as Bedrock sends it."""
    return {"toolUseId": tool_use_id, "name": name, "input": arguments}


def converse_reply(text: str | None = None, *tool_uses: dict[str, Any], **kwargs: Any) -> Scripted:
    """A Converse answer: ``text`` and/or ``tool_uses`` (built with :func:`tool_use`)."""
    return json_reply(converse_body(text, list(tool_uses), **kwargs))


def bedrock_error(status: int, code: str, message: str) -> Scripted:
    """An error as Bedrock sends it: ``x-amzn-ErrorType`` names the exception."""
    return Scripted(
        status=status,
        body=json.dumps({"message": message}).encode(),
        headers={
            "x-amzn-ErrorType": f"{code}:http://internal.amazon.com/coral/com.amazon.bedrock/"
        },
    )


class _Handler(RecordingHandler):
    protocol_version = "HTTP/1.1"


class FakeBedrock(ScriptedFake):
    """A scripted Bedrock runtime endpoint on ``127.0.0.1`` (a free port)."""

    handler = _Handler

    @property
    def url(self) -> str:
        """The endpoint URL to give boto3."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def _answer(self, request: RecordedRequest) -> Scripted:
        with self._lock:
            self._requests.append(request)
            known = request.path.endswith("/converse") or request.path.endswith(STREAM_SUFFIX)
            if not (request.path.startswith("/model/") and known):
                return bedrock_error(
                    404, "UnknownOperationException", "FakeBedrock serves Converse"
                )
            responder = self._script.popleft() if self._script else self.default
        if responder is None:
            return bedrock_error(418, "FakeException", "FakeBedrock has no scripted reply left")
        reply = responder(request) if callable(responder) else responder
        if reply.delay:
            self._closed.wait(reply.delay)
        if request.path.endswith(STREAM_SUFFIX):
            return streamed(reply)
        return reply
