"""Pins of a user (``/v1/memories/pins``): facts and constraints every conversation of that
user carries, beside the conversation's own pins (:mod:`.pins`).

The user is the one memory names (the caller's ``sub``, or ``X-Memory-User`` from a
trusted caller); a conversation carries the pins of the user its turn names, read in the
query that recalls the user's memory (:mod:`.memory_step`), so a turn with no memory user
reads nothing more. Adding and removing take the approver scope, as a conversation's pins
do; each change is recorded in the user's partition with its author and time
(:mod:`turnledger.store.user_pins`), as a conversation's are events of its log.

A pin that would not fit is refused when it is added (``422 pin_budget_exceeded``): the
user's pins with the system prompt must fit the pins' share of the smallest budget of the
models a turn may use by default (:data:`turnledger.context.pins.PIN_SHARE`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..context.pins import check_budget, new_pin_id, pin_message
from ..core.exceptions import InvalidRequest, PinNotFound
from ..core.models import PIN_TEXT_MAX_BYTES
from ..providers.base import Message
from ..store.user_pins import UserPin, UserPinBook, UserPinKind, UserPinRemoval

if TYPE_CHECKING:
    from .pipeline import Conversations


class UserPins:
    """The pins of one tenant's users, on the tenant's service."""

    def __init__(self, service: Conversations) -> None:
        self.service = service

    def _book(self, tenant: str, user: str) -> UserPinBook:
        return UserPinBook(self.service.store, tenant, user)

    def active(self, tenant: str, user: str) -> list[UserPin]:
        """The user's active pins, oldest first (one query)."""
        return self._book(tenant, user).active()

    def add(
        self, tenant: str, user: str, actor: str, text: str, kind: UserPinKind, reason: str | None
    ) -> UserPin:
        """Pin ``text`` for ``user`` as ``actor``'s.

        Raises:
            InvalidRequest: the text is over :data:`PIN_TEXT_MAX_BYTES`.
            PinBudgetExceeded: the user's pins would not fit their share of a model's
                budget; nothing was stored.
        """
        size = len(text.encode("utf-8"))
        if size > PIN_TEXT_MAX_BYTES:
            raise InvalidRequest(
                f"a pin's text holds at most {PIN_TEXT_MAX_BYTES} bytes (UTF-8); this one {size}",
                details={"limit": PIN_TEXT_MAX_BYTES, "bytes": size},
            )
        book = self._book(tenant, user)
        pin = UserPin(
            id=new_pin_id(),
            kind=kind,
            text=text,
            reason=reason,
            author=actor,
            added_at=self.service.clock(),
        )
        self._check_budget([*book.active(), pin])
        book.add(pin)
        return pin

    def remove(
        self, tenant: str, user: str, actor: str, pin_id: str, reason: str | None = None
    ) -> None:
        """Remove the user's active pin ``pin_id`` as ``actor``: the removal is recorded
        with the pin, then the pin stops being carried.

        Raises:
            PinNotFound: the user has no active pin with that id.
        """
        book = self._book(tenant, user)
        pin = next((p for p in book.active() if p.id == pin_id), None)
        if pin is None:
            raise PinNotFound(f"the user has no active pin {pin_id!r}", details={"pin_id": pin_id})
        book.remove(
            UserPinRemoval(
                pin=pin, removed_by=actor, removed_at=self.service.clock(), reason=reason
            )
        )

    def _check_budget(self, pins: list[UserPin]) -> None:
        """Refuse ``pins`` that would not fit the smallest budget of the models a turn may
        use (the default, every one described, every one allowed), by the default
        provider's estimate."""
        service = self.service
        settings = service.settings
        models = {settings.model, *settings.models}
        allowed = settings.models_allowed
        if allowed is not None:
            models |= allowed
        estimator = service._estimator(service.provider, None)
        sent: list[Message] = []
        if settings.system_prompt:
            sent.append(Message(role="system", content=settings.system_prompt))
        block = pin_message([], pins)
        assert block is not None  # at least one pin
        sent.append(block)
        tokens = estimator.tokens(sent)
        smallest = min(models, key=lambda name: (settings.context_budget(name), name))
        check_budget(smallest, tokens, settings.context_budget(smallest))
