"""Pinning: adding and removing a conversation's pins (``/v1/conversations/{id}/pins``).

Each change is one commit of one event (``pin_added``, ``pin_removed``, the caller as its
actor) and the head's active pins (:attr:`~turnledger.core.models.Head.pins`, slow state:
the change rewrites ``HEAD``, a turn does not). A pin may be added while a turn waits
(for an approval, a person or a job): the turn's next model call carries it. Only a run
holding the conversation's lease refuses it (``409 conversation_busy``, retry after).

What a pin is and how a context carries it: :mod:`turnledger.context.pins`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..context.pins import check_budget, new_pin_id, pin_message, pin_of
from ..core.exceptions import ConversationNotFound, InvalidRequest, PinNotFound
from ..core.models import (
    PIN_TEXT_MAX_BYTES,
    ConversationKey,
    Head,
    Pin,
    PinAdded,
    PinKind,
    PinRemoved,
)
from ..providers.base import Message
from ..store.user_pins import UserPinBook
from .admission import Rules
from .runner import TurnRunner
from .session import Session

if TYPE_CHECKING:
    from .pipeline import Conversations


@dataclass(frozen=True)
class PinCommand:
    """What ``POST .../pins`` asks for."""

    text: str
    kind: PinKind
    corrects: int | None = None
    reason: str | None = None


class Pins:
    """The pins of one deployment's conversations, on its service."""

    def __init__(self, service: Conversations) -> None:
        self.service = service

    def active(self, key: ConversationKey) -> list[Pin]:
        """The active pins of ``key``, oldest first (one read: the head).

        Raises:
            ConversationNotFound: absent, expired, cleared, or another tenant's.
        """
        return list(self._head(key).pins)

    def add(self, key: ConversationKey, actor: str, command: PinCommand) -> Pin:
        """Pin ``command`` on ``key`` as ``actor``'s, in one commit.

        Raises:
            ConversationNotFound: absent, expired, cleared, or another tenant's.
            InvalidRequest: the text is over :data:`PIN_TEXT_MAX_BYTES`; a correction names
                no event (or an event that is not there); ``corrects`` on another kind.
            PinBudgetExceeded: the pins would not fit their share of a model's budget.
            ConversationBusy: a run holds the conversation, or another request committed
                first; nothing was stored.
        """
        session, run = self._open(key)  # an absent conversation is 404 before anything
        size = len(command.text.encode("utf-8"))
        if size > PIN_TEXT_MAX_BYTES:
            raise InvalidRequest(
                f"a pin's text holds at most {PIN_TEXT_MAX_BYTES} bytes (UTF-8); this one {size}",
                details={"limit": PIN_TEXT_MAX_BYTES, "bytes": size},
            )
        if (command.kind == "correction") != (command.corrects is not None):
            raise InvalidRequest(
                "a correction names the event it corrects (corrects), and only a correction does",
                details={"kind": command.kind, "corrects": command.corrects},
            )
        if command.corrects is not None and command.corrects >= session.next_sequence:
            raise InvalidRequest(
                f"corrects names event {command.corrects}; the conversation has "
                f"{session.next_sequence - 1}",
                details={"corrects": command.corrects, "events": session.next_sequence - 1},
            )
        payload = PinAdded(
            pin_id=new_pin_id(),
            kind=command.kind,
            text=command.text,
            corrects=command.corrects,
            reason=command.reason,
            author=actor,
        )
        event = session.add(payload, actor=actor)
        pin = pin_of(event)
        assert pin is not None  # a pin_added event
        self._check_budget(session, [*session.pins, pin])
        session.pins = [*session.pins, pin]
        run.commit(session)
        return pin

    def remove(
        self, key: ConversationKey, actor: str, pin_id: str, reason: str | None = None
    ) -> None:
        """Remove the active pin ``pin_id`` of ``key`` as ``actor``, in one commit.

        Raises:
            ConversationNotFound: absent, expired, cleared, or another tenant's.
            PinNotFound: no active pin has that id.
            ConversationBusy: as :meth:`add`.
        """
        session, run = self._open(key)
        pin = next((p for p in session.pins if p.id == pin_id), None)
        if pin is None:
            raise PinNotFound(
                f"conversation {key.conversation_id!r} has no active pin {pin_id!r}",
                details={"pin_id": pin_id},
            )
        session.add(
            PinRemoved(pin_id=pin_id, removed_by=actor, reason=reason, pin=pin), actor=actor
        )
        session.pins = [p for p in session.pins if p.id != pin_id]
        run.commit(session)

    def _head(self, key: ConversationKey) -> Head:
        service = self.service
        head = service.store.get_head(key)
        if head is None or not head.is_visible(service.clock()):
            raise ConversationNotFound(f"conversation {key.conversation_id!r} not found")
        return head

    def _open(self, key: ConversationKey) -> tuple[Session, TurnRunner]:
        """A session on the head alone (a pin needs no history), admitted."""
        run = TurnRunner(self.service)
        session = run.session(key, self._head(key), [])
        run.admit(session, Rules())
        return session, run

    def _check_budget(self, session: Session, pins: list[Pin]) -> None:
        """Refuse ``pins`` that would not fit the smallest budget of the models a turn
        of ``session`` may use (the default, the turn's own, every one described), with the
        pins of the user its last turn named (one more read, only with such a user)."""
        service = self.service
        settings = service.settings
        models = {settings.model, *settings.models}
        if session.options.model:
            models.add(session.options.model)
        allowed = settings.models_allowed
        if allowed is not None:
            models |= allowed
        provider = service.provider_for(session.options.provider)
        estimator = service._estimator(provider, session.token_scale)
        sent: list[Message] = []
        if settings.system_prompt:
            sent.append(Message(role="system", content=settings.system_prompt))
        # The pins of the conversation's user (its last turn's) share the block.
        user = session.options.memory_user
        carried = UserPinBook(service.store, session.key.tenant, user).active() if user else []
        block = pin_message(pins, carried)
        assert block is not None  # at least one pin
        sent.append(block)
        tokens = estimator.tokens(sent)
        smallest = min(models, key=lambda name: (settings.context_budget(name), name))
        check_budget(smallest, tokens, settings.context_budget(smallest))
