"""What the service answers: the domain results of a conversation's routes.

Plain frozen dataclasses over the domain's own types (pending calls, events,
usage); only the HTTP edge (:mod:`turnledger.api.views`) turns them into the
response bodies of ``API.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from ..core.models import Event, PendingCall, Usage
from .lifecycle import Wait


@dataclass(frozen=True)
class OutputText:
    """An assistant message of this request."""

    content: str


@dataclass(frozen=True)
class OutputCall:
    """A tool call the model made during this request."""

    call_id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ContextReport:
    """How the working context of the turn's last model call was built and sent."""

    messages_sent: int
    provider_state: Literal["fresh", "continued", "fallback"] = "fresh"
    #: Tokens of what was sent, by the deployment's estimate.
    tokens_estimated: int = 0
    #: The context budget in force (tokens).
    budget_tokens: int = 0
    #: The last event sequence a summary in the context covers, or ``None``.
    summary_through: int | None = None


@dataclass(frozen=True)
class TurnResult:
    """Where a turn (or a decision that continued it) ended, and what it produced."""

    conversation_id: str
    turn: int
    #: The public status (``complete``, ``awaiting_approval``, ...).
    status: str
    #: Why a turn stopped early (``max_tool_steps``, ``turn_budget``, ``cancelled``).
    status_reason: str | None
    output_text: str | None
    #: JSON mode: the answer as a JSON value.
    output_json: Any
    output: list[OutputText | OutputCall]
    #: The calls that wait for someone (a decision, an output, the client, a job).
    waiting: list[PendingCall]
    #: Everything still awaited, the first being what ``status`` shows.
    awaiting: list[Wait]
    usage: Usage
    context: ContextReport


@dataclass(frozen=True)
class ConversationState:
    """A conversation's head as a read shows it (nothing is recorded by a read)."""

    conversation_id: str
    #: The public status (a run with a live lease is ``running_tools``).
    status: str
    turns: int
    events: int
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None
    ttl_seconds: int
    #: Calls that wait for someone and whose wait has not lapsed.
    waiting: list[PendingCall]
    usage: Usage
    cost_usd: float
    failed_turns: int
    summary_through: int | None
    awaiting: list[Wait]
    #: Calls whose wait closed with no decision (recorded by the next request or the sweep).
    expired: list[PendingCall] = field(default_factory=list)
    #: Set on a fork: where it was made.
    parent: ForkParent | None = None
    #: Live forks of this conversation.
    forks: int = 0
    #: The conversation's data class (``None``: none).
    data_class: str | None = None


@dataclass(frozen=True)
class ForkParent:
    """Where a fork was made: its parent, and the turn and last sequence it inherits."""

    conversation_id: str
    turn: int
    seq: int


@dataclass(frozen=True)
class ForkEntry:
    """One live fork of a conversation, as ``GET .../forks`` lists it."""

    conversation_id: str
    turn: int
    seq: int
    created_at: datetime


@dataclass(frozen=True)
class ForkPage:
    """A page of a conversation's live forks, by fork id."""

    conversation_id: str
    forks: list[ForkEntry]
    #: The fork id to read on after; ``None`` when this page reached the end.
    next_after: str | None


@dataclass(frozen=True)
class EventPage:
    """A page of a conversation's transcript."""

    conversation_id: str
    events: list[Event]
    #: The sequence to read on after; ``None`` when this page reached the end.
    next_after: int | None
    #: The life the page is of (what its tokens are made for: ``turnledger.context.tokens``).
    gen: str = ""


@dataclass(frozen=True)
class CancelResult:
    """What a cancel did."""

    conversation_id: str
    turn: int
    #: ``complete``, ``running_tools`` (asked to stop), ``in_progress`` (a long turn's answer).
    status: str
    cancelled_call_ids: list[str] = field(default_factory=list)
    #: True when a running request was asked to stop (it records the cancel itself).
    cancel_requested: bool = False


@dataclass(frozen=True)
class CallbackResult:
    """What a callback settled and where the conversation stands."""

    conversation_id: str
    call_id: str
    settled: Literal["succeeded", "failed", "cancelled"]
    status: str
    awaiting: list[Wait]
    #: True when the turn was continued in this request (the model answered).
    continued: bool = False


@dataclass(frozen=True)
class SweepReport:
    """What the sweep, a reclaim or an erasure removed, and what it spent."""

    conversations_removed: int
    events_removed: int
    objects_removed: int
    #: Stored responses deleted at the model provider (best effort).
    provider_state_deleted: int
    read_units: float
    #: ``False`` when the work stopped at its time budget; run it again to continue.
    complete: bool
    #: Calls whose wait closed, recorded by the sweep's expiry pass.
    waits_expired: int = 0
    #: Deleted conversations' lives kept while forks read them, deleted once none does.
    fork_lives_reclaimed: int = 0
    #: Events whose content their data class's retention removed (the sweep on demand).
    contents_removed: int = 0
