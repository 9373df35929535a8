"""The bodies of the pin routes (:mod:`.pin_routes`, :mod:`.user_pin_routes`), apart from
them: the context route shows pins too (:mod:`.replay_routes`), and its function loads none
of the pin service."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import ConfigDict, Field

from ..core.models import PIN_TEXT_MAX_BYTES, Deferred, Pin
from ..store.user_pins import UserPin


class PinCreate(Deferred):
    """Body of ``POST /v1/conversations/{id}/pins``."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(
        min_length=1,
        max_length=PIN_TEXT_MAX_BYTES,
        pattern=r"\S",
        description="Sent verbatim to every later model call; at most 2048 bytes (UTF-8).",
    )
    kind: Literal["fact", "constraint", "correction"]
    corrects: int | None = Field(
        default=None, ge=1, description="A correction: the sequence of the event it corrects."
    )
    reason: str | None = Field(default=None, max_length=1000)


class PinView(Deferred):
    """A pin as the API shows it."""

    id: str
    kind: Literal["fact", "constraint", "correction"]
    text: str
    corrects: int | None
    reason: str | None
    author: str
    added_at: datetime
    #: The sequence of its ``pin_added`` event.
    sequence: int


class PinsView(Deferred):
    """Answer of ``GET /v1/conversations/{id}/pins``: the active pins, oldest first."""

    pins: list[PinView]


def pin_view(pin: Pin) -> PinView:
    """The public view of ``pin``."""
    return PinView.model_validate(pin.model_dump())


class UserPinCreate(Deferred):
    """Body of ``POST /v1/memories/pins``: a conversation pin's body, but a user's pins
    name no event of one conversation, so no ``correction`` and no ``corrects``."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(
        min_length=1,
        max_length=PIN_TEXT_MAX_BYTES,
        pattern=r"\S",
        description="Sent verbatim to every later model call of the user's conversations; "
        "at most 2048 bytes (UTF-8).",
    )
    kind: Literal["fact", "constraint"]
    reason: str | None = Field(default=None, max_length=1000)


class UserPinView(Deferred):
    """A pin of a user as the API shows it."""

    id: str
    kind: Literal["fact", "constraint"]
    text: str
    reason: str | None
    author: str
    added_at: datetime


class UserPinsView(Deferred):
    """Answer of ``GET /v1/memories/pins``: the user's active pins, oldest first."""

    pins: list[UserPinView]


def user_pin_view(pin: UserPin) -> UserPinView:
    """The public view of ``pin``."""
    return UserPinView.model_validate(pin.model_dump())
