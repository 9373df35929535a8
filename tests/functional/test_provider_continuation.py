"""One fixed transcript continued on openai-chat, openai-responses and bedrock-converse.

Each provider gets the same provider-neutral context (a user fact, a tool call
and its result, then a question); every request it sends is checked against
that provider's own request schema, and what reaches the model is the whole
conversation, whether sent whole or over stored state.
"""

from __future__ import annotations

from typing import Any

from turnledger.providers.base import Continuation, Message, ModelRequest
from turnledger.providers.bedrock_converse import BedrockConverseProvider
from turnledger.providers.openai_chat import OpenAIChatProvider
from turnledger.providers.openai_responses import OpenAIResponsesProvider

from tests.functional.fake_bedrock import FakeBedrock, converse_reply, model_id
from tests.functional.fake_openai import (
    FakeOpenAI,
    function_call_item,
    response_reply,
    text_reply,
)
from tests.support.provider_schemas import (
    validate_chat_request,
    validate_converse_request,
    validate_responses_request,
)
from tests.support.transcripts import (
    SYSTEM_PROMPT,
    TRANSCRIPT,
    TURN_STARTS,
    WEATHER,
    converse_params,
    responses_input,
)


def request(messages: list[Message], **options: Any) -> ModelRequest:
    return ModelRequest(model="gpt-test", messages=messages, tools=[WEATHER], **options)


def test_openai_chat_gets_the_whole_transcript(fake: FakeOpenAI) -> None:
    fake.script(text_reply("Your name is Ann."))
    provider = OpenAIChatProvider(base_url=fake.base_url, max_retries=0)

    assert provider.complete(request(TRANSCRIPT)).text == "Your name is Ann."

    body = fake.requests[0].json()
    validate_chat_request(body)
    assert body["messages"] == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "Hi, my name is Ann."},
        {"role": "assistant", "content": "Nice to meet you, Ann."},
        {"role": "user", "content": "What is the weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_w1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_w1", "content": '{"temp_c": 4}'},
        {"role": "assistant", "content": "It is 4 degrees in Oslo."},
        {"role": "user", "content": "What is my name?"},
    ]


# --- openai-responses: turn by turn over stored state ------------------------------------

#: The Responses input items of the whole transcript (what a fresh request sends).
FULL_INPUT = responses_input()


def _seen(item: dict[str, Any]) -> tuple[Any, ...]:
    """What the model reads of an item, whether sent as input or kept as output."""
    content = item.get("content")
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content)
    return (
        item["type"],
        item.get("role"),
        content,
        item.get("call_id"),
        item.get("name"),
        item.get("arguments"),
        item.get("output"),
    )


def _play_turns(fake: FakeOpenAI, provider: OpenAIResponsesProvider) -> str:
    """Run the transcript turn by turn, each over the previous stored response; the last id."""
    fake.script(
        response_reply("Nice to meet you, Ann."),
        response_reply(None, function_call_item("call_w1", "get_weather", '{"city": "Oslo"}')),
        response_reply("It is 4 degrees in Oslo."),
    )
    first = provider.complete(request(TRANSCRIPT[:2], store=True))
    assert (first.provider_state, first.response_id) == ("fresh", "resp_fake_1")
    asking = provider.complete(
        request(
            TRANSCRIPT[:4],
            store=True,
            continuation=Continuation(previous_response_id="resp_fake_1", new_from=3),
        )
    )
    assert asking.provider_state == "continued"
    assert [call.id for call in asking.tool_calls] == ["call_w1"]
    answered = provider.complete(
        request(
            TRANSCRIPT[:6],
            store=True,
            continuation=Continuation(previous_response_id="resp_fake_2", new_from=5),
        )
    )
    assert answered.provider_state == "continued"
    assert answered.response_id is not None
    return answered.response_id


def test_openai_responses_continues_turn_by_turn_and_the_model_sees_everything(
    fake: FakeOpenAI,
) -> None:
    provider = OpenAIResponsesProvider(base_url=fake.base_url, max_retries=0)
    last = _play_turns(fake, provider)
    fake.script(response_reply("Your name is Ann."))

    reply = provider.complete(
        request(
            TRANSCRIPT,
            store=True,
            continuation=Continuation(previous_response_id=last, new_from=TURN_STARTS[2]),
        )
    )

    assert (reply.text, reply.provider_state, reply.response_id) == (
        "Your name is Ann.",
        "continued",
        "resp_fake_4",
    )
    bodies = [r.json() for r in fake.requests]
    for body in bodies:
        validate_responses_request(body)
        assert body["instructions"] == SYSTEM_PROMPT
        assert body["store"] is True
    # Each continued request sends only what the stored response has not seen.
    assert [body["input"] for body in bodies[1:]] == [
        [FULL_INPUT[2]],
        [FULL_INPUT[4]],
        [FULL_INPUT[6]],
    ]
    assert [body.get("previous_response_id") for body in bodies] == [
        None,
        "resp_fake_1",
        "resp_fake_2",
        "resp_fake_3",
    ]
    # What the model saw on the last turn is the whole transcript.
    assert [_seen(item) for item in fake.contexts[-1]] == [_seen(item) for item in FULL_INPUT]


def test_openai_responses_falls_back_to_the_whole_transcript_when_the_state_is_lost(
    fake: FakeOpenAI,
) -> None:
    provider = OpenAIResponsesProvider(base_url=fake.base_url, max_retries=0)
    last = _play_turns(fake, provider)
    fake.lose_responses()
    fake.script(response_reply("Your name is Ann."))

    reply = provider.complete(
        request(
            TRANSCRIPT,
            store=True,
            continuation=Continuation(previous_response_id=last, new_from=TURN_STARTS[2]),
        )
    )

    assert (reply.text, reply.provider_state) == ("Your name is Ann.", "fallback")
    refused, resent = fake.requests[-2:]
    assert refused.json()["previous_response_id"] == last
    body = resent.json()
    validate_responses_request(body)
    assert "previous_response_id" not in body
    assert body["input"] == FULL_INPUT
    assert reply.response_id == "resp_fake_4"  # the fallback answer is the next cursor


def test_bedrock_converse_gets_the_whole_transcript() -> None:
    with FakeBedrock() as fake:
        fake.script(converse_reply("Your name is Ann."))
        provider = BedrockConverseProvider(endpoint_url=fake.url, region="us-east-1")
        model = "anthropic.claude-3-5-haiku-20241022-v1:0"

        reply = provider.complete(ModelRequest(model=model, messages=TRANSCRIPT, tools=[WEATHER]))

        sent = fake.requests[0]
    assert reply.text == "Your name is Ann."
    params = {"modelId": model_id(sent), **sent.json()}
    validate_converse_request(params)
    assert params == converse_params(model)
