"""Export and import: a conversation as NDJSON, for migrations and backups.

The format (one JSON object a line, every line schema-versioned):

* the head line: ``{"type": "conversation", "schema_version": 1,
  "conversation_id", "status", "turns", "events", "created_at",
  "updated_at", "usage", "cost_usd", "failed_turns", "options"}``;
* then one line per event, in sequence order, its payload inline (offloaded
  payloads fetched): ``{"type": "event", "schema_version": 1, "event":
  {"event_id", "sequence", "turn", "kind", "actor", "occurred_at",
  "payload", "schema_version"}}`` (and ``"imported"``, the :class:`ImportMark` of an
  event that came from an earlier import).

An import is checked whole before anything is written (line types and
versions, sequences ``1..n`` without gaps, kinds and payloads, turn numbers
that never go back, a history a strict chat API accepts, no pending calls,
sizes) and is written all or nothing
(:meth:`~turnledger.store.base.ConversationStore.import_conversation`), opened by a
``conversation_imported`` event and with every imported event marked as the
source's claim (:func:`with_provenance`). The
conversation gets the importing tenant's TTL; provider-side state (stored
responses) is not carried over: the next turn sends the history afresh.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import Field, ValidationError

from ..context.assembly import build_messages, latest_summary
from ..context.pins import pins_through
from ..core.exceptions import (
    ConversationNotFound,
    ImportTooLarge,
    InternalError,
    InvalidHistory,
    InvalidRequest,
    PayloadTooLarge,
    RequestValidationFailed,
)
from ..core.models import (
    MAX_CALL_ID_CHARS,
    SCHEMA_VERSION,
    SUPPORTED_SCHEMA_VERSIONS,
    AssistantMessage,
    ContextCompacted,
    ConversationImported,
    ConversationKey,
    DataClassRaised,
    Event,
    EventKind,
    Head,
    ImportMark,
    PinAdded,
    PinRemoved,
    SummaryRef,
    ToolCallRequested,
    ToolResult,
    TurnOptions,
    Usage,
    _Strict,
)
from ..core.strict_json import MAX_DEPTH, BodyError, parse
from ..providers.base import Message
from ..providers.history import build_strict_history, check_strict_history
from ..store import keys
from ..store.base import ConversationStore
from ..store.imports import import_conversation
from ..turn.lifecycle import is_running, status_for
from ..turn.session import new_event_id

#: The version of the export format's lines this build writes and reads.
EXPORT_SCHEMA_VERSION = 1
#: The media type of an export.
NDJSON = "application/x-ndjson"
#: The actor of every event an import brings in (the source's actor is kept as a claim).
IMPORT_ACTOR = "import"
#: Events read per page while exporting.
_PAGE = 500
#: How many levels an export line adds above what a request body held (line, event,
#: payload, tool calls, call, arguments), with a margin.
_LINE_WRAPPING = 8


class ExportHead(_Strict):
    """The first line of an export: the conversation's state."""

    type: Literal["conversation"]
    schema_version: int
    conversation_id: str
    status: str
    turns: int = Field(ge=0)
    events: int = Field(ge=1)
    created_at: datetime
    updated_at: datetime
    usage: Usage = Field(default_factory=Usage)
    cost_usd: float = Field(default=0.0, ge=0)
    failed_turns: int = Field(default=0, ge=0)
    options: TurnOptions = Field(default_factory=TurnOptions)
    pending_tool_calls: int = Field(default=0, ge=0)


class ExportEvent(_Strict):
    """A line of an export after the head: one event, its payload inline."""

    type: Literal["event"]
    schema_version: int
    event: dict[str, Any]


def _line(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False) + "\n"


def export_lines(store: ConversationStore, key: ConversationKey, head: Head) -> Iterator[str]:
    """The export of the conversation whose visible head is ``head``, line by line.

    Raises:
        CorruptedState, UnsupportedStateVersion: an event cannot be read.
    """
    status = "running" if is_running(head) else head.status.value
    yield _line(
        ExportHead(
            type="conversation",
            schema_version=EXPORT_SCHEMA_VERSION,
            conversation_id=key.conversation_id,
            status=status,
            turns=head.turn,
            events=max(head.event_count, 1),
            created_at=head.created_at,
            updated_at=head.updated_at,
            usage=head.usage,
            cost_usd=head.cost_usd,
            failed_turns=head.failed_turns,
            options=head.options,
            pending_tool_calls=len(head.pending),
        ).model_dump(mode="json")
    )
    after = 0
    while after < head.event_count:
        events = store.read_events(key, head, after=after, limit=_PAGE)
        for event in events:
            # ``imported`` only where it is set: an export of a conversation made here
            # reads as it did before imports were marked.
            body = event.model_dump(
                mode="json",
                exclude={"conversation_id"} | ({"imported"} if not event.imported else set()),
            )
            yield _line({"type": "event", "schema_version": EXPORT_SCHEMA_VERSION, "event": body})
        if not events:
            break
        after = events[-1].sequence


def _visible_head(store: ConversationStore, key: ConversationKey, now: datetime) -> Head:
    head = store.get_head(key)
    if head is None or not head.is_visible(now):
        raise ConversationNotFound(f"conversation {key.conversation_id!r} not found")
    return head


def export_text(store: ConversationStore, key: ConversationKey, now: datetime) -> str:
    """The whole export of ``key`` as one string (the CLI's; the API answers :func:`export`).

    Raises:
        ConversationNotFound: absent, expired, cleared.
    """
    return "".join(export_lines(store, key, _visible_head(store, key, now)))


@dataclass(frozen=True)
class InlineExport:
    """An export small enough to answer in the response body."""

    text: str


@dataclass(frozen=True)
class LinkedExport:
    """An export written to the blob store, fetched through a short-lived URL."""

    url: str
    expires_at: datetime
    #: The export's size in bytes (UTF-8).
    bytes: int


def _escaped_size(line: str) -> int:
    # What the line weighs inside Lambda's JSON response: escaped, non-ASCII as \uXXXX.
    return len(json.dumps(line)) - 2


def export(
    store: ConversationStore,
    key: ConversationKey,
    now: datetime,
    *,
    inline_max_bytes: int,
    url_ttl_seconds: int,
    reader: Callable[[str], str] | None = None,
) -> InlineExport | LinkedExport:
    """The export of ``key``: inline while it weighs at most ``inline_max_bytes`` as a
    JSON-escaped response body; else streamed to the blob store (never whole in memory)
    under :func:`~turnledger.store.keys.export_key` and answered with a URL valid for
    ``url_ttl_seconds``. A blob store without URLs (files, memory) answers inline at any size.
    ``reader``: what each line becomes for the caller (the data policy's tokens for values
    it may not read), inline and linked alike.

    Raises:
        ConversationNotFound: absent, expired, cleared.
    """
    head = _visible_head(store, key, now)
    lines = export_lines(store, key, head)
    if reader is not None:
        lines = map(reader, lines)
    taken: list[str] = []
    weight = 0
    for line in lines:
        taken.append(line)
        weight += _escaped_size(line)
        if weight > inline_max_bytes and store.blobs.makes_urls:
            break
    else:
        return InlineExport(text="".join(taken))
    object_key = keys.export_key(key, head.gen)
    size = store.blobs.put_stream(
        object_key,
        (line.encode("utf-8") for line in itertools.chain(taken, lines)),
        NDJSON,
    )
    url = store.blobs.download_url(object_key, url_ttl_seconds)
    if url is None:
        raise InternalError("the blob store wrote the export but made no URL for it")
    return LinkedExport(url=url, expires_at=now + timedelta(seconds=url_ttl_seconds), bytes=size)


def split_lines(text: str) -> list[str]:
    """The lines of an export: split on ``\n`` only (a ``\r`` before it goes too).

    Not :meth:`str.splitlines`, which also splits on U+2028, U+2029, U+0085 and other
    characters JSON strings hold raw: an export of ordinary text would not read back.
    """
    return [line.removesuffix("\r") for line in text.split("\n")]


def _invalid(line: int, reason: str) -> RequestValidationFailed:
    return RequestValidationFailed(
        f"import line {line}: {reason}", details={"line": line, "reason": reason}
    )


def _parse_line(number: int, raw: str) -> dict[str, Any]:
    try:
        # Strictly, as a request body: no lone surrogate (which no store can write), no
        # key twice; a line wraps its event's payload a few levels deeper than a body.
        value = parse(raw, f"import line {number}", max_depth=MAX_DEPTH + _LINE_WRAPPING)
    except BodyError as exc:
        raise InvalidRequest(
            f"import line {number} is not JSON the ledger accepts: {exc}",
            details={"line": number, "reason": str(exc)},
        ) from exc
    if not isinstance(value, dict):
        raise InvalidRequest(f"import line {number} is not a JSON object", details={"line": number})
    version = value.get("schema_version")
    if version != EXPORT_SCHEMA_VERSION:
        raise _invalid(number, f"schema_version {version!r} is not supported (this build reads 1)")
    return value


def _check_calls(number: int, event: Event, asked: set[str]) -> None:
    """Refuse a call id over :data:`MAX_CALL_ID_CHARS`, and a result of a call no earlier
    event asked for; note the calls ``event`` asks for in ``asked``.

    Raises:
        RequestValidationFailed: either.
    """
    body = event.body()
    named: list[str] = []
    if isinstance(body, AssistantMessage):
        named = [call.id for call in body.tool_calls]
    elif isinstance(body, ToolCallRequested | ToolResult):
        named = [body.call_id]
    if any(len(call_id) > MAX_CALL_ID_CHARS for call_id in named):
        raise _invalid(number, f"a call id is longer than {MAX_CALL_ID_CHARS} characters")
    if isinstance(body, ToolResult) and body.call_id not in asked:
        raise _invalid(number, f"a tool_result of call {body.call_id!r}, which no call asked for")
    if not isinstance(body, ToolResult):
        asked.update(named)


def parse_import(
    text: str, conversation_id: str, *, max_bytes: int, max_events: int = 0
) -> tuple[ExportHead, list[Event]]:
    """Parse and check an export for import under ``conversation_id``; nothing is written.

    Raises:
        ImportTooLarge: more than ``max_events`` events (``0``: no cap), checked first.
        PayloadTooLarge: the export, or one event's payload, is over ``max_bytes``.
        InvalidRequest: a line is not a JSON object.
        RequestValidationFailed: a rule is broken (``details.line`` and ``details.reason``).
    """
    if len(text.encode()) > max_bytes:
        raise PayloadTooLarge(
            f"the export is over the limit of {max_bytes} bytes", details={"limit": max_bytes}
        )
    lines = [(n, raw) for n, raw in enumerate(split_lines(text), start=1) if raw.strip()]
    if not lines:
        raise _invalid(1, "the export is empty")
    if max_events and len(lines) - 1 > max_events:
        raise ImportTooLarge(
            f"the export holds {len(lines) - 1} events; an import takes at most {max_events} "
            "(import larger ones with the turnledger import command)",
            details={"limit_events": max_events, "events": len(lines) - 1},
        )
    number, raw = lines[0]
    try:
        head = ExportHead.model_validate(_parse_line(number, raw))
    except ValidationError as exc:
        raise _invalid(number, f"not a conversation line: {exc.errors()[0]['msg']}") from exc
    if head.pending_tool_calls or head.status not in {"complete"}:
        raise _invalid(
            number,
            f"a conversation with status {head.status!r} and {head.pending_tool_calls} pending "
            "call(s) cannot be imported: decide or answer its calls first",
        )
    events: list[Event] = []
    seen: set[str] = set()
    asked: set[str] = set()
    for number, raw in lines[1:]:
        try:
            line = ExportEvent.model_validate(_parse_line(number, raw))
        except ValidationError as exc:
            raise _invalid(number, f"not an event line: {exc.errors()[0]['msg']}") from exc
        body = {**line.event, "conversation_id": conversation_id}
        if body.get("schema_version", SCHEMA_VERSION) not in SUPPORTED_SCHEMA_VERSIONS:
            raise _invalid(number, f"event schema_version {body['schema_version']!r} is unknown")
        try:
            event = Event.model_validate(body)
        except ValidationError as exc:
            raise _invalid(number, f"not a valid event: {exc.errors()[0]['msg']}") from exc
        if (event.turn == 0) != (event.kind is EventKind.CONVERSATION_IMPORTED):
            raise _invalid(number, "turn 0 holds a conversation_imported event, and only that")
        expected = len(events) + 1
        if event.sequence != expected:
            raise _invalid(number, f"sequence {event.sequence}, expected {expected}")
        if events and event.turn < events[-1].turn:
            raise _invalid(number, f"turn {event.turn} after turn {events[-1].turn}")
        if event.event_id in seen:
            raise _invalid(number, f"event_id {event.event_id!r} is repeated")
        _check_calls(number, event, asked)
        if len(json.dumps(event.payload).encode()) > max_bytes:
            raise PayloadTooLarge(
                f"import line {number}: the payload is over the limit of {max_bytes} bytes",
                details={"limit": max_bytes, "line": number},
            )
        seen.add(event.event_id)
        events.append(event)
    last = lines[-1][0]
    if len(events) != head.events:
        raise _invalid(last, f"{len(events)} event lines, the head says {head.events}")
    if events[-1].turn != head.turns:
        raise _invalid(
            last, f"the last event is of turn {events[-1].turn}, the head says {head.turns}"
        )
    try:
        latest_summary(events)
        # A strict history ends with the next input: the check adds one, as a turn would.
        messages = build_messages(events)
        check_strict_history(
            build_strict_history([*messages, Message(role="user", content="(next input)")])
        )
    except InvalidHistory as exc:
        raise _invalid(last, f"the history is not one a model accepts: {exc}") from exc
    except Exception as exc:  # a summary whose hash does not match, for one
        raise _invalid(last, f"the events do not form a conversation: {exc}") from exc
    return head, events


def renumbered(event: Event, shift: int) -> dict[str, Any]:
    """``event``'s payload with its references to sequences moved up by ``shift``: a
    summary's range, a run record's context start, and a pin's (the event a correction
    names, a removed pin's own), which name events of the log."""
    body = event.body()
    if isinstance(body, PinAdded) and body.corrects is not None:
        return body.model_copy(update={"corrects": body.corrects + shift}).model_dump(mode="json")
    if isinstance(body, PinRemoved):
        pin = body.pin.model_copy(
            update={
                "sequence": body.pin.sequence + shift,
                "corrects": None if body.pin.corrects is None else body.pin.corrects + shift,
            }
        )
        return body.model_copy(update={"pin": pin}).model_dump(mode="json")
    if isinstance(body, ContextCompacted):
        return body.model_copy(
            update={
                "from_sequence": body.from_sequence + shift,
                "to_sequence": body.to_sequence + shift,
                "previous_through": None
                if body.previous_through is None
                else body.previous_through + shift,
            }
        ).model_dump(mode="json")
    if isinstance(body, AssistantMessage) and body.run is not None:
        run = body.run.model_copy(
            update={
                "context_from": body.run.context_from + shift,
                "summary_through": None
                if body.run.summary_through is None
                else body.run.summary_through + shift,
            }
        )
        return body.model_copy(update={"run": run}).model_dump(mode="json")
    return event.payload


def with_provenance(
    exported: ExportHead,
    events: list[Event],
    *,
    conversation_id: str,
    actor: str,
    now: datetime,
    export_sha256: str,
) -> list[Event]:
    """The events an import writes: a ``conversation_imported`` event (sequence 1, turn 0,
    by ``actor``), then the export's events renumbered from 2, each marked as imported
    (:class:`~turnledger.core.models.ImportMark`) with the actor ``import``.

    Usage and cost carried over are recomputed from the answers' own records.
    """
    answers = [b for e in events if isinstance(b := e.body(), AssistantMessage)]
    opening = Event(
        event_id=new_event_id(),
        conversation_id=conversation_id,
        sequence=1,
        turn=0,
        kind=EventKind.CONVERSATION_IMPORTED,
        actor=actor,
        occurred_at=now,
        payload=ConversationImported(
            imported_by=actor,
            source_conversation_id=exported.conversation_id,
            source_created_at=exported.created_at,
            source_updated_at=exported.updated_at,
            export_sha256=export_sha256,
            events=len(events),
            usage_carried_over=sum((a.usage for a in answers), Usage()),
            cost_usd_carried_over=sum(a.run.cost_usd for a in answers if a.run is not None),
        ).model_dump(mode="json"),
    )
    marked = [
        event.model_copy(
            update={
                "sequence": event.sequence + 1,
                "actor": IMPORT_ACTOR,
                "payload": renumbered(event, 1),
                "imported": ImportMark(
                    imported_by=actor,
                    imported_at=now,
                    source_conversation_id=exported.conversation_id,
                    export_sha256=export_sha256,
                    source_sequence=event.sequence,
                    claimed_actor=event.imported.claimed_actor
                    if event.imported is not None
                    else event.actor,
                ),
            }
        )
        for event in events
    ]
    return [opening, *marked]


def raised_to(events: list[Event]) -> str | None:
    """The class the events' last ``data_class_raised`` rose to (``None``: never classed).

    A class only rises, and an import must not lower it: the copy is held to the class its
    source was (a name this deployment's policy lacks is held to its most sensitive class:
    :meth:`~turnledger.context.policy.DataPolicy.effective`)."""
    rises = [b for e in events if isinstance(b := e.body(), DataClassRaised)]
    return rises[-1].to if rises else None


def import_text(
    store: ConversationStore,
    key: ConversationKey,
    text: str,
    *,
    actor: str,
    now: datetime,
    ttl_seconds: int,
    max_bytes: int,
    max_events: int = 0,
) -> Head:
    """Check ``text`` (an export) and create ``key`` from it as ``actor``, all or nothing.

    The history written opens with ``conversation_imported``; the export's events follow,
    marked as imported (:func:`with_provenance`). The head's usage, cost and failed turns
    are recomputed from the events, not taken from the export's head line.

    Raises:
        ConversationExists: the id is taken.
        PayloadTooLarge, InvalidRequest, RequestValidationFailed: see :func:`parse_import`.
        ConversationBusy: the conversation changed during the import (nothing is visible).
    """
    exported, parsed = parse_import(
        text, key.conversation_id, max_bytes=max_bytes, max_events=max_events
    )
    events = with_provenance(
        exported,
        parsed,
        conversation_id=key.conversation_id,
        actor=actor,
        now=now,
        export_sha256=hashlib.sha256(text.encode()).hexdigest(),
    )
    opening = events[0].body()
    assert isinstance(opening, ConversationImported)
    summary = latest_summary(events)
    expires_at = int(now.timestamp()) + ttl_seconds if ttl_seconds else None
    head = Head(
        gen="-",  # chosen by the store
        version=1,
        base=0,
        seq=0,
        turn=exported.turns,
        status=status_for(()),  # an imported conversation waits for nothing
        created_at=exported.created_at,
        updated_at=now,
        ttl_seconds=ttl_seconds,
        expires_at=expires_at,
        usage=opening.usage_carried_over,
        options=exported.options,
        summary=SummaryRef(sequence=summary.sequence, through=summary.body.to_sequence)
        if summary is not None
        else None,
        failed_turns=sum(1 for e in events if e.kind is EventKind.TURN_FAILED),
        cost_usd=opening.cost_usd_carried_over,
        # The source's active pins, from its events: claims of the source, as they are.
        pins=pins_through(events),
        data_class=raised_to(events),
    )
    return import_conversation(store, key, head, events, now)


@dataclass(frozen=True)
class Transfer:
    """Export and import over one store, as the composition root wires them
    (:meth:`turnledger.runtime.Runtime.transfer_for`)."""

    store: ConversationStore
    clock: Callable[[], datetime]
    #: The TTL an imported conversation of a tenant gets.
    ttl_for: Callable[[str], int]
    #: The largest export an import accepts.
    max_bytes: int
    #: The most events an import accepts (``0``: no cap).
    max_events: int = 0
    #: Larger exports go to the blob store and are answered with a URL this long valid.
    export_inline_max_bytes: int = 4 * 1024 * 1024
    export_url_ttl_seconds: int = 300

    def export(
        self, key: ConversationKey, reader: Callable[[str], str] | None = None
    ) -> InlineExport | LinkedExport:
        """The export of ``key``, inline or through a URL (see :func:`export`)."""
        return export(
            self.store,
            key,
            self.clock(),
            inline_max_bytes=self.export_inline_max_bytes,
            url_ttl_seconds=self.export_url_ttl_seconds,
            reader=reader,
        )

    def import_text(self, key: ConversationKey, text: str, actor: str) -> Head:
        """Create ``key`` from an export as ``actor``, all or nothing (see :func:`import_text`)."""
        return import_text(
            self.store,
            key,
            text,
            actor=actor,
            now=self.clock(),
            ttl_seconds=self.ttl_for(key.tenant),
            max_bytes=self.max_bytes,
            max_events=self.max_events,
        )
