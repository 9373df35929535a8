"""The ``/v1/conversations/{id}/pins`` routes: a conversation's pinned facts, constraints
and corrections (:mod:`turnledger.context.pins`).

Adding or removing a pin needs the approver scope (operators: :func:`.resolver.approver`,
``APPROVER_SCOPE``); listing them needs only access to the conversation. The service is
:class:`~turnledger.turn.pins.Pins` on the tenant's conversations.
"""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body, Path

from ..runtime import get_runtime
from ..turn.pins import PinCommand, Pins
from .pin_views import PinCreate, PinsView, PinView, pin_view
from .resolver import ConversationId, app, approver, conversation, json_response, responses

PinId = Annotated[str, Path(pattern=r"^pin_[0-9a-z]{1,40}$", description="A pin's id.")]


def _pins(tenant: str) -> Pins:
    return Pins(get_runtime().conversations_for(tenant))


@app.post(
    "/v1/conversations/<conversation_id>/pins",
    responses=responses(PinView, 400, 401, 403, 404, 409, 422, 503, status=201),
)
def add_pin(
    conversation_id: ConversationId, request: Annotated[PinCreate, Body()]
) -> Response[str]:
    """Pin a fact, a constraint or a correction: every later model call carries it
    verbatim; ``201`` with the pin. Needs the approver scope."""
    who = approver(conversation_id)
    key = who.key(conversation_id)
    command = PinCommand(
        text=request.text, kind=request.kind, corrects=request.corrects, reason=request.reason
    )
    pin = _pins(key.tenant).add(key, who.actor, command)
    return json_response(201, pin_view(pin))


@app.get(
    "/v1/conversations/<conversation_id>/pins",
    responses=responses(PinsView, 400, 401, 404, 422, 503),
)
def list_pins(conversation_id: ConversationId) -> PinsView:
    """The active pins, oldest first."""
    _, key = conversation(conversation_id)
    return PinsView(pins=[pin_view(pin) for pin in _pins(key.tenant).active(key)])


@app.delete(
    "/v1/conversations/<conversation_id>/pins/<pin_id>",
    responses=responses(None, 400, 401, 403, 404, 409, 422, 503, status=204),
)
def remove_pin(conversation_id: ConversationId, pin_id: PinId) -> Response[str]:
    """Remove a pin (a ``pin_removed`` event); ``204``. Needs the approver scope."""
    who = approver(conversation_id)
    _pins(who.tenant).remove(who.key(conversation_id), who.actor, pin_id)
    return Response(status_code=204, body="")
