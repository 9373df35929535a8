"""What each model call was sent, rebuilt from the log (``GET .../turns/{n}/context``).

Every answer's run record (:class:`~turnledger.core.models.RunRecord`) holds what its
context was built with (budget, estimate scale, redaction version) and the hash of the
messages sent (``context_sha256``). :func:`call_contexts` reads the log once and rebuilds
the context of each recorded model call with :func:`turnledger.context.assembly.rebuild`,
recomputes the hash and sets it beside the recorded one: a mismatch is reported with
what differs, never hidden. Replays (:mod:`.replays`) send exactly these contexts.

What is not in the log is taken from the deployment as it is now: the system prompt,
the redaction rule set and the tool registry. The user's long-term memory records a call
carried (``run.memory_ids``, of ``run.memory_user``) are read back from the user's memory
and set in the rebuilt context as the call had them; so are the user's pins it carried
(``run.user_pins``: a pin's text never changes, and a removed pin is kept). A call whose
context was built with another system prompt or rule set, or with records since edited or
deleted, rebuilds to another hash, and the mismatch says which of these may explain it.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..context.assembly import MESSAGE_OVERHEAD_TOKENS, rebuild
from ..context.memory import memory_message
from ..context.pins import pin_of
from ..core.exceptions import ConversationNotFound, UnknownProvider
from ..core.models import (
    AssistantMessage,
    ContextCompacted,
    ConversationKey,
    Event,
    Head,
    Pin,
    PinRemoved,
    RunRecord,
    ToolResult,
    UserMessage,
)
from ..providers.base import Message, Provider, ToolSpec
from ..store.memories import MemoryBook, MemoryRecord
from ..store.user_pins import UserPin, pins_by_id
from .turn_reads import TurnNotFound

if TYPE_CHECKING:
    from .pipeline import Conversations
    from .reads import Reads

#: Events read per store query while the log is read.
_PAGE = 1000


@dataclass(frozen=True)
class CallContext:
    """One recorded model call: what it answered, and its context rebuilt from the log."""

    turn: int
    #: The call's place in its turn (1, 2, ...).
    index: int
    #: The sequence of the call's ``assistant_message`` event.
    sequence: int
    answer: AssistantMessage
    run: RunRecord
    #: The messages the call was sent, rebuilt (system prompt and summary included).
    messages: list[Message]
    #: The hash of :attr:`messages` (to compare with ``run.context_sha256``).
    sha256: str
    #: Why the hashes may differ when they do (``[]``: nothing known).
    causes: list[str] = field(default_factory=list)
    #: The recorded results of this call's tool calls, by call id.
    results: dict[str, ToolResult] = field(default_factory=dict)
    #: The pins in force when the call was made (its context carried each), oldest first.
    pins: list[Pin] = field(default_factory=list)
    #: The pins of the conversation's user the call carried (``run.user_pins``), in order.
    user_pins: list[UserPin] = field(default_factory=list)

    @property
    def matches(self) -> bool:
        """Whether the rebuilt context hashes to the recorded one."""
        return self.sha256 == self.run.context_sha256


@dataclass(frozen=True)
class ConversationLog:
    """A conversation's whole log, read once, and its head."""

    key: ConversationKey
    head: Head
    events: list[Event]

    def turn_events(self, turn: int) -> list[Event]:
        """The events of ``turn``, in sequence order."""
        return [event for event in self.events if event.turn == turn]


def visible_head(service: Reads, key: ConversationKey) -> Head:
    """The head of ``key`` if a client may see it.

    Raises:
        ConversationNotFound: absent, expired, cleared, or another tenant's.
    """
    head = service.store.get_head(key)
    if head is None or not head.is_visible(service.clock()):
        raise ConversationNotFound(f"conversation {key.conversation_id!r} not found")
    return head


def read_log(
    service: Conversations, key: ConversationKey, *, through_turn: int | None = None
) -> ConversationLog:
    """The head and the events of ``key`` (a fork's inherited events first): every one,
    or (``through_turn``) the pages up to the first that goes past that turn.

    Raises:
        ConversationNotFound: absent, expired, cleared, or another tenant's.
    """
    head = visible_head(service, key)
    events: list[Event] = []
    while len(events) < head.event_count:
        after = events[-1].sequence if events else 0
        page = service.store.read_events(key, head, after=after, limit=_PAGE)
        if not page:
            break
        events.extend(page)
        if through_turn is not None and page[-1].turn > through_turn:
            break
    return ConversationLog(key=key, head=head, events=events)


def tool_specs(service: Conversations) -> list[ToolSpec]:
    """The tools the deployment's registry offers now (the log does not keep a turn's set)."""
    return [tool.spec() for tool in service.tools.select(None)]


def call_contexts(
    service: Conversations,
    log: ConversationLog,
    *,
    from_turn: int = 1,
    to_turn: int | None = None,
) -> list[CallContext]:
    """The recorded model calls of turns ``from_turn``..``to_turn`` (``None``: the last),
    oldest first, each with its context rebuilt from ``log`` and hashed.

    Answers without a run record (assistant items a client sent as history) are no call.
    """
    last = to_turn if to_turn is not None else log.head.turn
    plain = service.redactor
    # A call made with the policy's tokens is rebuilt with them (its run record says so).
    tokens = service.redactor_for(log.key, log.head.data_class, log.head.gen)
    system_prompt = service.settings.system_prompt
    calls: list[CallContext] = []
    index_in_turn: dict[int, int] = {}
    events = log.events
    sequences = [event.sequence for event in events]
    newest: int | None = None  # the position of the newest summary's event so far
    memories = _Memories(service, log)
    pins: dict[str, Pin] = {}  # in force so far: the log's pin events, folded
    for position, event in enumerate(events):
        if event.turn > last:
            break
        body = event.body()
        if isinstance(body, ContextCompacted):
            newest = position
        pin = pin_of(event)
        if pin is not None:
            pins[pin.id] = pin
        elif isinstance(body, PinRemoved):
            pins.pop(body.pin_id, None)
        if event.turn < from_turn:
            continue
        if not isinstance(body, AssistantMessage) or body.run is None:
            continue
        run = body.run
        provider = _provider(service, run.provider)
        memory, memory_changed = memories.block(run, event)
        user_pins = memories.user_pins(run)
        redactor = tokens if "policy:" in (run.redaction_version or "") else plain
        assembly = rebuild(
            _window(events, sequences, newest, position),
            run,
            count=provider.estimate_tokens,
            per_message=0 if provider.estimate_is_exact else MESSAGE_OVERHEAD_TOKENS,
            system_prompt=system_prompt,
            redactor=redactor,
            memory=memory,
            pins=list(pins.values()),
            user_pins=user_pins,
        )
        index_in_turn[event.turn] = index_in_turn.get(event.turn, 0) + 1
        causes: list[str] = []
        if assembly.sha256 != run.context_sha256:
            causes = _causes(service, run, provider, memory_changed=memory_changed)
        calls.append(
            CallContext(
                turn=event.turn,
                index=index_in_turn[event.turn],
                sequence=event.sequence,
                answer=body,
                run=run,
                messages=assembly.messages,
                sha256=assembly.sha256,
                causes=causes,
                results=_results(events[position + 1 :], body),
                pins=list(pins.values()),
                user_pins=user_pins,
            )
        )
    return calls


def _window(
    events: list[Event], sequences: list[int], newest: int | None, position: int
) -> list[Event]:
    """What the call at ``position`` was built from: the events before it, without those
    its newest summary covers (the summary's own event kept), so a rebuild reads only what
    a turn reads and a conversation's calls rebuild in time linear in their number."""
    if newest is None:
        return events[:position]
    summary = events[newest].body()
    assert isinstance(summary, ContextCompacted)
    start = bisect.bisect_right(sequences, summary.to_sequence, hi=position)
    if newest >= start:
        return events[start:position]
    return [events[newest], *events[start:position]]


def _provider(service: Conversations, name: str) -> Provider:
    """The provider whose estimate built a call's context (the default one if the
    deployment no longer enables it: the mismatch then says so)."""
    try:
        return service.provider_for(name)
    except UnknownProvider:
        return service.provider


class _Memories:
    """The memory blocks of a log's calls, read back from their users' records (each
    user's records read once)."""

    def __init__(self, service: Conversations, log: ConversationLog) -> None:
        self.service = service
        self.log = log
        self._records: dict[str, dict[str, MemoryRecord]] = {}
        self._pins: dict[str, dict[str, UserPin]] = {}

    def user_pins(self, run: RunRecord) -> list[UserPin]:
        """The user's pins ``run``'s call carried, read back by id (active or removed
        since: a pin's text never changes; each user's pins read once)."""
        user = run.memory_user
        if not run.user_pins or user is None:
            return []
        if user not in self._pins:
            self._pins[user] = pins_by_id(self.service.store, self.log.key.tenant, user)
        return [self._pins[user][pin_id] for pin_id in run.user_pins if pin_id in self._pins[user]]

    def block(self, run: RunRecord, answer: Event) -> tuple[Message | None, bool]:
        """The memory block ``run``'s call carried, rebuilt from the records it names as
        they read now, and whether any of them changed since the call (edited after it,
        or gone: the block then holds what is left, and cannot match)."""
        if not run.memory_ids:
            return None, False
        user = run.memory_user or self._turn_actor(answer.turn)
        if user is None:
            return None, True
        if user not in self._records:
            book = MemoryBook(self.service.store, self.log.key.tenant, user)
            self._records[user] = {record.id: record for record in book.records()}
        found = [self._records[user].get(record_id) for record_id in run.memory_ids]
        kept = [record for record in found if record is not None]
        changed = len(kept) < len(found) or any(
            record.updated_at > answer.occurred_at for record in kept
        )
        if not kept:
            return None, changed
        message = memory_message(kept)
        redactor = self.service.redactor
        if redactor is not None:
            # As the turn did: everything a model sees is redacted.
            message = Message(role="system", content=redactor.text(message.content or ""))
        return message, changed

    def _turn_actor(self, turn: int) -> str | None:
        """Who sent ``turn``'s message: the memory user of a run recorded before run
        records named it (a trusted caller's named user was not kept then)."""
        return next(
            (
                event.actor
                for event in self.log.events
                if event.turn == turn and isinstance(event.body(), UserMessage)
            ),
            None,
        )


def _causes(
    service: Conversations, run: RunRecord, provider: Provider, *, memory_changed: bool
) -> list[str]:
    """What may explain a mismatch: what the log does not hold and has changed, or may."""
    causes: list[str] = []
    if provider.name != run.provider:
        causes.append("provider_not_enabled")
    redactor = service.redactor
    if (redactor.version if redactor is not None else None) != run.redaction_version:
        causes.append("redaction_changed")
    if memory_changed:
        causes.append("memory_changed")
    if not causes:
        causes.append("system_prompt_or_log_changed")
    return causes


def _results(after: Sequence[Event], answer: AssistantMessage) -> dict[str, ToolResult]:
    """The recorded results of ``answer``'s tool calls among the events ``after`` it (a
    deferred call's result may come much later)."""
    wanted = {call.id for call in answer.tool_calls}
    found: dict[str, ToolResult] = {}
    if not wanted:
        return found
    for event in after:
        body = event.body()
        if isinstance(body, ToolResult) and body.call_id in wanted:
            found[body.call_id] = body
    return found


def turn_calls(service: Conversations, key: ConversationKey, turn: int) -> list[CallContext]:
    """The recorded model calls of ``turn`` with their contexts rebuilt (``GET
    .../turns/{n}/context``); ``[]`` for a turn that made none (a failed turn).

    Raises:
        ConversationNotFound: absent, expired, cleared, or another tenant's.
        TurnNotFound: the conversation has no turn ``turn``.
    """
    log = read_log(service, key, through_turn=turn)
    if turn > log.head.turn:
        raise TurnNotFound(
            f"conversation {key.conversation_id!r} has no turn {turn}",
            details={"turn": turn, "turns": log.head.turn},
        )
    return call_contexts(service, log, from_turn=turn, to_turn=turn)
