"""The working context (issue: working context): budgets, summaries, redaction, run records.

Every scenario drives :class:`Conversations` with the demo model, whose token
estimate is its usage (whitespace-separated words), so budgets are exact and
the tests can say precisely what was sent. The ``store`` fixture runs the
long scenarios on memory, moto and DynamoDB Local.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import httpx
import pytest
from turnledger.api.schemas import TurnRequest, TurnResponse
from turnledger.context.assembly import (
    SUMMARY_PREFIX,
    Estimator,
    assemble,
    build_messages,
    messages_sha256,
    rebuild,
)
from turnledger.context.redaction import Redactor
from turnledger.core.config import Settings
from turnledger.core.exceptions import BudgetExceeded, ContextLengthExceeded, ProviderError
from turnledger.core.models import (
    AssistantMessage,
    ContextCompacted,
    ConversationKey,
    Event,
    EventKind,
    Usage,
)
from turnledger.ops.transfer import export_text, import_text
from turnledger.providers.base import ModelReply, ModelRequest, Provider
from turnledger.providers.demo import DemoProvider
from turnledger.providers.history import check_strict_history
from turnledger.store.base import ContextBudget, ConversationStore
from turnledger.tools import ToolRegistry, ToolRunner
from turnledger.turn.pipeline import Conversations

from tests.functional.http_sink import HttpSink, Reply
from tests.support import edge
from tests.support.edge import Caller
from tests.support.factories import FakeClock
from tests.support.providers import Recording

ANN = Caller(tenant="tenant-a", actor="ann")
WORDS = DemoProvider().estimate_tokens


def service(
    store: ConversationStore,
    clock: FakeClock,
    provider: Provider | None = None,
    *,
    redactor: Redactor | None = None,
    tools: ToolRegistry | None = None,
    runner: ToolRunner | None = None,
    **settings: Any,
) -> Conversations:
    return Conversations(
        store=store,
        provider=provider or Recording(),
        settings=replace(Settings(), **settings),
        clock=clock.now,
        redactor=redactor,
        tools=tools,
        runner=runner,
    )


@contextmanager
def weather_service(
    store: ConversationStore, clock: FakeClock, **settings: Any
) -> Iterator[tuple[Conversations, HttpSink]]:
    """A service whose one tool, ``get_weather``, posts to a real HTTP sink answering
    ``{"temp": 21}`` on ``/weather``."""
    with HttpSink() as sink, httpx.Client() as client:
        sink.respond("/weather", Reply(body={"temp": 21}))
        tool = {
            "name": "get_weather",
            "parameters": {"type": "object"},
            "executor": {"type": "http", "url": sink.url("/weather")},
        }
        tools = ToolRegistry.from_json(json.dumps({"tools": [tool]}))
        yield service(store, clock, tools=tools, runner=ToolRunner(client, None), **settings), sink


def turn(svc: Conversations, text: str, conversation: str = "conv-1") -> TurnResponse:
    return edge.turn(svc, ANN, conversation, TurnRequest(input=text))


def transcript(svc: Conversations, conversation: str = "conv-1") -> list[Event]:
    events: list[Event] = []
    after = 0
    while True:
        page = edge.events(svc, ANN, conversation, after=after, limit=1000)
        events.extend(Event.model_validate(view.model_dump()) for view in page.events)
        if page.next_after is None:
            return events
        after = page.next_after


def summaries(events: list[Event]) -> list[ContextCompacted]:
    return [e.body() for e in events if e.kind is EventKind.CONTEXT_COMPACTED]  # type: ignore[misc]


def turn_requests(provider: Recording) -> list[ModelRequest]:
    return [r for r in provider.requests if r.purpose == "turn"]


def summary_calls(provider: Recording) -> int:
    return sum(1 for r in provider.requests if r.purpose == "summary")


# A user message of exactly 10 words; the demo answers "Noted (K user messages so far)." (6).
def ten_words(index: int) -> str:
    return f"message {index} says one two three four five six seven"


# --- assembly -------------------------------------------------------------------------


def test_assembly_sends_the_newest_whole_turns_that_fit_exactly(
    memory_store: ConversationStore, clock: FakeClock
) -> None:
    """System prompt, then the newest whole turns within the budget; the rest waits."""
    svc = service(memory_store, clock, system_prompt="Be brief.")
    for index in range(1, 6):
        turn(svc, ten_words(index))
    events = transcript(svc)
    # Each turn is 10 + 6 = 16 words; the system prompt 2; the budget fits 3 turns.
    assembly = assemble(
        events, budget=2 + 3 * 16, estimator=Estimator(count=WORDS), system_prompt="Be brief."
    )
    assert [m.content for m in assembly.messages] == [
        "Be brief.",
        ten_words(3),
        "Noted (3 user messages so far).",
        ten_words(4),
        "Noted (4 user messages so far).",
        ten_words(5),
        "Noted (5 user messages so far).",
    ]
    assert (assembly.tokens, assembly.dropped, assembly.context_from) == (50, 2, 5)
    # One word less and the oldest of the three no longer fits whole.
    smaller = assemble(
        events, budget=2 + 3 * 16 - 1, estimator=Estimator(count=WORDS), system_prompt="Be brief."
    )
    assert (len(smaller.messages), smaller.dropped, smaller.context_from) == (5, 3, 7)


def test_the_current_turn_is_sent_whole_and_an_input_over_the_budget_alone_is_refused(
    memory_store: ConversationStore, clock: FakeClock
) -> None:
    """A user message outranks everything else: one that fits the budget is sent whole
    with nothing else; one that cannot fit even alone is refused and nothing is stored."""
    recording = Recording()
    svc = service(memory_store, clock, recording, context_max_tokens=40)
    turn(svc, "my name is Ann")
    long = " ".join(["word"] * 40)
    reply = turn(svc, long)
    assert reply.context.messages_sent == 1
    assert reply.context.tokens_estimated == 40
    assert turn_requests(recording)[-1].messages[-1].content == long
    with pytest.raises(ContextLengthExceeded) as refused:
        turn(svc, long + " more")
    assert refused.value.details == {"limit": 40, "tokens": 41, "model": "demo-1"}
    kinds = [e.kind for e in transcript(svc)]
    assert kinds.count(EventKind.USER_MESSAGE) == 2 and len(turn_requests(recording)) == 2


def test_the_budget_is_the_models_window_less_its_reserve_unless_smaller() -> None:
    """Settings: per model (window - reserve), capped by ContextMaxTokens."""
    settings = Settings(models={})
    assert settings.context_budget("demo-1") == 8192 - 1024
    assert replace(settings, context_max_tokens=300).context_budget("demo-1") == 300
    assert replace(settings, context_max_tokens=10**6).context_budget("demo-1") == 7168
    configured = Settings.from_env(
        {
            "MODELS": json.dumps(
                {
                    "big": {
                        "context_window": 128000,
                        "answer_reserve": 8000,
                        "input_price_per_mtok": 0.15,
                        "output_price_per_mtok": 0.6,
                    }
                }
            )
        }
    )
    assert configured.context_budget("big") == 120000
    spent = Usage(input_tokens=1_000_000, output_tokens=1_000_000)
    assert configured.model_spec("big").cost(spent) == pytest.approx(0.75)
    with pytest.raises(ValueError, match="MODELS"):
        Settings.from_env({"MODELS": '{"m": {"context_window": 10, "answer_reserve": 10}}'})


# --- compaction -----------------------------------------------------------------------


def test_compaction_starts_when_the_budget_is_full_and_summaries_are_reused(
    memory_store: ConversationStore, clock: FakeClock
) -> None:
    """No summary while everything fits; then one summary, reused (never recomputed) by the
    following turns until the context is full again."""
    recording = Recording()
    svc = service(memory_store, clock, recording, context_max_tokens=400)
    sent_tokens = []
    for index in range(1, 26):
        sent_tokens.append(turn(svc, ten_words(index)).context.tokens_estimated)
    # 25 turns x 16 words = 400: everything still fits, nothing was summarized.
    assert summary_calls(recording) == 0 and not summaries(transcript(svc))
    assert sent_tokens == [10 + 16 * k for k in range(25)]
    compacting = turn(svc, ten_words(26))
    assert summary_calls(recording) == 1
    [summary] = summaries(transcript(svc))
    # Compaction summarized down to half the budget: the new input (10 words) and the
    # eleven newest turns (176) make 186 <= 200; turns 1-14 (events 1-28) are summarized.
    assert (summary.from_sequence, summary.to_sequence) == (1, 28)
    assert summary.previous_through is None
    assert compacting.context.summary_through == 28
    assert compacting.context.tokens_estimated <= 400
    # The following turns reuse the same summary, no summarizer call, until full again.
    reused = []
    for index in range(27, 31):
        reply = turn(svc, ten_words(index))
        reused.append(reply.context.summary_through)
        assert reply.context.tokens_estimated <= 400
    assert reused == [28, 28, 28, 28] and summary_calls(recording) == 1
    first = turn_requests(recording)[-1].messages[0]
    assert first.role == "system" and first.content == summary.text
    assert summary.text.startswith(SUMMARY_PREFIX)
    assert (summary.prompt_version, summary.summarizer_model) == ("summary-v1", "demo-1")
    # The demo summarizer keeps 12 items: the newest user messages it was given.
    assert summary.text.count(" | ") == 11 and ten_words(14) in summary.text
    turn(svc, ten_words(31))
    assert summary_calls(recording) == 2


def test_a_new_summary_folds_in_the_previous_one_over_five_cycles(
    store: ConversationStore, clock: FakeClock
) -> None:
    """A fact stated in turn 1 survives 200 turns and many compactions at 300 tokens."""
    recording = Recording()
    svc = service(store, clock, recording, context_max_tokens=300)
    turn(svc, "Hello, my name is Ann and I like green tea.")
    for index in range(2, 201):
        reply = turn(svc, ten_words(index))
        assert reply.context.tokens_estimated <= 300
    events = transcript(svc)
    cycles = summaries(events)
    assert len(cycles) >= 5
    for earlier, later in itertools.pairwise(cycles):
        assert later.previous_through == earlier.to_sequence
        assert later.from_sequence == 1 and later.to_sequence > earlier.to_sequence
    # The transcript itself was never rewritten: every user message is still there.
    users = [e for e in events if e.kind is EventKind.USER_MESSAGE]
    assert len(users) == 200 and users[0].payload["content"].startswith("Hello, my name is Ann")
    answer = turn(svc, "What is my name?")
    assert answer.output_text == "Your name is Ann."
    assert answer.context.summary_through == cycles[-1].to_sequence
    # Summaries are reused: far fewer summarizer calls than turns.
    assert summary_calls(recording) == len(cycles) < 200 // 5


def test_every_summary_carries_its_manifest_over_five_cycles(
    memory_store: ConversationStore, clock: FakeClock
) -> None:
    """Each context_compacted event says what it covers (sequences and turns), how many
    messages and tool calls, the tokens it replaced and its own, and who wrote it."""
    with weather_service(memory_store, clock, context_max_tokens=150) as (svc, _):
        turn(svc, "my name is Ann")
        index = 1
        while len(summaries(transcript(svc))) < 5:
            index += 1
            if index % 3 == 0:
                turn(svc, f'/tool get_weather {{"city": "Paris {index}"}}')
            else:
                turn(svc, ten_words(index))
        events = transcript(svc)
    estimate = Estimator(count=WORDS)
    previous: ContextCompacted | None = None
    for summary in summaries(events):
        covered = [e for e in events if e.sequence <= summary.to_sequence]
        new = [e for e in covered if e.sequence > (summary.previous_through or 0)]
        messages = build_messages(covered)
        assert (summary.from_sequence, summary.from_turn) == (1, 1)
        assert summary.to_turn == covered[-1].turn
        assert summary.to_turn != events[summary.to_sequence].turn  # whole turns only
        assert summary.messages == len(messages)
        assert summary.tool_calls == sum(len(m.tool_calls) for m in messages) > 0
        replaced = estimate.tokens(build_messages(new))
        if previous is not None:
            assert summary.previous_through == previous.to_sequence
            replaced += previous.tokens_after or 0
        assert summary.tokens_before == replaced
        assert summary.tokens_after == summary.tokens_estimated == WORDS(summary.text)
        assert summary.tokens_after < summary.tokens_before
        assert (summary.summarizer_provider, summary.summarizer_model) == ("demo", "demo-1")
        assert (summary.prompt_version, summary.trigger) == ("summary-v1", "budget")
        previous = summary
    assert turn(svc, "What is my name?").output_text == "Your name is Ann."


def test_a_summary_never_splits_a_tool_call_from_its_result_nor_covers_a_pending_call(
    memory_store: ConversationStore, clock: FakeClock
) -> None:
    """Compaction cuts at whole turns: every call it covers has its result inside the
    range, and a call awaiting approval is never covered."""
    with HttpSink() as sink, httpx.Client() as client:
        sink.respond("/weather", Reply(body={"temp": 21}))
        sink.respond("/email", Reply(body={"sent": True}))
        tools = ToolRegistry.from_json(
            json.dumps(
                {
                    "tools": [
                        {
                            "name": "get_weather",
                            "parameters": {"type": "object"},
                            "executor": {"type": "http", "url": sink.url("/weather")},
                        },
                        {
                            "name": "send_email",
                            "parameters": {"type": "object"},
                            "require_approval": True,
                            "executor": {"type": "http", "url": sink.url("/email")},
                        },
                    ]
                }
            )
        )
        recording = Recording()
        svc = service(
            memory_store,
            clock,
            recording,
            tools=tools,
            runner=ToolRunner(client, None),
            context_max_tokens=120,
        )
        for index in range(1, 30):
            if index % 3 == 0:
                turn(svc, f'/tool get_weather {{"city": "Paris {index}"}}')
            else:
                turn(svc, ten_words(index))
        paused = turn(svc, '/tool send_email {"to": "bob@example.com"}')
        assert paused.status == "awaiting_approval"
        approved = edge.approve(svc, ANN, "conv-1", _approve("call_1"))
        assert approved.status == "complete"
        events = transcript(svc)
        for summary in summaries(events):
            covered = [
                e for e in events if summary.from_sequence <= e.sequence <= summary.to_sequence
            ]
            asked = {
                e.payload["call_id"] for e in covered if e.kind is EventKind.TOOL_CALL_REQUESTED
            }
            answered = {e.payload["call_id"] for e in covered if e.kind is EventKind.TOOL_RESULT}
            assert asked == answered
            turns_inside = {e.turn for e in covered}
            outside = {
                e.turn
                for e in events
                if e.sequence > summary.to_sequence and e.kind is not EventKind.CONTEXT_COMPACTED
            }
            assert not turns_inside & outside, "a summary covers part of a turn"
        approval_turn = next(e.turn for e in events if e.kind is EventKind.APPROVAL_REQUESTED)
        first_of_it = min(e.sequence for e in events if e.turn == approval_turn)
        assert all(s.to_sequence < first_of_it for s in summaries(events))
        assert summaries(events), "the scenario must compact"
        for request in turn_requests(recording):
            check_strict_history(
                request.messages[:1] + [m for m in request.messages[1:] if m.role != "system"]
            )


def _approve(call_id: str) -> Any:
    from turnledger.api.schemas import ApprovalRequest

    return ApprovalRequest(approve=[call_id])


def test_a_failing_summarizer_does_not_fail_the_turn(
    memory_store: ConversationStore, clock: FakeClock
) -> None:
    """The turn goes on with the newest turns that fit; the next turn summarizes."""

    class FlakySummarizer(Recording):
        failures = 1

        def complete(self, request: ModelRequest) -> ModelReply:
            if request.purpose == "summary" and self.failures:
                self.failures -= 1
                raise ProviderError("summarizer down")
            return super().complete(request)

    recording = FlakySummarizer()
    svc = service(memory_store, clock, recording, context_max_tokens=100)
    for index in range(1, 8):
        reply = turn(svc, ten_words(index))
    assert reply.context.summary_through is None and reply.context.tokens_estimated <= 100
    assert not summaries(transcript(svc))
    assert turn(svc, ten_words(8)).context.summary_through is not None
    assert len(summaries(transcript(svc))) == 1


def test_a_turn_reads_only_the_head_the_newest_summary_and_the_events_after_it(
    store: ConversationStore, clock: FakeClock
) -> None:
    """The store's load starts after the range the newest summary covers."""
    svc = service(store, clock, context_max_tokens=100)
    for index in range(1, 30):
        turn(svc, ten_words(index))
    head = store.get_head(ConversationKey(tenant=ANN.tenant, conversation_id="conv-1"))
    assert head is not None and head.summary is not None
    snapshot = store.load(
        ConversationKey(tenant=ANN.tenant, conversation_id="conv-1"), ContextBudget()
    )
    assert snapshot.events[0].sequence == head.summary.through + 1
    assert snapshot.events[-1].sequence == head.event_count
    assert any(e.sequence == head.summary.sequence for e in snapshot.events)


# --- budgets --------------------------------------------------------------------------


def test_the_turn_that_crosses_the_conversation_budget_is_delivered_the_next_is_refused(
    store: ConversationStore, clock: FakeClock
) -> None:
    svc = service(store, clock, conversation_token_budget=60)
    used = 0
    while used < 60:
        reply = turn(svc, ten_words(1))
        used += reply.usage.input_tokens + reply.usage.output_tokens
    with pytest.raises(BudgetExceeded) as refused:
        turn(svc, "one more")
    assert refused.value.details == {"limit": 60, "used": used}
    head = edge.get(svc, ANN, "conv-1")
    assert head.usage.input_tokens + head.usage.output_tokens == used
    # Per-tenant override: another tenant's budget is its own.
    other = service(
        store, clock, conversation_token_budget=60, tenant_conversation_token_budget={"tenant-b": 0}
    )
    edge.turn(other, Caller(tenant="tenant-b", actor="bob"), "conv-1", TurnRequest(input="hi"))


def test_a_turn_budget_ends_a_tool_loop_cleanly(
    memory_store: ConversationStore, clock: FakeClock
) -> None:
    with weather_service(memory_store, clock, turn_token_budget=5) as (svc, sink):
        reply = turn(svc, '/tool get_weather {"city": "Paris"}')
        assert (reply.status, reply.status_reason) == ("complete", "turn_budget")
        kinds = [e.kind for e in transcript(svc)]
        assert kinds[-1] is EventKind.TOOL_RESULT
        assert len(sink.requests_for("/weather")) == 1
        # The next turn is normal: the loop's results are in its context.
        assert turn(svc, "thanks").status_reason is None


def test_usage_and_estimated_cost_roll_up_on_the_head(
    memory_store: ConversationStore, clock: FakeClock
) -> None:
    svc = service(
        memory_store,
        clock,
        models={"demo-1": _spec(input_price=2.0, output_price=8.0)},
    )
    first = turn(svc, "My name is Ann.")
    second = turn(svc, "What is my name?")
    usage = first.usage + second.usage
    head = edge.get(svc, ANN, "conv-1")
    assert head.usage == usage
    assert head.cost_usd == pytest.approx(
        (usage.input_tokens * 2.0 + usage.output_tokens * 8.0) / 1e6
    )


def _spec(*, input_price: float, output_price: float) -> Any:
    from turnledger.core.config import ModelSpec

    return ModelSpec(
        context_window=8192,
        answer_reserve=1024,
        input_price_per_mtok=input_price,
        output_price_per_mtok=output_price,
    )


# --- redaction ------------------------------------------------------------------------

SECRET = "4111111111111111"
RULES = Redactor.model_validate(
    {
        "version": "r1",
        "rules": [{"name": "card", "pattern": r"\b\d{16}\b", "replacement": "[card]"}],
    }
)


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.DEBUG)
    yield caplog


def test_redaction_applies_to_what_the_model_sees_and_the_log_keeps_the_original(
    memory_store: ConversationStore, clock: FakeClock, debug_logs: pytest.LogCaptureFixture
) -> None:
    recording = Recording()
    svc = service(memory_store, clock, recording, redactor=RULES)
    reply = turn(svc, f"echo: my card is {SECRET}")
    assert reply.output_text == "my card is [card]"
    assert all(SECRET not in (m.content or "") for m in recording.requests[-1].messages)
    events = transcript(svc)
    assert events[0].payload["content"] == f"echo: my card is {SECRET}"
    assert events[1].payload["run"]["redaction_version"] == "r1"
    # Logs, at every level, hold neither the message nor the answer.
    assert SECRET not in debug_logs.text
    assert "my card is" not in debug_logs.text


def test_redaction_rules_fail_loudly_when_invalid() -> None:
    with pytest.raises(ValueError, match=r"redaction rules in rules\.json are invalid"):
        Redactor.parse('{"version": "x", "rules": [{"name": "a", "pattern": "("}]}', "rules.json")
    with pytest.raises(ValueError):
        Redactor.parse("not json", "rules.json")


def test_summaries_are_made_from_redacted_inputs(
    memory_store: ConversationStore, clock: FakeClock
) -> None:
    recording = Recording()
    svc = service(memory_store, clock, recording, redactor=RULES, context_max_tokens=60)
    turn(svc, f"pay with {SECRET} please and thank you very much")
    for index in range(2, 8):
        turn(svc, ten_words(index))
    [summary] = summaries(transcript(svc))[:1]
    assert SECRET not in summary.text and "[card]" in summary.text
    assert all(SECRET not in json.dumps(r.model_dump()) for r in recording.requests)


# --- run records and rebuild ------------------------------------------------------------


def test_every_answer_carries_a_run_record_and_its_context_rebuilds_from_the_log(
    store: ConversationStore, clock: FakeClock
) -> None:
    """Recomputing the context of any past call from the log gives the same messages."""
    recording = Recording()
    svc = service(store, clock, recording, context_max_tokens=120, system_prompt="Be kind.")
    for index in range(1, 40):
        turn(svc, ten_words(index))
    events = transcript(svc)
    calls = [(i, e) for i, e in enumerate(events) if e.kind is EventKind.ASSISTANT_MESSAGE]
    sent = turn_requests(recording)
    assert len(calls) == len(sent) == 39
    for (index, event), request in zip(calls, sent, strict=True):
        body = event.body()
        assert isinstance(body, AssistantMessage) and body.run is not None
        run = body.run
        assert run.model == "demo-1" and run.provider == "demo"
        assert run.provider_state == "fresh"
        assert run.usage == body.usage and run.latency_ms >= 0
        assert run.tokens_estimated <= 120 and run.budget_tokens == 120
        assert run.messages_sent == len(request.messages)
        assert run.context_sha256 == messages_sha256(request.messages)
        rebuilt = rebuild(events[:index], run, count=WORDS, per_message=0, system_prompt="Be kind.")
        assert rebuilt.sha256 == run.context_sha256
        assert rebuilt.summary_through == run.summary_through
    assert any(e.body().run.summary_through for _, e in calls)  # type: ignore[union-attr]


def test_an_imported_log_still_rebuilds_every_context_and_summary(
    memory_store: ConversationStore, clock: FakeClock
) -> None:
    """An import renumbers the events (its opening event takes sequence 1) and the sequences
    inside them with it: every imported run record still rebuilds from the imported log, and
    the imported conversation's head points at the moved summary."""
    svc = service(memory_store, clock, Recording(), context_max_tokens=120)
    for index in range(1, 25):
        turn(svc, ten_words(index))
    source = ConversationKey(tenant=ANN.tenant, conversation_id="conv-1")
    copy = ConversationKey(tenant=ANN.tenant, conversation_id="conv-copy")
    text = export_text(memory_store, source, clock.now())
    import_text(
        memory_store, copy, text, actor="ann", now=clock.now(), ttl_seconds=0, max_bytes=10**8
    )
    events = transcript(svc, "conv-copy")
    runs = 0
    for index, event in enumerate(events):
        body = event.body()
        if isinstance(body, AssistantMessage) and body.run is not None:
            rebuilt = rebuild(events[:index], body.run, count=WORDS, per_message=0)
            assert rebuilt.sha256 == body.run.context_sha256
            assert rebuilt.summary_through == body.run.summary_through
            runs += 1
    assert runs == 24
    head = memory_store.get_head(copy)
    original = memory_store.get_head(source)
    assert head is not None and head.summary is not None
    assert original is not None and original.summary is not None
    assert (head.summary.sequence, head.summary.through) == (
        original.summary.sequence + 1,
        original.summary.through + 1,
    )
    assert turn(svc, ten_words(99), "conv-copy").output_text  # it goes on from there


def test_a_failed_turn_is_never_in_what_the_model_sees(
    memory_store: ConversationStore, clock: FakeClock
) -> None:
    recording = Recording()
    svc = service(memory_store, clock, recording)
    turn(svc, "My name is Ann.")

    class Down(Recording):
        def complete(self, request: ModelRequest) -> ModelReply:
            raise ProviderError("down", details={"status": 503, "attempts": 3})

    with pytest.raises(ProviderError):
        turn(service(memory_store, clock, Down()), "lost")
    turn(svc, "What is my name?")
    contents = [m.content for m in recording.requests[-1].messages]
    assert contents == ["My name is Ann.", "Noted (1 user messages so far).", "What is my name?"]
    assert [m.content for m in build_messages(transcript(svc))] == [
        *contents,
        "Your name is Ann.",
    ]


class Counting(Provider):
    """A real-model stand-in: reports 4/3 of the characters-based estimate as usage."""

    name = "counting"

    def __init__(self) -> None:
        self.demo = DemoProvider()

    def complete(self, request: ModelRequest) -> ModelReply:
        reply = self.demo.complete(request)
        sent = sum(self.estimate_tokens(m.content or "") + 4 for m in request.messages)
        return reply.model_copy(
            update={"usage": reply.usage.model_copy(update={"input_tokens": sent * 4 // 3})}
        )


def test_a_real_models_estimate_is_calibrated_by_the_usage_it_reports(
    memory_store: ConversationStore, clock: FakeClock
) -> None:
    svc = service(memory_store, clock, Counting())
    first = turn(svc, "x" * 300)
    assert first.context.tokens_estimated == 100 + 4
    head = memory_store.get_head(ConversationKey(tenant=ANN.tenant, conversation_id="conv-1"))
    assert head is not None and head.token_scale == pytest.approx(4 / 3 * 1.05, abs=0.01)
    second = turn(svc, "y" * 300)
    # Scaled: the next estimate is over what the provider will report, never under.
    reported = second.usage.input_tokens
    assert second.context.tokens_estimated >= reported


def test_the_summarizer_provider_is_the_configured_one(
    memory_store: ConversationStore, clock: FakeClock
) -> None:
    """``SUMMARIZER_PROVIDER`` names who writes summaries (built like any provider)."""
    summarizer = Recording()
    built: list[str] = []

    def build(name: str) -> Provider:
        built.append(name)
        return summarizer

    turns = Recording()
    svc = Conversations(
        store=memory_store,
        provider=turns,
        settings=replace(Settings(), context_max_tokens=100, summarizer_provider="other"),
        clock=clock.now,
        providers=build,
    )
    for index in range(1, 9):
        turn(svc, ten_words(index))
    assert built == ["other"]
    assert summary_calls(summarizer) >= 1 and summary_calls(turns) == 0
