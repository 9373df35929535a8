"""bedrock-converse honours the request's deadline: botocore's read timeout is cut to it.

botocore fixes a client's read timeout when the client is built, so an attempt that
must end sooner than the configured timeout goes through a client built for the whole
seconds the request has left (cached per second).
"""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber
from turnledger.core.deadline import request_deadline
from turnledger.core.exceptions import ProviderError, ProviderTimeout
from turnledger.providers.base import Message, ModelRequest
from turnledger.providers.bedrock_converse import MAX_TIMED_CLIENTS, BedrockConverseProvider

MODEL = "amazon.nova-lite-v1:0"
HELLO = ModelRequest(model=MODEL, messages=[Message(role="user", content="hi")])


def answer(text: str) -> dict[str, Any]:
    return {
        "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
        "stopReason": "end_turn",
        "usage": {"inputTokens": 5, "outputTokens": 2, "totalTokens": 7},
        "metrics": {"latencyMs": 10},
    }


def provider(timeout: float = 18.0, **kwargs: Any) -> BedrockConverseProvider:
    # Never contacted: every call below is answered by a Stubber.
    return BedrockConverseProvider(
        region="us-east-1",
        endpoint_url="http://127.0.0.1:9",
        timeout_seconds=timeout,
        sleep=lambda _: None,
        **kwargs,
    )


def test_without_a_deadline_the_configured_timeout_applies() -> None:
    bedrock = provider(18.0)
    assert bedrock.client.meta.config.read_timeout == 18.0
    with Stubber(bedrock.client) as stubber:
        stubber.add_response("converse", answer("hello"))
        assert bedrock.complete(HELLO).text == "hello"


def test_a_deadline_sooner_than_the_timeout_cuts_the_read_timeout() -> None:
    bedrock = provider(18.0)
    # 7.5 s left, less the deadline's 2 s margin: 5.5 s, so a client of 5 s.
    timed = bedrock.timed_client(5)
    assert timed.meta.config.read_timeout == 5.0
    assert timed.meta.config.connect_timeout == 5.0
    with Stubber(timed) as stubber, request_deadline(7.5):
        stubber.add_response("converse", answer("in time"))
        assert bedrock.complete(HELLO).text == "in time"
        stubber.assert_no_pending_responses()


def test_a_deadline_later_than_the_timeout_keeps_the_configured_client() -> None:
    bedrock = provider(4.0)
    with Stubber(bedrock.client) as stubber, request_deadline(60.0):
        stubber.add_response("converse", answer("plenty of time"))
        assert bedrock.complete(HELLO).text == "plenty of time"
    assert bedrock.client.meta.config.read_timeout == 4.0


def test_timed_clients_are_cached_per_second_and_bounded() -> None:
    bedrock = provider(60.0)
    assert bedrock.timed_client(3) is bedrock.timed_client(3)
    assert bedrock.timed_client(3) is not bedrock.timed_client(4)
    for seconds in range(1, MAX_TIMED_CLIENTS + 5):
        assert bedrock.timed_client(seconds).meta.config.read_timeout == float(seconds)
    assert len(bedrock._timed_clients) == MAX_TIMED_CLIENTS


def test_less_than_a_second_left_still_gets_one_second() -> None:
    bedrock = provider(18.0)
    timed = bedrock.timed_client(1)
    with Stubber(timed) as stubber, request_deadline(2.5):
        stubber.add_response("converse", answer("just"))
        assert bedrock.complete(HELLO).text == "just"
        stubber.assert_no_pending_responses()


def test_no_time_left_answers_a_provider_timeout_without_calling() -> None:
    bedrock = provider(18.0)
    with Stubber(bedrock.client) as stubber, request_deadline(1.0):  # under the margin
        with pytest.raises(ProviderTimeout) as caught:
            bedrock.complete(HELLO)
        stubber.assert_no_pending_responses()
    assert caught.value.details["reason"] == "deadline"
    assert bedrock._timed_clients == {}


class _Clock:
    """Stands in for the ``time`` module of :mod:`turnledger.core.deadline`."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class _SlowThrottledClient:
    """A client whose every call takes ``seconds`` (of the fake clock) and is throttled."""

    def __init__(self, clock: _Clock, seconds: float) -> None:
        self.clock, self.seconds, self.calls = clock, seconds, 0

    def converse(self, **_: Any) -> Any:
        self.calls += 1
        self.clock.now += self.seconds
        raise ClientError(
            {
                "Error": {"Code": "ThrottlingException", "Message": "slow down"},
                "ResponseMetadata": {"HTTPStatusCode": 429},
            },
            "Converse",
        )


def test_no_retry_once_the_time_is_spent(monkeypatch: pytest.MonkeyPatch) -> None:
    import turnledger.core.deadline as deadline_module

    clock = _Clock()
    monkeypatch.setattr(deadline_module, "time", clock)
    bedrock = provider(18.0, max_retries=3)
    slow = _SlowThrottledClient(clock, seconds=4.0)
    bedrock._timed_clients[4] = slow  # type: ignore[assignment]
    with request_deadline(6.0), pytest.raises(ProviderError) as caught:  # 4 s to spend
        bedrock.complete(HELLO)
    # Throttling is retryable, but the one attempt used the request's time: no second.
    assert slow.calls == 1
    assert caught.value.details["attempts"] == 1
    assert caught.value.details["provider_code"] == "ThrottlingException"


def test_retries_go_on_while_time_is_left(monkeypatch: pytest.MonkeyPatch) -> None:
    import turnledger.core.deadline as deadline_module

    clock = _Clock()
    monkeypatch.setattr(deadline_module, "time", clock)
    bedrock = provider(18.0, max_retries=3)
    slow = _SlowThrottledClient(clock, seconds=1.0)
    for seconds in range(1, 12):
        bedrock._timed_clients[seconds] = slow  # type: ignore[assignment]
    with request_deadline(12.0), pytest.raises(ProviderError) as caught:  # 10 s to spend
        bedrock.complete(HELLO)
    assert slow.calls == 4  # the first attempt and 3 retries, each with less time
    assert caught.value.details["attempts"] == 4


def test_a_given_client_is_used_as_it_is() -> None:
    import boto3

    client = boto3.client("bedrock-runtime", region_name="us-east-1")
    bedrock = BedrockConverseProvider(client=client, timeout_seconds=18.0)
    with Stubber(client) as stubber, request_deadline(7.5):
        stubber.add_response("converse", answer("stubbed"))
        assert bedrock.complete(HELLO).text == "stubbed"
    assert bedrock._timed_clients == {}
