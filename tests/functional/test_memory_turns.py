"""Memory write-back inside a request's deadline: the extraction runs only when the
request still has time for a model call, so the answer's commit is never put at risk."""

from __future__ import annotations

from dataclasses import replace

from turnledger.core import deadline
from turnledger.core.config import Settings
from turnledger.core.models import AssistantMessage
from turnledger.providers.demo import DemoProvider
from turnledger.store.memories import MemoryBook
from turnledger.store.memory import MemoryConversationStore
from turnledger.turn.commands import TurnCommand
from turnledger.turn.pipeline import Conversations

from tests.support.factories import FakeClock, make_key


def _answer_run(service: Conversations, conversation: str) -> AssistantMessage:
    events = service.events(make_key("acme", conversation), after=0, limit=100).events
    [body] = [e.body() for e in events if isinstance(e.body(), AssistantMessage)]
    assert isinstance(body, AssistantMessage)
    return body


def test_no_extraction_in_a_requests_last_seconds() -> None:
    store = MemoryConversationStore()
    service = Conversations(
        store=store,
        provider=DemoProvider(),
        settings=replace(Settings(), memory_enabled=True),
        clock=FakeClock(),
    )
    # 4 s left, 2 of them kept for the commit: 2 s for calls, under the 3 s extraction needs.
    with deadline.request_deadline(4.0):
        result = service.turn(
            make_key("acme", "late"), "ann", TurnCommand(messages=["my name is Ann"])
        )
    assert result.output_text == "Noted (1 user messages so far)."
    run = _answer_run(service, "late").run
    assert run is not None and run.memory_usage is None
    assert MemoryBook(store, "acme", "ann").records() == []

    with deadline.request_deadline(30.0):
        service.turn(make_key("acme", "early"), "ann", TurnCommand(messages=["my name is Ann"]))
    run = _answer_run(service, "early").run
    assert run is not None and run.memory_usage is not None
    assert [r.key for r in MemoryBook(store, "acme", "ann").records()] == ["name"]
