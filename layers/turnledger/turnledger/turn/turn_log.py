"""Turns read back from the log: a turn's answer rebuilt from its events, and turns as a
history (``GET .../turns/{n}`` and ``GET .../turns``).

Nothing here is stored: every answer is rebuilt from the canonical events of the turn.
A turn is worked on by one or more requests (its input, then decisions, client outputs or
callbacks that continue it); its answer is the answer of the *last* of them. A request
opens with what its caller brought (:func:`opens_request`): user messages, decisions,
outputs a person supplied, client results, a settled deferred call. Everything after
that, up to the next such event, is the request's work: the model's answers (their run
records say how each call was made), calls and their results, a failure or a cancel.

Finding a turn's events (:func:`turn_events`) never reads the whole conversation:
events are numbered in turn order, so the latest turn is read backwards from the tail
in windows that double (one query when the turn has at most :data:`TAIL_WINDOW`
events), and an older turn's first event is found by a binary search of one-event reads
(``ceil(log2(events))`` reads of 0.5 RCU each), then its events are read forward.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from ..core.models import (
    ApprovalResolved,
    AssistantMessage,
    ConversationKey,
    Event,
    EventKind,
    Head,
    PendingCall,
    ToolCallRequested,
    ToolCallSettled,
    TurnFailed,
    Usage,
    UserMessage,
)
from ..store.base import ConversationStore
from .lifecycle import Wait, answer_status, awaiting, is_running, logged_status, waiting
from .results import ContextReport, OutputCall, OutputText, TurnResult

#: Events read in the first query of the latest turn (the window doubles until the
#: turn's first event is in it).
TAIL_WINDOW = 16
#: Events read per query when a turn is read forward.
FORWARD_PAGE = 100


@dataclass(frozen=True)
class TurnFailure:
    """A turn whose last request failed: the error its request answered."""

    code: str
    status: int
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        """The error body (``{"error": {code, message, details}}``)."""
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}


@dataclass(frozen=True)
class LoggedTurn:
    """One turn as the log tells it."""

    turn: int
    #: The user messages of the turn, in order.
    input: list[str]
    #: The answer of the turn's last request (``None`` when that request failed).
    answer: TurnResult | None
    failure: TurnFailure | None
    #: ``event_id`` of each model answer of the turn (its run record rides on it).
    run_ids: list[str]
    #: Usage and cost of every model call of the turn (all its requests).
    usage: Usage
    cost_usd: float
    started_at: datetime
    ended_at: datetime
    #: The newest model text of the turn (``None``: the model wrote none).
    output_text: str | None

    @property
    def status(self) -> str:
        """The answer's status, or ``failed``."""
        answered = self.answer.status if self.answer is not None else None
        return logged_status(answered, in_progress=False, lease_lost=False)

    @property
    def reason(self) -> str | None:
        """Why the turn stopped early (``status_reason``) or the failure's code."""
        if self.failure is not None:
            return self.failure.code
        return self.answer.status_reason if self.answer is not None else None

    @property
    def awaiting(self) -> list[Wait]:
        """What the turn still waits for."""
        return list(self.answer.awaiting) if self.answer is not None else []


def opens_request(event: Event) -> bool:
    """Whether ``event`` is what a caller brought to the turn (a request begins with it)."""
    kind = event.kind
    if kind in (EventKind.USER_MESSAGE, EventKind.TOOL_INPUT_PROVIDED):
        return True
    if kind is EventKind.APPROVAL_RESOLVED:
        body = event.body()
        assert isinstance(body, ApprovalResolved)
        return body.approver != "system"  # the system's rejections come with an expiry
    if kind is EventKind.TOOL_CALL_SETTLED:
        body = event.body()
        assert isinstance(body, ToolCallSettled)
        return body.via in ("callback", "approvals", "turn")
    return kind is EventKind.TOOL_RESULT and event.actor == "client"


def last_request(events: list[Event]) -> list[Event]:
    """The events of the last request of a turn's ``events`` (from its opening events on);
    all of them when none opens a request (a failure recorded alone, an imported turn)."""
    start = 0
    for index, event in enumerate(events):
        if opens_request(event) and (index == 0 or not opens_request(events[index - 1])):
            start = index
    return events[start:]


def _model_answers(events: Iterable[Event]) -> list[tuple[Event, AssistantMessage]]:
    answers = []
    for event in events:
        if event.kind is EventKind.ASSISTANT_MESSAGE:
            body = event.body()
            assert isinstance(body, AssistantMessage)
            if body.source == "model":
                answers.append((event, body))
    return answers


def _text(body: AssistantMessage) -> str | None:
    if body.content_json is not None:
        # JSON mode keeps the value; its text is the compact serialization.
        import json

        return json.dumps(body.content_json, ensure_ascii=False, separators=(",", ":"))
    return body.content


def _failure(event: Event) -> TurnFailure:
    body = event.body()
    assert isinstance(body, TurnFailed)
    return TurnFailure(
        code=body.code,
        status=body.status,
        message=body.message,
        details={"attempts": body.attempts, "turn": event.turn},
    )


def rebuild(
    conversation_id: str,
    turn: int,
    events: list[Event],
    *,
    pending: list[PendingCall] | None,
    default_budget: int,
    max_tool_steps: int,
) -> LoggedTurn:
    """Turn ``turn`` from its ``events`` (non-empty, in order).

    ``pending``: the head's pending calls when ``turn`` is the head's latest turn (what
    the answer shows as waiting); ``None`` for an older turn (nothing waits any more).
    ``default_budget``: the context budget a request that made no model call reports.
    """
    request = last_request(events)
    answers = _model_answers(request)
    failed = request[-1] if request[-1].kind is EventKind.TURN_FAILED else None
    whole = _model_answers(events)
    usage = Usage()
    cost = 0.0
    for _, body in whole:
        usage = usage + body.usage
        cost += body.run.cost_usd if body.run is not None else 0.0
    texts = [t for _, body in whole if (t := _text(body))]
    inputs: list[str] = []
    for event in events:
        if event.kind is EventKind.USER_MESSAGE:
            message = event.body()
            assert isinstance(message, UserMessage)
            inputs.append(message.content)
    logged = LoggedTurn(
        turn=turn,
        input=inputs,
        answer=None,
        failure=_failure(failed) if failed is not None else None,
        run_ids=[event.event_id for event, _ in whole],
        usage=usage,
        cost_usd=round(cost, 6),
        started_at=events[0].occurred_at,
        ended_at=events[-1].occurred_at,
        output_text=texts[-1] if texts else None,
    )
    if failed is not None:
        return logged
    return _answered(
        logged, conversation_id, request, answers, pending, default_budget, max_tool_steps
    )


def _answered(
    logged: LoggedTurn,
    conversation_id: str,
    request: list[Event],
    answers: list[tuple[Event, AssistantMessage]],
    pending: list[PendingCall] | None,
    default_budget: int,
    max_tool_steps: int,
) -> LoggedTurn:
    output: list[OutputText | OutputCall] = []
    output_text: str | None = None
    output_json: Any = None
    usage = Usage()
    for _, body in answers:
        usage = usage + body.usage
        text = _text(body)
        if text:
            output.append(OutputText(content=text))
            output_text, output_json = text, body.content_json
        output.extend(
            OutputCall(call_id=c.id, name=c.name, arguments=c.arguments) for c in body.tool_calls
        )
    calls = pending or []
    reason: str | None = None
    if any(e.kind is EventKind.TURN_INTERRUPTED for e in request):
        reason = "cancelled"
    elif answers and answers[-1][1].tool_calls and _ran_all(request, answers[-1][0]):
        # The model's last word was calls that ran at once and whose results it never
        # answered: the request stopped at a limit (steps, or the turn's token budget).
        reason = "max_tool_steps" if len(answers) >= max_tool_steps else "turn_budget"
    last = answers[-1][1].run if answers else None
    context = (
        ContextReport(
            messages_sent=last.messages_sent,
            provider_state=last.provider_state,
            tokens_estimated=last.tokens_estimated,
            budget_tokens=last.budget_tokens,
            summary_through=last.summary_through,
        )
        if last is not None
        else ContextReport(messages_sent=0, budget_tokens=default_budget)
    )
    answer = TurnResult(
        conversation_id=conversation_id,
        turn=logged.turn,
        status=answer_status(calls),
        status_reason=reason,
        output_text=output_text,
        output_json=output_json,
        output=output,
        waiting=waiting(calls),
        awaiting=awaiting(calls),
        usage=usage,
        context=context,
    )
    return replace(logged, answer=answer)


def _ran_all(request: list[Event], answer: Event) -> bool:
    """Whether every call the model asked for in ``answer`` needed no one (it ran at once)."""
    for event in request:
        if event.sequence > answer.sequence and event.kind is EventKind.TOOL_CALL_REQUESTED:
            body = event.body()
            assert isinstance(body, ToolCallRequested)
            if body.requires != "none":
                return False
    return True


# --- reading a turn's events --------------------------------------------------------------


def latest_turn(store: ConversationStore, key: ConversationKey, head: Head) -> int:
    """The conversation's latest turn number: the head's, or one past it when the log
    ends with a failed (or cancelled) attempt at the next turn (1 read when so)."""
    count = head.event_count
    if count == 0:
        return head.turn
    [last] = store.read_events(key, head, after=count - 1, limit=1)
    return max(head.turn, last.turn)


def turn_events(
    store: ConversationStore, key: ConversationKey, head: Head, turn: int
) -> list[Event]:
    """The events of ``turn`` (empty when it has none), without reading the whole log:
    see the module docstring for the reads."""
    count = head.event_count
    if count == 0:
        return []
    if turn >= head.turn:
        window = TAIL_WINDOW
        while True:
            after = max(count - window, 0)
            events = store.read_events(key, head, after=after, limit=count - after)
            if after == 0 or events[0].turn < turn:
                return [e for e in events if e.turn == turn]
            window *= 2
    first = _first_of(store, key, head, turn)
    if first is None:
        return []
    found: list[Event] = []
    after = first - 1
    while after < count:
        page = store.read_events(key, head, after=after, limit=FORWARD_PAGE)
        found.extend(e for e in page if e.turn == turn)
        if not page or page[-1].turn > turn:
            break
        after = page[-1].sequence
    return found


def _first_of(store: ConversationStore, key: ConversationKey, head: Head, turn: int) -> int | None:
    """The sequence of the first event with a turn >= ``turn`` (binary search)."""
    low, high = 1, head.event_count
    found: int | None = None
    while low <= high:
        middle = (low + high) // 2
        [event] = store.read_events(key, head, after=middle - 1, limit=1)
        if event.turn >= turn:
            found, high = middle, middle - 1
        else:
            low = middle + 1
    return found


def turns_range(
    store: ConversationStore, key: ConversationKey, head: Head, first: int, last: int
) -> dict[int, list[Event]]:
    """The events of turns ``first..last``, by turn (turns without events left out)."""
    count = head.event_count
    start = _first_of(store, key, head, first) if count else None
    by_turn: dict[int, list[Event]] = {}
    if start is None:
        return by_turn
    after = start - 1
    while after < count:
        page = store.read_events(key, head, after=after, limit=FORWARD_PAGE)
        for event in page:
            if first <= event.turn <= last:
                by_turn.setdefault(event.turn, []).append(event)
        if not page or page[-1].turn > last:
            break
        after = page[-1].sequence
    return by_turn


def running_now(head: Head, turn: int, now: datetime) -> bool:
    """Whether ``turn`` is the head's and a request runs its tools under a live lease."""
    return turn == head.turn and is_running(head) and head.live_lease(now) is not None
