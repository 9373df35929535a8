"""``POST .../compact`` and the rules every summary keeps (issue 23, the auditable context):
a new summary over the same range, written by the summarizer the caller names, used by the
next turn; and a summary that cannot be trusted never replaces history."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from aws_lambda_powertools.metrics import MetricUnit
from turnledger.api.schemas import TurnRequest
from turnledger.context.assembly import Estimator, split_turns, splits_tool_call
from turnledger.core.config import ModelSpec, Settings
from turnledger.core.exceptions import (
    ApprovalPending,
    ConversationNotFound,
    NothingToCompact,
    ProviderError,
    UnknownProvider,
)
from turnledger.core.models import (
    AssistantMessage,
    ContextCompacted,
    ConversationKey,
    Event,
    EventKind,
    ToolCall,
    UserMessage,
)
from turnledger.core.models import ToolResult as ToolResultBody
from turnledger.providers.base import ModelReply, ModelRequest, Provider
from turnledger.providers.demo import SUMMARY_PREFIX, DemoProvider
from turnledger.store.base import ConversationStore
from turnledger.tools import ToolRegistry
from turnledger.turn import compaction
from turnledger.turn.pipeline import Conversations

from tests.support import edge
from tests.support.edge import Caller
from tests.support.factories import FakeClock
from tests.support.providers import Recording

ANN = Caller(tenant="tenant-a", actor="ann")
WORDS = DemoProvider().estimate_tokens
KEY = ConversationKey(tenant=ANN.tenant, conversation_id="conv-1")


class NamesOnly(Recording):
    """Another summarizer (provider ``names``): keeps only what says a name."""

    name = "names"

    def complete(self, request: ModelRequest) -> ModelReply:
        reply = super().complete(request)
        if request.purpose != "summary":
            return reply
        items = (reply.text or "").removeprefix(SUMMARY_PREFIX).split(" | ")
        kept = [item.strip() for item in items if "my name is" in item.lower()]
        return reply.model_copy(
            update={"text": f"{SUMMARY_PREFIX} " + " | ".join(kept), "model": "names-1"}
        )


def service(
    store: ConversationStore,
    clock: FakeClock,
    provider: Provider,
    *,
    others: dict[str, Provider] | None = None,
    **settings: Any,
) -> Conversations:
    built = others or {}
    return Conversations(
        store=store,
        provider=provider,
        settings=replace(Settings(), providers=("demo", *built), **settings),
        clock=clock.now,
        providers=built.__getitem__,
    )


def turn(svc: Conversations, text: str, conversation: str = "conv-1") -> str | None:
    return edge.turn(svc, ANN, conversation, TurnRequest(input=text)).output_text


def summaries(svc: Conversations, conversation: str = "conv-1") -> list[Event]:
    page = edge.events(svc, ANN, conversation, after=0, limit=1000)
    return [
        Event.model_validate(e.model_dump())
        for e in page.events
        if e.kind == EventKind.CONTEXT_COMPACTED.value
    ]


def ten_words(index: int) -> str:
    return f"message {index} says one two three four five six seven"


def test_compact_with_another_summarizer_changes_what_the_next_turn_sees(
    memory_store: ConversationStore, clock: FakeClock
) -> None:
    turns, names = Recording(), NamesOnly()
    svc = service(
        memory_store,
        clock,
        turns,
        others={"names": names},
        context_max_tokens=120,
        allowed_models=("demo-1", "names-1"),
    )
    turn(svc, "my name is Ann")
    index = 1
    while not summaries(svc):
        index += 1
        turn(svc, ten_words(index))
    [old] = summaries(svc)
    old_body = old.body()
    assert isinstance(old_body, ContextCompacted) and ten_words(2) in old_body.text

    new = svc.compact(KEY, ANN.actor, provider="names", model="names-1")

    body = new.body()
    assert isinstance(body, ContextCompacted)
    assert (body.from_sequence, body.to_sequence) == (old_body.from_sequence, old_body.to_sequence)
    assert (body.from_turn, body.to_turn) == (old_body.from_turn, old_body.to_turn)
    assert (body.messages, body.tool_calls) == (old_body.messages, old_body.tool_calls)
    assert (body.trigger, body.replaces, body.previous_through) == ("manual", old.sequence, None)
    assert (body.summarizer_provider, body.summarizer_model) == ("names", "names-1")
    assert body.text == f"{SUMMARY_PREFIX} my name is Ann" and new.actor == "ann"
    assert sum(1 for r in names.requests if r.purpose == "summary") == 1
    # Nothing is deleted: both summaries stay in the log; the next turn sends the new one.
    assert [e.sequence for e in summaries(svc)] == [old.sequence, new.sequence]
    assert turn(svc, "What is my name?") == "Your name is Ann."
    sent = [r for r in turns.requests if r.purpose == "turn"][-1].messages
    assert sent[0].content == body.text
    assert all(m.content != old_body.text for m in sent)
    view = edge.get(svc, ANN, "conv-1")
    assert view.summary_through == body.to_sequence


def test_compact_refuses_what_it_cannot_do_and_stores_nothing(
    memory_store: ConversationStore, clock: FakeClock
) -> None:
    tools = ToolRegistry.from_json(
        '{"tools": [{"name": "send", "parameters": {"type": "object"},'
        ' "require_approval": true, "executor": {"type": "http", "url": "http://127.0.0.1:9"}}]}'
    )

    class Blank(Recording):
        name = "blank"

        def complete(self, request: ModelRequest) -> ModelReply:
            return ModelReply(text="  ", model="blank-1")

    svc = service(memory_store, clock, Recording(), others={"blank": Blank()})
    svc = Conversations(
        store=memory_store,
        provider=Recording(),
        settings=replace(Settings(), providers=("demo", "blank"), context_max_tokens=120),
        clock=clock.now,
        providers={"blank": Blank()}.__getitem__,
        tools=tools,
    )
    with pytest.raises(ConversationNotFound):
        svc.compact(KEY, ANN.actor)
    turn(svc, "my name is Ann")
    with pytest.raises(NothingToCompact) as nothing:
        svc.compact(KEY, ANN.actor)
    assert nothing.value.status == 409
    for index in range(2, 12):
        turn(svc, ten_words(index))
    with pytest.raises(UnknownProvider):
        svc.compact(KEY, ANN.actor, provider="elsewhere")
    stored = len(edge.events(svc, ANN, "conv-1", after=0, limit=1000).events)
    with pytest.raises(ProviderError):
        svc.compact(KEY, ANN.actor, provider="blank")
    assert len(edge.events(svc, ANN, "conv-1", after=0, limit=1000).events) == stored
    paused = edge.turn(svc, ANN, "conv-1", TurnRequest(input='/tool send {"to": "bob"}'))
    assert paused.status == "awaiting_approval"
    with pytest.raises(ApprovalPending) as waiting:
        svc.compact(KEY, ANN.actor)
    assert waiting.value.status == 409


def test_an_empty_summary_never_replaces_history_and_is_counted(
    memory_store: ConversationStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turn goes on with the previous summary (and the newest turns that fit)."""
    counted: list[tuple[str, float]] = []
    monkeypatch.setattr(
        compaction.metrics,
        "add_metric",
        lambda name, unit, value: (
            counted.append((name, value)) if unit is MetricUnit.Count else None
        ),
    )

    class Emptying(Recording):
        empty = False

        def complete(self, request: ModelRequest) -> ModelReply:
            if request.purpose == "summary" and self.empty:
                return ModelReply(text="", model="demo-1")
            return super().complete(request)

    provider = Emptying()
    svc = service(memory_store, clock, provider, context_max_tokens=120)
    turn(svc, "my name is Ann")
    index = 1
    while not summaries(svc):
        index += 1
        turn(svc, ten_words(index))
    [first] = summaries(svc)
    provider.empty = True
    for later in range(index + 1, index + 9):
        turn(svc, ten_words(later))
    assert [e.sequence for e in summaries(svc)] == [first.sequence]
    assert counted and all(name == compaction.SKIPPED_METRIC for name, _ in counted)
    sent = [r for r in provider.requests if r.purpose == "turn"][-1].messages
    assert sent[0].content == first.body().text  # type: ignore[union-attr]
    assert turn(svc, "What is my name?") == "Your name is Ann."


def test_a_summary_that_would_cut_a_call_from_its_result_is_refused() -> None:
    """Call ids repeat across turns: a result answers the newest request of its id."""

    def event(sequence: int, turn: int, body: Any) -> Event:
        return Event.model_validate(
            {
                "event_id": f"e{sequence}",
                "conversation_id": "c",
                "sequence": sequence,
                "turn": turn,
                "kind": {
                    UserMessage: "user_message",
                    AssistantMessage: "assistant_message",
                    ToolResultBody: "tool_result",
                }[type(body)],
                "actor": "ann",
                "occurred_at": "2026-01-01T00:00:00Z",
                "payload": body.model_dump(mode="json"),
            }
        )

    call = ToolCall(id="call_1", name="t", arguments={})
    asked = [
        event(1, 1, UserMessage(content="go")),
        event(2, 1, AssistantMessage(content=None, tool_calls=[call], model="m")),
    ]
    result = event(3, 1, ToolResultBody(call_id="call_1", name="t", output="ok"))
    again = event(4, 2, AssistantMessage(content=None, tool_calls=[call], model="m"))
    later_result = event(5, 2, ToolResultBody(call_id="call_1", name="t", output="ok"))
    covered = split_turns(asked, after=0, estimator=Estimator(count=len), redactor=None)
    assert splits_tool_call(covered, [result])
    assert splits_tool_call(covered, [], pending=["call_1"])
    assert not splits_tool_call(covered, [again, later_result], pending=["call_1"])
    whole = split_turns([*asked, result], after=0, estimator=Estimator(count=len), redactor=None)
    assert not splits_tool_call(whole, [again, later_result])


def test_a_summary_the_read_window_missed_stays_in_the_context_when_the_next_one_fails(
    memory_store: ConversationStore, clock: FakeClock
) -> None:
    """A long message pushes the newest summary's event past the history read window; the
    summary of what the read left out fails: the turn still goes on with that summary."""

    class Flaky(Recording):
        down = False

        def complete(self, request: ModelRequest) -> ModelReply:
            if request.purpose == "summary" and self.down:
                raise ProviderError("summarizer down")
            return super().complete(request)

    provider = Flaky()
    svc = service(memory_store, clock, provider, context_max_tokens=120, context_max_chars=6000)
    turn(svc, "my name is Ann")
    index = 1
    while not summaries(svc):
        index += 1
        turn(svc, ten_words(index))
    [first] = summaries(svc)
    turn(svc, "x" * 7000 + " long")  # one turn over the whole read window
    provider.down = True
    assert turn(svc, "What is my name?") == "Your name is Ann."
    assert [e.sequence for e in summaries(svc)] == [first.sequence]
    sent = [r for r in provider.requests if r.purpose == "turn"][-1].messages
    assert sent[0].content == first.body().text  # type: ignore[union-attr]
    # Once the summarizer is back, the next turn covers what the read left out.
    provider.down = False
    assert turn(svc, "What is my name?") == "Your name is Ann."
    newest = summaries(svc)[-1].body()
    assert isinstance(newest, ContextCompacted) and newest.trigger == "read_window"
    assert newest.previous_through == first.body().to_sequence  # type: ignore[union-attr]


def test_a_long_range_is_summarized_in_batches_that_fold_into_one_summary(
    memory_store: ConversationStore, clock: FakeClock
) -> None:
    """Each summarizer call is sent at most half its model's room; the calls fold."""
    provider = Recording()
    small = {"demo-1": ModelSpec(context_window=120, answer_reserve=20)}  # room 100: 50 a call
    svc = service(memory_store, clock, provider, models=small)
    turn(svc, "my name is Ann")
    index = 1
    while not summaries(svc):
        index += 1
        turn(svc, ten_words(index))
    calls = [r for r in provider.requests if r.purpose == "summary"]
    assert len(calls) >= 2
    for call in calls:
        sent = json.loads(call.messages[-1].content or "")
        assert sum(WORDS(m.get("content") or "") for m in sent["messages"]) <= 50
    assert json.loads(calls[1].messages[-1].content or "")["previous_summary"] is not None
    [only] = summaries(svc)
    body = only.body()
    assert isinstance(body, ContextCompacted) and "my name is Ann" in body.text
    assert body.from_turn == 1 and body.messages == 2 * body.to_turn  # type: ignore[operator]
