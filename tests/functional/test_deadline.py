"""The request's deadline cuts provider and tool timeouts to the time Lambda has left.

Against real HTTP endpoints on loopback that never answer in time: with a 60 s
provider timeout and a 30 s tool timeout, a request with 1.5 s left is over in about
that long; one with no time left sends nothing. Through the API handler, a turn
whose Lambda has 3.5 s left (2 s kept for the commit) answers ``504
provider_timeout`` with its ``turn_failed`` recorded, before the function's timeout.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from moto import mock_aws
from turnledger.api import lambda_handler
from turnledger.core.deadline import cap, remaining, request_deadline
from turnledger.core.exceptions import ProviderTimeout
from turnledger.providers.openai_chat import OpenAIChatProvider
from turnledger.runtime import set_runtime
from turnledger.tools.http import HttpExecutor
from turnledger_local.gateway import LambdaContext

from tests.functional.http_sink import HttpSink, Reply
from tests.functional.test_api_edges import request
from tests.functional.test_executors import http_tool, invocation
from tests.support.aws import aws_clients, create_bucket, create_conversations_table

HANG = Reply(body={"late": True}, delay=30.0)


def test_without_a_deadline_timeouts_are_unchanged() -> None:
    assert remaining() is None
    assert cap(60.0) == 60.0
    with request_deadline(None):
        assert cap(60.0) == 60.0
    with request_deadline(10.0, margin_seconds=2.0):
        left = remaining()
        assert left is not None and 7.5 < left <= 8.0
        assert cap(60.0) == pytest.approx(left, abs=0.1)
        assert cap(1.0) == 1.0
        assert cap(None) == pytest.approx(left, abs=0.1)
    assert remaining() is None


def test_a_provider_call_ends_at_the_deadline(sink: HttpSink) -> None:
    sink.respond("/v1/chat/completions", HANG)
    provider = OpenAIChatProvider(
        base_url=sink.url("/v1"), timeout_seconds=60.0, max_retries=2, sleep=lambda _: None
    )
    began = time.monotonic()
    with request_deadline(1.5, margin_seconds=0.0), pytest.raises(ProviderTimeout):
        provider.send("POST", sink.url("/v1/chat/completions"), key=None, body={})
    assert time.monotonic() - began < 5.0
    # The retries were not sent: the time was spent.
    assert len(sink.requests_for("/v1/chat/completions")) == 1


def test_no_time_left_sends_nothing(sink: HttpSink) -> None:
    sink.respond("/v1/chat/completions", HANG)
    provider = OpenAIChatProvider(base_url=sink.url("/v1"), timeout_seconds=60.0)
    with request_deadline(1.0, margin_seconds=2.0), pytest.raises(ProviderTimeout) as caught:
        provider.send("POST", sink.url("/v1/chat/completions"), key=None, body={})
    assert caught.value.details["reason"] == "deadline"
    assert sink.requests_for("/v1/chat/completions") == []


def test_a_tool_call_ends_at_the_deadline(sink: HttpSink) -> None:
    sink.respond("/weather", HANG)
    with httpx.Client() as http:
        executor = HttpExecutor(http, timeout_seconds=30)
        began = time.monotonic()
        with request_deadline(1.0, margin_seconds=0.0):
            outcome = executor.execute(invocation(http_tool(sink.url("/weather"))))
        assert outcome.is_error and "timed out" in outcome.output
        assert time.monotonic() - began < 5.0
        with request_deadline(0.5, margin_seconds=1.0):
            outcome = executor.execute(invocation(http_tool(sink.url("/weather"))))
        assert outcome.is_error and "ran out of time" in outcome.output
        assert len(sink.requests_for("/weather")) == 1


def test_a_turn_out_of_time_answers_504_and_records_turn_failed(
    sink: HttpSink, monkeypatch: pytest.MonkeyPatch, load_event: Any
) -> None:
    sink.respond("/v1/chat/completions", HANG)
    with mock_aws():
        clients = aws_clients()
        monkeypatch.setenv("TABLE_NAME", create_conversations_table(clients.dynamodb))
        monkeypatch.setenv("BUCKET_NAME", create_bucket(clients.s3))
        monkeypatch.setenv("PROVIDER", "openai-chat")
        monkeypatch.setenv("MODEL", "gpt-test")
        monkeypatch.setenv("OPENAI_BASE_URL", sink.url("/v1"))
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        monkeypatch.setenv("PROVIDER_TIMEOUT_SECONDS", "60")
        set_runtime(None)
        try:
            context = LambdaContext(
                function_name="TurnFunction", memory_limit_in_mb=512, timeout_seconds=3.5
            )
            began = time.monotonic()
            answer = lambda_handler(
                request(load_event("turn"), request_id="req-late", tenant="acme"), context
            )
            took = time.monotonic() - began
            assert answer["statusCode"] == 504, answer
            assert json.loads(answer["body"])["error"]["code"] == "provider_timeout"
            assert took < 3.5
            events = lambda_handler(
                request(load_event("get-events"), request_id="req-events", tenant="acme"),
                LambdaContext(
                    function_name="ReadFunction", memory_limit_in_mb=512, timeout_seconds=29
                ),
            )
            kinds = [e["kind"] for e in json.loads(events["body"])["events"]]
            assert kinds == ["turn_failed"], kinds
        finally:
            set_runtime(None)
