"""The ``/v1/memories/pins`` routes: the pins of a user, carried by every model call of
that user's conversations (:mod:`turnledger.turn.user_pins`).

The user is memory's (the caller's ``sub``, or the user ``X-Memory-User`` names where the
deployment allows it: :func:`.resolver.memory_user`). Adding or removing a pin needs the
approver scope, as a conversation's pins do (:func:`.resolver.approver`); listing them
needs only the caller's identity.
"""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body, Path

from ..runtime import get_runtime
from ..turn.user_pins import UserPins
from .pin_views import UserPinCreate, UserPinsView, UserPinView, user_pin_view
from .resolver import app, approver, caller, json_response, memory_user, responses

PinId = Annotated[str, Path(pattern=r"^pin_[0-9a-z]{1,40}$", description="A pin's id.")]


def _pins(tenant: str) -> UserPins:
    return UserPins(get_runtime().conversations_for(tenant))


@app.post(
    "/v1/memories/pins",
    responses=responses(UserPinView, 400, 401, 403, 422, 503, status=201),
)
def add_user_pin(request: Annotated[UserPinCreate, Body()]) -> Response[str]:
    """Pin a fact or a constraint for the user: every later model call of the user's
    conversations carries it verbatim; ``201`` with the pin. Needs the approver scope."""
    who = approver()
    user = memory_user() or who.actor
    pin = _pins(who.tenant).add(
        who.tenant, user, who.actor, request.text, request.kind, request.reason
    )
    return json_response(201, user_pin_view(pin))


@app.get("/v1/memories/pins", responses=responses(UserPinsView, 400, 401, 403, 422, 503))
def list_user_pins() -> UserPinsView:
    """The user's active pins, oldest first."""
    who = caller()
    user = memory_user() or who.actor
    return UserPinsView(pins=[user_pin_view(p) for p in _pins(who.tenant).active(who.tenant, user)])


@app.delete(
    "/v1/memories/pins/<pin_id>",
    responses=responses(None, 400, 401, 403, 404, 422, 503, status=204),
)
def remove_user_pin(pin_id: PinId) -> Response[str]:
    """Remove one of the user's pins (recorded with who and when); ``204``. Needs the
    approver scope."""
    who = approver()
    user = memory_user() or who.actor
    _pins(who.tenant).remove(who.tenant, user, who.actor, pin_id)
    return Response(status_code=204, body="")
