"""Turns read back from the log (:mod:`turnledger.turn.turn_log`) and cached tokens
(:class:`~turnledger.core.models.Usage`, :meth:`~turnledger.core.config.ModelSpec.cost`,
the providers' usage), as pure logic."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from turnledger.core.config import ModelSpec
from turnledger.core.models import EventKind, Usage
from turnledger.providers import openai_chat, openai_responses
from turnledger.providers.bedrock_converse import ConverseCall, parse_reply
from turnledger.providers.call_ids import BEDROCK_CALL_ID, CallIdMap
from turnledger.store.codec import A_BODY, encode_head
from turnledger.turn.turn_log import last_request, rebuild

from tests.support.factories import START, make_event, make_head, make_key

RUN = {
    "provider": "demo",
    "latency_ms": 3,
    "tokens_estimated": 7,
    "budget_tokens": 7000,
    "messages_sent": 2,
    "context_from": 1,
    "context_sha256": "0" * 64,
    "cost_usd": 0.25,
}


def answer(sequence: int, text: str | None = None, *calls: str, tokens: int = 5) -> Any:
    tool_calls = [{"id": c, "name": "get_weather", "arguments": {"city": "Oslo"}} for c in calls]
    return make_event(
        sequence,
        kind=EventKind.ASSISTANT_MESSAGE,
        payload={
            "content": text,
            "tool_calls": tool_calls,
            "model": "demo-1",
            "usage": {"input_tokens": tokens, "output_tokens": 1},
            "run": RUN,
        },
        occurred_at=START + timedelta(seconds=sequence),
        actor="model:demo-1",
    )


def requested(sequence: int, call: str, requires: str) -> Any:
    payload = {
        "call_id": call,
        "name": "get_weather",
        "arguments": {"city": "Oslo"},
        "requires": requires,
        "idempotency_key": f"k-{call}",
    }
    return make_event(sequence, kind=EventKind.TOOL_CALL_REQUESTED, payload=payload, actor="system")


def result(sequence: int, call: str, actor: str = "tool:get_weather") -> Any:
    payload = {"call_id": call, "name": "get_weather", "output": "sunny"}
    return make_event(sequence, kind=EventKind.TOOL_RESULT, payload=payload, actor=actor)


def decided(sequence: int, call: str) -> Any:
    payload = {
        "call_id": call,
        "decision": "approved",
        "approver": "ann",
        "arguments_sha256": "0" * 64,
    }
    return make_event(sequence, kind=EventKind.APPROVAL_RESOLVED, payload=payload, actor="ann")


def test_the_last_request_begins_with_what_its_caller_brought() -> None:
    events = [
        make_event(1, content="Weather?"),
        answer(2, None, "c1"),
        requested(3, "c1", "approval"),
        decided(4, "c1"),
        result(5, "c1"),
        answer(6, "It is sunny."),
    ]
    assert [e.sequence for e in last_request(events)] == [4, 5, 6]
    # Client results open a request too; results of the service's own tools do not.
    client = [*events[:3], result(4, "c1", actor="client"), answer(5, "Thanks.")]
    assert [e.sequence for e in last_request(client)] == [4, 5]
    assert [e.sequence for e in last_request(events[:3])] == [1, 2, 3]


def test_a_rebuilt_answer_holds_only_its_request_and_the_turn_holds_all() -> None:
    events = [
        make_event(1, content="Weather?"),
        answer(2, None, "c1", tokens=5),
        requested(3, "c1", "approval"),
        decided(4, "c1"),
        result(5, "c1"),
        answer(6, "It is sunny.", tokens=9),
    ]
    logged = rebuild("conv-1", 1, events, pending=[], default_budget=100, max_tool_steps=4)
    assert logged.answer is not None
    assert logged.answer.output_text == "It is sunny."
    assert logged.answer.usage == Usage(input_tokens=9, output_tokens=1)
    assert logged.answer.context.messages_sent == 2
    assert (logged.status, logged.reason, logged.input) == ("complete", None, ["Weather?"])
    assert logged.usage == Usage(input_tokens=14, output_tokens=2)
    assert logged.cost_usd == 0.5 and len(logged.run_ids) == 2
    assert (logged.started_at, logged.ended_at) == (START, START + timedelta(seconds=6))


@pytest.mark.parametrize(("steps", "reason"), [(1, "max_tool_steps"), (5, "turn_budget")])
def test_calls_that_ran_unanswered_mean_a_limit_stopped_the_request(
    steps: int, reason: str
) -> None:
    events = [make_event(1), answer(2, None, "c1"), requested(3, "c1", "none"), result(4, "c1")]
    logged = rebuild("conv-1", 1, events, pending=[], default_budget=100, max_tool_steps=steps)
    assert logged.reason == reason
    # A call that waited for someone is no limit: the turn went on elsewhere.
    waited = [*events[:2], requested(3, "c1", "client"), result(4, "c1", actor="system")]
    other = rebuild("conv-1", 1, waited, pending=None, default_budget=100, max_tool_steps=steps)
    assert other.reason is None


def test_a_request_without_a_model_call_reports_the_default_budget() -> None:
    events = [
        make_event(1),
        answer(2, None, "c1"),
        requested(3, "c1", "approval"),
        decided(4, "c1"),
    ]
    logged = rebuild("conv-1", 1, events, pending=[], default_budget=123, max_tool_steps=4)
    assert logged.answer is not None
    assert logged.answer.output == [] and logged.answer.usage == Usage()
    assert (logged.answer.context.messages_sent, logged.answer.context.budget_tokens) == (0, 123)


def test_a_failed_attempt_is_the_turns_failure() -> None:
    failed = make_event(
        1,
        turn=2,
        kind=EventKind.TURN_FAILED,
        payload={"code": "provider_error", "status": 502, "attempts": 3, "message": "reset"},
        actor="system",
    )
    logged = rebuild("conv-1", 2, [failed], pending=None, default_budget=1, max_tool_steps=1)
    assert logged.answer is None and (logged.status, logged.reason) == ("failed", "provider_error")
    assert logged.failure is not None
    assert logged.failure.body() == {
        "error": {
            "code": "provider_error",
            "message": "reset",
            "details": {"attempts": 3, "turn": 2},
        }
    }


def test_cached_input_is_priced_at_its_rate_and_defaults_to_the_input_price() -> None:
    usage = Usage(
        input_tokens=1000, output_tokens=10, cached_input_tokens=800, cache_write_input_tokens=100
    )
    plain = ModelSpec(100, 10, input_price_per_mtok=2.0, output_price_per_mtok=8.0)
    assert plain.cost(usage) == pytest.approx((1000 * 2.0 + 10 * 8.0) / 1e6)
    cached = ModelSpec(
        100,
        10,
        input_price_per_mtok=2.0,
        output_price_per_mtok=8.0,
        cached_input_price_per_mtok=0.5,
        cache_write_input_price_per_mtok=2.5,
    )
    assert cached.cost(usage) == pytest.approx((100 * 2.0 + 800 * 0.5 + 100 * 2.5 + 80) / 1e6)
    assert usage + usage == Usage(
        input_tokens=2000, output_tokens=20, cached_input_tokens=1600, cache_write_input_tokens=200
    )


def test_a_head_without_cached_tokens_stores_no_byte_more() -> None:
    key = make_key()
    plain = encode_head(key, make_head(usage=Usage(input_tokens=5, output_tokens=2)))
    body = json.loads(plain[A_BODY])
    assert body["usage"] == {"input_tokens": 5, "output_tokens": 2}
    cached = make_head(usage=Usage(input_tokens=5, output_tokens=2, cached_input_tokens=4))
    assert json.loads(encode_head(key, cached)[A_BODY])["usage"]["cached_input_tokens"] == 4
    # Answers leave them out too while zero: usage reads as it did before caching.
    assert Usage(input_tokens=5).model_dump(mode="json") == {"input_tokens": 5, "output_tokens": 0}


def test_providers_report_cached_tokens() -> None:
    chat = {
        "choices": [{"message": {"role": "assistant", "content": "hi"}}],
        "usage": {
            "prompt_tokens": 100,
            "completion_tokens": 2,
            "prompt_tokens_details": {"cached_tokens": 64},
        },
    }
    reply = openai_chat.parse_reply(json.dumps(chat).encode(), "m")
    assert reply.usage == Usage(input_tokens=100, output_tokens=2, cached_input_tokens=64)
    response = {
        "id": "resp_1",
        "output": [{"type": "message", "content": [{"type": "output_text", "text": "hi"}]}],
        "usage": {
            "input_tokens": 90,
            "output_tokens": 3,
            "input_tokens_details": {"cached_tokens": 32},
        },
    }
    _, answered = openai_responses.parse_reply(json.dumps(response).encode(), "m")
    assert answered.usage == Usage(input_tokens=90, output_tokens=3, cached_input_tokens=32)
    converse = {
        "output": {"message": {"role": "assistant", "content": [{"text": "hi"}]}},
        "usage": {
            "inputTokens": 10,
            "outputTokens": 4,
            "cacheReadInputTokens": 70,
            "cacheWriteInputTokens": 20,
        },
    }
    bedrock = parse_reply(converse, ConverseCall(params={}, ids=_ids()), "m")
    assert bedrock.usage == Usage(
        input_tokens=100, output_tokens=4, cached_input_tokens=70, cache_write_input_tokens=20
    )


def _ids() -> CallIdMap:
    return CallIdMap(BEDROCK_CALL_ID, unique=True)
