"""The four questions of a conversation, answered from the log (``GET .../state``).

* ``happened``: the events by kind, the turns, and the last turn with its status;
* ``external_actions``: every call of a tool this service runs (``http`` or ``lambda``)
  that may have acted outside, with its idempotency key: ``running`` (a live lease),
  ``interrupted`` (its run died while it ran: it may have completed; the next request
  runs it again under the same key), ``outcome_unknown`` (a tool that cannot deduplicate
  was running when its run died: a person decides), ``deferred`` (accepted, finishing
  elsewhere), ``succeeded`` or ``failed`` (a result is recorded). Calls that never ran
  (awaiting a decision, rejected, expired, invalid) and calls the client or a person
  answer are not listed;
* ``may_send``: what the next model call may receive: the provider and model its turn
  would use under today's settings, the active pins, the summary in force, and under a
  data policy the conversation's class, the policy's version, the models the class
  allows (that the deployment enables) and whether a provider may keep state;
* ``if_cursor_lost``: the provider cursor (a cache over the log), and what losing it
  costs: the next call is built from the log (``fresh``), nothing of the transcript lost.

It reads the head, then the log in pages of :data:`PAGE` events: ``1 + ceil(events /
PAGE)`` reads, and nothing is written. Read-side only: no provider or tool is loaded.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from pydantic import ConfigDict, Field

from ..context.policy import DataPolicy, allowed_models, enabled
from ..core.exceptions import ConversationNotFound
from ..core.models import (
    ContextCompacted,
    ConversationKey,
    Deferred,
    Event,
    Head,
    Pin,
    ToolCallDeferred,
    ToolCallRequested,
    ToolCallSettled,
    ToolResult,
)
from ..store.user_pins import UserPin, UserPinBook
from .lifecycle import public_status
from .reads import Reads

#: Events read per store query.
PAGE = 1000

ActionState = Literal[
    "running", "interrupted", "outcome_unknown", "deferred", "succeeded", "failed"
]


class _View(Deferred):
    model_config = ConfigDict(extra="forbid")


class LastTurn(_View):
    turn: int
    status: str


class Happened(_View):
    """Which events have already happened."""

    events: dict[str, int]
    event_count: int
    turns: int
    failed_turns: int
    last_turn: LastTurn | None


class ExternalAction(_View):
    """A tool call that may have had an effect outside."""

    call_id: str
    name: str
    turn: int
    #: The sequence of its ``tool_call_requested`` event.
    sequence: int
    idempotency_key: str
    state: ActionState
    #: Whether its effect may have happened: false only for ``failed`` (the tool answered
    #: that it did not complete); a running, interrupted or unknown call may have acted
    #: before any result was recorded, a deferred call's job may finish any time.
    may_have_completed: bool
    task_id: str | None = None


class SummaryInForce(_View):
    sequence: int
    from_sequence: int
    through: int
    text: str


class MaySend(_View):
    """What the next model call may receive."""

    provider: str
    models: list[str]
    pins: list[Pin]
    summary: SummaryInForce | None
    #: The conversation's data class (``None``: no class, or no data policy).
    data_class: str | None = None
    #: The version of the data policy that holds it (``None``: no data policy).
    policy_version: str | None = None
    #: The models its class allows that the deployment enables, in the class's order
    #: (``["*"]``: any enabled model); ``None`` without a class.
    allowed_models: list[str] | None = None
    #: Whether a provider may keep the conversation's state (its class's
    #: ``provider_state``); ``None`` without a class.
    provider_state: bool | None = None
    #: The pins of the last turn's memory user (``/v1/memories/pins``), carried before
    #: ``pins`` while the next turn names the same user; ``[]`` without a memory user.
    user_pins: list[UserPin] = Field(default_factory=list)


class CursorView(_View):
    provider: str
    model: str
    response_id: str
    sequence: int
    created_at: datetime


class IfCursorLost(_View):
    """What remains if the provider's conversation state (the cursor) disappears."""

    provider_cursor: CursorView | None
    #: Always ``log``: every context can be built from the log alone.
    next_call_rebuilds_from: Literal["log"] = "log"
    transcript_lost: bool = False
    #: What is lost (the provider's cached copy only; nothing of the record).
    lost: list[str] = Field(default_factory=list)


class FourAnswers(_View):
    """``GET /v1/conversations/{id}/state``."""

    conversation_id: str
    happened: Happened
    external_actions: list[ExternalAction]
    may_send: MaySend
    if_cursor_lost: IfCursorLost
    #: The store reads this answer took.
    reads: int


def four_answers(
    service: Reads, key: ConversationKey, policy: DataPolicy | None = None
) -> FourAnswers:
    """The four questions of ``key`` answered from its head and its log.

    Raises:
        ConversationNotFound: absent, expired, cleared, or another tenant's.
    """
    head = service.store.get_head(key)
    now = service.clock()
    if head is None or not head.is_visible(now):
        raise ConversationNotFound(f"conversation {key.conversation_id!r} not found")
    events: list[Event] = []
    reads = 1
    while len(events) < head.event_count:
        page = service.store.read_events(
            key, head, after=events[-1].sequence if events else 0, limit=PAGE
        )
        reads += 1
        if not page:
            break
        events.extend(page)
    kinds = Counter(event.kind.value for event in events)
    status = public_status(head, now)
    user = head.options.memory_user
    user_pins = UserPinBook(service.store, key.tenant, user).active() if user is not None else []
    reads += user is not None
    return FourAnswers(
        conversation_id=key.conversation_id,
        happened=Happened(
            events=dict(sorted(kinds.items())),
            event_count=head.event_count,
            turns=head.turn,
            failed_turns=head.failed_turns,
            last_turn=LastTurn(turn=head.turn, status=status) if head.turn else None,
        ),
        external_actions=_actions(head, events, now),
        may_send=_may_send(service, head, events, policy, user_pins),
        if_cursor_lost=_if_cursor_lost(head),
        reads=reads,
    )


@dataclass
class _Call:
    """A call of a tool run here, as the log tells it so far."""

    event: Event
    body: ToolCallRequested
    standing: ActionState | None = None
    task_id: str | None = None
    never_ran: bool = False


def _actions(head: Head, events: list[Event], now: datetime) -> list[ExternalAction]:
    """The calls of tools run here, in request order, and where each stands."""
    calls: list[_Call] = []
    newest: dict[str, _Call] = {}  # providers reuse call ids: a result answers the newest
    for event in events:
        body = event.body()
        if isinstance(body, ToolCallRequested):
            if body.requires in ("none", "approval", "async"):
                newest[body.call_id] = _Call(event=event, body=body)
                calls.append(newest[body.call_id])
            else:
                newest.pop(body.call_id, None)  # the client's or a person's to answer
            continue
        call = newest.get(getattr(body, "call_id", ""))
        if call is None:
            continue
        if isinstance(body, ToolCallDeferred):
            call.standing, call.task_id = "deferred", body.task_id
        elif isinstance(body, ToolCallSettled):
            call.standing = "succeeded" if body.status == "succeeded" else "failed"
        elif isinstance(body, ToolResult) and call.standing is None:
            if event.actor.startswith("tool:"):
                call.standing = "failed" if body.is_error else "succeeded"
            else:
                call.never_ran = True  # rejected, expired or invalid: answered by the system
    pending = {p.id: p for p in head.pending}
    # A run's status as a client sees it: its lease live, or lapsed (the run died).
    run_status = public_status(head, now)
    found: list[ExternalAction] = []
    for call in calls:
        waiting = pending.get(call.body.call_id)
        if waiting is not None and newest.get(call.body.call_id) is call:
            if waiting.state == "outcome_unknown":
                call.standing = "outcome_unknown"
            elif waiting.state == "deferred":
                call.standing, call.task_id = "deferred", waiting.task_id
            elif waiting.state == "ready" and run_status in ("running_tools", "interrupted"):
                call.standing = "running" if run_status == "running_tools" else "interrupted"
        if call.standing is None or call.never_ran:
            continue  # never ran: waiting for a decision, or rejected before it ran
        found.append(
            ExternalAction(
                call_id=call.body.call_id,
                name=call.body.name,
                turn=call.event.turn,
                sequence=call.event.sequence,
                idempotency_key=call.body.idempotency_key,
                state=call.standing,
                may_have_completed=call.standing != "failed",
                task_id=call.task_id,
            )
        )
    return found


def _may_send(
    service: Reads,
    head: Head,
    events: list[Event],
    policy: DataPolicy | None,
    user_pins: list[UserPin],
) -> MaySend:
    settings = service.settings
    provider = head.options.provider or settings.provider
    summary: SummaryInForce | None = None
    if head.summary is not None:
        event = next((e for e in events if e.sequence == head.summary.sequence), None)
        body = event.body() if event is not None else None
        if event is not None and isinstance(body, ContextCompacted):
            summary = SummaryInForce(
                sequence=event.sequence,
                from_sequence=body.from_sequence,
                through=body.to_sequence,
                text=body.text,
            )
    classed = policy is not None and head.data_class is not None
    data_class = policy.effective(head.data_class) if policy is not None and classed else None
    return MaySend(
        provider=provider,
        models=[head.options.model or settings.model],
        pins=list(head.pins),
        summary=summary,
        data_class=head.data_class,
        policy_version=policy.version if policy is not None else None,
        allowed_models=allowed_models(policy, head.data_class, enabled(settings, provider))
        if policy is not None and classed
        else None,
        provider_state=data_class.provider_state if data_class is not None else None,
        user_pins=user_pins,
    )


def _if_cursor_lost(head: Head) -> IfCursorLost:
    cursor = head.provider_cursor
    if cursor is None:
        return IfCursorLost(provider_cursor=None)
    return IfCursorLost(
        provider_cursor=CursorView(
            provider=cursor.provider,
            model=cursor.model,
            response_id=cursor.response_id,
            sequence=cursor.sequence,
            created_at=cursor.created_at,
        ),
        lost=["the provider's stored copy of the context (the next call is sent whole: fresh)"],
    )
