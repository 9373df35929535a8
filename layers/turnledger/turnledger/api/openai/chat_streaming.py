"""``stream: true`` on ``POST /openai/v1/chat/completions``: an answer as
``chat.completion.chunk`` server-sent events, ending with ``data: [DONE]``, in the order
the ``openai`` SDK, LangChain and the Vercel AI SDK read them.

The encoder (:func:`chunks`) is a function over a sequence of deltas (:data:`Delta`): the
route feeds it the deltas of a finished answer (:func:`deltas_of`: the turn's draft chunks,
then its calls, then how it finished); a live stream feeds it the same deltas as they are
written. The first chunk gives the role; each text delta is one chunk; each call is one
chunk (its id, name and whole arguments); the finish is a chunk with ``finish_reason`` and
an empty delta; with ``stream_options.include_usage`` every chunk carries ``usage: null``
and one last chunk with no choice carries the usage.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from aws_lambda_powertools.event_handler import Response

from .streaming import EVENT_STREAM

__all__ = ["CallDelta", "Delta", "Finish", "TextDelta", "chunks", "deltas_of", "event_stream"]


@dataclass(frozen=True)
class TextDelta:
    """A piece of the answer's text."""

    text: str


@dataclass(frozen=True)
class CallDelta:
    """A tool call the client is to run (the ``index``-th of the answer)."""

    index: int
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Finish:
    """How the answer ended, and its usage (``usage`` in the chat completion's shape)."""

    reason: str
    usage: dict[str, Any]


Delta = TextDelta | CallDelta | Finish


def deltas_of(
    text: str | None, calls: list[dict[str, Any]], finish: Finish, pieces: Iterable[str] | None
) -> Iterator[Delta]:
    """The deltas of a finished answer: ``pieces`` (the draft's chunks) when they add up to
    ``text``, else ``text`` as one; then each call of ``calls`` (``tool_calls`` entries of a
    chat completion's message); then ``finish``."""
    given = list(pieces) if pieces is not None else []
    if text:
        yield from map(TextDelta, given if "".join(given) == text else [text])
    for index, call in enumerate(calls):
        function = call["function"]
        yield CallDelta(index, call["id"], function["name"], function["arguments"])
    yield finish


def chunks(head: dict[str, Any], deltas: Iterable[Delta], *, include_usage: bool) -> Iterator[str]:
    """The server-sent events of ``deltas``: ``head`` (``id``, ``created``, ``model``) is in
    every chunk; the last event is ``data: [DONE]``."""

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
        body = {**head, "object": "chat.completion.chunk", "choices": [choice]}
        if include_usage:
            body["usage"] = None
        return _event(body)

    yield chunk({"role": "assistant", "content": "", "refusal": None})
    for delta in deltas:
        if isinstance(delta, TextDelta):
            yield chunk({"content": delta.text})
        elif isinstance(delta, CallDelta):
            call = {
                "index": delta.index,
                "id": delta.id,
                "type": "function",
                "function": {"name": delta.name, "arguments": delta.arguments},
            }
            yield chunk({"tool_calls": [call]})
        else:
            yield chunk({}, delta.reason)
            if include_usage:
                yield _event(
                    {**head, "object": "chat.completion.chunk", "choices": [], "usage": delta.usage}
                )
    yield "data: [DONE]\n\n"


def _event(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def event_stream(events: Iterable[str]) -> Response[str]:
    """The ``text/event-stream`` answer of a streamed chat completion."""
    return Response(
        status_code=200,
        content_type=EVENT_STREAM,
        body="".join(events),
        headers={"Cache-Control": "no-cache"},
    )
