"""Routes of turns that wait: cancel a turn, and settle a deferred tool call by callback.

``POST /v1/callbacks/{token}`` has no authorizer (the template opens it with
``Auth: NONE``): the signed token is the credential, and the tenant comes from
it once verified (:mod:`turnledger.turn.callbacks`), never from anything else in
the request. Being open, it is refused before its body is read (:mod:`.callback_gate`).
"""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Body, Path

from ..runtime import get_runtime
from ..turn.callbacks import MAX_TOKEN_CHARS, signing_key, verify
from .resolver import ConversationId, app, conversation, responses
from .schemas import CallbackRequest, CallbackResponse, CancelRequestBody, CancelResponse
from .views import callback_outcome, callback_response, cancel_response

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
