"""The working context: what the model sees next, rebuilt from the log to a token budget.

The transcript is the record; the context is derived from it on every turn,
in this order::

    system prompt -> pins (the user's, then the conversation's) -> recalled memory ->
    the newest summary -> the newest whole turns that fit -> (the new input)

The current turn (the new input, and the calls and results of a turn that is
still running) is always sent whole: a user message outranks a summary, so
when even that does not fit, the summary is left out before any of it, and the
user's recalled memory (:mod:`turnledger.context.memory`, already cut to its share of
the budget) before the summary. The pins (:mod:`turnledger.context.pins`) are never left
out: their size was checked against the budget when each was added. An event a pinned
correction names keeps its text, marked as corrected.

Only conversational events become messages: user and assistant messages and
tool results. Execution-state events (requests, approvals), failed turns and
summaries' own events stay out. Tool results are placed right after the
assistant message that asked for them, in its call order, whatever order
they were recorded in (approvals may arrive in any order).

**Compaction.** When older turns no longer fit, they are summarized once and
the summary is appended to the log as a ``context_compacted`` event (in the
same commit as the turn). Compaction starts when the budget is full and then
summarizes down to :data:`KEEP_SHARE` of it, so it happens once every many
turns, not after every answer. A summary covers whole turns only, so it
never splits a tool call from its result, and never the current turn, where
pending calls live. A new summary folds in the previous one. What the history read
leaves out, and the summarizer calls themselves, are :mod:`turnledger.turn.compaction`'s.

**Redaction** (:mod:`turnledger.context.redaction`) is applied while messages are
built, to everything a model would see, summaries' inputs included.

**Rebuild.** :func:`assemble` depends only on the events, the budget, the
estimator and the rule set, and every answer records those on its run record
(:class:`~turnledger.core.models.RunRecord`), so the context of any past call can
be rebuilt from the log and compared by hash (:func:`rebuild`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..core.exceptions import CorruptedState
from ..core.models import (
    AssistantMessage,
    ContextCompacted,
    Event,
    Pin,
    RunRecord,
    ToolCall,
    ToolResult,
    UserMessage,
)
from ..providers.base import Message, ModelRequest
from ..store.user_pins import UserPin
from .pins import corrected, correction_mark, pin_message
from .redaction import Redactor

#: Every summary in a context is one system message starting with this.
SUMMARY_PREFIX = "Summary of earlier conversation:"

#: Names the summarizer prompt below; recorded on every ``context_compacted`` event.
SUMMARY_PROMPT_VERSION = "summary-v1"

SUMMARY_PROMPT = (
    "You maintain the memory of a conversation between a user and an assistant. "
    "The user message is JSON: `previous_summary` (the summary so far, or null) and "
    "`messages` (the turns to add, oldest first). Write one updated summary that keeps "
    "every fact the user stated about themselves, their goals, decisions, names, numbers "
    "and open questions, and what tools returned that still matters. Be brief; no "
    f"preamble. Start with '{SUMMARY_PREFIX}'."
)

#: After a compaction, the newest turns kept whole take at most this share of the
#: budget: the context then grows for many turns before the next compaction.
KEEP_SHARE = 0.5

#: Tokens a message costs beyond its text on a real model's chat format.
MESSAGE_OVERHEAD_TOKENS = 4


@dataclass(frozen=True)
class Estimator:
    """Token counts of messages: a provider's text estimate, scaled, plus per-message cost."""

    count: Callable[[str], int]
    scale: float = 1.0
    per_message: int = 0

    def raw(self, messages: Iterable[Message]) -> int:
        """Unscaled estimate of ``messages`` (what calibration compares with usage)."""
        total = 0
        for message in messages:
            total += self.per_message + self.count(message.content or "")
            for call in message.tool_calls:
                total += self.count(call.name) + self.count(_json(call.arguments))
        return total

    def tokens(self, messages: Iterable[Message]) -> int:
        """The estimate of ``messages`` in the provider's tokens."""
        raw = self.raw(messages)
        return raw if self.scale == 1.0 else int(raw * self.scale + 0.999)


@dataclass(frozen=True)
class Turn:
    """One whole turn of the log: its sequence range and the messages it makes."""

    number: int
    first_sequence: int
    last_sequence: int
    messages: list[Message]
    tokens: int
    events: list[Event] = field(default_factory=list, repr=False)


@dataclass(frozen=True)
class Summary:
    """The newest summary: its event's sequence and payload."""

    sequence: int
    body: ContextCompacted

    def message(self) -> Message:
        """The summary as the context's system message."""
        text = self.body.text.strip()
        if not text.startswith(SUMMARY_PREFIX):
            text = f"{SUMMARY_PREFIX} {text}"
        return Message(role="system", content=text)


@dataclass(frozen=True)
class Assembly:
    """A context built to a budget, and what did not fit."""

    messages: list[Message]
    tokens: int
    budget: int
    #: The last sequence the summary in the context covers (``None``: no summary sent).
    summary_through: int | None
    #: The first sequence of the whole turns sent.
    context_from: int
    #: Every whole turn after the newest summary, oldest first (the current one last).
    turns: list[Turn] = field(default_factory=list)
    #: Older turns that did not fit: compaction should summarize them.
    dropped: int = 0
    summary: Summary | None = None
    #: Tokens of the system prompt and the summary: what every context carries.
    fixed_tokens: int = 0

    @property
    def sha256(self) -> str:
        """The hash of the messages, as recorded on the run record."""
        return messages_sha256(self.messages)


def messages_sha256(messages: Sequence[Message]) -> str:
    """A stable hash of a list of messages."""
    canonical = json.dumps(
        [m.model_dump(mode="json") for m in messages], separators=(",", ":"), sort_keys=True
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def text_sha256(text: str) -> str:
    """The content hash of a summary's text."""
    return hashlib.sha256(text.encode()).hexdigest()


def latest_summary(events: Iterable[Event]) -> Summary | None:
    """The newest ``context_compacted`` event among ``events``.

    Raises:
        CorruptedState: its text does not match its content hash.
    """
    found: Summary | None = None
    for event in events:
        body = event.body()
        if isinstance(body, ContextCompacted) and (
            found is None or event.sequence > found.sequence
        ):
            found = Summary(sequence=event.sequence, body=body)
    if found is not None and text_sha256(found.body.text) != found.body.content_sha256:
        raise CorruptedState(
            "a context summary does not match its content hash",
            details={"item": f"event {found.sequence}", "reason": "sha256 mismatch"},
        )
    return found


def build_messages(
    events: Iterable[Event], *, system_prompt: str = "", redactor: Redactor | None = None
) -> list[Message]:
    """The provider-neutral messages for ``events`` (oldest first), without a budget."""
    messages: list[Message] = []
    if system_prompt:
        messages.append(Message(role="system", content=system_prompt))
    messages.extend(_messages(events, redactor))
    return messages


def _messages(
    events: Iterable[Event],
    redactor: Redactor | None,
    marks: Mapping[int, list[str]] | None = None,
) -> list[Message]:
    """``marks``: sequences a pinned correction names, with its pin ids."""
    messages: list[Message] = []
    waiting: list[str] = []  # call ids of the last assistant message, in order
    results: dict[str, Message] = {}
    sequence = 0

    def text(value: str) -> str:
        value = redactor.text(value) if redactor is not None else value
        if marks and sequence in marks:
            return correction_mark(marks[sequence]) + value
        return value

    def flush() -> None:
        messages.extend(results.pop(call_id) for call_id in waiting if call_id in results)
        waiting.clear()
        results.clear()

    for event in events:
        body = event.body()
        sequence = event.sequence
        if isinstance(body, UserMessage):
            flush()
            messages.append(Message(role="user", content=text(body.content)))
        elif isinstance(body, AssistantMessage):
            flush()
            calls = body.tool_calls
            if redactor is not None:
                calls = [
                    ToolCall(id=c.id, name=c.name, arguments=redactor.value(c.arguments))
                    for c in calls
                ]
            raw = body.content
            if body.content_json is not None:
                # JSON mode: the value is the record; a model is sent its text.
                raw = json.dumps(body.content_json, ensure_ascii=False)
            if raw is None and marks and sequence in marks:
                raw = ""  # tool calls alone: the mark still shows
            content = text(raw) if raw is not None else None
            messages.append(Message(role="assistant", content=content, tool_calls=calls))
            waiting.extend(call.id for call in body.tool_calls)
        elif isinstance(body, ToolResult):
            results[body.call_id] = Message(
                role="tool",
                tool_call_id=body.call_id,
                name=body.name,
                content=text(body.output),
                is_error=body.is_error,
            )
    flush()
    return messages


def split_turns(
    events: Sequence[Event],
    *,
    after: int,
    estimator: Estimator,
    redactor: Redactor | None,
    marks: Mapping[int, list[str]] | None = None,
) -> list[Turn]:
    """The whole turns of ``events`` with sequences over ``after``, oldest first.

    Turns that make no message (a failed turn alone, pins alone) are left out.
    ``marks``: the events pinned corrections name (:func:`.pins.corrected`).
    """
    groups: dict[int, list[Event]] = {}
    for event in events:
        if event.sequence > after:
            groups.setdefault(event.turn, []).append(event)
    turns = []
    for number in sorted(groups):
        group = groups[number]
        messages = _messages(group, redactor, marks)
        if not messages:
            continue
        turns.append(
            Turn(
                number=number,
                first_sequence=group[0].sequence,
                last_sequence=group[-1].sequence,
                messages=messages,
                tokens=estimator.tokens(messages),
                events=group,
            )
        )
    return turns


def assemble(
    events: Sequence[Event],
    *,
    budget: int,
    estimator: Estimator,
    system_prompt: str = "",
    redactor: Redactor | None = None,
    memory: Message | None = None,
    pins: Sequence[Pin] = (),
    user_pins: Sequence[UserPin] = (),
) -> Assembly:
    """The context of the next model call over ``events`` (everything after the newest
    summary's range, the summary's event among them; the current turn last), with the
    user's ``user_pins`` and the conversation's active ``pins`` after the system prompt,
    always, and the user's recalled ``memory`` block after them when it fits.

    Raises:
        CorruptedState: the newest summary does not match its hash.
    """
    summary = latest_summary(events)
    through = summary.body.to_sequence if summary is not None else 0
    marks = corrected(pins)
    turns = split_turns(events, after=through, estimator=estimator, redactor=redactor, marks=marks)
    head: list[Message] = []
    if system_prompt:
        head.append(Message(role="system", content=system_prompt))
    block = pin_message(pins, user_pins)
    if block is not None:
        head.append(block)
    summary_message = summary.message() if summary is not None else None
    used = fixed = estimator.tokens(head)
    taken: list[Turn] = []
    if turns:
        taken.append(turns[-1])  # the current turn, whole, whatever its size
        used += turns[-1].tokens
    if summary_message is not None:
        cost = estimator.tokens([summary_message])
        fixed += cost
        if used + cost <= budget:
            used += cost
        else:
            summary_message = None  # the newest turn outranks the summary
    if memory is not None:
        cost = estimator.tokens([memory])
        if used + cost <= budget:
            used += cost
            fixed += cost
            head.append(memory)
    for turn in reversed(turns[:-1]):
        if used + turn.tokens > budget:
            break
        taken.append(turn)
        used += turn.tokens
    taken.reverse()
    messages = [*head]
    if summary_message is not None:
        messages.append(summary_message)
    for turn in taken:
        messages.extend(turn.messages)
    return Assembly(
        messages=messages,
        tokens=used,
        budget=budget,
        summary_through=through if summary_message is not None else None,
        context_from=taken[0].first_sequence if taken else through + 1,
        turns=turns,
        dropped=len(turns) - len(taken),
        summary=summary,
        fixed_tokens=fixed,
    )


def messages_through(
    assembly: Assembly,
    sequence: int,
    redactor: Redactor | None = None,
    marks: Mapping[int, list[str]] | None = None,
) -> int | None:
    """How many of ``assembly``'s messages come from the log up to ``sequence`` (system
    prompt and summary included): the part a stored provider response already holds.

    ``None`` when the context does not hold that point (its turn was left out).
    """
    taken = [t for t in assembly.turns if t.first_sequence >= assembly.context_from]
    if not taken or taken[0].first_sequence > sequence:
        return None
    count = len(assembly.messages) - sum(len(t.messages) for t in taken)
    for turn in taken:
        if turn.last_sequence <= sequence:
            count += len(turn.messages)
            continue
        if turn.first_sequence <= sequence:
            # Within a turn, messages follow the log: the part up to ``sequence`` is a prefix.
            count += len(
                _messages([e for e in turn.events if e.sequence <= sequence], redactor, marks)
            )
        break
    return count


def turns_to_compact(assembly: Assembly) -> list[Turn]:
    """The older turns to summarize now: none while everything fits; once something
    does not, every turn but the newest that fit, with the system prompt, the summary
    (at its current size) and the current turn, in :data:`KEEP_SHARE` of the budget.

    The current turn is never summarized.
    """
    if assembly.dropped == 0 or len(assembly.turns) < 2:
        return []
    keep = assembly.budget * KEEP_SHARE
    used = assembly.fixed_tokens + assembly.turns[-1].tokens
    kept = 0
    for turn in reversed(assembly.turns[:-1]):
        if used + turn.tokens > keep:
            break
        used += turn.tokens
        kept += 1
    return assembly.turns[: len(assembly.turns) - 1 - kept]


#: A compaction asked for (``POST .../compact`` with no summary yet) keeps at most this
#: many of the newest turns whole (fewer when they do not fit :data:`KEEP_SHARE`).
MANUAL_KEEP_TURNS = 2


def turns_to_compact_now(assembly: Assembly) -> list[Turn]:
    """The turns a compaction asked for summarizes: every turn but the newest ones, by the
    rules of :func:`turns_to_compact` (whole turns, the newest never), keeping at most
    :data:`MANUAL_KEEP_TURNS` whether or not the context is full."""
    if len(assembly.turns) < 2:
        return []
    keep = assembly.budget * KEEP_SHARE
    used = assembly.fixed_tokens + assembly.turns[-1].tokens
    kept = 1
    for turn in reversed(assembly.turns[:-1]):
        if kept >= MANUAL_KEEP_TURNS or used + turn.tokens > keep:
            break
        used += turn.tokens
        kept += 1
    return assembly.turns[: len(assembly.turns) - kept]


def counts(turns: Iterable[Turn]) -> tuple[int, int]:
    """The messages and tool calls ``turns`` make: what a summary of them stands for."""
    messages = calls = 0
    for turn in turns:
        messages += len(turn.messages)
        calls += sum(len(m.tool_calls) for m in turn.messages)
    return messages, calls


def summary_batches(turns: Sequence[Turn], limit: int) -> list[list[Turn]]:
    """``turns`` in order, cut into batches of at most ``limit`` tokens each (a turn over
    ``limit`` alone is a batch of its own): one summarizer call each, folded in turn, so no
    call is sent more than its share of the summarizer's window."""
    batches: list[list[Turn]] = []
    used = 0
    for turn in turns:
        if not batches or used + turn.tokens > limit:
            batches.append([])
            used = 0
        batches[-1].append(turn)
        used += turn.tokens
    return batches


def splits_tool_call(
    covered: Iterable[Turn], later: Iterable[Event], pending: Iterable[str] = ()
) -> bool:
    """Whether a summary of ``covered`` would cut a tool call from its result: one of its
    calls has its result among the ``later`` events, or is still ``pending``. Providers
    reuse call ids across turns, so a result (or a pending call) answers the newest
    request of its id: one asked again later is a later call's.
    """
    asked = {
        call.id for turn in covered for message in turn.messages for call in message.tool_calls
    }
    asked_later: set[str] = set()
    for event in later:
        body = event.body()
        if isinstance(body, AssistantMessage):
            asked_later.update(call.id for call in body.tool_calls)
        elif isinstance(body, ToolResult) and body.call_id in asked - asked_later:
            return True
    return bool((asked - asked_later) & set(pending))


def summary_request(model: str, previous: str | None, turns: Sequence[Turn]) -> ModelRequest:
    """The summarizer call for ``turns`` (already redacted), folding in the ``previous``
    summary's text (``None``: the first summary of the range)."""
    messages = []
    for turn in turns:
        for message in turn.messages:
            item: dict[str, object] = {"role": message.role}
            if message.content is not None:
                item["content"] = message.content
            if message.tool_calls:
                item["tool_calls"] = [
                    {"name": c.name, "arguments": c.arguments} for c in message.tool_calls
                ]
            if message.role == "tool":
                item["tool"] = message.name
            messages.append(item)
    payload = {
        "previous_summary": previous,
        "messages": messages,
    }
    return ModelRequest(
        model=model,
        purpose="summary",
        messages=[
            Message(role="system", content=SUMMARY_PROMPT),
            Message(role="user", content=json.dumps(payload, ensure_ascii=False)),
        ],
    )


def rebuild(
    events: Sequence[Event],
    run: RunRecord,
    *,
    count: Callable[[str], int],
    per_message: int,
    system_prompt: str = "",
    redactor: Redactor | None = None,
    memory: Message | None = None,
    pins: Sequence[Pin] = (),
    user_pins: Sequence[UserPin] = (),
) -> Assembly:
    """The context a past model call sent, recomputed from the log.

    ``events``: the log up to (not including) the call's ``assistant_message``
    event; older events than the newest summary may be included or not. Compare
    ``.sha256`` with ``run.context_sha256``. ``memory``: the memory block of the
    records ``run.memory_ids`` names, as they read then (memory is not in the log);
    ``pins``: those in force then (:func:`.pins.pins_through` of the log);
    ``user_pins``: the user's pins ``run.user_pins`` names (a pin's text never changes).
    """
    return assemble(
        events,
        budget=run.budget_tokens,
        estimator=Estimator(count=count, scale=run.token_scale, per_message=per_message),
        system_prompt=system_prompt,
        redactor=redactor,
        memory=memory,
        pins=pins,
        user_pins=user_pins,
    )
