"""The reads of turns: ``GET .../turns/{n}``, ``GET .../turns/{n}/stream`` and the
history page ``GET .../turns``.

Registered on the API's resolver when :mod:`.app` loads (as every route module is).
"""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler import Response, content_types
from aws_lambda_powertools.event_handler.openapi.params import Path, Query

from ..core.exceptions import RequestValidationFailed
from ..runtime import get_runtime
from ..turn.turn_reads import MAX_WAIT_SECONDS, list_turns
from .resolver import ConversationId, app, conversation, json_response, responses
from .schemas import TurnResponse, TurnsPage
from .streaming import StreamPage, TurnProgress, sse_text, stream_page, turn_view
from .views import turns_page

EVENT_STREAM = "text/event-stream"
#: ``GET .../turns``: turns per page by default, and at most.
DEFAULT_TURNS_PAGE = 20
MAX_TURNS_PAGE = 100
TurnNumber = Annotated[int, Path(ge=1, description="The turn's number (1, 2, ...)")]


@app.get(
    "/v1/conversations/<conversation_id>/turns/<turn>",
    responses=responses(TurnProgress, 400, 401, 404, 409, 422, 502, 503, 504)
    | {
        200: {
            "description": "The turn's response as the turn route answered it, or its "
            "progress while it runs",
            "content": {"application/json": {"model": TurnResponse | TurnProgress}},
        }
    },
)
def get_turn(
    conversation_id: ConversationId,
    turn: TurnNumber,
    wait: Annotated[
        float,
        Query(ge=0, le=MAX_WAIT_SECONDS, description="Seconds to wait for a running turn's end."),
    ] = 0,
) -> Response[str]:
    """Any turn: its progress while it runs (``in_progress`` and the draft so far; ``wait``
    long-polls for its end), or its final response as the turn route answered it.

    A turn whose last request failed or was cancelled answers that request's error, with
    ``details.turn`` (and ``details.draft_text``: what was written before it stopped).
    """
    from .policy_views import reader_view  # the data policy's: loaded by reads only

    _, key = conversation(conversation_id)
    service = get_runtime().reads_for(key.tenant)
    status, body = turn_view(service, key, turn, wait=wait)
    view = reader_view(key)
    return json_response(status, body if view is None else view(body))


@app.get(
    "/v1/conversations/<conversation_id>/turns",
    responses=responses(TurnsPage, 400, 401, 404, 409, 422, 503),
)
def get_turns(
    conversation_id: ConversationId,
    after: Annotated[int, Query(ge=0, description="Return turns numbered > after.")] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_TURNS_PAGE, description="At most this many.")] = (
        DEFAULT_TURNS_PAGE
    ),
) -> TurnsPage:
    """The conversation's turns, oldest first, rebuilt from the log: input, output text,
    status and reason, waits, run ids, usage, cost, times."""
    from .policy_views import reader_view  # the data policy's: loaded by reads only

    _, key = conversation(conversation_id)
    service = get_runtime().reads_for(key.tenant)
    page = turns_page(conversation_id, list_turns(service, key, after=after, limit=limit))
    view = reader_view(key)
    return page if view is None else TurnsPage.model_validate(view(page.model_dump(mode="json")))


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
    service = get_runtime().reads_for(key.tenant)
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
