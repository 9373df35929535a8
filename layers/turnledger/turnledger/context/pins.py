"""Pins: facts, constraints and corrections an operator states, carried by every model call.

A pin is an event in the log (``pin_added``, ``pin_removed``) and, while active, part of
the head (:attr:`~turnledger.core.models.Head.pins`), so a turn reads it with the head
whatever its age. The working context (:mod:`.assembly`) sends the active pins as one
system message right after the system prompt, before the recalled memory and the summary::

    Pinned by operators (these override anything below, summaries included):
    [pin_ab12 fact] The customer's confirmed language is Portuguese.
    [pin_cd34 correction of event 5] The order number is 7731, not 7713.

A user's pins (:mod:`turnledger.store.user_pins`, ``/v1/memories/pins``) come first in the
same block, each marked ``user``: ``[pin_ef56 user fact] The customer is a minor.``

Each pin's text is sent verbatim (neither redacted nor cut: an operator wrote it for the
model). The summarizer is never given a pin, and nothing that trims a context to its
budget drops one: a pin that would not fit is refused when it is added
(:func:`check_budget`, ``422 pin_budget_exceeded``). A correction keeps the corrected
event as it is in the transcript; the context marks that event's message with
:func:`correction_mark`.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable

from ..core.exceptions import PinBudgetExceeded
from ..core.models import Event, Pin, PinAdded, PinRemoved
from ..providers.base import Message
from ..store.user_pins import UserPin

#: What the pin block starts with.
PINS_PREFIX = "Pinned by operators (these override anything below, summaries included):"

#: The share of a model's context budget the system prompt and every pin may take
#: together: the rest is the summary's, the recalled memory's and the turns'.
PIN_SHARE = 0.25


def new_pin_id() -> str:
    """A new pin id: ``pin_`` and 16 random hex digits."""
    return f"pin_{secrets.token_hex(8)}"


def pin_line(pin: Pin) -> str:
    """One pin as the block lists it: its id and kind, then its text verbatim."""
    what = pin.kind if pin.corrects is None else f"{pin.kind} of event {pin.corrects}"
    return f"[{pin.id} {what}] {pin.text}"


def user_pin_line(pin: UserPin) -> str:
    """One pin of the conversation's user as the block lists it: marked ``user``."""
    return f"[{pin.id} user {pin.kind}] {pin.text}"


def pin_message(pins: Iterable[Pin], user_pins: Iterable[UserPin] = ()) -> Message | None:
    """The pin block of the user's ``user_pins`` then the conversation's ``pins`` (each
    oldest first), or ``None`` when there is none."""
    lines = [*(user_pin_line(pin) for pin in user_pins), *(pin_line(pin) for pin in pins)]
    if not lines:
        return None
    return Message(role="system", content="\n".join([PINS_PREFIX, *lines]))


def correction_mark(pin_ids: Iterable[str]) -> str:
    """What starts the message of an event a correction names."""
    return f"[corrected by {', '.join(pin_ids)}; see the pinned corrections] "


def corrected(pins: Iterable[Pin]) -> dict[int, list[str]]:
    """The sequences the corrections among ``pins`` name, each with their pin ids."""
    found: dict[int, list[str]] = {}
    for pin in pins:
        if pin.corrects is not None:
            found.setdefault(pin.corrects, []).append(pin.id)
    return found


def pin_of(event: Event) -> Pin | None:
    """The pin a ``pin_added`` event adds (``None`` for any other event)."""
    body = event.body()
    if not isinstance(body, PinAdded):
        return None
    return Pin(
        id=body.pin_id,
        kind=body.kind,
        text=body.text,
        corrects=body.corrects,
        reason=body.reason,
        author=body.author,
        added_at=event.occurred_at,
        sequence=event.sequence,
    )


def pins_before(active: Iterable[Pin], later: Iterable[Event], through: int) -> list[Pin]:
    """The pins in force at sequence ``through``, from the pins ``active`` now and the
    events ``later`` than ``through``: those added since are left out, those removed since
    are put back (a ``pin_removed`` holds the pin as it stood)."""
    pins: dict[str, Pin] = {pin.id: pin for pin in active if pin.sequence <= through}
    for event in later:
        body = event.body() if event.sequence > through else None
        if isinstance(body, PinRemoved) and body.pin.sequence <= through:
            pins[body.pin.id] = body.pin
    return sorted(pins.values(), key=lambda pin: pin.sequence)


def pins_through(events: Iterable[Event], through: int | None = None) -> list[Pin]:
    """The pins in force after ``events`` (oldest first; only those up to ``through``
    when given): every ``pin_added`` not followed by its ``pin_removed``."""
    pins: dict[str, Pin] = {}
    for event in events:
        if through is not None and event.sequence > through:
            break
        pin = pin_of(event)
        if pin is not None:
            pins[pin.id] = pin
            continue
        body = event.body()
        if isinstance(body, PinRemoved):
            pins.pop(body.pin_id, None)
    return sorted(pins.values(), key=lambda pin: pin.sequence)


def check_budget(model: str, tokens: int, budget: int) -> None:
    """Refuse pins whose block, with the system prompt (``tokens`` together, by ``model``'s
    estimate), would take more than :data:`PIN_SHARE` of ``model``'s context ``budget``.

    Raises:
        PinBudgetExceeded: names the model, the share and what the pins would take.
    """
    share = int(budget * PIN_SHARE)
    if tokens > share:
        raise PinBudgetExceeded(
            f"the pins and the system prompt would take about {tokens} tokens of {model}'s "
            f"context; they may take {share}",
            details={"model": model, "limit": share, "tokens": tokens},
        )
