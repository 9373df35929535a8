"""``Prefer: respond-async`` on the turn routes: accept the turn and start the turn worker.

The logic is :mod:`turnledger.longturns`; this module only binds it to the current
request (identity, ``Idempotency-Key``) and answers ``202`` with ``Location``.
"""

from __future__ import annotations

from aws_lambda_powertools.event_handler import Response, content_types
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse

from ..longturns import (
    AsyncTurnAccepted,
    RouteKind,
    accept,
    invoke_worker,
    prefers_async,
    turn_url,
)
from ..models import ConversationKey
from ..runtime import get_runtime
from .schemas import ApprovalRequest, TurnRequest, TurnResponse
from .idempotency import idempotent

__all__ = ["ASYNC_ANSWER", "AsyncTurnAccepted", "accept_async", "prefers_async"]

#: The ``202`` answer of the turn routes, for the OpenAPI document.
ASYNC_ANSWER: dict[int, OpenAPIResponse] = {
    202: {
        "description": "Accepted (Prefer: respond-async): the turn runs on; read it at Location",
        "content": {"application/json": {"model": AsyncTurnAccepted}},
    }
}


def accept_async(
    conversation_id: str, kind: RouteKind, request: TurnRequest | ApprovalRequest
) -> Response[TurnResponse | AsyncTurnAccepted]:
    """Accept the current request as a long turn: ``202``, ``Location`` of the turn.

    Under an ``Idempotency-Key`` a retry answers the same ``202`` and starts nothing.
    """
    from .app import app, caller

    runtime = get_runtime()
    who = caller(conversation_id)
    service = runtime.conversations_for(who.tenant)
    function = runtime.settings.turn_worker_function or ""
    endpoint = runtime.settings.turn_worker_endpoint
    accepted = idempotent(
        key=app.current_event.headers.get("idempotency-key") or None,
        conversation=ConversationKey(tenant=who.tenant, conversation_id=conversation_id),
        # Not the synchronous route's records: the same key answers in its own shape.
        route=f"{kind}s-async",
        body=request.model_dump(mode="json"),
        run=lambda: accept(
            service,
            who,
            conversation_id,
            kind,
            request,
            invoke=lambda payload: invoke_worker(function, payload, endpoint),
        ),
        parse=AsyncTurnAccepted.model_validate,
    )
    return Response[TurnResponse | AsyncTurnAccepted](
        status_code=202,
        content_type=content_types.APPLICATION_JSON,
        body=accepted,
        headers={
            "Location": turn_url(conversation_id, accepted.turn),
            "Preference-Applied": "respond-async",
        },
    )
