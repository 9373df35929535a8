"""``POST /v1/conversations/{id}/turns`` and ``POST /v1/conversations/{id}/approvals``:
the routes that run a turn, synchronously (:func:`turnledger.turn.longturns.run_synchronously`)
or, with ``Prefer: respond-async``, in the turn worker.

Apart from :mod:`.routes`, which every API function loads: only the turn and approve
functions load what running a turn needs (long turns and their drafts, the async answer,
the idempotency layer).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, cast

from aws_lambda_powertools.event_handler import Response, content_types
from aws_lambda_powertools.event_handler.openapi.params import Body

from ..core.models import ConversationKey
from ..core.observability import timed
from ..runtime import get_runtime
from ..turn import longturns
from ..turn.results import TurnResult
from .idempotency import idempotent
from .live import EVENT_STREAM
from .live_turns import stream_turn
from .resolver import (
    ConversationId,
    app,
    approver,
    conversation,
    idempotency_key,
    memory_user,
    responses,
    with_approver_claims,
)
from .schemas import ApprovalRequest, TurnRequest, TurnResponse
from .streaming import ASYNC_ANSWER, AsyncTurnAccepted, accept_async, prefers_async, streamed
from .views import decisions, turn_command, turn_response


def _answer_turn(
    key: ConversationKey,
    route: str,
    request: TurnRequest | ApprovalRequest,
    run: Callable[[], TurnResult],
) -> Response[TurnResponse | AsyncTurnAccepted]:
    """Run a request that answers a turn: timed, and idempotent under its key."""
    with timed("TurnLatency"):
        answer = idempotent(
            key=idempotency_key(),
            conversation=key,
            route=route,
            body=request.model_dump(mode="json"),
            run=lambda: turn_response(run()),
            parse=TurnResponse.model_validate,
        )
    # The data policy's: loaded with the turn routes' first answer, not at init.
    from .policy_views import answer_for_reader

    answer = answer_for_reader(answer, key)
    return Response(status_code=200, content_type=content_types.APPLICATION_JSON, body=answer)


@app.post(
    "/v1/conversations/<conversation_id>/turns",
    responses=streamed(responses(TurnResponse, 400, 401, 403, 409, 413, 422, 502, 503, 504))
    | ASYNC_ANSWER,
)
def post_turn(
    conversation_id: ConversationId, request: Annotated[TurnRequest, Body()]
) -> Response[TurnResponse | AsyncTurnAccepted]:
    """Run one turn: append the input, call the model, run or pause tools, persist, answer.

    The output of a human-input or deferred call needs the approver scope, as on the
    approvals route (:func:`turnledger.turn.lifecycle.check_settler`); a client call's is
    the caller's.

    With ``Prefer: respond-async``: ``202`` at once, the turn runs in the turn worker.
    With ``Accept: text/event-stream``: ``200`` server-sent events as the answer is written.
    """
    who, key = conversation(conversation_id)
    who = with_approver_claims(who)
    command = turn_command(request, idempotency_key(), who.approver_claims)
    named = memory_user()
    if named is not None:
        command = command.model_copy(update={"memory_user": named})
    if prefers_async(app.current_event.headers.get("prefer")):
        return accept_async(who, key, request, command)
    if EVENT_STREAM in (app.current_event.headers.get("accept") or ""):
        # Written as the model writes it where the answer can stream (:mod:`.live_turns`).
        return cast(
            Response[TurnResponse | AsyncTurnAccepted],
            stream_turn(who.actor, key, request, command),
        )
    service = get_runtime().conversations_for(key.tenant)
    return _answer_turn(
        key, "turns", request, lambda: longturns.run_synchronously(service, key, who.actor, command)
    )


@app.post(
    "/v1/conversations/<conversation_id>/approvals",
    responses=responses(TurnResponse, 400, 401, 403, 404, 409, 413, 422, 502, 503, 504)
    | ASYNC_ANSWER,
)
def post_approvals(
    conversation_id: ConversationId, request: Annotated[ApprovalRequest, Body()]
) -> Response[TurnResponse | AsyncTurnAccepted]:
    """Decide pending tool calls; continue the turn when none is left undecided.

    Only a caller with the approver scope decides (:func:`.resolver.approver`).
    With ``Prefer: respond-async``: ``202`` at once, the turn goes on in the turn worker.
    """
    who = approver(conversation_id)
    key = who.key(conversation_id)
    decided = decisions(request, who.approver_claims)
    if prefers_async(app.current_event.headers.get("prefer")):
        return accept_async(who, key, request, decided)
    service = get_runtime().conversations_for(key.tenant)
    return _answer_turn(
        key,
        "approvals",
        request,
        lambda: longturns.run_synchronously(service, key, who.actor, decided),
    )
