"""``stream: true`` on ``POST /openai/v1/responses``: the response as the Responses API's
server-sent events, in the order the ``openai`` SDK (and the Agents SDK) parse them.

``response.created`` and ``response.in_progress``; per output item
``response.output_item.added``, its content (a message's ``response.content_part.added``,
``response.output_text.delta`` per piece, ``response.output_text.done``,
``response.content_part.done``; a function call's
``response.function_call_arguments.delta`` and ``.done``) and
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

__all__ = ["EVENT_STREAM", "event_stream", "events_of", "sse_text"]

EVENT_STREAM = "text/event-stream"
#: OpenAI's status of a response or an item whose events are still coming: a word of
#: OpenAI's shapes, not a status of the ledger's (those are the lifecycle's).
STREAMING = "in_progress"


def events_of(body: dict[str, Any], pieces: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """The streaming events of the ``response`` ``body``; ``pieces`` are the deltas of its
    (first) message's text: the turn's draft chunks. Text they do not add up to (none, or
    another message's) is one delta."""
    events: list[dict[str, Any]] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append({"type": kind, "sequence_number": len(events), **fields})

    started = {**copy.deepcopy(body), "status": STREAMING, "output": [], "usage": None}
    emit("response.created", response=started)
    emit("response.in_progress", response=started)
    given = list(pieces) if pieces is not None else None
    for index, item in enumerate(body["output"]):
        kind = item["type"]
        if kind == "message":
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": STREAMING, "content": []},
            )
            for part_index, part in enumerate(item["content"]):
                text = part.get("text", "")
                where = {"item_id": item["id"], "output_index": index, "content_index": part_index}
                emit("response.content_part.added", **where, part={**part, "text": ""})
                deltas = given if given is not None and "".join(given) == text else [text]
                given = None
                for delta in deltas:
                    emit("response.output_text.delta", **where, delta=delta, logprobs=[])
                emit("response.output_text.done", **where, text=text, logprobs=[])
                emit("response.content_part.done", **where, part=part)
        elif kind == "function_call":
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "arguments": "", "status": STREAMING},
            )
            where = {"item_id": item["id"], "output_index": index}
            emit("response.function_call_arguments.delta", **where, delta=item["arguments"])
            emit(
                "response.function_call_arguments.done",
                **where,
                name=item["name"],
                arguments=item["arguments"],
            )
        elif kind in ("mcp_call", "mcp_list_tools"):
            _mcp_events(emit, index, item)
        else:
            emit("response.output_item.added", output_index=index, item=item)
        emit("response.output_item.done", output_index=index, item=item)
    emit("response.completed", response=body)
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
