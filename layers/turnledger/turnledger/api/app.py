"""The HTTP API: Powertools event handler routes over :class:`Conversations`.

Each route parses (Powertools validates path, query and body against the
pydantic models, which also make the OpenAPI document), calls the service
and answers. Every failure answers the contract's error shape
``{"error": {"code", "message", "details"}}`` through the exception handlers
below; nothing chooses a status by matching message text.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable
from typing import Annotated, Any
from urllib.parse import quote

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response, content_types
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import BaseModel

from .. import __version__
from ..approvals import DEFAULT_LIMIT, MAX_LIMIT, InboxPageView, list_inbox
from ..deadline import request_deadline
from ..exceptions import (
    ConversationBusy,
    InvalidConversationId,
    InvalidRequest,
    PayloadTooLarge,
    RequestValidationFailed,
    ServiceUnavailable,
    TurnledgerError,
    Unauthorized,
)
from ..models import ConversationKey
from ..observability import logger, metrics, timed, traced
from ..pipeline import Caller
from ..runtime import get_runtime
from .schemas import (
    ApprovalRequest,
    ConversationView,
    ErrorBody,
    EventsPage,
    PurgeReportView,
    TurnRequest,
    TurnResponse,
)
from ..strict_json import BodyError, parse_object
from .idempotency import idempotent
from .streaming import ASYNC_ANSWER, AsyncTurnAccepted, accept_async, prefers_async

CONVERSATION_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
#: A usable tenant claim: 1-128 of ``A-Z a-z 0-9 . _ : @ + = , -``. Anything else (a
#: 2,000-character claim, control characters) is ``401 unauthorized`` before any storage call.
TENANT_PATTERN = re.compile(r"[A-Za-z0-9._:@+=,-]{1,128}")
#: The media type of an export (``turnledger.transfer.NDJSON``; not imported here, so the
#: handler's cold start does not load the transfer module).
NDJSON = "application/x-ndjson"
#: Routes whose body is not one JSON object (an import is NDJSON).
_NDJSON_ROUTES = ("/import",)
ConversationId = Annotated[
    str, Path(pattern=CONVERSATION_ID_PATTERN, description="1-128 of A-Z a-z 0-9 . _ : -")
]

app = APIGatewayHttpResolver(enable_validation=True)

#: The error codes each status can carry, for the OpenAPI document.
_ERROR_CODES = {
    400: "invalid_request, invalid_conversation_id, invalid_cursor",
    401: "unauthorized",
    404: "conversation_not_found",
    409: "conversation_busy, approval_pending, not_awaiting_approval, corrupted_state, "
    "unsupported_state_version, conversation_exists, input_pending",
    410: "callback_invalid",
    413: "payload_too_large",
    422: "validation_error, unknown_tool_call, unknown_tool, unknown_provider, "
    "idempotency_key_reused",
    502: "provider_error",
    503: "service_unavailable",
    504: "provider_timeout",
}


def _responses(
    ok: type[BaseModel] | None, *errors: int, status: int = 200
) -> dict[int, OpenAPIResponse]:
    """The documented answers of a route: its success, and its errors in the error shape."""
    answers: dict[int, OpenAPIResponse] = {
        # An empty content map: no body (Powertools would otherwise document the return type).
        status: {"description": "Success, no body", "content": {}}
        if ok is None
        else {"description": "Success", "content": {"application/json": {"model": ok}}}
    }
    for code in errors:
        answers[code] = {
            "description": f"Error ({_ERROR_CODES[code]})",
            "content": {"application/json": {"model": ErrorBody}},
        }
    return answers


def _error(exc: TurnledgerError) -> Response[str]:
    retry_after = (
        exc.retry_after if isinstance(exc, ConversationBusy | ServiceUnavailable) else None
    )
    body = exc.to_body()
    if _under_openai_face():
        from .openai_face import openai_error_body

        body = openai_error_body(exc)
    return Response(
        status_code=exc.status,
        content_type=content_types.APPLICATION_JSON,
        body=json.dumps(body),
        headers={"Retry-After": str(retry_after)} if retry_after is not None else None,
    )


def _under_openai_face() -> bool:
    """Whether the current request is under ``/openai/`` (errors in OpenAI's shape)."""
    try:
        return str(app.current_event.raw_event.get("rawPath", "")).startswith("/openai/")
    except (AttributeError, RuntimeError):
        return False  # no current event (an error before routing)


def caller(conversation_id: str | None = None) -> Caller:
    """The verified identity of the current request (JWT authorizer claims).

    Also puts the tenant (and ``conversation_id``, when given) on every log line
    of this invocation.

    Raises:
        Unauthorized: no claims, or no usable tenant claim (see :data:`TENANT_PATTERN`).
    """
    settings = get_runtime().settings
    context = app.current_event.raw_event.get("requestContext") or {}
    claims = ((context.get("authorizer") or {}).get("jwt") or {}).get("claims") or {}
    tenant = claims.get(settings.tenant_claim)
    if not isinstance(tenant, str) or not tenant:
        raise Unauthorized(f"no verified identity with a {settings.tenant_claim!r} claim")
    if not TENANT_PATTERN.fullmatch(tenant):
        raise Unauthorized(
            f"the {settings.tenant_claim!r} claim must be 1-128 characters of "
            "A-Z a-z 0-9 . _ : @ + = , -"
        )
    actor = claims.get("sub")
    logger.append_keys(tenant=tenant)
    if conversation_id is not None:
        logger.append_keys(conversation_id=conversation_id)
    return Caller(tenant=tenant, actor=str(actor) if actor else "anonymous")


def _answer_turn(
    conversation_id: str,
    route: str,
    request: TurnRequest | ApprovalRequest,
    run: Callable[[Caller], TurnResponse],
) -> TurnResponse:
    """Run a request that answers a turn: timed, and idempotent under its key."""
    who = caller(conversation_id)
    with timed("TurnLatency"):
        return idempotent(
            key=app.current_event.headers.get("idempotency-key") or None,
            conversation=ConversationKey(tenant=who.tenant, conversation_id=conversation_id),
            route=route,
            body=request.model_dump(mode="json"),
            run=lambda: run(who),
            parse=TurnResponse.model_validate,
        )


@app.post(
    "/v1/conversations/<conversation_id>/turns",
    responses=_responses(TurnResponse, 400, 401, 409, 413, 422, 502, 503, 504) | ASYNC_ANSWER,
)
def post_turn(
    conversation_id: ConversationId, request: Annotated[TurnRequest, Body()]
) -> Response[TurnResponse | AsyncTurnAccepted]:
    """Run one turn: append the input, call the model, run or pause tools, persist, answer.

    With ``Prefer: respond-async``: ``202`` at once, the turn runs in the turn worker.
    """
    if prefers_async(app.current_event.headers.get("prefer")):
        return accept_async(conversation_id, "turn", request)
    answer = _answer_turn(
        conversation_id,
        "turns",
        request,
        lambda who: get_runtime().conversations_for(who.tenant).turn(who, conversation_id, request),
    )
    return Response(status_code=200, content_type=content_types.APPLICATION_JSON, body=answer)


@app.post(
    "/v1/conversations/<conversation_id>/approvals",
    responses=_responses(TurnResponse, 400, 401, 404, 409, 413, 422, 502, 503, 504) | ASYNC_ANSWER,
)
def post_approvals(
    conversation_id: ConversationId, request: Annotated[ApprovalRequest, Body()]
) -> Response[TurnResponse | AsyncTurnAccepted]:
    """Decide pending tool calls; continue the turn when none is left undecided.

    With ``Prefer: respond-async``: ``202`` at once, the turn goes on in the turn worker.
    """
    if prefers_async(app.current_event.headers.get("prefer")):
        return accept_async(conversation_id, "approval", request)
    answer = _answer_turn(
        conversation_id,
        "approvals",
        request,
        lambda who: (
            get_runtime().conversations_for(who.tenant).approve(who, conversation_id, request)
        ),
    )
    return Response(status_code=200, content_type=content_types.APPLICATION_JSON, body=answer)


@app.get(
    "/v1/conversations/<conversation_id>",
    responses=_responses(ConversationView, 400, 401, 404, 409, 422, 503),
)
def get_conversation(conversation_id: ConversationId) -> ConversationView:
    """The conversation's head: status, timestamps, expiry, counts, pending calls."""
    who = caller(conversation_id)
    return get_runtime().conversations_for(who.tenant).get(who, conversation_id)


@app.get(
    "/v1/conversations/<conversation_id>/events",
    responses=_responses(EventsPage, 400, 401, 404, 409, 422, 503),
)
def get_events(
    conversation_id: ConversationId,
    after: Annotated[int, Query(ge=0, description="Return events with sequence > after.")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000, description="At most this many events.")] = 100,
) -> EventsPage:
    """The transcript: canonical events in sequence order, paginated."""
    who = caller(conversation_id)
    return (
        get_runtime()
        .conversations_for(who.tenant)
        .events(who, conversation_id, after=after, limit=limit)
    )


@app.delete(
    "/v1/conversations/<conversation_id>",
    responses=_responses(None, 400, 401, 409, 422, 503, status=204),
)
def delete_conversation(conversation_id: ConversationId) -> Response[str]:
    """Clear: delete the conversation, its events and its stored artifacts.

    Answers 204, also when the conversation is absent.
    """
    who = caller(conversation_id)
    get_runtime().conversations_for(who.tenant).clear(who, conversation_id)
    return Response(status_code=204, body="")


@app.get(
    "/v1/conversations/<conversation_id>/export",
    responses={
        200: {"description": "The conversation as NDJSON", "content": {NDJSON: {}}},
        **{k: v for k, v in _responses(None, 400, 401, 404, 409, 422).items() if k != 200},
    },
)
def export_conversation(conversation_id: ConversationId) -> Response[str]:
    """The whole conversation as NDJSON: its head line, then every event, payloads inline."""
    from ..transfer import export_text

    who = caller(conversation_id)
    service = get_runtime().conversations_for(who.tenant)
    key = ConversationKey(tenant=who.tenant, conversation_id=conversation_id)
    return Response(
        status_code=200, content_type=NDJSON, body=export_text(service.store, key, service.clock())
    )


@app.post(
    "/v1/conversations/<conversation_id>/import",
    responses=_responses(ConversationView, 400, 401, 409, 413, 422, status=201),
)
def import_conversation(conversation_id: ConversationId) -> Response[str]:
    """Create the conversation from an export (NDJSON), checked whole and written all or nothing.

    ``409 conversation_exists`` when the id is taken.
    """
    from ..transfer import import_text

    runtime = get_runtime()
    who = caller(conversation_id)
    service = runtime.conversations_for(who.tenant)
    key = ConversationKey(tenant=who.tenant, conversation_id=conversation_id)
    raw = _raw_body(app.current_event.raw_event)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest("the export is not UTF-8") from exc
    import_text(
        service.store,
        key,
        text,
        now=service.clock(),
        ttl_seconds=runtime.settings.ttl_for(who.tenant),
        max_bytes=runtime.settings.max_input_bytes,
    )
    view = service.get(who, conversation_id)
    return Response(
        status_code=201,
        content_type=content_types.APPLICATION_JSON,
        body=view.model_dump_json(),
    )


@app.delete("/v1/conversations", responses=_responses(PurgeReportView, 401, 422, 503))
def erase_tenant() -> PurgeReportView:
    """Tenant-wide erasure: every conversation of the caller's tenant, in time-bounded pages.

    ``complete: false`` means the time budget ran out: call again to continue.
    """
    from ..sweep import erase_tenant as erase

    context: LambdaContext | None = app.lambda_context
    return erase(get_runtime(), caller().tenant, context)


@app.get("/v1/approvals", responses=_responses(InboxPageView, 400, 401, 409, 422, 503))
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
    """The tenant's approval inbox: every call waiting for a person, oldest first."""
    who = caller()
    return list_inbox(
        get_runtime().conversations_for(who.tenant),
        who,
        limit=limit,
        cursor=cursor,
        tool=tool,
        conversation_id=conversation_id,
    )


@app.get("/approvals", include_in_schema=False)
def approvals_page() -> Response[str]:
    """The approval inbox as a web page (static; it calls the JSON routes with the
    token the user pastes, so it needs none itself)."""
    from ..approvals_page import page

    html, headers = page()
    return Response(
        status_code=200, content_type="text/html; charset=utf-8", body=html, headers=headers
    )


@app.get("/v1/openapi.json", include_in_schema=False)
def openapi() -> Response[str]:
    """The OpenAPI 3 document of this API."""
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


@app.exception_handler(TurnledgerError)
def _domain_error(exc: TurnledgerError) -> Response[str]:
    if exc.status >= 500:
        logger.exception("request failed", extra={"code": exc.code})
    return _error(exc)


@app.exception_handler(RequestValidationError)
def _validation_error(exc: RequestValidationError) -> Response[str]:
    errors = list(exc.errors())
    if any(tuple(e.get("loc", ()))[:2] == ("path", "conversation_id") for e in errors):
        return _error(
            InvalidConversationId(
                "conversation_id must be 1-128 characters of A-Z a-z 0-9 . _ : - "
                "and start with a letter or digit"
            )
        )
    for error in errors:
        loc = tuple(error.get("loc", ()))
        if error.get("type") == "json_invalid" or (
            loc in {("body",), ()}
            and error.get("type") in {"model_attributes_type", "missing", "dict_type", "model_type"}
        ):
            return _error(InvalidRequest("the body must be a JSON object"))
    details = [
        {
            "loc": [str(part) for part in e.get("loc", ())],
            "msg": e.get("msg"),
            "type": e.get("type"),
        }
        for e in errors
    ]
    return _error(
        RequestValidationFailed("the request fails the schema", details={"errors": details})
    )


@app.exception_handler(Exception)
def _unexpected(exc: Exception) -> Response[str]:
    logger.exception("unexpected failure")
    return _error(TurnledgerError("internal error; the request left no partial state"))


@app.not_found
def _not_found(exc: Exception) -> Response[str]:
    return Response(
        status_code=404,
        content_type=content_types.APPLICATION_JSON,
        body=json.dumps(
            {"error": {"code": "not_found", "message": "no such route", "details": {}}}
        ),
    )


def _raw_body(event: dict[str, Any]) -> bytes:
    """The request body's bytes as the client sent them.

    Raises:
        InvalidRequest: the event claims base64 and the body is not.
    """
    body = event.get("body") or ""
    if event.get("isBase64Encoded"):
        try:
            return base64.b64decode(body, validate=True)
        except binascii.Error as exc:
            raise InvalidRequest("the body is not valid base64") from exc
    # A str body came from valid UTF-8; surrogates (never in valid UTF-8) pass through
    # so that the JSON check below names them.
    return body.encode("utf-8", "surrogatepass")


def _with_decoded_path(event: dict[str, Any]) -> dict[str, Any]:
    """``event`` with its path's parameters decoded, as API Gateway decodes them.

    HTTP APIs deliver ``pathParameters`` percent-decoded and ``rawPath`` as sent;
    Powertools matches routes on the path. A parameter that is a valid
    conversation id once decoded (``a%3Ab`` is ``a:b``) is put back decoded; any
    other keeps its raw form, which the id rule then refuses.
    """
    parameters = event.get("pathParameters") or {}
    template = str(event.get("routeKey") or "").partition(" ")[2]
    raw = str(event.get("rawPath") or "")
    template_segments, raw_segments = template.split("/"), raw.split("/")
    if not parameters or len(template_segments) != len(raw_segments):
        return event
    segments: list[str] = []
    for pattern, segment in zip(template_segments, raw_segments, strict=True):
        name = pattern[1:-1] if pattern.startswith("{") and pattern.endswith("}") else None
        value = parameters.get(name) if name else None
        if isinstance(value, str) and re.fullmatch(CONVERSATION_ID_PATTERN, value):
            segments.append(quote(value, safe=":"))
        else:
            segments.append(segment)
    path = "/".join(segments)
    return event if path == raw else {**event, "rawPath": path}


def _answer(error: TurnledgerError, event: dict[str, Any]) -> dict[str, Any]:
    body = error.to_body()
    if str(event.get("rawPath", "")).startswith("/openai/"):
        from .openai_face import openai_error_body

        body = openai_error_body(error)
    return {
        "statusCode": error.status,
        "headers": {"Content-Type": content_types.APPLICATION_JSON},
        "body": json.dumps(body),
    }


def _check_body(event: dict[str, Any], limit: int) -> None:
    """Refuse a body over ``limit`` bytes, or one that is no JSON object within the limits of
    :mod:`turnledger.strict_json` (any bytes get a 4xx, never a crash deeper in).

    Raises:
        PayloadTooLarge: over ``limit``.
        InvalidRequest: not UTF-8, not JSON, not an object, or over a parsing limit.
    """
    raw = _raw_body(event)
    if len(raw) > limit:
        raise PayloadTooLarge(
            f"the request body is over the limit of {limit} bytes", details={"limit": limit}
        )
    method = str(((event.get("requestContext") or {}).get("http") or {}).get("method", ""))
    if method.upper() not in {"POST", "PUT", "PATCH"}:
        return
    if str(event.get("routeKey") or "").endswith(_NDJSON_ROUTES):
        return  # checked line by line by the route (turnledger.transfer)
    try:
        parse_object(raw)
    except BodyError as exc:
        raise InvalidRequest(str(exc), details=exc.details) from exc


@logger.inject_lambda_context(
    correlation_id_path=correlation_paths.API_GATEWAY_HTTP,
    # Keys appended for one request (tenant, conversation id) never reach the next one's lines.
    clear_state=True,
)
@metrics.log_metrics
@traced
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """The Lambda entry point of every API function."""
    try:
        _check_body(event, get_runtime().settings.max_input_bytes)
    except TurnledgerError as exc:
        return _answer(exc, event)
    event = _with_decoded_path(event)
    headers = event.get("headers") or {}
    if (
        event.get("body")
        and headers.get("content-type") != content_types.APPLICATION_JSON
        and not str(event.get("routeKey") or "").endswith(_NDJSON_ROUTES)
    ):
        # Bodies are JSON whatever the client labels them (``curl -d`` says form data):
        # a form or an unlabeled body would otherwise fail validation with a puzzling error.
        event = {**event, "headers": {**headers, "content-type": content_types.APPLICATION_JSON}}
    remaining_ms = getattr(context, "get_remaining_time_in_millis", None)
    with request_deadline(remaining_ms() / 1000 if callable(remaining_ms) else None):
        return app.resolve(event, context)


# The OpenAI-compatible face, the routes of waiting turns (cancel, callbacks) and long
# turns' reads (``GET .../turns/{n}[/stream]``) add their routes to ``app`` (they import
# the names above).
from . import openai_face, streaming_routes, waits  # noqa: E402, F401
