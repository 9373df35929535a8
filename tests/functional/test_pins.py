"""Pins in the service (issue 42) on every store backend: a correction marks the event it
corrects and keeps it in the transcript; the head keeps the pins (sealed where content is);
a fork inherits the pins in force at its point; bad pins are refused and store nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest
from turnledger.api.schemas import TurnRequest
from turnledger.context.pins import PINS_PREFIX
from turnledger.core.config import Settings
from turnledger.core.exceptions import ConversationNotFound, InvalidRequest, PinNotFound
from turnledger.core.models import EventKind
from turnledger.store.base import ConversationStore
from turnledger.turn.contexts import turn_calls
from turnledger.turn.pins import PinCommand, Pins
from turnledger.turn.pipeline import Conversations

from tests.support import edge
from tests.support.edge import Caller
from tests.support.factories import FakeClock
from tests.support.providers import Recording

ANN = Caller(tenant="tenant-a", actor="ann")
OPS = "ops"


def service(store: ConversationStore, clock: FakeClock, provider: Recording) -> Conversations:
    return Conversations(
        store=store, provider=provider, settings=replace(Settings()), clock=clock.now
    )


def say(svc: Conversations, text: str, conversation: str = "conv-1") -> None:
    edge.turn(svc, ANN, conversation, TurnRequest(input=text))


def last_context(provider: Recording) -> list[str]:
    return [
        m.content or "" for m in [r for r in provider.requests if r.purpose == "turn"][-1].messages
    ]


def test_a_correction_marks_the_event_it_corrects_and_keeps_it(
    store: ConversationStore, clock: FakeClock
) -> None:
    provider = Recording()
    svc = service(store, clock, provider)
    say(svc, "My order is 7713.")
    pins = Pins(svc)
    key = ANN.key("conv-1")
    fix = pins.add(key, OPS, PinCommand("The order number is 7731.", "correction", corrects=1))
    say(svc, "Where is my order?")
    sent = last_context(provider)
    assert sent[0] == f"{PINS_PREFIX}\n[{fix.id} correction of event 1] The order number is 7731."
    assert sent[1] == f"[corrected by {fix.id}; see the pinned corrections] My order is 7713."
    events = edge.events(svc, ANN, "conv-1", after=0, limit=100).events
    assert events[0].payload["content"] == "My order is 7713."  # the transcript keeps it
    assert [e.kind for e in events][2:4] == [
        EventKind.PIN_ADDED.value,
        EventKind.USER_MESSAGE.value,
    ]
    # The head keeps the pin, read back whole (sealed content included).
    head = store.get_head(key)
    assert head is not None and head.pins == [fix]
    assert pins.active(key) == [fix]
    # The context route's rebuild carries it and hashes as sent.
    [call] = turn_calls(svc, key, 2)
    assert call.matches and [p.id for p in call.pins] == [fix.id]


def test_a_fork_inherits_the_pins_in_force_at_its_point(
    store: ConversationStore, clock: FakeClock
) -> None:
    provider = Recording()
    svc = service(store, clock, provider)
    pins = Pins(svc)
    key = ANN.key("conv-1")
    say(svc, "hello")
    kept = pins.add(key, OPS, PinCommand("Answer in Portuguese.", "fact"))
    gone = pins.add(key, OPS, PinCommand("VIP customer.", "fact"))
    say(svc, "second")
    pins.remove(key, OPS, gone.id, reason="no longer VIP")
    later = pins.add(key, OPS, PinCommand("Ships to Porto.", "fact"))
    say(svc, "third")
    svc.fork(key, "at-one", 1)  # the first two pins were added in turn 1
    svc.fork(key, "at-three", None)
    assert pins.active(ANN.key("at-one")) == [kept, gone]
    assert pins.active(ANN.key("at-three")) == [kept, later]
    say(svc, "on the fork", conversation="at-one")
    assert "VIP customer." in last_context(provider)[0]
    assert pins.active(key) == [kept, later]


def test_bad_pins_are_refused_and_store_nothing(store: ConversationStore, clock: FakeClock) -> None:
    svc = service(store, clock, Recording())
    pins = Pins(svc)
    key = ANN.key("conv-1")
    with pytest.raises(ConversationNotFound):
        pins.add(key, OPS, PinCommand("x", "fact"))
    say(svc, "hello")
    stored = edge.get(svc, ANN, "conv-1").events
    for bad in (
        PinCommand("é" * 1025, "fact"),  # 2050 bytes
        PinCommand("x", "correction"),  # names nothing
        PinCommand("x", "fact", corrects=1),
        PinCommand("x", "correction", corrects=9),
    ):
        with pytest.raises(InvalidRequest):
            pins.add(key, OPS, bad)
    with pytest.raises(PinNotFound):
        pins.remove(key, OPS, "pin_0")
    assert edge.get(svc, ANN, "conv-1").events == stored


def test_a_pin_after_a_turn_leaves_that_turn_as_it_was(
    store: ConversationStore, clock: FakeClock
) -> None:
    """The pin's event is filed under the turn before it; GET .../turns/{n} still shows
    that turn's own end."""
    svc = service(store, clock, Recording())
    say(svc, "hello")
    before = edge.turn_view(svc, ANN, "conv-1", 1)
    clock.advance(60)
    Pins(svc).add(ANN.key("conv-1"), OPS, PinCommand("VIP customer.", "fact"))
    assert edge.turn_view(svc, ANN, "conv-1", 1) == before
