"""The ``/v1`` routes of conversations (reads, forks, clear, export and import, tenant
erasure), the approval inbox (and its page, ``GET /approvals``) and the OpenAPI
document. The routes that run a turn are in :mod:`.turn_routes`.

Each route parses (Powertools validates path, query and body against the
pydantic models of :mod:`.schemas`, which also make the OpenAPI document), maps
the body to a domain command (:mod:`.views`), calls the service (or the composition
root's sweeper and transfer) with the request's one
:class:`~turnledger.core.models.ConversationKey`, and answers the result's view.
"""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler import Response, content_types
from aws_lambda_powertools.event_handler.openapi.params import Body, Query
from aws_lambda_powertools.utilities.typing import LambdaContext

from .. import __version__
from ..core.exceptions import InvalidRequest
from ..core.models import CONVERSATION_ID_PATTERN
from ..runtime import get_runtime
from ..turn.approvals import DEFAULT_LIMIT, MAX_LIMIT, list_inbox
from .resolver import (
    ConversationId,
    app,
    approver,
    caller,
    conversation,
    json_response,
    raw_body,
    responses,
)
from .schemas import (
    ConversationView,
    EventsPage,
    ExportLink,
    ForkRequest,
    ForksPage,
    InboxPageView,
    PurgeReportView,
)
from .views import conversation_view, events_page, forks_page, inbox_page, purge_report

#: The media type of an export (``turnledger.ops.transfer.NDJSON``; not imported here, so the
#: handler's cold start does not load the transfer module).
NDJSON = "application/x-ndjson"


@app.get(
    "/v1/conversations/<conversation_id>",
    responses=responses(ConversationView, 400, 401, 404, 409, 422, 503),
)
def get_conversation(conversation_id: ConversationId) -> ConversationView:
    """The conversation's head: status, timestamps, expiry, counts, pending calls."""
    _, key = conversation(conversation_id)
    return conversation_view(get_runtime().reads_for(key.tenant).get(key))


@app.post(
    "/v1/conversations/<conversation_id>/fork",
    responses=responses(ConversationView, 400, 401, 404, 409, 422, 503, status=201),
)
def fork_conversation(
    conversation_id: ConversationId, request: Annotated[ForkRequest, Body()]
) -> Response[str]:
    """Fork: a new conversation ``to`` that continues this one from the end of
    ``after_turn`` (default: the latest turn), copying nothing; ``201`` with its head."""
    _, key = conversation(conversation_id)
    service = get_runtime().conversations_for(key.tenant)
    state = service.fork(key, request.to, request.after_turn)
    return json_response(201, conversation_view(state))


@app.get(
    "/v1/conversations/<conversation_id>/forks",
    responses=responses(ForksPage, 400, 401, 404, 409, 422, 503),
)
def get_forks(
    conversation_id: ConversationId,
    after: Annotated[
        str | None,
        Query(pattern=CONVERSATION_ID_PATTERN, description="Return forks with id > after."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="At most this many forks.")] = 100,
) -> ForksPage:
    """The conversation's live forks, by id, paginated."""
    _, key = conversation(conversation_id)
    service = get_runtime().reads_for(key.tenant)
    return forks_page(service.forks(key, after=after, limit=limit))


@app.get(
    "/v1/conversations/<conversation_id>/events",
    responses=responses(EventsPage, 400, 401, 404, 409, 422, 503),
)
def get_events(
    conversation_id: ConversationId,
    after: Annotated[int, Query(ge=0, description="Return events with sequence > after.")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000, description="At most this many events.")] = 100,
) -> EventsPage:
    """The transcript: canonical events in sequence order, paginated."""
    from .policy_views import events_for_reader  # the data policy's: loaded by reads only

    _, key = conversation(conversation_id)
    service = get_runtime().reads_for(key.tenant)
    page = service.events(key, after=after, limit=limit)
    return events_for_reader(events_page(page), key, page.gen)


@app.delete(
    "/v1/conversations/<conversation_id>",
    responses=responses(None, 400, 401, 409, 422, 503, status=204),
)
def delete_conversation(conversation_id: ConversationId) -> Response[str]:
    """Clear: delete the conversation, its events and its stored artifacts.

    Answers 204, also when the conversation is absent.
    """
    _, key = conversation(conversation_id)
    get_runtime().reads_for(key.tenant).clear(key)
    return Response(status_code=204, body="")


@app.get(
    "/v1/conversations/<conversation_id>/export",
    responses={
        200: {"description": "The conversation as NDJSON", "content": {NDJSON: {}}},
        303: {
            "description": "An export larger than a response carries: fetch it from "
            "Location (a short-lived URL, no credentials)",
            "content": {"application/json": {"model": ExportLink}},
        },
        **{k: v for k, v in responses(None, 400, 401, 404, 409, 422).items() if k != 200},
    },
)
def export_conversation(conversation_id: ConversationId) -> Response[str]:
    """The whole conversation as NDJSON: its head line, then every event, payloads inline.

    Larger than ``EXPORT_INLINE_MAX_BYTES``: written to the bucket, answered ``303`` with a
    presigned ``Location`` (and the same in the body).
    """
    from ..ops.transfer import InlineExport  # see NDJSON: loaded by this route only
    from .policy_views import export_reader

    _, key = conversation(conversation_id)
    answer = get_runtime().transfer_for(key.tenant).export(key, export_reader(key))
    if isinstance(answer, InlineExport):
        return Response(status_code=200, content_type=NDJSON, body=answer.text)
    link = ExportLink(export_url=answer.url, expires_at=answer.expires_at, bytes=answer.bytes)
    return Response(
        status_code=303,
        content_type=content_types.APPLICATION_JSON,
        body=link.model_dump_json(),
        headers={"Location": answer.url},
    )


@app.post(
    "/v1/conversations/<conversation_id>/import",
    responses=responses(ConversationView, 400, 401, 409, 413, 422, status=201),
)
def import_conversation(conversation_id: ConversationId) -> Response[str]:
    """Create the conversation from an export (NDJSON), checked whole and written all or nothing.

    ``409 conversation_exists`` when the id is taken.
    """
    who, key = conversation(conversation_id)
    runtime = get_runtime()
    raw = raw_body(app.current_event.raw_event)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest("the export is not UTF-8") from exc
    runtime.transfer_for(key.tenant).import_text(key, text, who.actor)
    view = conversation_view(runtime.reads_for(key.tenant).get(key))
    return Response(
        status_code=201,
        content_type=content_types.APPLICATION_JSON,
        body=view.model_dump_json(),
    )


@app.delete("/v1/conversations", responses=responses(PurgeReportView, 401, 422, 503))
def erase_tenant() -> PurgeReportView:
    """Tenant-wide erasure: every conversation of the caller's tenant, in time-bounded pages.

    ``complete: false`` means the time budget ran out: call again to continue.
    """
    context: LambdaContext | None = app.lambda_context
    tenant, runtime = caller().tenant, get_runtime()
    # Listed on the function's own role (the by-tenant index), cleared on the tenant's.
    cleared = runtime.sweeper(context).erase(tenant, runtime.reads_for(tenant).store)
    return purge_report(cleared)


@app.get("/v1/approvals", responses=responses(InboxPageView, 400, 401, 403, 409, 422, 503))
def get_approvals(
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="At most this many calls.")] = (
        DEFAULT_LIMIT
    ),
    cursor: Annotated[
        str | None, Query(max_length=2048, description="next_cursor of the previous page.")
    ] = None,
    tool: Annotated[str | None, Query(min_length=1, max_length=256)] = None,
    conversation_id: Annotated[
        str | None, Query(pattern=CONVERSATION_ID_PATTERN, description="Only this conversation.")
    ] = None,
) -> InboxPageView:
    """The tenant's approval inbox: every call waiting for a person, oldest first (for a
    caller with the approver scope)."""
    tenant = approver().tenant
    listing = list_inbox(
        get_runtime().reads_for(tenant),
        tenant,
        limit=limit,
        cursor=cursor,
        tool=tool,
        conversation_id=conversation_id,
    )
    return inbox_page(listing)


@app.get("/approvals", include_in_schema=False)
def approvals_page() -> Response[str]:
    """The approval inbox as a web page (static; it calls the JSON routes with the
    token the user pastes, so it needs none itself)."""
    from .approvals_page import page

    html, headers = page()
    return Response(
        status_code=200, content_type="text/html; charset=utf-8", body=html, headers=headers
    )


@app.get("/v1/openapi.json", include_in_schema=False)
def openapi() -> Response[str]:
    """The OpenAPI 3 document of this API: every function's routes, not only this one's."""
    # Imported here: the other functions' routes are loaded for this document only.
    from .functions import EVERY_ROUTE, register

    register(EVERY_ROUTE)
    return Response(
        status_code=200,
        content_type=content_types.APPLICATION_JSON,
        body=app.get_openapi_json_schema(
            title="turnledger",
            version=__version__,
            description="Durable, multi-turn conversation state for LLM applications. "
            "Errors are {error: {code, message, details}}; see the README's error table.",
        ),
    )
