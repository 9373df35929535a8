"""The scheduled sweep finds the content whose class's retention is due (issue 41).

The first commit of a class with a retention sets the head's ``retention_due`` (in the
commit that raises the class: no write of its own), the store files the head on
``by-wait`` under that hour, and :meth:`Sweeper.expired` (what the hourly schedule runs),
naming no conversation, removes the content and files the head under the time the
content it kept falls due, or under nothing. A conversation with no class is filed
nowhere. The clock is injected and moved; the physical items are checked.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from turnledger.api.schemas import TurnRequest
from turnledger.context.policy import DataPolicy
from turnledger.core.config import Settings
from turnledger.core.models import ConversationKey
from turnledger.ops.sweep import Sweeper
from turnledger.providers.demo import DemoProvider
from turnledger.store import codec, keys
from turnledger.store.base import ConversationStore
from turnledger.turn.pipeline import Conversations

from tests.support import edge
from tests.support.edge import Caller
from tests.support.factories import START, FakeClock, holds_text, raw_item, raw_sort_keys

ANN = Caller(tenant="tenant-a", actor="ann")
#: A card number the policy's detector knows (a test number, not a real card).
CARD = "4111111111111111"
RETENTION = 600
POLICY = DataPolicy.model_validate(
    {
        "version": "v1",
        "classes": [
            {"name": "public"},
            {"name": "pii", "provider_state": False, "retention_seconds": RETENTION},
        ],
        "detectors": [{"class": "pii", "name": "card", "pattern": "\\b4[0-9]{15}\\b"}],
    }
)


@pytest.fixture(autouse=True)
def token_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tokens need a secret: without a keyring, the callback signing key."""
    monkeypatch.setenv("CALLBACK_KEY", "00" * 32)


@pytest.fixture(params=["memory", "moto", "sqlite"])
def store(request: pytest.FixtureRequest) -> ConversationStore:
    """The store on the in-process backend, on DynamoDB (moto) and on SQLite."""
    backend: ConversationStore = request.getfixturevalue(f"{request.param}_store")
    return backend


def _service(store: ConversationStore, clock: FakeClock) -> Conversations:
    return Conversations(
        store=store,
        provider=DemoProvider(),
        settings=Settings(),
        clock=clock.now,
        data_policy=POLICY,
    )


def _sweeper(service: Conversations, clock: FakeClock) -> Sweeper:
    """The scheduled sweep as the composition root builds it (a tenant's policy)."""
    return Sweeper(
        service.store,
        clock=clock.now,
        expire_waits=service.expire_waits,
        policy_of=service.data_policy,
    )


def _filed(store: ConversationStore, key: ConversationKey) -> int | None:
    """The hour ``key``'s ``HEAD`` is filed under on ``by-wait`` (``None``: nowhere)."""
    item = store.head_item(key)
    assert item is not None
    filed = item.get(codec.A_WAIT_BUCKET)
    return None if filed is None else int(str(filed).split("#")[0])


def _hour(at: float) -> int:
    return keys.bucket_of(int(at))


def _holds(service: Conversations, key: ConversationKey, text: str) -> bool:
    """Whether ``text`` is in ``key``'s stored items or in its events as read."""
    store = service.store
    items = [raw_item(store, key, sk) for sk in raw_sort_keys(store, key)]
    events = edge.events(service, ANN, key.conversation_id).events
    stored = any(holds_text(item, text) for item in items if item is not None)
    return stored or any(text in str(e.payload) for e in events)


def test_the_scheduled_sweep_removes_due_content_and_refiles_the_head(
    store: ConversationStore, clock: FakeClock
) -> None:
    service = _service(store, clock)
    key = ANN.key("pii-1")
    edge.turn(service, ANN, "pii-1", TurnRequest(input=f"my card is {CARD}"))
    head = store.get_head(key)
    assert head is not None and head.data_class == "pii"
    assert head.retention_due == START + timedelta(seconds=RETENTION)
    assert _filed(store, key) == _hour(START.timestamp() + RETENTION)

    # Not due yet: the pass lists it (its hour is the current one) and removes nothing.
    clock.advance(RETENTION - 1)
    early = _sweeper(service, clock).expired()
    assert early.contents_removed == 0
    assert _holds(service, key, CARD)

    # A later turn's content (not yet due when the first falls due) stays filed.
    clock.advance(-RETENTION + 1 + 300)
    edge.turn(service, ANN, "pii-1", TurnRequest(input=f"and {CARD[:-1]}2 too"))
    clock.advance(RETENTION - 300 + 1)  # START + RETENTION + 1
    swept = _sweeper(service, clock).expired()
    assert swept.contents_removed >= 2  # the first user message and its answer
    assert swept.complete
    assert not _holds(service, key, CARD)
    assert _holds(service, key, f"{CARD[:-1]}2")
    head = store.get_head(key)
    assert head is not None
    second = START + timedelta(seconds=300 + RETENTION)
    assert head.retention_due == second
    assert _filed(store, key) == _hour(second.timestamp())

    clock.advance(300)  # past the second turn's due
    again = _sweeper(service, clock).expired()
    assert again.contents_removed >= 2
    assert not _holds(service, key, f"{CARD[:-1]}2")
    head = store.get_head(key)
    assert head is not None and head.retention_due is None
    assert _filed(store, key) is None  # nothing due: filed nowhere
    assert _sweeper(service, clock).expired().contents_removed == 0

    # The conversation goes on; its next content is filed again.
    edge.turn(service, ANN, "pii-1", TurnRequest(input="hello again"))
    head = store.get_head(key)
    assert head is not None and head.retention_due is not None
    assert _filed(store, key) is not None


def test_a_plain_turn_of_a_retained_class_writes_no_head(
    store: ConversationStore, clock: FakeClock
) -> None:
    """The due time is set by the commit that raises the class (it writes ``HEAD`` for the
    class anyway) and carried by every later turn: they are one put each, as before."""
    service = _service(store, clock)
    key = ANN.key("pii-2")
    edge.turn(service, ANN, "pii-2", TurnRequest(input=f"my card is {CARD}"))
    stored = store.head_item(key)
    clock.advance(5)
    edge.turn(service, ANN, "pii-2", TurnRequest(input="and the weather?"))
    assert store.head_item(key) == stored


def test_a_conversation_with_no_class_is_filed_nowhere(
    store: ConversationStore, clock: FakeClock
) -> None:
    service = _service(store, clock)
    key = ANN.key("plain-1")
    edge.turn(service, ANN, "plain-1", TurnRequest(input="hello"))
    edge.turn(service, ANN, "plain-1", TurnRequest(input="and again"))
    head = store.get_head(key)
    assert head is not None and head.data_class is None and head.retention_due is None
    assert _filed(store, key) is None
    clock.advance(2 * RETENTION)
    assert _sweeper(service, clock).expired().contents_removed == 0
    assert "and again" in str(edge.events(service, ANN, "plain-1").events)


def test_a_class_raised_later_files_its_older_content_at_once(
    store: ConversationStore, clock: FakeClock
) -> None:
    """A conversation that was plain for a while, then rose to ``pii``: its older content
    is the class's now, so the head is due no later than the rise (early is safe); the
    pass removes what is due and files the head under what it kept."""
    service = _service(store, clock)
    key = ANN.key("rises-1")
    edge.turn(service, ANN, "rises-1", TurnRequest(input="an old plain message"))
    clock.advance(2 * RETENTION)
    edge.turn(service, ANN, "rises-1", TurnRequest(input=f"now {CARD}"))
    head = store.get_head(key)
    assert head is not None and head.retention_due == clock.now()
    swept = _sweeper(service, clock).expired()
    assert swept.contents_removed >= 2  # the plain turn's message and answer
    events = str(edge.events(service, ANN, "rises-1").events)
    assert "an old plain message" not in events
    head = store.get_head(key)
    assert head is not None
    assert head.retention_due == clock.now() + timedelta(seconds=RETENTION)


def test_a_rise_to_a_class_kept_shorter_brings_the_due_time_forward(
    store: ConversationStore, clock: FakeClock
) -> None:
    policy = DataPolicy.model_validate(
        {
            "version": "v2",
            "classes": [
                {"name": "internal", "retention_seconds": 6 * RETENTION},
                {"name": "pii", "retention_seconds": RETENTION},
            ],
            "detectors": [{"class": "pii", "name": "card", "pattern": "\\b4[0-9]{15}\\b"}],
        }
    )
    service = Conversations(
        store=store,
        provider=DemoProvider(),
        settings=Settings(),
        clock=clock.now,
        data_policy=policy,
    )
    key = ANN.key("rises-2")
    edge.turn(service, ANN, "rises-2", TurnRequest(input="a memo of ours", data_class="internal"))
    head = store.get_head(key)
    assert head is not None and head.retention_due == START + timedelta(seconds=6 * RETENTION)
    clock.advance(60)
    edge.turn(service, ANN, "rises-2", TurnRequest(input=f"now {CARD}"))
    head = store.get_head(key)
    assert head is not None and head.data_class == "pii"
    assert head.retention_due == START + timedelta(seconds=RETENTION)
    clock.advance(RETENTION)
    assert _sweeper(service, clock).expired().contents_removed >= 2
    assert "a memo of ours" not in str(edge.events(service, ANN, "rises-2").events)
