"""Memory extraction (the demo extractor, the answer's parsing, the writes it plans) and
recall (ranking and the block's share of the budget): :mod:`turnledger.context.memory`."""

from __future__ import annotations

from datetime import timedelta

import pytest
from turnledger.context.assembly import Estimator, assemble
from turnledger.context.memory import (
    MEMORY_PREFIX,
    Fact,
    Provenance,
    extraction_request,
    parse_facts,
    plan_writes,
    rank,
    recall_block,
)
from turnledger.providers.base import Message, ModelRequest
from turnledger.providers.demo import DemoProvider
from turnledger.store.memories import MemoryRecord, new_memory_id

from tests.support.factories import START

WORDS = Estimator(count=lambda text: len(text.split()))
SOURCE = Provenance(conversation_id="c-1", from_sequence=3, to_sequence=3)


def record(text: str, key: str | None = None, minutes: int = 0) -> MemoryRecord:
    at = START + timedelta(minutes=minutes)
    return MemoryRecord(id=new_memory_id(), text=text, key=key, created_at=at, updated_at=at)


def extract(*texts: str, known: list[MemoryRecord] | None = None) -> list[Fact]:
    reply = DemoProvider().complete(extraction_request("demo-1", texts, known or []))
    return parse_facts(reply.text or "")


def test_the_demo_extractor_keeps_what_the_user_says_about_themselves() -> None:
    facts = extract("Hi, my name is Ann. I live in Berlin, and I work on payments.")
    assert {(f.key, f.text) for f in facts} == {
        ("name", "My name is Ann."),
        ("city", "I live in Berlin."),
        ("work", "I work on payments."),
    }
    assert extract("Please answer in Spanish!") == [Fact(key="language", text="Answer in Spanish.")]
    assert extract("what is my name?") == []
    # The latest statement of a key wins.
    assert extract("I live in Berlin.", "I moved to Paris.") == [
        Fact(key="city", text="I live in Paris.")
    ]


def test_an_answer_that_is_not_the_json_asked_for_is_refused() -> None:
    assert parse_facts('```json\n{"memories": [{"key": "name", "text": "Ann"}]}\n```') == [
        Fact(key="name", text="Ann")
    ]
    for bad in ("Sure! Your name is Ann.", '{"memories": [{"key": "Bad Key", "text": "x"}]}'):
        with pytest.raises(ValueError):
            parse_facts(bad)


def test_a_fact_with_a_known_key_supersedes_its_record() -> None:
    berlin, tea = record("I live in Berlin.", "city"), record("I like tea.")
    plan = plan_writes(
        [berlin, tea],
        [Fact(key="city", text="I live in Paris."), Fact(text="I like tea.")],
        now=START + timedelta(hours=1),
        source=SOURCE,
        cap=10,
    )
    [paris] = plan.puts
    assert (paris.id, paris.text, paris.created_at) == (berlin.id, "I live in Paris.", START)
    assert (paris.conversation_id, paris.from_sequence, paris.source) == ("c-1", 3, "extracted")
    assert plan.deletes == []
    # The same text again writes nothing.
    again = plan_writes(
        [paris], [Fact(key="city", text="I live in Paris.")], now=START, source=SOURCE, cap=10
    )
    assert again.puts == [] and again.deletes == []


def test_beyond_the_cap_the_least_recently_updated_go() -> None:
    old = [record(f"Fact {n}.", minutes=n) for n in range(3)]
    plan = plan_writes(
        old, [Fact(text="New fact.")], now=START + timedelta(hours=1), source=SOURCE, cap=3
    )
    assert [p.text for p in plan.puts] == ["New fact."]
    assert plan.deletes == [old[0].id]


def test_a_key_written_twice_by_racing_turns_keeps_the_newest() -> None:
    older, newer = record("I live in Rome.", "city", 0), record("I live in Oslo.", "city", 5)
    assert plan_writes([older, newer], [], now=START, source=SOURCE, cap=10).deletes == [older.id]
    assert rank([older, newer], "where do I live") == [newer]


def test_ranking_prefers_shared_words_then_recency() -> None:
    tea = record("I like green tea.", minutes=0)
    cat = record("I have a cat called Tom.", minutes=1)
    work = record("I work on payments.", "work", minutes=2)
    assert rank([tea, cat, work], "what is my cat called?")[0] == cat
    assert rank([tea, cat, work], "hello") == [work, cat, tea]  # no overlap: newest first
    vectors = {tea.id: [1.0, 0.0], cat.id: [0.0, 1.0], work.id: [0.6, 0.8]}
    by_vector = rank(
        [tea, cat, work], "x", query_vector=[1.0, 0.0], vector_of=lambda r: vectors[r.id]
    )
    assert by_vector == [tea, work, cat]


def test_the_block_stays_within_its_share_of_the_budget() -> None:
    ranked = [record("My name is Ann."), record("word " * 40), record("I like tea.")]
    message, ids = recall_block(ranked, budget=200, share=0.1, estimator=WORDS)
    assert message is not None and message.content is not None
    assert message.content.startswith(MEMORY_PREFIX)
    assert ids == [ranked[0].id, ranked[2].id]  # the long one does not fit; the short next
    assert WORDS.tokens([message]) <= 20
    assert recall_block(ranked, budget=20, share=0.1, estimator=WORDS) == (None, [])


def test_the_demo_model_answers_from_the_recalled_block() -> None:
    message, _ = recall_block([record("My name is Ann.")], budget=1000, share=0.1, estimator=WORDS)
    events: list = []
    context = assemble(events, budget=1000, estimator=WORDS, memory=message).messages
    request = ModelRequest(
        model="demo-1", messages=[*context, Message(role="user", content="What is my name?")]
    )
    assert DemoProvider().complete(request).text == "Your name is Ann."
    # The conversation's own word outranks memory.
    said = Message(role="user", content="my name is Bo")
    request = ModelRequest(
        model="demo-1", messages=[*context, said, Message(role="user", content="what is my name")]
    )
    assert DemoProvider().complete(request).text == "Your name is Bo."
