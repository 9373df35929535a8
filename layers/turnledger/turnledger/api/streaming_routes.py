"""The reads of long turns: ``GET .../turns/{n}`` and ``GET .../turns/{n}/stream``.

Registered on the API's resolver when :mod:`.app` loads (as every route module is).
"""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler import Response, content_types
from aws_lambda_powertools.event_handler.openapi.params import Path, Query

from ..core.exceptions import RequestValidationFailed
from ..runtime import get_runtime
from ..turn.longturns import MAX_WAIT_SECONDS
from .resolver import ConversationId, app, conversation, json_response, responses
from .streaming import StreamPage, TurnProgress, sse_text, stream_page, turn_view

EVENT_STREAM = "text/event-stream"
TurnNumber = Annotated[int, Path(ge=1, description="The turn's number (1, 2, ...)")]


@app.get(
    "/v1/conversations/<conversation_id>/turns/<turn>",
    responses=responses(TurnProgress, 400, 401, 404, 409, 422, 502, 503, 504),
)
def get_turn(conversation_id: ConversationId, turn: TurnNumber) -> Response[str]:
    """A long turn's progress (``in_progress`` and the draft so far) or its final response.

    A turn that failed or was cancelled answers the error its synchronous request would
    have, with ``details.draft_text`` (what was written before it stopped).
    """
    _, key = conversation(conversation_id)
    service = get_runtime().conversations_for(key.tenant)
    status, body = turn_view(service, key, turn)
    return json_response(status, body)


@app.get(
    "/v1/conversations/<conversation_id>/turns/<turn>/stream",
    responses={
        **responses(StreamPage, 400, 401, 404, 409, 422, 503),
    },
)
def get_turn_stream(
    conversation_id: ConversationId,
    turn: TurnNumber,
    after: Annotated[int, Query(ge=0, description="Return chunks with seq > after.")] = 0,
    wait: Annotated[
        float,
        Query(ge=0, le=MAX_WAIT_SECONDS, description="Seconds to wait when nothing is new."),
    ] = 0,
) -> Response[str]:
    """The draft's chunks after ``after``, long-polling up to ``wait`` seconds.

    With ``Accept: text/event-stream``: server-sent events (``id`` = the chunk's seq,
    resumed from ``Last-Event-ID``), up to the end of the turn or ``wait`` seconds.
    """
    _, key = conversation(conversation_id)
    service = get_runtime().conversations_for(key.tenant)
    headers = app.current_event.headers
    sse = EVENT_STREAM in (headers.get("accept") or "")
    last_event_id = headers.get("last-event-id")
    if last_event_id:
        if not last_event_id.isdigit():
            raise RequestValidationFailed(
                "Last-Event-ID must be a chunk's seq (a whole number)",
                details={"errors": [{"loc": ["header", "last-event-id"], "msg": "not a seq"}]},
            )
        after = max(after, int(last_event_id))
    page = stream_page(service, key, turn, after=after, wait=wait, gather=sse)
    if sse:
        return Response(
            status_code=200,
            content_type=EVENT_STREAM,
            body=sse_text(page),
            headers={"Cache-Control": "no-cache"},
        )
    return Response(
        status_code=200,
        content_type=content_types.APPLICATION_JSON,
        body=page.model_dump_json(),
    )
