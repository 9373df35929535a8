"""The turn pipeline over every storage backend: the scenarios users hit (issue: the ledger).

Each test drives :class:`Conversations` with the deterministic demo model and
an injected clock; the ``store`` fixture runs it on memory, moto and DynamoDB
Local.
"""

from __future__ import annotations

import re
import threading
from dataclasses import replace

import pytest
from turnledger.api.schemas import TurnRequest
from turnledger.core.config import Settings
from turnledger.core.exceptions import (
    ConversationBusy,
    ConversationNotFound,
    CorruptedState,
    InvalidConversationId,
    ProviderError,
    ProviderTimeout,
    UnsupportedStateVersion,
)
from turnledger.core.models import (
    CONVERSATION_ID_PATTERN,
    SUPPORTED_SCHEMA_VERSIONS,
    ConversationKey,
    validate_conversation_id,
)
from turnledger.providers.base import ModelRequest, Provider
from turnledger.store import keys
from turnledger.store.base import ConversationStore
from turnledger.turn.pipeline import Conversations

from tests.support import edge
from tests.support.concurrency import all_at_once
from tests.support.edge import Caller
from tests.support.factories import FakeClock, corrupt
from tests.support.providers import Recording

ANN = Caller(tenant="tenant-a", actor="ann")
BOB = Caller(tenant="tenant-b", actor="bob")


def service(
    store: ConversationStore,
    clock: FakeClock,
    provider: Provider | None = None,
    **settings: object,
) -> Conversations:
    return Conversations(
        store=store,
        provider=provider or Recording(),
        settings=replace(Settings(), **settings),  # type: ignore[arg-type]
        clock=clock.now,
    )


def say(svc: Conversations, text: str, conversation: str = "conv-1", who: Caller = ANN) -> str:
    reply = edge.turn(svc, who, conversation, TurnRequest(input=text))
    assert reply.output_text is not None
    return reply.output_text


def test_turn_three_remembers_turns_one_and_two(store: ConversationStore, clock: FakeClock) -> None:
    """Turn N's model request holds every earlier user and assistant message, in order."""
    provider = Recording()
    svc = service(store, clock, provider)
    assert say(svc, "My name is Ann.") == "Noted (1 user messages so far)."
    assert say(svc, "I live in Oslo.") == "Noted (2 user messages so far)."
    assert say(svc, "What is my name?") == "Your name is Ann."
    assert say(svc, "And again: what is my name?") == "Your name is Ann."

    last = provider.requests[-1].messages
    assert [(m.role, m.content) for m in last] == [
        ("user", "My name is Ann."),
        ("assistant", "Noted (1 user messages so far)."),
        ("user", "I live in Oslo."),
        ("assistant", "Noted (2 user messages so far)."),
        ("user", "What is my name?"),
        ("assistant", "Your name is Ann."),
        ("user", "And again: what is my name?"),
    ]
    view = edge.get(svc, ANN, "conv-1")
    assert (view.turns, view.events, view.status) == (4, 8, "complete")


def test_interleaved_conversations_share_nothing(
    store: ConversationStore, clock: FakeClock
) -> None:
    """Turns of many conversations interleaved: each remembers only its own history."""
    svc = service(store, clock)
    names = {f"conv-{i}": f"Name{i}" for i in range(5)}
    for conversation, name in names.items():
        say(svc, f"My name is {name}.", conversation)
    for conversation in names:
        say(svc, "Nice weather.", conversation)
    for conversation, name in names.items():
        assert say(svc, "What is my name?", conversation) == f"Your name is {name}."
        assert edge.get(svc, ANN, conversation).events == 6


def test_concurrent_conversations_share_nothing(store: ConversationStore, clock: FakeClock) -> None:
    """Truly concurrent turns on different conversations all commit, each with its own history."""
    svc = service(store, clock)

    def talk(index: int) -> str:
        conversation = f"parallel-{index}"
        say(svc, f"My name is P{index}.", conversation)
        say(svc, "Hello.", conversation)
        return say(svc, "What is my name?", conversation)

    assert all_at_once(8, talk) == [f"Your name is P{index}." for index in range(8)]
    for index in range(8):
        assert edge.get(svc, ANN, f"parallel-{index}").turns == 3


def test_same_id_under_two_tenants_is_two_conversations(
    store: ConversationStore, clock: FakeClock
) -> None:
    """Another tenant's conversation is indistinguishable from a missing one."""
    svc = service(store, clock)
    say(svc, "My name is Ann.", "shared-id", ANN)
    with pytest.raises(ConversationNotFound):
        edge.get(svc, BOB, "shared-id")
    assert say(svc, "What is my name?", "shared-id", BOB) == "I don't know your name yet."
    assert say(svc, "What is my name?", "shared-id", ANN) == "Your name is Ann."
    edge.clear(svc, BOB, "shared-id")
    assert edge.get(svc, ANN, "shared-id").turns == 2


def test_idle_conversation_expires_at_once_and_restarts_fresh(
    store: ConversationStore, clock: FakeClock
) -> None:
    """Past its TTL a conversation is invisible; the next turn starts over under the same id."""
    svc = service(store, clock, ttl_seconds=60)
    say(svc, "My name is Ann.")
    clock.advance(59)
    assert edge.get(svc, ANN, "conv-1").turns == 1
    say(svc, "Still here.")  # refreshes the TTL
    clock.advance(59)
    assert say(svc, "What is my name?") == "Your name is Ann."
    clock.advance(60)
    with pytest.raises(ConversationNotFound):
        edge.get(svc, ANN, "conv-1")
    with pytest.raises(ConversationNotFound):
        edge.events(svc, ANN, "conv-1", after=0, limit=10)
    assert say(svc, "What is my name?") == "I don't know your name yet."
    view = edge.get(svc, ANN, "conv-1")
    assert (view.turns, view.events) == (1, 2)
    page = edge.events(svc, ANN, "conv-1", after=0, limit=10)
    assert [e.sequence for e in page.events] == [1, 2]
    assert page.events[0].payload["content"] == "What is my name?"


def test_ttl_zero_never_expires(store: ConversationStore, clock: FakeClock) -> None:
    """``ttl_seconds=0`` disables idle expiry: no TTL attribute, visible forever."""
    svc = service(store, clock, ttl_seconds=0)
    say(svc, "My name is Ann.")
    clock.advance(10 * 365 * 24 * 3600)
    view = edge.get(svc, ANN, "conv-1")
    assert view.expires_at is None and view.ttl_seconds == 0
    assert say(svc, "What is my name?") == "Your name is Ann."


def test_tenant_ttl_overrides_the_default(store: ConversationStore, clock: FakeClock) -> None:
    """A tenant setting overrides the deployment's TTL (``0`` disables it for that tenant)."""
    svc = service(store, clock, ttl_seconds=60, tenant_ttl_seconds={"tenant-b": 0})
    say(svc, "Hi.", "c", ANN)
    say(svc, "Hi.", "c", BOB)
    clock.advance(3600)
    with pytest.raises(ConversationNotFound):
        edge.get(svc, ANN, "c")
    assert edge.get(svc, BOB, "c").turns == 1


def test_clear_deletes_one_conversation_and_spares_its_siblings(
    store: ConversationStore, clock: FakeClock
) -> None:
    """Clear removes the conversation at once; siblings are untouched; absent is fine."""
    svc = service(store, clock)
    say(svc, "My name is Ann.", "a")
    say(svc, "My name is Bea.", "b")
    report = edge.clear(svc, ANN, "a")
    assert (report.conversations, report.events) == (1, 2)
    with pytest.raises(ConversationNotFound):
        edge.get(svc, ANN, "a")
    assert say(svc, "What is my name?", "b") == "Your name is Bea."
    assert edge.clear(svc, ANN, "never-existed").conversations == 0
    assert say(svc, "What is my name?", "a") == "I don't know your name yet."


@pytest.mark.parametrize("damage", ["head-body", "event-body", "head-version", "event-version"])
def test_damaged_state_fails_loudly_and_delete_recovers(
    store: ConversationStore, clock: FakeClock, damage: str
) -> None:
    """Corrupted or unknown-version items are reported, never guessed at; DELETE recovers."""
    svc = service(store, clock)
    say(svc, "My name is Ann.")
    key = ConversationKey(tenant=ANN.tenant, conversation_id="conv-1")
    target = keys.HEAD_SK if damage.startswith("head") else keys.event_sort_key(1)
    if damage.endswith("body"):
        corrupt(store, key, target, d='{"not": "valid"')
        expected: type[Exception] = CorruptedState
    else:
        corrupt(store, key, target, v=99)
        expected = UnsupportedStateVersion
    with pytest.raises(expected) as raised:
        say(svc, "What is my name?")
    if expected is UnsupportedStateVersion:
        assert raised.value.details["found"] == 99
        assert raised.value.details["supported"] == SUPPORTED_SCHEMA_VERSIONS
    edge.clear(svc, ANN, "conv-1")
    assert say(svc, "What is my name?") == "I don't know your name yet."


def test_racing_turns_one_commits_the_other_is_busy(
    store: ConversationStore, clock: FakeClock
) -> None:
    """Two turns on one conversation: one commits, the other is busy and stores nothing."""
    both_loaded = threading.Barrier(2)
    provider = Recording(before=lambda _request: both_loaded.wait(timeout=10))
    svc = service(store, clock, provider)
    say(service(store, clock), "My name is Ann.")
    racers = ["first racer", "second racer"]

    def turn(index: int) -> object:
        try:
            return say(svc, racers[index])
        except ConversationBusy as exc:
            return exc

    outcomes = dict(zip(racers, all_at_once(len(racers), turn), strict=True))
    busy = [t for t, o in outcomes.items() if isinstance(o, ConversationBusy)]
    assert len(busy) == 1
    page = edge.events(svc, ANN, "conv-1", after=0, limit=100)
    contents = [e.payload.get("content") for e in page.events]
    assert busy[0] not in contents
    assert len(page.events) == 4 and edge.get(svc, ANN, "conv-1").turns == 2


@pytest.mark.parametrize("failure", [ProviderError, ProviderTimeout])
def test_provider_failure_is_recorded_as_turn_failed_and_nothing_else(
    store: ConversationStore, clock: FakeClock, failure: type[ProviderError]
) -> None:
    """A provider failure stores a ``turn_failed`` event and nothing of the turn's input:
    the failure shows in the transcript and GET's counts, never in what the model sees."""

    def fail(_request: ModelRequest) -> None:
        raise failure("the model is down", details={"attempts": 3, "provider_message": "x" * 900})

    svc = service(store, clock)
    say(svc, "My name is Ann.")
    before = edge.get(svc, ANN, "conv-1")
    with pytest.raises(failure):
        say(service(store, clock, Recording(before=fail)), "This is lost.")
    after = edge.get(svc, ANN, "conv-1")
    assert (after.turns, after.events, after.failed_turns) == (before.turns, 3, 1)
    failed = edge.events(svc, ANN, "conv-1", after=2, limit=10).events
    assert [e.kind for e in failed] == ["turn_failed"]
    assert failed[0].turn == 2
    assert failed[0].payload == {
        "code": failure.code,
        "status": failure.status,
        "attempts": 3,
        "message": "x" * 500,
    }
    recording = Recording()
    assert say(service(store, clock, recording), "What is my name?") == "Your name is Ann."
    sent = [m.content for m in recording.requests[-1].messages]
    assert sent == ["My name is Ann.", "Noted (1 user messages so far).", "What is my name?"]
    assert edge.get(svc, ANN, "conv-1").turns == 2
    with pytest.raises(failure):
        say(service(store, clock, Recording(before=fail)), "Also lost.", "new-conv")
    fresh = edge.get(svc, ANN, "new-conv")
    assert (fresh.turns, fresh.events, fresh.failed_turns) == (0, 1, 1)


def test_turn_racing_a_clear_never_resurrects_half_a_history(
    store: ConversationStore, clock: FakeClock
) -> None:
    """A turn that loaded before a clear cannot commit after it: the clear wins whole."""
    svc = service(store, clock)
    say(svc, "My name is Ann.")
    cleared = threading.Event()

    def clear_first(_request: ModelRequest) -> None:
        edge.clear(svc, ANN, "conv-1")
        cleared.set()

    racer = service(store, clock, Recording(before=clear_first))
    with pytest.raises(ConversationBusy):
        say(racer, "I began before the clear.")
    assert cleared.is_set()
    with pytest.raises(ConversationNotFound):
        edge.get(svc, ANN, "conv-1")
    assert say(svc, "What is my name?") == "I don't know your name yet."
    assert [e.sequence for e in edge.events(svc, ANN, "conv-1", after=0, limit=10).events] == [1, 2]


def test_large_message_round_trips_whole_through_s3(
    store: ConversationStore, clock: FakeClock
) -> None:
    """A 600 KB message is offloaded and returned whole by the events route."""
    svc = service(store, clock)
    big = "My name is Ann. " + "x" * 600_000
    say(svc, big)
    assert say(svc, "What is my name?") == "Your name is Ann."
    [first] = edge.events(svc, ANN, "conv-1", after=0, limit=1).events
    assert first.payload["content"] == big


def test_invalid_conversation_id_is_rejected_by_the_one_rule(
    store: ConversationStore, clock: FakeClock
) -> None:
    """Ids break the rule (the edge checks it before any I/O, tests/http); a 128-character
    id that keeps it is a conversation like any other."""
    svc = service(store, clock)
    for bad in ["", "-leading-dash", "has space", "x" * 129, "slash/inside", "hash#inside"]:
        with pytest.raises(InvalidConversationId):
            validate_conversation_id(bad)
        assert not re.fullmatch(CONVERSATION_ID_PATTERN, bad)
    assert say(svc, "hi", "A." + "b" * 126) == "Noted (1 user messages so far)."


def test_events_route_pages_in_sequence_order(store: ConversationStore, clock: FakeClock) -> None:
    """``after``/``limit`` page through the whole transcript; ``next_after`` is None at the end."""
    svc = service(store, clock)
    for i in range(5):
        say(svc, f"message {i}")
    seen: list[int] = []
    after: int | None = 0
    while after is not None:
        page = edge.events(svc, ANN, "conv-1", after=after, limit=3)
        seen.extend(e.sequence for e in page.events)
        after = page.next_after
    assert seen == list(range(1, 11))
