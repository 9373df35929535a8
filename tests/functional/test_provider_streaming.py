"""Providers stream (issue 13): ``Provider.stream`` against the fake servers' real wire formats.

The fake OpenAI server streams any scripted answer when the request says ``stream:
true`` (Chat Completions chunks with ``[DONE]``, Responses API events); the streamed
reply must equal what the same answer gives unstreamed, and the deltas must join to
its text.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from turnledger.core.exceptions import ProviderError
from turnledger.core.models import ToolCall
from turnledger.providers.base import Continuation, Message, ModelRequest, Provider
from turnledger.providers.demo import DemoProvider
from turnledger.providers.openai_chat import OpenAIChatProvider
from turnledger.providers.openai_responses import OpenAIResponsesProvider

from tests.functional.fake_openai import (
    FakeOpenAI,
    broken_stream,
    error_reply,
    function_call_item,
    response_reply,
    text_reply,
    tool_call,
    tool_calls_reply,
)
from tests.support import edge
from tests.support.edge import Caller

HELLO = ModelRequest(model="gpt-test", messages=[Message(role="user", content="hello")])


def options(fake: FakeOpenAI) -> dict[str, Any]:
    return {
        "base_url": fake.base_url,
        "api_key": lambda: "sk-test",
        "timeout_seconds": 5.0,
        "max_retries": 2,
        "sleep": lambda _: None,
    }


def streamed(provider: Provider, request: ModelRequest) -> tuple[list[str], Any]:
    pieces: list[str] = []
    reply = provider.stream(request, pieces.append)
    return pieces, reply


def test_openai_chat_streams_text_and_usage(fake: FakeOpenAI) -> None:
    answer = "The quick brown fox jumps."
    fake.script(text_reply(answer, prompt_tokens=7, completion_tokens=5))
    fake.script(text_reply(answer, prompt_tokens=7, completion_tokens=5))
    provider = OpenAIChatProvider(**options(fake))
    pieces, reply = streamed(provider, HELLO)
    assert len(pieces) == 5 and "".join(pieces) == answer
    assert reply == provider.complete(HELLO)  # the same reply as unstreamed
    body = fake.requests[0].json()
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert fake.requests[0].headers["accept"] == "text/event-stream"
    assert "stream" not in fake.requests[1].json()


def test_openai_chat_streams_tool_calls_in_pieces(fake: FakeOpenAI) -> None:
    fake.script(
        tool_calls_reply(
            tool_call("call_a", "get_weather", '{"city": "Oslo"}'),
            tool_call("call_b", "send_email", '{"to": "bob@example.com"}'),
        )
    )
    pieces, reply = streamed(OpenAIChatProvider(**options(fake)), HELLO)
    assert pieces == [] and reply.text is None
    assert reply.tool_calls == [
        ToolCall(id="call_a", name="get_weather", arguments={"city": "Oslo"}),
        ToolCall(id="call_b", name="send_email", arguments={"to": "bob@example.com"}),
    ]


def test_openai_chat_retries_before_the_stream_and_fails_on_a_broken_one(
    fake: FakeOpenAI,
) -> None:
    fake.script(error_reply(429, "slow down"), text_reply("after a retry"))
    pieces, reply = streamed(OpenAIChatProvider(**options(fake)), HELLO)
    assert "".join(pieces) == reply.text == "after a retry"
    fake.script(broken_stream("half", " an"))
    pieces = []
    with pytest.raises(ProviderError) as caught:
        OpenAIChatProvider(**options(fake)).stream(HELLO, pieces.append)
    assert caught.value.details["reason"] == "stream_incomplete"
    assert pieces == ["half", " an"]
    assert len(fake.requests) == 3  # a stream that began is never retried


def test_openai_responses_streams_and_keeps_state(fake: FakeOpenAI) -> None:
    fake.script(response_reply("Stored and streamed.", input_tokens=3, output_tokens=3))
    provider = OpenAIResponsesProvider(**options(fake))
    request = HELLO.model_copy(update={"store": True})
    pieces, reply = streamed(provider, request)
    assert "".join(pieces) == reply.text == "Stored and streamed."
    assert reply.response_id == "resp_fake_1" and reply.provider_state == "fresh"
    assert reply.usage.input_tokens == 3
    assert fake.requests[0].json()["stream"] is True
    # Continued over the stored state, streamed too.
    fake.script(response_reply(None, function_call_item("call_1", "lookup", '{"q": "x"}')))
    follow = ModelRequest(
        model="gpt-test",
        messages=[
            Message(role="user", content="hello"),
            Message(role="assistant", content="Stored and streamed."),
            Message(role="user", content="more"),
        ],
        continuation=Continuation(previous_response_id="resp_fake_1", new_from=2),
        store=True,
    )
    pieces, reply = streamed(provider, follow)
    assert pieces == [] and reply.provider_state == "continued"
    assert [c.name for c in reply.tool_calls] == ["lookup"]


def test_openai_responses_stream_falls_back_when_state_is_gone(fake: FakeOpenAI) -> None:
    fake.script(response_reply("whole context again"))
    request = ModelRequest(
        model="gpt-test",
        messages=[Message(role="user", content="hello"), Message(role="user", content="again")],
        continuation=Continuation(previous_response_id="resp_gone", new_from=1),
        store=True,
    )
    pieces, reply = streamed(OpenAIResponsesProvider(**options(fake)), request)
    assert "".join(pieces) == "whole context again"
    assert reply.provider_state == "fallback"
    assert [r.json().get("previous_response_id") for r in fake.requests] == ["resp_gone", None]


def test_openai_responses_stream_reports_a_failed_response(fake: FakeOpenAI) -> None:
    from tests.functional.fake_openai import json_reply, response_body

    failed = response_body("partial", status="failed")
    failed["error"] = {"code": "server_error", "message": "the model crashed"}
    fake.script(json_reply(failed))
    with pytest.raises(ProviderError) as caught:
        OpenAIResponsesProvider(**options(fake)).stream(HELLO, lambda _: None)
    assert caught.value.details["reason"] == "response_failed"


def test_the_default_stream_hands_the_whole_text_over_once() -> None:
    class Whole(DemoProvider):
        def stream(self, request: ModelRequest, on_text: Any) -> Any:
            return Provider.stream(self, request, on_text)

    pieces, reply = streamed(Whole(), ModelRequest(model="m", messages=[_user("echo: a b c")]))
    assert pieces == ["a b c"] and reply.text == "a b c"


def test_the_demo_model_streams_word_by_word() -> None:
    pieces, reply = streamed(
        DemoProvider(), ModelRequest(model="m", messages=[_user("echo: a  b c ")])
    )
    assert pieces == ["a", "  b", " c"] and "".join(pieces) == reply.text == "a  b c"


def _user(text: str) -> Message:
    return Message(role="user", content=text)


# --- Bedrock ConverseStream (AWS event stream, decoded by botocore) ------------------------

MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"


@pytest.fixture
def bedrock() -> Iterator[Any]:
    from tests.functional.fake_bedrock import FakeBedrock

    with FakeBedrock() as server:
        yield server


def bedrock_provider(fake: Any, **overrides: Any) -> Any:
    from turnledger.providers.bedrock_converse import BedrockConverseProvider

    return BedrockConverseProvider(
        endpoint_url=fake.url,
        region="us-east-1",
        timeout_seconds=5.0,
        max_retries=2,
        sleep=lambda _: None,
        **overrides,
    )


def test_bedrock_converse_stream_streams_text_and_tool_uses(bedrock: Any) -> None:
    from tests.functional.fake_bedrock import converse_reply, tool_use

    answer = "Rain in Oslo today."
    bedrock.script(converse_reply(answer, input_tokens=9, output_tokens=4))
    request = ModelRequest(model=MODEL, messages=[_user("weather?")])
    pieces, reply = streamed(bedrock_provider(bedrock), request)
    assert pieces == ["Rain", " in", " Oslo", " today."] and reply.text == answer
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (9, 4)
    assert bedrock.requests[0].path.endswith("/converse-stream")
    bedrock.script(converse_reply(None, tool_use("tu_1", "get_weather", {"city": "Oslo"})))
    pieces, reply = streamed(bedrock_provider(bedrock), request)
    assert pieces == []
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("get_weather", {"city": "Oslo"})]


def test_bedrock_stream_retries_before_and_fails_on_an_exception_event(bedrock: Any) -> None:
    from tests.functional.fake_bedrock import bedrock_error, converse_reply, failing_stream

    bedrock.script(bedrock_error(429, "ThrottlingException", "slow down"), converse_reply("ok"))
    request = ModelRequest(model=MODEL, messages=[_user("hi")])
    pieces, _ = streamed(bedrock_provider(bedrock), request)
    assert pieces == ["ok"] and len(bedrock.requests) == 2
    bedrock.script(failing_stream("half an"))
    pieces = []
    with pytest.raises(ProviderError) as caught:
        bedrock_provider(bedrock).stream(request, pieces.append)
    assert pieces == ["half an"]
    assert caught.value.details["attempts"] == 1  # a stream that began is never sent again
    assert len(bedrock.requests) == 3


def test_bedrock_json_tool_mode_hands_the_answer_over_whole(bedrock: Any) -> None:
    from turnledger.providers.base import ResponseFormat

    from tests.functional.fake_bedrock import converse_reply, tool_use

    def answer(request: Any) -> Any:
        tool = request.json()["toolConfig"]["tools"][-1]["toolSpec"]["name"]
        return converse_reply(None, tool_use("tu_j", tool, {"answer": "Ann"}))

    bedrock.script(answer)
    request = ModelRequest(
        model=MODEL,
        messages=[_user("Who am I?")],
        response_format=ResponseFormat(type="json_object"),
    )
    pieces, reply = streamed(bedrock_provider(bedrock), request)
    assert pieces == ['{"answer": "Ann"}'] and reply.text == '{"answer": "Ann"}'


# --- through the pipeline: a long turn's model call streams into its draft ------------------


def test_a_turn_on_openai_chat_streams_into_its_draft_and_a_broken_stream_fails_it(
    fake: FakeOpenAI,
) -> None:
    from dataclasses import replace

    from turnledger.api.schemas import TurnRequest
    from turnledger.core.config import Settings
    from turnledger.core.models import ConversationKey
    from turnledger.store.memory import MemoryConversationStore
    from turnledger.turn import drafts
    from turnledger.turn.drafts import DraftWriter
    from turnledger.turn.longturns import DraftedRun
    from turnledger.turn.pipeline import Conversations

    from tests.support.factories import FakeClock

    clock = FakeClock()
    store = MemoryConversationStore()
    service = Conversations(
        store=store,
        provider=OpenAIChatProvider(**options(fake)),
        settings=replace(Settings(), provider="openai-chat", model="gpt-test"),
        clock=clock.now,
    )
    caller = Caller(tenant="t", actor="ann")
    key = ConversationKey(tenant="t", conversation_id="c1")

    def run(turn: int, text: str) -> Any:
        writer = DraftWriter(
            store=store, key=key, turn=turn, expires_at=None, now=clock.now, flush_chars=1
        )
        writer.begin()
        sink = DraftedRun(service, key, writer)
        return edge.turn(service, caller, "c1", TurnRequest(input=text), sink=sink)

    fake.script(text_reply("Hello there, Ann."))
    answer = run(1, "My name is Ann.")
    assert answer.output_text == "Hello there, Ann."
    assert [c.text for c in drafts.read(store, key, 1).chunks] == ["Hello", " there,", " Ann."]
    fake.script(broken_stream("I", " think"))
    with pytest.raises(ProviderError):
        run(2, "What is my name?")
    assert [c.text for c in drafts.read(store, key, 2).chunks] == ["I", " think"]
    kinds = [e.kind for e in edge.events(service, caller, "c1", after=0, limit=50).events]
    assert kinds == ["user_message", "assistant_message", "turn_failed"]
    # The next model call sees the committed answer only, never the half one.
    fake.script(text_reply("Ann."))
    run(3, "What is my name?")
    sent = fake.requests[-1].json()["messages"]
    assert [m["content"] for m in sent] == [
        "My name is Ann.",
        "Hello there, Ann.",
        "What is my name?",
    ]
