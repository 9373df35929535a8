"""The API's resolver, its error handlers, and what every route module needs of the
current request.

Route modules (:mod:`.routes`, :mod:`.openai`, :mod:`.waits`,
:mod:`.streaming_routes`) import this module and register on :data:`app`;
:mod:`.app` imports them all, so no route module imports another.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass, field, replace
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response, content_types
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Path
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse
from aws_lambda_powertools.shared.json_encoder import Encoder
from pydantic import BaseModel

from ..core.exceptions import (
    ApproverScopeMissing,
    ConversationBusy,
    InvalidConversationId,
    InvalidRequest,
    MemoryUserNotAllowed,
    ProviderError,
    RequestValidationFailed,
    ServiceUnavailable,
    TurnledgerError,
    Unauthorized,
)
from ..core.models import CONVERSATION_ID_PATTERN, ConversationKey
from ..core.observability import logger
from ..runtime import get_runtime
from .errors import body_for
from .schemas import ErrorBody

#: A usable tenant claim: 1-128 of ``A-Z a-z 0-9 . _ : @ + = , -``. Anything else (a
#: 2,000-character claim, control characters) is ``401 unauthorized`` before any storage call.
TENANT_PATTERN = re.compile(r"[A-Za-z0-9._:@+=,-]{1,128}")
#: A conversation id in a path: checked (the only check of a request) by the resolver's
#: validation against the rule of :mod:`turnledger.core.models`, which the OpenAPI document shows.
ConversationId = Annotated[
    str, Path(pattern=CONVERSATION_ID_PATTERN, description="1-128 of A-Z a-z 0-9 . _ : -")
]


def json_text(body: Any) -> str:
    """A response body as JSON, written as Powertools writes a route's result (compact),
    so that errors and hand-built responses are spaced like every other answer."""
    return json.dumps(body, separators=(",", ":"), cls=Encoder)


def json_response(status: int, body: Any) -> Response[str]:
    """``body`` as a compact JSON response with ``status`` (a route whose status varies)."""
    return Response(
        status_code=status, content_type=content_types.APPLICATION_JSON, body=json_text(body)
    )


app = APIGatewayHttpResolver(enable_validation=True, serializer=json_text)

#: The error codes each status can carry, for the OpenAPI document.
_ERROR_CODES = {
    400: "invalid_request, invalid_conversation_id, invalid_cursor",
    401: "unauthorized",
    403: "approver_scope_missing, approver_is_requester, memory_user_not_allowed",
    404: "conversation_not_found, memory_not_found, turn_not_found, replay_not_found",
    409: "conversation_busy, approval_pending, not_awaiting_approval, corrupted_state, "
    "unsupported_state_version, conversation_exists, input_pending, fork_point_open, "
    "fork_too_deep, memory_full, nothing_to_compact",
    410: "callback_invalid",
    413: "payload_too_large, import_too_large, context_length_exceeded",
    422: "validation_error, unknown_tool_call, unknown_tool, unknown_provider, unknown_model, "
    "idempotency_key_reused, invalid_fork_point, invalid_turn_range",
    502: "provider_error",
    503: "service_unavailable",
    504: "provider_timeout",
}


def responses(
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


@dataclass(frozen=True)
class Caller:
    """The verified identity of a request: its tenant and who acts (and, for the
    approvals routes, the claims that allowed the caller to decide)."""

    tenant: str
    actor: str
    #: What :func:`approver` checked: ``sub`` and the approver claim (empty elsewhere).
    approver_claims: dict[str, str] = field(default_factory=dict)

    def key(self, conversation_id: str) -> ConversationKey:
        """The key of the caller's conversation ``conversation_id`` (an id already checked)."""
        return ConversationKey(tenant=self.tenant, conversation_id=conversation_id)


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


_CLAIM_SEPARATORS = re.compile(r"[\s,\[\]]+")


def _claim_values(value: Any) -> set[str]:
    # HTTP APIs pass every claim as a string: ``scope`` space-separated, a list claim
    # (``cognito:groups``) as ``[a b]``; a JSON list is taken too.
    if isinstance(value, list):
        return {str(v) for v in value}
    return {part for part in _CLAIM_SEPARATORS.split(str(value or "")) if part}


def _held(claim: str, event: dict[str, Any] | None = None) -> set[str]:
    """The values ``claim`` of ``event`` (default: the current request) holds (for
    ``scope``, the authorizer's ``scopes`` count too)."""
    raw = app.current_event.raw_event if event is None else event
    jwt = (raw.get("requestContext") or {}).get("authorizer") or {}
    jwt = jwt.get("jwt") or {}
    held = _claim_values((jwt.get("claims") or {}).get(claim))
    if claim == "scope":
        held |= _claim_values(jwt.get("scopes") or [])
    return held


def scope_values() -> set[str]:
    """The values the current request's ``APPROVER_CLAIM`` claim holds (a data class's
    ``read_scope`` is checked there, as the approver scope is)."""
    return _held(get_runtime().settings.approver_claim)


def with_approver_claims(who: Caller) -> Caller:
    """``who`` with the claims that make it an approver (``sub``, and ``APPROVER_SCOPE``
    in the ``APPROVER_CLAIM`` claim), or as it is (none) when its identity lacks the scope.
    The turn routes pass them down: whether a caller may give the output of a call that
    waits for a person or a job is decided once the call is read
    (:func:`turnledger.turn.lifecycle.check_settler`)."""
    settings = get_runtime().settings
    claims_used = {"sub": who.actor}
    if settings.approver_scope:
        if settings.approver_scope not in _held(settings.approver_claim):
            return who
        claims_used[settings.approver_claim] = settings.approver_scope
    return replace(who, approver_claims=claims_used)


def approver(conversation_id: str | None = None) -> Caller:
    """The caller, allowed to decide approvals: its identity holds ``APPROVER_SCOPE`` in the
    ``APPROVER_CLAIM`` claim (for ``scope``, the authorizer's ``scopes`` count too).

    Raises:
        Unauthorized: see :func:`caller`.
        ApproverScopeMissing: the claim does not hold the scope (nothing is read or decided).
    """
    who = with_approver_claims(caller(conversation_id))
    if not who.approver_claims:
        settings = get_runtime().settings
        raise ApproverScopeMissing(
            f"deciding approvals needs {settings.approver_scope!r} in the "
            f"{settings.approver_claim!r} claim",
            details={"claim": settings.approver_claim, "required": settings.approver_scope},
        )
    return who


#: The header a trusted caller names the memory's user with (``MEMORY_USER_SCOPE``).
MEMORY_USER_HEADER = "x-memory-user"
#: What a named user may be: 1-256 characters, no control characters.
_MEMORY_USER = re.compile(r"[^\x00-\x1f\x7f]{1,256}")


def memory_user() -> str | None:
    """The memory user the current request names (``X-Memory-User``), or ``None``: the
    caller's own ``sub``. Only a caller holding ``MEMORY_USER_SCOPE`` in the
    ``APPROVER_CLAIM`` claim may name one (a backend acting for its users).

    Raises:
        MemoryUserNotAllowed: a user is named, and the deployment or the caller's
            claims do not allow it.
        InvalidRequest: the named user is empty, too long or holds control characters.
    """
    return named_memory_user(app.current_event.raw_event)


def named_memory_user(event: dict[str, Any]) -> str | None:
    """:func:`memory_user` of the request ``event``: the entry point checks it on every
    route before routing (:mod:`.app`), so no route drops the header; the routes that
    begin a turn or read a user's memories use it.

    Raises:
        MemoryUserNotAllowed, InvalidRequest: as :func:`memory_user`.
    """
    headers = event.get("headers") or {}
    named = next((str(v) for k, v in headers.items() if str(k).lower() == MEMORY_USER_HEADER), None)
    if named is None:
        return None
    settings = get_runtime().settings
    held = _held(settings.approver_claim, event)
    if not settings.memory_user_scope or settings.memory_user_scope not in held:
        raise MemoryUserNotAllowed(
            "naming the memory's user needs MEMORY_USER_SCOPE in the caller's claims",
            details={"claim": settings.approver_claim, "header": "X-Memory-User"},
        )
    if not _MEMORY_USER.fullmatch(named.strip()):
        raise InvalidRequest("X-Memory-User must be 1-256 characters, no control characters")
    return named.strip()


def conversation(conversation_id: str) -> tuple[Caller, ConversationKey]:
    """The caller and the key of the conversation the current request names: the one
    key of the request, passed down to the service."""
    who = caller(conversation_id)
    return who, who.key(conversation_id)


def idempotency_key() -> str | None:
    """The current request's ``Idempotency-Key`` header, if it has one."""
    return app.current_event.headers.get("idempotency-key") or None


def raw_body(event: dict[str, Any]) -> bytes:
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
    # so that the JSON check names them.
    return body.encode("utf-8", "surrogatepass")


# --- errors: every failure answers the error shape (:mod:`.errors`) ----------------------


def _error(exc: TurnledgerError) -> Response[str]:
    retry_after = (
        exc.retry_after if isinstance(exc, ConversationBusy | ServiceUnavailable) else None
    )
    return Response(
        status_code=exc.status,
        content_type=content_types.APPLICATION_JSON,
        body=json_text(body_for(exc, _current_path())),
        headers={"Retry-After": str(retry_after)} if retry_after is not None else None,
    )


def _current_path() -> str:
    """The current request's raw path (empty before routing)."""
    try:
        return str(app.current_event.raw_event.get("rawPath", ""))
    except (AttributeError, RuntimeError):
        return ""  # no current event (an error before routing)


@app.exception_handler(TurnledgerError)
def _domain_error(exc: TurnledgerError) -> Response[str]:
    if isinstance(exc, ProviderError):
        # Expected (a provider down, a key refused): one line with the cause, no traceback.
        logger.error(
            f"the model provider failed: {exc}", extra={"code": exc.code, "details": exc.details}
        )
    elif exc.status >= 500:
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
    return _error(
        TurnledgerError(
            "internal error; the conversation is as the request's last commit left it, and not held"
        )
    )


class RouteNotFound(TurnledgerError):
    """No route has the request's path."""

    status = 404
    code = "not_found"


class MethodNotAllowed(TurnledgerError):
    """A route has the request's path, not its method."""

    status = 405
    code = "method_not_allowed"


def methods_of(path: str) -> list[str]:
    """The methods the resolver's routes take on ``path`` (none: no route has it)."""
    routes = [*app._static_routes, *app._dynamic_routes]
    return sorted({route.method for route in routes if route.rule.match(path)})


@app.not_found
def _not_found(exc: Exception) -> Response[str]:
    event = app.current_event
    path, method = event.path, event.http_method.upper()
    allowed = methods_of(path)
    if allowed:
        error: TurnledgerError = MethodNotAllowed(
            f"{method} is not allowed on {path}", details={"allowed": allowed}
        )
        answer = _error(error)
        answer.headers["Allow"] = ", ".join(allowed)
        return answer
    return _error(RouteNotFound(f"no route for {method} {path}"))
