"""Export and import over every storage backend (the ``store`` fixture): round trips that answer
the same, offloaded payloads, approvals, and invalid imports that leave nothing behind."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
from turnledger.api.schemas import ApprovalRequest, TurnRequest
from turnledger.context.assembly import build_messages
from turnledger.core.config import Settings
from turnledger.core.exceptions import (
    ConversationExists,
    ConversationNotFound,
    ImportTooLarge,
    InvalidRequest,
    PayloadTooLarge,
    RequestValidationFailed,
    TurnledgerError,
)
from turnledger.core.models import ConversationKey, ConversationStatus, Event, EventKind, Usage
from turnledger.ops.sweep import Sweeper
from turnledger.ops.transfer import (
    IMPORT_ACTOR,
    InlineExport,
    LinkedExport,
    export_text,
    import_text,
    renumbered,
)
from turnledger.ops.transfer import export as export_answer
from turnledger.providers.base import Message
from turnledger.providers.history import build_strict_history, check_strict_history
from turnledger.store import keys
from turnledger.store import purge as purge_protocol
from turnledger.store.base import ConversationStore
from turnledger.store.blobs import S3BlobStore
from turnledger.store.dynamodb import DynamoDBConversationStore
from turnledger.tools import ToolRegistry, ToolRunner
from turnledger.turn.pipeline import Conversations

from tests.functional.http_sink import HttpSink, Reply
from tests.support import edge
from tests.support.edge import Caller
from tests.support.factories import FakeClock, data_sort_keys
from tests.support.providers import Recording

ANN = Caller(tenant="tenant-a", actor="ann")
BOB = Caller(tenant="tenant-b", actor="bob")
BIG = "y" * 600_000
LIMIT = Settings().max_input_bytes


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        server.respond("/email", Reply(body={"sent": True}))
        yield server


@pytest.fixture
def service(store: ConversationStore, clock: FakeClock, sink: HttpSink) -> Iterator[Conversations]:
    tools = {
        "tools": [
            {
                "name": "send_email",
                "parameters": {"type": "object", "properties": {"to": {"type": "string"}}},
                "require_approval": True,
                "executor": {"type": "http", "url": sink.url("/email")},
            }
        ]
    }
    with httpx.Client() as http:
        yield Conversations(
            store=store,
            provider=Recording(),
            settings=replace(Settings()),
            tools=ToolRegistry.from_json(json.dumps(tools)),
            runner=ToolRunner(http, None),
            clock=clock.now,
        )


def say(svc: Conversations, text: str, conversation: str, who: Caller = ANN) -> str:
    reply = edge.turn(svc, who, conversation, TurnRequest(input=text))
    assert reply.output_text is not None
    return reply.output_text


def export(svc: Conversations, conversation: str, who: Caller = ANN) -> str:
    key = ConversationKey(tenant=who.tenant, conversation_id=conversation)
    return export_text(svc.store, key, svc.clock())


def load(svc: Conversations, conversation: str, text: str, who: Caller = ANN) -> None:
    key = ConversationKey(tenant=who.tenant, conversation_id=conversation)
    import_text(
        svc.store, key, text, actor=who.actor, now=svc.clock(), ttl_seconds=3600, max_bytes=LIMIT
    )


def transcript(svc: Conversations, conversation: str, who: Caller = ANN) -> list[Event]:
    page = edge.events(svc, who, conversation, after=0, limit=1000)
    return [Event.model_validate(view.model_dump()) for view in page.events]


def comparable(events: list[Event]) -> list[dict[str, Any]]:
    """The events as their source wrote them: an import's opening event left out, and each
    imported event's sequence, actor and payload as the export had them."""
    source = [
        e.model_copy(
            update={
                "sequence": e.imported.source_sequence,
                "actor": e.imported.claimed_actor,
                "payload": renumbered(e, -1),
                "imported": None,
            }
        )
        if e.imported is not None
        else e
        for e in events
        if e.kind is not EventKind.CONVERSATION_IMPORTED
    ]
    return [e.model_dump(mode="json", exclude={"conversation_id"}) for e in source]


def leaves_nothing(store: ConversationStore, key: ConversationKey) -> bool:
    """No head, no item and no object of ``key``: as if no import was ever tried (the
    gravestones a purge leaves at recently written slots hold no data, docs/STORAGE.md)."""
    return not data_sort_keys(store, key) and not list(store.blobs.list_keys(keys.blob_prefix(key)))


def test_a_round_trip_under_another_tenant_answers_the_same(service: Conversations) -> None:
    """Export → import under another id and tenant: the same events, a strict history, and the
    demo model still knows the name; a 600 KB offloaded message comes back whole."""
    say(service, BIG, "orig")
    say(service, "My name is Ada.", "orig")
    text = export(service, "orig")
    head, *lines = [json.loads(line) for line in text.splitlines()]
    assert head["type"] == "conversation" and head["schema_version"] == 1
    assert head["turns"] == 2 and head["events"] == 4
    assert lines[0]["event"]["payload"]["content"] == BIG  # inline, fetched from the blobs

    load(service, "copy", text, who=BOB)
    assert comparable(transcript(service, "copy", BOB)) == comparable(transcript(service, "orig"))
    messages = build_messages(transcript(service, "copy", BOB))
    check_strict_history(build_strict_history([*messages, Message(role="user", content="x")]))
    copy = ConversationKey(tenant=BOB.tenant, conversation_id="copy")
    assert list(service.store.blobs.list_keys(keys.blob_prefix(copy)))  # offloaded again
    assert say(service, "What is my name?", "copy", BOB) == "Your name is Ada."
    view = edge.get(service, BOB, "copy")
    # 8: the 600 KB turn is past the history read window, so a summary covers it first.
    assert (view.turns, view.events, view.status) == (3, 8, "complete")
    with pytest.raises(ConversationNotFound):
        edge.get(service, BOB, "orig")  # the tenant is the importer's, never the file's


def test_a_conversation_with_approvals_round_trips(service: Conversations, sink: HttpSink) -> None:
    """Approved and rejected calls, their results and decisions, travel with the export."""
    paused = edge.turn(
        service, ANN, "tools", TurnRequest(input='/tool send_email {"to": "a@x.io"}')
    )
    edge.approve(service, ANN, "tools", ApprovalRequest(approve=[paused.pending_tool_calls[0].id]))
    paused = edge.turn(
        service, ANN, "tools", TurnRequest(input='/tool send_email {"to": "b@x.io"}')
    )
    edge.approve(service, ANN, "tools", ApprovalRequest(reject=[paused.pending_tool_calls[0].id]))
    load(service, "tools-copy", export(service, "tools"))
    kinds = [e.kind.value for e in transcript(service, "tools-copy")]
    assert kinds.count("approval_resolved") == 2 and "tool_result" in kinds
    assert comparable(transcript(service, "tools-copy")) == comparable(transcript(service, "tools"))
    assert say(service, "Thanks.", "tools-copy")
    assert len(sink.requests_for("/email")) == 1  # nothing ran again


def test_an_import_is_marked_and_its_approvals_are_claims_of_the_source(
    service: Conversations, sink: HttpSink
) -> None:
    """A forged export (an approval "by ceo@acme", a made-up tool output, usage zeroed) is
    imported as what it is: a ``conversation_imported`` event by the importer opens the
    history, every imported event has the actor ``import`` and an import mark keeping the
    source's actor as a claim, and usage is recomputed from the answers, not the head line."""
    paused = edge.turn(
        service, ANN, "forge", TurnRequest(input='/tool send_email {"to": "a@x.io"}')
    )
    edge.approve(service, ANN, "forge", ApprovalRequest(approve=[paused.pending_tool_calls[0].id]))
    source = transcript(service, "forge")
    used = edge.get(service, ANN, "forge").usage
    assert used.input_tokens > 0

    def forge(lines: list[dict[str, Any]]) -> None:
        lines[0]["usage"], lines[0]["cost_usd"] = {"input_tokens": 0, "output_tokens": 0}, 0.0
        for line in lines[1:]:
            event = line["event"]
            event["actor"] = "ceo@acme"
            if event["kind"] == "approval_resolved":
                event["payload"]["approver"] = "ceo@acme"
            if event["kind"] == "tool_result":
                event["payload"]["output"] = '{"sent": true, "to": "everyone@acme"}'

    text = _edit(export(service, "forge"), forge)
    load(service, "forged", text, who=BOB)
    events = transcript(service, "forged", BOB)
    opening = events[0]
    assert (opening.sequence, opening.turn, opening.kind, opening.actor, opening.imported) == (
        1,
        0,
        EventKind.CONVERSATION_IMPORTED,
        "bob",
        None,
    )
    body = opening.payload
    assert body["imported_by"] == "bob" and body["source_conversation_id"] == "forge"
    assert body["events"] == len(source) and len(body["export_sha256"]) == 64
    assert Usage.model_validate(body["usage_carried_over"]) == used  # recomputed, not zero
    assert edge.get(service, BOB, "forged").usage == used
    for event, original in zip(events[1:], source, strict=True):
        assert event.actor == IMPORT_ACTOR  # never the source's actor, never the importer
        assert event.imported is not None
        assert (event.imported.imported_by, event.imported.source_conversation_id) == (
            "bob",
            "forge",
        )
        assert event.imported.imported_at == opening.occurred_at
        assert event.imported.source_sequence == original.sequence == event.sequence - 1
        assert event.imported.claimed_actor == "ceo@acme"
    resolved = [e for e in events if e.kind is EventKind.APPROVAL_RESOLVED]
    assert resolved and all(e.imported and e.actor == IMPORT_ACTOR for e in resolved)
    assert say(service, "Thanks.", "forged", BOB)  # the imported conversation goes on
    after = transcript(service, "forged", BOB)[len(events) :]
    assert after and all(e.imported is None and e.actor == "bob" for e in after[:1])
    assert len(sink.requests_for("/email")) == 1  # nothing ran again

    # Imported again (a copy of the copy): the first source's claims stay the claims.
    load(service, "forged-again", export(service, "forged", BOB), who=ANN)
    again = transcript(service, "forged-again")
    assert again[0].kind is EventKind.CONVERSATION_IMPORTED and again[0].actor == "ann"
    assert again[1].imported is not None and again[1].imported.claimed_actor == "bob"
    assert again[2].imported is not None and again[2].imported.claimed_actor == "ceo@acme"


def test_an_import_onto_a_taken_id_is_refused(service: Conversations) -> None:
    """409 conversation_exists; a cleared id is free again."""
    say(service, "Hello.", "one")
    text = export(service, "one")
    with pytest.raises(ConversationExists):
        load(service, "one", text)
    edge.clear(service, ANN, "one")
    load(service, "one", text)
    assert edge.get(service, ANN, "one").turns == 1


def test_a_conversation_with_pending_calls_is_not_imported(service: Conversations) -> None:
    """A paused turn exports (a backup), but is refused on import: decide it first."""
    edge.turn(service, ANN, "paused", TurnRequest(input='/tool send_email {"to": "a@x.io"}'))
    with pytest.raises(RequestValidationFailed, match="pending"):
        load(service, "paused-copy", export(service, "paused"))


def _edit(text: str, change: Callable[[list[dict[str, Any]]], None]) -> str:
    lines = [json.loads(line) for line in text.splitlines()]
    change(lines)
    return "".join(json.dumps(line) + "\n" for line in lines)


def _set(index: int, path: tuple[str, ...], value: Any) -> Callable[[list[dict[str, Any]]], None]:
    def change(lines: list[dict[str, Any]]) -> None:
        target = lines[index]
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value

    return change


def _edit_both_ids(lines: list[dict[str, Any]]) -> None:
    lines[1]["event"]["event_id"] = lines[2]["event"]["event_id"] = "same"


def _unanswered_call(lines: list[dict[str, Any]]) -> None:
    # The assistant's answer replaced by a tool call whose result never came.
    call = {"id": "call_9", "name": "send_email", "arguments": {}}
    lines[2]["event"]["payload"] = {"content": None, "tool_calls": [call], "model": "demo"}


INVALID: dict[str, tuple[Callable[[list[dict[str, Any]]], None], type[TurnledgerError], str]] = {
    "turn 0": (_set(1, ("event", "turn"), 0), RequestValidationFailed, "turn 0"),
    "head version": (_set(0, ("schema_version",), 2), RequestValidationFailed, "schema_version"),
    "event line version": (_set(1, ("schema_version",), 9), RequestValidationFailed, "version"),
    "event version": (
        _set(1, ("event", "schema_version"), 99),
        RequestValidationFailed,
        "schema_version",
    ),
    "no head": (lambda lines: lines.pop(0), RequestValidationFailed, "conversation line"),
    "a gap": (lambda lines: lines.pop(2), RequestValidationFailed, "sequence"),
    "a repeat": (_set(2, ("event", "sequence"), 1), RequestValidationFailed, "sequence"),
    "unknown kind": (_set(1, ("event", "kind"), "telepathy"), RequestValidationFailed, "event"),
    "payload unlike its kind": (
        _set(1, ("event", "payload"), {"content": 5}),
        RequestValidationFailed,
        "event",
    ),
    "turn going back": (_set(4, ("event", "turn"), 1), RequestValidationFailed, "turn"),
    "count": (_set(0, ("events",), 9), RequestValidationFailed, "event lines"),
    "history not strict": (_unanswered_call, RequestValidationFailed, "history"),
    "repeated event id": (_edit_both_ids, RequestValidationFailed, "event_id"),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_an_invalid_import_leaves_nothing(service: Conversations, case: str) -> None:
    """Each rule: the import is refused with a clear error, and nothing of it is stored."""
    say(service, "My name is Ada.", "src")
    say(service, "Hello again.", "src")
    text = export(service, "src")
    change, error, message = INVALID[case]
    with pytest.raises(error, match=message):
        load(service, "dst", _edit(text, change))
    assert leaves_nothing(service.store, ConversationKey(tenant="tenant-a", conversation_id="dst"))


def test_bytes_that_are_no_export_are_refused(service: Conversations) -> None:
    key = ConversationKey(tenant="tenant-a", conversation_id="dst")
    for text, error in [("", RequestValidationFailed), ("not json\n", InvalidRequest)]:
        with pytest.raises(error):
            load(service, "dst", text)
    with pytest.raises(InvalidRequest):
        load(service, "dst", "[1, 2]\n")
    with pytest.raises(PayloadTooLarge):
        import_text(
            service.store,
            key,
            "x" * 100,
            actor="ann",
            now=service.clock(),
            ttl_seconds=0,
            max_bytes=10,
        )
    assert leaves_nothing(service.store, key)


def test_an_import_that_fails_midway_leaves_nothing_visible(
    service: Conversations, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More than one commit's worth of events; the flip refused: nothing is visible, and what
    was staged is removed. A crash (no clean-up at all) leaves a hidden tombstone, which
    whatever finishes a purge that died removes whole."""
    store = service.store
    for n in range(60):  # 120 events: two staging commits
        say(service, f"Message {n}.", "long")
    text = export(service, "long")
    key = ConversationKey(tenant="tenant-a", conversation_id="dst")

    monkeypatch.setattr(store, "_replace_head", lambda head, expected: False)
    with pytest.raises(TurnledgerError):
        load(service, "dst", text)
    monkeypatch.undo()
    with pytest.raises(ConversationNotFound):
        edge.get(service, ANN, "dst")
    assert leaves_nothing(store, key)

    # A crash after the staging writes: the flip and the clean-up never happen. What is
    # left is a hidden tombstone, finished like any purge that died: by DELETE, by the
    # on-demand sweep, or (on DynamoDB) by its TTL and the stream's reclaim.
    for finish in (
        lambda: edge.clear(service, ANN, "dst"),
        lambda: Sweeper(store, clock=clock.now).conversations([key]),
        lambda: Sweeper(store, clock=clock.now).reclaim([key]),
    ):
        monkeypatch.setattr(store, "_replace_head", lambda head, expected: False)
        monkeypatch.setattr(purge_protocol, "purge", lambda store, key, item, now: None)
        with pytest.raises(TurnledgerError):
            load(service, "dst", text)
        monkeypatch.undo()
        staged = store.get_head(key)
        assert staged is not None and staged.status is ConversationStatus.CLEARED
        with pytest.raises(ConversationNotFound):
            edge.get(service, ANN, "dst")
        finish()
        assert leaves_nothing(store, key)
    load(service, "dst", text)  # the id is free
    assert edge.get(service, ANN, "dst").events == 121


def test_an_import_over_the_event_cap_is_refused_and_leaves_nothing(
    service: Conversations,
) -> None:
    """IMPORT_MAX_EVENTS: counted before anything is parsed or written, 413 import_too_large."""
    say(service, "Hello.", "capped")
    say(service, "Hello again.", "capped")
    key = ConversationKey(tenant=ANN.tenant, conversation_id="capped-copy")
    with pytest.raises(ImportTooLarge) as refused:
        import_text(
            service.store,
            key,
            export(service, "capped"),
            actor="ann",
            now=service.clock(),
            ttl_seconds=0,
            max_bytes=LIMIT,
            max_events=3,
        )
    assert (refused.value.status, refused.value.code) == (413, "import_too_large")
    assert refused.value.details == {"limit_events": 3, "events": 4}
    assert leaves_nothing(service.store, key)


def test_an_export_over_the_inline_limit_is_written_whole_and_linked(
    service: Conversations,
) -> None:
    """Over ``inline_max_bytes`` (JSON-escaped): a store that makes URLs (S3) writes the export
    under the conversation's life and answers its URL; one that does not answers inline.
    Either way the content is the export, and clearing the conversation removes the object."""
    say(service, "é" * 50_000, "linked")  # 100 KB of UTF-8, 300 KB escaped
    key = ConversationKey(tenant=ANN.tenant, conversation_id="linked")
    whole = export(service, "linked")
    answer = export_to(service.store, key, service.clock(), inline_max_bytes=200_000)
    if not service.store.blobs.makes_urls:
        assert isinstance(answer, InlineExport) and answer.text == whole
        return
    assert isinstance(answer, LinkedExport)
    assert answer.bytes == len(whole.encode())
    assert answer.expires_at == service.clock() + timedelta(seconds=60)
    head = service.store.get_head(key)
    assert head is not None
    assert service.store.blobs.get(keys.export_key(key, head.gen)) == whole.encode()
    small = export_to(service.store, key, service.clock(), inline_max_bytes=400_000)
    assert isinstance(small, InlineExport) and small.text == whole
    edge.clear(service, ANN, "linked")
    assert leaves_nothing(service.store, key)


def export_to(
    store: ConversationStore, key: ConversationKey, now: datetime, *, inline_max_bytes: int
) -> InlineExport | LinkedExport:
    return export_answer(store, key, now, inline_max_bytes=inline_max_bytes, url_ttl_seconds=60)


def test_s3_streams_a_large_object_in_parts_and_aborts_a_failed_one(
    moto_store: DynamoDBConversationStore,
) -> None:
    """``put_stream`` over one part: a multipart upload, one part in memory at a time; a
    stream that fails midway leaves no object and no open upload."""
    blobs = moto_store.blobs
    assert isinstance(blobs, S3BlobStore)
    chunk = b"0123456789abcdef" * (1024 * 1024 // 16)  # 1 MiB
    size = blobs.put_stream("t/x/big.ndjson", (chunk for _ in range(20)), "application/x-ndjson")
    assert size == 20 * len(chunk) and blobs.get("t/x/big.ndjson") == chunk * 20

    def failing() -> Iterator[bytes]:
        yield from (chunk for _ in range(10))
        raise RuntimeError("the export failed midway")

    with pytest.raises(RuntimeError):
        blobs.put_stream("t/x/failed.ndjson", failing(), "application/x-ndjson")
    assert list(blobs.list_keys("t/x/failed")) == []
    client = blobs._client
    assert not client.list_multipart_uploads(Bucket=blobs._bucket).get("Uploads")


def test_pins_round_trip_renumbered_and_active(service: Conversations) -> None:
    """Issue 42: an imported conversation's head holds the source's active pins, their
    sequences (and a correction's target) moved with the renumbered events."""
    from turnledger.turn.pins import PinCommand, Pins

    say(service, "My order is 7713.", "pinned")
    pins = Pins(service)
    key = ANN.key("pinned")
    fix = pins.add(key, "ops", PinCommand("Order 7731.", "correction", corrects=1))
    gone = pins.add(key, "ops", PinCommand("VIP.", "fact"))
    pins.remove(key, "ops", gone.id)
    load(service, "pinned-copy", export(service, "pinned"), who=BOB)
    copy = ConversationKey(tenant=BOB.tenant, conversation_id="pinned-copy")
    [pin] = pins.active(copy)
    assert (pin.id, pin.text, pin.sequence, pin.corrects) == (fix.id, fix.text, 4, 2)
    events = transcript(service, "pinned-copy", BOB)
    assert events[5].payload["pin"]["sequence"] == 5  # the removed pin's own, renumbered
    assert comparable(events) == comparable(transcript(service, "pinned"))
