"""bedrock-converse against botocore's Stubber: the exact parameters, and the error mapping."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from turnledger.core.exceptions import ProviderError, ProviderTimeout
from turnledger.providers.base import Continuation, Message, ModelRequest
from turnledger.providers.bedrock_converse import BedrockConverseProvider

from tests.support.provider_schemas import validate_converse_request
from tests.support.transcripts import TRANSCRIPT, WEATHER, converse_params

MODEL = "amazon.nova-lite-v1:0"


@pytest.fixture
def stubbed() -> Iterator[tuple[BedrockConverseProvider, Stubber, list[float]]]:
    client = boto3.client("bedrock-runtime", region_name="us-east-1")
    waits: list[float] = []
    provider = BedrockConverseProvider(client=client, sleep=waits.append, jitter=lambda: 0.0)
    with Stubber(client) as stubber:
        yield provider, stubber, waits
        stubber.assert_no_pending_responses()


def answer(text: str) -> dict[str, Any]:
    return {
        "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
        "stopReason": "end_turn",
        "usage": {"inputTokens": 5, "outputTokens": 2, "totalTokens": 7},
        "metrics": {"latencyMs": 10},
    }


def test_the_transcript_is_sent_as_these_exact_parameters(stubbed: Any) -> None:
    provider, stubber, _ = stubbed
    request = ModelRequest(
        model=MODEL,
        messages=TRANSCRIPT,
        tools=[WEATHER],
        # Bedrock keeps no state: a continuation changes nothing, the whole context goes.
        continuation=Continuation(previous_response_id="resp_x", new_from=7),
        store=True,
    )
    expected = converse_params(MODEL)
    validate_converse_request(expected)
    stubber.add_response("converse", answer("Your name is Ann."), expected)

    reply = provider.complete(request)

    assert (reply.text, reply.provider_state, reply.response_id) == (
        "Your name is Ann.",
        "fresh",
        None,
    )


def test_throttling_then_model_not_ready_are_retried(stubbed: Any) -> None:
    provider, stubber, waits = stubbed
    stubber.add_client_error("converse", "ThrottlingException", "slow down", 429)
    stubber.add_client_error("converse", "ModelNotReadyException", "warming up", 429)
    stubber.add_response("converse", answer("ready"))

    reply = provider.complete(
        ModelRequest(model=MODEL, messages=[Message(role="user", content="hi")])
    )

    assert reply.text == "ready"
    assert waits == [0.25, 0.5]


def test_a_validation_error_is_not_retried(stubbed: Any) -> None:
    provider, stubber, waits = stubbed
    stubber.add_client_error("converse", "ValidationException", "The model ID is invalid", 400)

    with pytest.raises(ProviderError) as caught:
        provider.complete(ModelRequest(model=MODEL, messages=[Message(role="user", content="hi")]))

    assert caught.value.details == {
        "status": 400,
        "provider_code": "ValidationException",
        "provider_message": "The model ID is invalid",
        "attempts": 1,
    }
    assert waits == []


def test_a_model_timeout_becomes_a_provider_timeout(stubbed: Any) -> None:
    provider, stubber, _ = stubbed
    for _ in range(3):
        stubber.add_client_error("converse", "ModelTimeoutException", "too slow", 408)

    with pytest.raises(ProviderTimeout) as caught:
        provider.complete(ModelRequest(model=MODEL, messages=[Message(role="user", content="hi")]))

    assert caught.value.details["attempts"] == 3


def test_the_client_is_built_once_on_first_use() -> None:
    built: list[int] = []
    client = boto3.client("bedrock-runtime", region_name="us-east-1")

    def factory() -> Any:
        built.append(1)
        return client

    provider = BedrockConverseProvider(client_factory=factory)
    assert built == []
    with Stubber(client) as stubber:
        stubber.add_response("converse", answer("a"))
        stubber.add_response("converse", answer("b"))
        hello = ModelRequest(model=MODEL, messages=[Message(role="user", content="hi")])
        provider.complete(hello)
        provider.complete(hello)

    assert built == [1]


def test_a_client_that_cannot_be_built_is_a_provider_error() -> None:
    def factory() -> Any:
        return boto3.client("bedrock-runtime", region_name="not a region!")

    provider = BedrockConverseProvider(client_factory=factory)

    with pytest.raises(ProviderError) as caught:
        provider.complete(ModelRequest(model=MODEL, messages=[Message(role="user", content="hi")]))

    assert caught.value.details["reason"] == "client_unavailable"
