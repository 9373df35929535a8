"""Conversations written by the legacy storage layout are read and continued, no migration.

Issue 21 changes how a turn is stored. Conversations stored before the change stay in
the table as the old store wrote them: one ``E#`` item per event, a full head per
commit, written by one transaction (:mod:`tests.support.legacy_layout`, a frozen copy
of that layout). Each test here creates conversations through the service running on
the legacy layout (plain turns, a call waiting for approval, a summary, a payload
offloaded to the object store), checks that the items really are the legacy ones, and
then reads and continues them with the current store and service on the same table or
database file: new turns, the approval's decision, the events page, export, clear and
the sweep. Backends: moto, DynamoDB Local, SQLite (memory has no file to carry over).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import httpx
import pytest
from turnledger.api.schemas import ApprovalRequest, TurnRequest, TurnResponse
from turnledger.core.config import Settings
from turnledger.core.exceptions import ConversationNotFound
from turnledger.core.models import ConversationKey, Event
from turnledger.ops.sweep import Sweeper
from turnledger.ops.transfer import export_text
from turnledger.providers.demo import DemoProvider
from turnledger.store import keys
from turnledger.store.base import ConversationStore
from turnledger.store.dynamodb import DynamoDBConversationStore
from turnledger.store.sqlite import SQLiteConversationStore
from turnledger.tools import ToolRegistry, ToolRunner
from turnledger.turn.approvals import list_inbox
from turnledger.turn.pipeline import Conversations

from tests.functional.http_sink import HttpSink, Reply
from tests.support import edge
from tests.support.edge import Caller
from tests.support.factories import FakeClock
from tests.support.legacy_layout import (
    EVENT_PREFIX,
    HEAD_SK,
    LegacyDynamoDBStore,
    LegacyLayout,
    LegacySQLiteStore,
    legacy_items,
)

ANN = Caller(tenant="tenant-legacy", actor="ann")
EMAIL = {"to": "ops@example.com", "body": "The nightly report is ready."}
#: Over the 64 KiB offload threshold: the legacy layout put it in the object store.
BIG_CHARS = 70_000
#: Small enough that a few dozen turns compact (a ``context_compacted`` event and a
#: summary on the head).
SUMMARY_BUDGET_TOKENS = 300


@dataclass
class Pair:
    """The legacy and the current store over one table (or file) and one bucket."""

    legacy: ConversationStore
    current: ConversationStore


@pytest.fixture(
    params=[
        pytest.param("moto", id="moto"),
        pytest.param("dynamodb-local", id="dynamodb-local", marks=pytest.mark.integration),
        pytest.param("sqlite", id="sqlite"),
    ]
)
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    """The legacy store and the current one on the same backend."""
    if request.param == "sqlite":
        sqlite: SQLiteConversationStore = request.getfixturevalue("sqlite_store")
        legacy_sqlite = LegacySQLiteStore(sqlite.path, sqlite.blobs)
        yield Pair(legacy=legacy_sqlite, current=sqlite)
        legacy_sqlite.close()
        return
    fixture = "moto_store" if request.param == "moto" else "ddb_local_store"
    dynamodb: DynamoDBConversationStore = request.getfixturevalue(fixture)
    yield Pair(
        legacy=LegacyDynamoDBStore(dynamodb.client, dynamodb.table_name, dynamodb.blobs),
        current=dynamodb,
    )


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        server.respond("/email", Reply(body={"sent": True}))
        yield server


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client() as client:
        yield client


def _registry(sink: HttpSink) -> ToolRegistry:
    definition = {
        "name": "send_email",
        "description": "Send an email.",
        "parameters": {
            "type": "object",
            "properties": {"to": {"type": "string"}, "body": {"type": "string"}},
            "required": ["to"],
        },
        "require_approval": True,
        "executor": {"type": "http", "url": sink.url("/email")},
    }
    return ToolRegistry.from_json(json.dumps({"tools": [definition]}))


def service(
    store: ConversationStore, clock: FakeClock, sink: HttpSink, http: httpx.Client, **settings: Any
) -> Conversations:
    return Conversations(
        store=store,
        provider=DemoProvider(),
        settings=replace(Settings(), **settings),
        tools=_registry(sink),
        runner=ToolRunner(http, None),
        clock=clock.now,
    )


def say(svc: Conversations, conversation: str, text: str) -> TurnResponse:
    return edge.turn(svc, ANN, conversation, TurnRequest(input=text))


def transcript(svc: Conversations, conversation: str) -> list[Event]:
    page = edge.events(svc, ANN, conversation, after=0, limit=1000)
    assert page.next_after is None
    return [Event.model_validate(view.model_dump()) for view in page.events]


def key_of(conversation: str) -> ConversationKey:
    return ConversationKey(tenant=ANN.tenant, conversation_id=conversation)


def raw_items(store: LegacyLayout, conversation: str) -> list[dict[str, Any]]:
    """Every item of the conversation's partition, read raw (no decoding)."""
    pk = keys.partition_key(key_of(conversation))
    found: list[dict[str, Any]] = []
    cursor: Any = None
    while True:
        page = store.legacy.query(
            pk, lower=None, upper=None, descending=False, limit=1000, cursor=cursor
        )
        found.extend(page.items)
        if page.cursor is None:
            return found
        cursor = page.cursor


def assert_legacy_layout(store: LegacyLayout, conversation: str, events: list[Event]) -> None:
    """The conversation is stored as the legacy layout stores it: one item per event."""
    items = raw_items(store, conversation)
    assert [i["sk"] for i in items if i["sk"] == HEAD_SK] == [HEAD_SK]
    per_event = legacy_items(iter(items))
    assert (
        len(per_event)
        == len(events)
        == len([i for i in items if i["sk"] >= EVENT_PREFIX and i["sk"] < "E$"])
    )
    assert [json.loads(i["d"])["id"] for i in per_event] == [e.event_id for e in events]


def test_conversations_of_the_legacy_layout_are_continued_with_no_migration(
    pair: Pair, clock: FakeClock, sink: HttpSink, http: httpx.Client
) -> None:
    assert isinstance(pair.legacy, LegacyLayout)
    old = service(pair.legacy, clock, sink, http)
    compacting_old = service(
        pair.legacy, clock, sink, http, context_max_tokens=SUMMARY_BUDGET_TOKENS
    )

    # --- written by the legacy layout --------------------------------------------------
    for n in range(1, 5):
        say(old, "legacy-plain", f"plain turn {n}: what is stored stays readable")
        clock.advance(1)
    asked = say(old, "legacy-approval", f"/tool send_email {json.dumps(EMAIL)}")
    assert [p.name for p in asked.pending_tool_calls] == ["send_email"]
    for n in range(1, 41):
        say(compacting_old, "legacy-summary", f"turn {n} talks about ledgers and durable state")
        clock.advance(1)
    big = "x" * (BIG_CHARS - 6) + " tail."
    say(old, "legacy-big", big)

    before = {
        c: transcript(old, c)
        for c in ("legacy-plain", "legacy-approval", "legacy-summary", "legacy-big")
    }
    for conversation, events in before.items():
        assert_legacy_layout(pair.legacy, conversation, events)
    summary_head = pair.legacy.get_head(key_of("legacy-summary"))
    assert summary_head is not None and summary_head.summary is not None, "no compaction"
    [big_item] = [
        json.loads(i["d"])
        for i in legacy_items(iter(raw_items(pair.legacy, "legacy-big")))
        if json.loads(i["d"])["kind"] == "user_message"
    ]
    assert "ref" in big_item and "payload" not in big_item, "the big message was not offloaded"

    # --- read by the current store ----------------------------------------------------
    new = service(pair.current, clock, sink, http)
    compacting_new = service(
        pair.current, clock, sink, http, context_max_tokens=SUMMARY_BUDGET_TOKENS
    )
    for conversation, events in before.items():
        assert transcript(new, conversation) == events
        view = edge.get(new, ANN, conversation)
        assert (view.turns, view.events) == (events[-1].turn, len(events))
    assert transcript(new, "legacy-big")[0].payload["content"] == big

    # --- and continued ------------------------------------------------------------------
    for n in range(5, 8):
        reply = say(new, "legacy-plain", f"plain turn {n}: continued by the current store")
        assert reply.turn == n and reply.output_text
        clock.advance(1)
    plain = transcript(new, "legacy-plain")
    assert plain[: len(before["legacy-plain"])] == before["legacy-plain"]
    assert [e.sequence for e in plain] == list(range(1, len(plain) + 1))
    assert [e.payload["content"] for e in plain if e.kind.value == "user_message"] == [
        *(f"plain turn {n}: what is stored stays readable" for n in range(1, 5)),
        *(f"plain turn {n}: continued by the current store" for n in range(5, 8)),
    ]

    [call] = asked.pending_tool_calls
    # The inbox entry the legacy commit wrote with the wait is listed, then decided away.
    waiting = list_inbox(new, ANN.tenant)
    assert [(e.conversation_id, e.call_id) for e in waiting.entries] == [
        ("legacy-approval", call.id)
    ]
    decided = edge.approve(new, ANN, "legacy-approval", ApprovalRequest(approve=[call.id]))
    assert decided.status == "complete" and not decided.pending_tool_calls
    assert [r.json()["arguments"] for r in sink.requests_for("/email")] == [EMAIL]
    assert list_inbox(new, ANN.tenant).entries == []
    after_decision = say(new, "legacy-approval", "thanks")
    assert after_decision.turn == 2
    approval_events = transcript(new, "legacy-approval")
    assert approval_events[: len(before["legacy-approval"])] == before["legacy-approval"]
    assert [e.kind.value for e in approval_events].count("tool_result") == 1

    summarized_through = summary_head.summary.through
    continued = say(compacting_new, "legacy-summary", "turn 41 after the layout change")
    assert continued.turn == 41
    assert continued.context.summary_through is not None
    assert continued.context.summary_through >= summarized_through
    summary_events = transcript(new, "legacy-summary")
    assert summary_events[: len(before["legacy-summary"])] == before["legacy-summary"]

    say(new, "legacy-big", "and a small one after it")
    big_events = transcript(new, "legacy-big")
    assert big_events[0].payload["content"] == big and len(big_events) == 4

    # A fork made now reads its inherited turn from the legacy items (offloaded payload too).
    new.fork(key_of("legacy-big"), "legacy-big-fork", 1)
    # Inherited events read as written in the parent (its id among them).
    assert transcript(new, "legacy-big-fork")[:2] == big_events[:2]
    forked = say(new, "legacy-big-fork", "a turn on the fork")
    assert forked.turn == 2 and len(transcript(new, "legacy-big-fork")) == 4
    edge.clear(new, ANN, "legacy-big-fork")

    exported = export_text(pair.current, key_of("legacy-plain"), clock.now())
    lines = [json.loads(line) for line in exported.splitlines() if line.strip()]
    exported_ids = [line["event"]["event_id"] for line in lines if line["type"] == "event"]
    assert exported_ids == [e.event_id for e in plain]
    assert big in export_text(pair.current, key_of("legacy-big"), clock.now())

    # --- cleared and swept --------------------------------------------------------------
    edge.clear(new, ANN, "legacy-plain")
    with pytest.raises(ConversationNotFound):
        edge.get(new, ANN, "legacy-plain")
    assert [i["sk"] for i in raw_items(pair.legacy, "legacy-plain")] in ([], [HEAD_SK])

    # Past the 7-day TTL, within the first sweep's one-week look-back.
    clock.advance(timedelta(days=7, hours=2).total_seconds())
    report = Sweeper(pair.current, clock=clock.now).expired()
    assert report.conversations_removed == 3
    for conversation in ("legacy-approval", "legacy-summary", "legacy-big"):
        with pytest.raises(ConversationNotFound):
            edge.get(new, ANN, conversation)
        assert [i["sk"] for i in raw_items(pair.legacy, conversation)] in ([], [HEAD_SK])
    assert not list(pair.current.blobs.list_keys(keys.blob_prefix(key_of("legacy-big"))))
