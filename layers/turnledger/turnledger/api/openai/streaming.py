"""``stream: true`` on ``POST /openai/v1/responses``: the response as the Responses API's
server-sent events, in the order the ``openai`` SDK (and the Agents SDK) parse them.

``response.created`` and ``response.in_progress``; per output item
``response.output_item.added``, its content (a message's ``response.content_part.added``,
``response.output_text.delta`` per piece, ``response.output_text.done``,
``response.content_part.done``; a function call's
``response.function_call_arguments.delta`` and ``.done``; an MCP call's or listing's
``response.mcp_call.*`` or ``response.mcp_list_tools.*``) and
``response.output_item.done``; then ``response.completed``. Each event carries its
``sequence_number`` (from 0). The events are written once the turn is committed, so the
final one never announces what the ledger does not hold.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable
from typing import Any

from aws_lambda_powertools.event_handler import Response

__all__ = ["EVENT_STREAM", "ResponseEvents", "event_stream", "events_of", "sse_text"]

EVENT_STREAM = "text/event-stream"
#: OpenAI's status of a response or an item whose events are still coming: a word of
#: OpenAI's shapes, not a status of the ledger's (those are the lifecycle's).
STREAMING = "in_progress"


class ResponseEvents:
    """The streaming events of one response, made as it is written: :meth:`start` (its
    ``response.created`` and ``response.in_progress``), :meth:`text` per delta of its
    message's text (the message item and its part are added before the first), then
    :meth:`finish` with the whole response. Each event is handed to ``emit`` as it is made."""

    def __init__(self, emit: Callable[[dict[str, Any]], None]) -> None:
        self._emit = emit
        self._count = 0
        #: The deltas sent as the message's text (``None``: no message begun yet).
        self.sent: list[str] | None = None
        self._message: dict[str, Any] | None = None

    def event(self, kind: str, **fields: Any) -> None:
        """Emit one event of type ``kind``, numbered in order."""
        self._emit({"type": kind, "sequence_number": self._count, **fields})
        self._count += 1

    def start(self, body: dict[str, Any]) -> None:
        """The response begins (``body``: the response as it will be; its output is not sent)."""
        started = {**copy.deepcopy(body), "status": STREAMING, "output": [], "usage": None}
        self.event("response.created", response=started)
        self.event("response.in_progress", response=started)

    def begin_message(self, item_id: str) -> None:
        """The message item ``item_id`` and its text part begin (output 0, part 0)."""
        if self.sent is not None:
            return
        self.sent = []
        self._message = {"item_id": item_id, "output_index": 0, "content_index": 0}
        item = {"type": "message", "id": item_id, "role": "assistant"}
        self.event(
            "response.output_item.added",
            output_index=0,
            item={**item, "status": STREAMING, "content": []},
        )
        part = {"type": "output_text", "text": "", "annotations": []}
        self.event("response.content_part.added", **self._message, part=part)

    def text(self, item_id: str, delta: str) -> None:
        """A delta of the message's text."""
        self.begin_message(item_id)
        assert self._message is not None and self.sent is not None
        self.sent.append(delta)
        self.event("response.output_text.delta", **self._message, delta=delta, logprobs=[])

    def finish(self, body: dict[str, Any]) -> None:
        """The rest of the response's events, from its whole ``body``: each output item's
        content and end (a message whose text was sent ends with the text it holds; text
        the deltas do not add up to comes as one more delta), then ``response.completed``."""
        for index, item in enumerate(body["output"]):
            kind = item["type"]
            if kind == "message":
                self._finish_message(index, item)
            elif kind == "function_call":
                self.event(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "arguments": "", "status": STREAMING},
                )
                where = {"item_id": item["id"], "output_index": index}
                self.event(
                    "response.function_call_arguments.delta", **where, delta=item["arguments"]
                )
                self.event(
                    "response.function_call_arguments.done",
                    **where,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            elif kind in ("mcp_call", "mcp_list_tools"):
                _mcp_events(self.event, index, item)
            else:
                self.event("response.output_item.added", output_index=index, item=item)
            self.event("response.output_item.done", output_index=index, item=item)
        self.event("response.completed", response=body)

    def _finish_message(self, index: int, item: dict[str, Any]) -> None:
        for part_index, part in enumerate(item["content"]):
            text = part.get("text", "")
            where = {"item_id": item["id"], "output_index": index, "content_index": part_index}
            # The message sent live is found by its id: MCP items may come before it.
            live = self._message is not None and item["id"] == self._message["item_id"]
            if live and part_index == 0 and self.sent is not None:
                sent = "".join(self.sent)
                if text.startswith(sent) and text != sent:
                    self.text(item["id"], text[len(sent) :])
            else:
                if index == 0 and part_index == 0:
                    self.begin_message(item["id"])
                else:
                    if part_index == 0:
                        self.event(
                            "response.output_item.added",
                            output_index=index,
                            item={**item, "status": STREAMING, "content": []},
                        )
                    self.event("response.content_part.added", **where, part={**part, "text": ""})
                self.event("response.output_text.delta", **where, delta=text, logprobs=[])
            self.event("response.output_text.done", **where, text=text, logprobs=[])
            self.event("response.content_part.done", **where, part=part)


def events_of(body: dict[str, Any], pieces: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """The streaming events of the ``response`` ``body``; ``pieces`` are the deltas of its
    (first) message's text: the turn's draft chunks. Text they do not add up to (none, or
    another message's) is one delta."""
    events: list[dict[str, Any]] = []
    made = ResponseEvents(events.append)
    made.start(body)
    output = body["output"]
    given = list(pieces) if pieces is not None else None
    if output and output[0]["type"] == "message" and given:
        text = output[0]["content"][0].get("text", "") if output[0]["content"] else ""
        if "".join(given) == text:
            for piece in given:
                made.text(output[0]["id"], piece)
    made.finish(body)
    return events


def sse_text(events: Iterable[dict[str, Any]]) -> str:
    """Events as server-sent events: ``event: <type>`` and its JSON ``data``."""
    return "".join(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n" for event in events)


def event_stream(body: dict[str, Any], pieces: Iterable[str] | None = None) -> Response[str]:
    """The ``text/event-stream`` answer of a streamed response."""
    return Response(
        status_code=200,
        content_type=EVENT_STREAM,
        body=sse_text(events_of(body, pieces)),
        headers={"Cache-Control": "no-cache"},
    )


def _mcp_events(emit: Callable[..., None], index: int, item: dict[str, Any]) -> None:
    """The events of an ``mcp_call`` or ``mcp_list_tools`` item, up to its ``done``."""
    where = {"item_id": item["id"], "output_index": index}
    if item["type"] == "mcp_list_tools":
        emit("response.output_item.added", output_index=index, item={**item, "tools": []})
        emit("response.mcp_list_tools.in_progress", **where)
        emit("response.mcp_list_tools.completed", **where)
        return
    emit(
        "response.output_item.added",
        output_index=index,
        item={**item, "arguments": "", "output": None, "error": None, "status": STREAMING},
    )
    emit("response.mcp_call.in_progress", **where)
    emit("response.mcp_call_arguments.delta", **where, delta=item["arguments"])
    emit("response.mcp_call_arguments.done", **where, arguments=item["arguments"])
    emit(f"response.mcp_call.{'failed' if item['status'] == 'failed' else 'completed'}", **where)
