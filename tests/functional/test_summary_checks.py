"""Summaries checked by code and compaction on demand (issue 42): a summary that loses a
must-keep value of what it replaces is refused (logged and counted) and the previous one
kept; ``POST .../compact`` on a conversation with no summary compacts now."""

from __future__ import annotations

from dataclasses import replace

import pytest
from aws_lambda_powertools.metrics import MetricUnit
from turnledger.api.schemas import TurnRequest
from turnledger.core.config import Settings
from turnledger.core.exceptions import NothingToCompact
from turnledger.core.models import ContextCompacted, ConversationKey, Event, EventKind
from turnledger.providers.base import ModelReply, ModelRequest
from turnledger.providers.demo import SUMMARY_PREFIX
from turnledger.store.base import ConversationStore
from turnledger.turn import compaction
from turnledger.turn.pipeline import Conversations

from tests.support import edge
from tests.support.edge import Caller
from tests.support.factories import FakeClock
from tests.support.providers import Recording

ANN = Caller(tenant="tenant-a", actor="ann")
MUST_KEEP = {"order": r"\border (\d{4})\b", "language": r"\banswer in ([A-Z][a-z]+)"}


class Forgetful(Recording):
    """The demo model, whose summaries keep only what says a name while ``forget`` is on."""

    forget = False

    def complete(self, request: ModelRequest) -> ModelReply:
        reply = super().complete(request)
        if request.purpose != "summary" or not self.forget:
            return reply
        items = (reply.text or "").removeprefix(SUMMARY_PREFIX).split(" | ")
        kept = [item.strip() for item in items if "name" in item.lower()] or ["nothing"]
        return reply.model_copy(update={"text": f"{SUMMARY_PREFIX} " + " | ".join(kept)})


def service(store: ConversationStore, clock: FakeClock, provider: Recording) -> Conversations:
    settings = replace(Settings(), context_max_tokens=120, summary_must_keep=MUST_KEEP)
    return Conversations(store=store, provider=provider, settings=settings, clock=clock.now)


def turn(svc: Conversations, text: str, conversation: str = "conv-1") -> str | None:
    return edge.turn(svc, ANN, conversation, TurnRequest(input=text)).output_text


def summaries(svc: Conversations, conversation: str = "conv-1") -> list[ContextCompacted]:
    page = edge.events(svc, ANN, conversation, after=0, limit=1000)
    found = []
    for view in page.events:
        event = Event.model_validate(view.model_dump())
        body = event.body()
        if event.kind is EventKind.CONTEXT_COMPACTED and isinstance(body, ContextCompacted):
            found.append(body)
    return found


def test_a_summary_that_loses_a_must_keep_value_is_refused_and_the_previous_one_kept(
    memory_store: ConversationStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted: list[str] = []
    logged: list[dict[str, object]] = []
    monkeypatch.setattr(
        compaction.metrics,
        "add_metric",
        lambda name, unit, value: counted.append(name) if unit is MetricUnit.Count else None,
    )
    monkeypatch.setattr(
        compaction.logger, "warning", lambda message, extra: logged.append(dict(extra))
    )
    provider = Forgetful()
    svc = service(memory_store, clock, provider)
    turn(svc, "my name is Ann, answer in Portuguese")
    turn(svc, "order 7731 is late, please check it now")
    index = 2
    while not summaries(svc):
        index += 1
        turn(svc, f"note {index} one two three four five six seven eight")
    [first] = summaries(svc)
    assert "order 7731" in first.text and "answer in Portuguese" in first.text
    provider.forget = True
    for later in range(index + 1, index + 10):
        turn(svc, f"note {later} one two three four five six seven eight")
    # Every later summary lost the order (the name's item keeps the language): none was
    # written.
    assert summaries(svc) == [first]
    assert counted and set(counted) == {compaction.SKIPPED_METRIC}
    assert logged and all(entry["reason"] == "lost_values" for entry in logged)
    assert logged[0]["patterns"] == ["order"]
    # Values are never logged: only the patterns' names.
    assert all("7731" not in str(entry) for entry in logged)
    sent = [r for r in provider.requests if r.purpose == "turn"][-1].messages
    assert any(m.content == first.text for m in sent)
    # The newest messages always follow the summary.
    assert sent[-1].role == "user" and sent[-1].content is not None
    assert [m.content for m in sent].index(first.text) < len(sent) - 1


def test_a_summary_that_keeps_every_value_is_written(
    memory_store: ConversationStore, clock: FakeClock
) -> None:
    svc = service(memory_store, clock, Recording())
    turn(svc, "order 7731 is late")
    index = 1
    while not summaries(svc):
        index += 1
        turn(svc, f"note {index} one two three four five six seven eight")
    assert "7731" in summaries(svc)[0].text


def test_compact_with_no_summary_compacts_every_turn_but_the_newest_now(
    memory_store: ConversationStore, clock: FakeClock
) -> None:
    provider = Recording()
    svc = service(memory_store, clock, provider)
    key = ConversationKey(tenant=ANN.tenant, conversation_id="conv-1")
    turn(svc, "my name is Ann")
    with pytest.raises(NothingToCompact):
        svc.compact(key, ANN.actor)  # one turn: nothing but the newest
    for index in range(2, 7):
        turn(svc, f"short {index}")
    assert summaries(svc) == []
    event = svc.compact(key, ANN.actor)
    body = event.body()
    assert isinstance(body, ContextCompacted)
    assert (event.kind, event.actor, body.trigger) == (EventKind.CONTEXT_COMPACTED, "ann", "manual")
    assert (body.from_turn, body.to_turn, body.from_sequence, body.to_sequence) == (1, 4, 1, 8)
    assert body.replaces is None and body.pins == []
    assert "my name is Ann" in body.text
    view = edge.get(svc, ANN, "conv-1")
    assert view.summary_through == 8
    assert turn(svc, "What is my name?") == "Your name is Ann."
    sent = [r for r in provider.requests if r.purpose == "turn"][-1].messages
    assert sent[0].content == body.text
    assert [m.content for m in sent[1:] if m.role == "user"] == [
        "short 5",
        "short 6",
        "What is my name?",
    ]
