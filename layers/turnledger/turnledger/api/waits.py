"""Routes of turns that wait: cancel a turn, and settle a deferred tool call by callback.

``POST /v1/callbacks/{token}`` has no authorizer (the template opens it with
``Auth: NONE``): the signed token is the credential, and the tenant comes from
it once verified (:mod:`turnledger.turn.callbacks`), never from anything else in
the request. Being open, it is refused cheaply: :func:`refuse_early` checks the token
and the callback's own body limit before the entry point reads the body.
"""

from __future__ import annotations

from typing import Annotated, Any

from aws_lambda_powertools.event_handler.openapi.params import Body, Path

from ..core.exceptions import PayloadTooLarge
from ..runtime import get_runtime
from ..turn.callbacks import MAX_TOKEN_CHARS, max_input_bytes, signing_key, verify
from .resolver import ConversationId, app, conversation, responses
from .schemas import CallbackRequest, CallbackResponse, CancelRequestBody, CancelResponse
from .views import callback_outcome, callback_response, cancel_response

#: The route key of the callback route (as the HTTP API and the local runner name it).
CALLBACK_ROUTE = "POST /v1/callbacks/{token}"

CallbackToken = Annotated[
    str, Path(max_length=MAX_TOKEN_CHARS, description="The signed token of the callback_url")
]


@app.post(
    "/v1/conversations/<conversation_id>/cancel",
    responses=responses(CancelResponse, 400, 401, 404, 409, 413, 422, 503),
)
def post_cancel(
    conversation_id: ConversationId, request: Annotated[CancelRequestBody, Body()]
) -> CancelResponse:
    """Stop a running or waiting turn at the next step boundary; results recorded stay."""
    who, key = conversation(conversation_id)
    service = get_runtime().conversations_for(key.tenant)
    return cancel_response(service.cancel(key, who.actor, reason=request.reason))


@app.post(
    "/v1/callbacks/<token>",
    responses=responses(CallbackResponse, 400, 409, 410, 413, 422, 502, 503, 504),
)
def post_callback(
    token: CallbackToken, request: Annotated[CallbackRequest, Body()]
) -> CallbackResponse:
    """Settle a deferred tool call: the token is the only credential (single use)."""
    runtime = get_runtime()
    claims = verify(signing_key(), token, now=runtime.clock())
    service = runtime.conversations_for(claims.tenant)
    return callback_response(service.settle_callback(claims, callback_outcome(request)))


def refuse_early(event: dict[str, Any]) -> int | None:
    """For a callback, check its token and the size of its body without reading the body.

    Returns the body limit of the route (``None``: not a callback, the API's limit holds).
    The size is judged on the event's body field as given (a string of N characters
    encodes to at least N bytes, base64 of N characters to at least 3N/4 - 2): the exact
    check of the decoded bytes against the returned limit follows in the entry point.

    Raises:
        CallbackInvalid: the token is not genuine or is past its deadline (``410``).
        PayloadTooLarge: the body field is over the route's limit (``413``).
    """
    if event.get("routeKey") != CALLBACK_ROUTE:
        return None
    token = (event.get("pathParameters") or {}).get("token")
    verify(signing_key(), str(token or ""), now=get_runtime().clock())
    limit = max_input_bytes()
    body = event.get("body")
    if isinstance(body, str):
        least = len(body) * 3 // 4 - 2 if event.get("isBase64Encoded") else len(body)
        if least > limit:
            raise PayloadTooLarge(
                f"a callback body is over the limit of {limit} bytes", details={"limit": limit}
            )
    return limit
