"""The openai-chat provider against a real HTTP fake of the OpenAI API on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import boto3
import httpx
import openai
import pytest
from moto import mock_aws
from turnledger.core.config import Settings
from turnledger.core.exceptions import InvalidHistory, ProviderError, ProviderTimeout
from turnledger.core.models import ToolCall, Usage
from turnledger.providers.base import Message, ModelRequest, ToolSpec
from turnledger.providers.factory import build_provider
from turnledger.providers.openai_chat import OpenAIChatProvider

from tests.functional.fake_openai import (
    CHAT_PATH,
    HANG,
    FakeOpenAI,
    completion,
    error_reply,
    raw_reply,
    text_reply,
    tool_call,
    tool_calls_reply,
)
from tests.support.providers import Sleeps, quick_retries

KEY = "sk-test-0123456789"


@pytest.fixture
def make(fake: FakeOpenAI, sleeps: Sleeps) -> Iterator[Any]:
    """``make(**overrides)``: a provider aimed at the fake, with no real waiting."""
    built: list[OpenAIChatProvider] = []

    def factory(**overrides: Any) -> OpenAIChatProvider:
        options: dict[str, Any] = {
            "base_url": fake.base_url,
            "api_key": lambda: KEY,
            **quick_retries(sleeps),
            **overrides,
        }
        provider = OpenAIChatProvider(**options)
        built.append(provider)
        return provider

    yield factory


def request(*messages: Message, tools: list[ToolSpec] | None = None) -> ModelRequest:
    return ModelRequest(model="gpt-test", messages=list(messages), tools=tools or [])


HELLO = request(Message(role="user", content="hello"))


# --- the request is the one the official client sends ------------------------------------

WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather of a city",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
)
LOOKUP = ToolSpec(name="lookup_user", parameters={"type": "object"})

CONVERSATION = [
    Message(role="system", content="You are terse."),
    Message(role="user", content="Weather in Paris, and who am I?"),
    Message(
        role="assistant",
        content=None,
        tool_calls=[
            ToolCall(id="call_a", name="get_weather", arguments={"city": "Paris"}),
            ToolCall(id="call_b", name="lookup_user", arguments={}),
        ],
    ),
    Message(role="tool", tool_call_id="call_a", name="get_weather", content="sunny, 21C"),
    Message(
        role="tool",
        tool_call_id="call_b",
        name="lookup_user",
        content="rejected: not allowed",
        is_error=True,
    ),
    Message(role="assistant", content="Sunny and 21C; I may not look you up."),
    Message(role="user", content="Thanks! Zürich too?"),
]

# The same conversation, written in OpenAI's own message format.
OPENAI_MESSAGES: list[Any] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris, and who am I?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
            {
                "id": "call_b",
                "type": "function",
                "function": {"name": "lookup_user", "arguments": "{}"},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_a", "content": "sunny, 21C"},
    {"role": "tool", "tool_call_id": "call_b", "content": "rejected: not allowed"},
    {"role": "assistant", "content": "Sunny and 21C; I may not look you up."},
    {"role": "user", "content": "Thanks! Zürich too?"},
]
OPENAI_TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city",
            "parameters": WEATHER.parameters,
        },
    },
    {
        "type": "function",
        "function": {"name": "lookup_user", "description": "", "parameters": {"type": "object"}},
    },
]


def test_sends_the_request_the_official_openai_client_sends(fake: FakeOpenAI, make: Any) -> None:
    fake.script(text_reply("from openai"), text_reply("from turnledger"))
    client = openai.OpenAI(base_url=fake.base_url, api_key=KEY, max_retries=0)
    client.chat.completions.create(model="gpt-test", messages=OPENAI_MESSAGES, tools=OPENAI_TOOLS)

    reply = make().complete(request(*CONVERSATION, tools=[WEATHER, LOOKUP]))

    theirs, ours = fake.requests
    assert reply.text == "from turnledger"
    assert (ours.method, ours.path) == (theirs.method, theirs.path) == ("POST", CHAT_PATH)
    assert ours.headers["authorization"] == theirs.headers["authorization"] == f"Bearer {KEY}"
    assert ours.headers["content-type"] == theirs.headers["content-type"]
    assert ours.json() == theirs.json()
    assert list(ours.json()) == ["model", "messages", "tools"]


def test_an_injected_transport_is_used() -> None:
    seen: list[httpx.Request] = []

    def handle(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return httpx.Response(200, json=completion("via transport"))

    provider = OpenAIChatProvider(
        base_url="http://model.invalid/v1/", transport=httpx.MockTransport(handle)
    )

    assert provider.complete(HELLO).text == "via transport"
    assert [str(r.url) for r in seen] == ["http://model.invalid/v1/chat/completions"]


def test_tools_are_left_out_when_there_are_none(fake: FakeOpenAI, make: Any) -> None:
    fake.script(text_reply("hi"))

    make().complete(HELLO)

    assert fake.requests[0].json() == {
        "model": "gpt-test",
        "messages": [{"role": "user", "content": "hello"}],
    }


def test_without_a_key_no_authorization_header_is_sent(fake: FakeOpenAI, make: Any) -> None:
    fake.script(text_reply("hi"), text_reply("hi"))

    make(api_key=None).complete(HELLO)
    make(api_key=lambda: None).complete(HELLO)

    assert all("authorization" not in r.headers for r in fake.requests)


# --- the reply ---------------------------------------------------------------------------


def test_text_usage_and_model_are_mapped(fake: FakeOpenAI, make: Any) -> None:
    fake.script(
        text_reply("Hello there", model="gpt-test-2025", prompt_tokens=12, completion_tokens=3)
    )

    reply = make().complete(HELLO)

    assert reply.text == "Hello there"
    assert reply.tool_calls == []
    assert reply.usage == Usage(input_tokens=12, output_tokens=3)
    assert reply.model == "gpt-test-2025"


def test_a_reply_without_usage_or_model_falls_back(fake: FakeOpenAI, make: Any) -> None:
    fake.script(raw_reply(json.dumps({"choices": [{"message": {"content": "x"}}]})))

    reply = make().complete(HELLO)

    assert (reply.text, reply.usage, reply.model) == ("x", Usage(), "gpt-test")


def test_tool_calls_are_parsed_with_their_arguments(fake: FakeOpenAI, make: Any) -> None:
    fake.script(
        tool_calls_reply(
            tool_call("call_1", "get_weather", '{"city": "Paris", "days": 2}'),
            tool_call("call_2", "lookup_user", ""),
            tool_call("call_3", "broken", '{"city": "Par'),
            tool_call("call_4", "listy", "[1, 2]"),
            text="Checking.",
        )
    )

    reply = make().complete(HELLO)

    assert reply.text == "Checking."
    assert reply.tool_calls == [
        ToolCall(id="call_1", name="get_weather", arguments={"city": "Paris", "days": 2}),
        ToolCall(id="call_2", name="lookup_user", arguments={}),
        ToolCall(id="call_3", name="broken", arguments={}, raw_arguments='{"city": "Par'),
        ToolCall(id="call_4", name="listy", arguments={}, raw_arguments="[1, 2]"),
    ]


@pytest.mark.parametrize(
    "body",
    [
        "this is not json",
        "{}",
        '{"choices": []}',
        '{"choices": [{"message": {"tool_calls": [{"function": {"name": "x"}}]}}]}',
        "[]",
    ],
    ids=["not json", "no choices", "empty choices", "tool call without id", "not an object"],
)
def test_an_unusable_success_body_is_a_provider_error_without_retry(
    fake: FakeOpenAI, make: Any, sleeps: Sleeps, body: str
) -> None:
    fake.script(raw_reply(body))

    with pytest.raises(ProviderError) as caught:
        make().complete(HELLO)

    assert caught.value.status == 502
    assert caught.value.details["reason"] == "invalid_response"
    assert len(fake.requests) == 1
    assert sleeps.waits == []


# --- retries -----------------------------------------------------------------------------


def test_retries_on_500_and_429_then_succeeds(fake: FakeOpenAI, make: Any, sleeps: Sleeps) -> None:
    fake.script(error_reply(500, "boom"), error_reply(429, "slow down"), text_reply("finally"))

    reply = make(max_retries=2).complete(HELLO)

    assert reply.text == "finally"
    assert len(fake.requests) == 3
    # Exponential backoff (jitter pinned to its top): 0.5 s, then 1 s.
    assert sleeps.waits == [0.5, 1.0]
    # Every attempt sends the same request.
    assert len({r.body for r in fake.requests}) == 1


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504])
def test_retryable_statuses_are_retried(fake: FakeOpenAI, make: Any, status: int) -> None:
    fake.script(error_reply(status, "try again"), text_reply("ok"))

    assert make().complete(HELLO).text == "ok"
    assert len(fake.requests) == 2


def test_retries_are_bounded_then_a_provider_error_carries_the_status(
    fake: FakeOpenAI, make: Any, sleeps: Sleeps
) -> None:
    fake.default = error_reply(503, "The server is overloaded")

    with pytest.raises(ProviderError) as caught:
        make(max_retries=3, jitter=lambda: 0.0).complete(HELLO)

    error = caught.value
    assert type(error) is ProviderError
    assert (error.status, error.code) == (502, "provider_error")
    assert error.details == {
        "status": 503,
        "provider_message": "The server is overloaded",
        "attempts": 4,
    }
    assert len(fake.requests) == 4
    # Jitter pinned to its bottom: half of 0.5, 1, 2.
    assert sleeps.waits == [0.25, 0.5, 1.0]


def test_backoff_is_capped(fake: FakeOpenAI, make: Any, sleeps: Sleeps) -> None:
    fake.default = error_reply(500, "down")

    with pytest.raises(ProviderError):
        make(max_retries=4, backoff_seconds=1.0, max_backoff_seconds=3.0).complete(HELLO)

    assert sleeps.waits == [1.0, 2.0, 3.0, 3.0]


@pytest.mark.parametrize(
    ("headers", "wait"),
    [
        ({"Retry-After": "3"}, 3.0),
        ({"Retry-After": "0.25"}, 0.25),
        ({"Retry-After": "3600"}, 8.0),
        ({"retry-after-ms": "1500", "Retry-After": "2"}, 1.5),
        ({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0),
    ],
    ids=["seconds", "fraction", "capped", "milliseconds first", "date in the past"],
)
def test_retry_after_is_honoured_and_capped(
    fake: FakeOpenAI, make: Any, sleeps: Sleeps, headers: dict[str, str], wait: float
) -> None:
    fake.script(error_reply(429, "rate limited", headers=headers), text_reply("ok"))

    assert make().complete(HELLO).text == "ok"
    assert sleeps.waits == [wait]


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_other_client_errors_are_not_retried(
    fake: FakeOpenAI, make: Any, sleeps: Sleeps, status: int
) -> None:
    fake.script(error_reply(status, "Invalid value for 'messages'"), text_reply("unused"))

    with pytest.raises(ProviderError) as caught:
        make().complete(HELLO)

    assert caught.value.details == {
        "status": status,
        "provider_message": "Invalid value for 'messages'",
        "attempts": 1,
    }
    assert len(fake.requests) == 1
    assert sleeps.waits == []


def test_the_key_never_appears_in_the_error(fake: FakeOpenAI, make: Any) -> None:
    fake.script(error_reply(401, f"Incorrect API key provided: {KEY}."))

    with pytest.raises(ProviderError) as caught:
        make().complete(HELLO)

    error = caught.value
    assert error.details["provider_message"] == "Incorrect API key provided: ***."
    assert KEY not in json.dumps(error.to_body())
    assert KEY not in str(error)


def test_a_non_json_error_body_is_reported_as_text(fake: FakeOpenAI, make: Any) -> None:
    fake.script(raw_reply("<html>Bad Gateway</html>", status=400, content_type="text/html"))

    with pytest.raises(ProviderError) as caught:
        make().complete(HELLO)

    assert caught.value.details["provider_message"] == "<html>Bad Gateway</html>"


def test_a_timeout_is_retried_then_a_provider_timeout(
    fake: FakeOpenAI, make: Any, sleeps: Sleeps
) -> None:
    fake.default = HANG

    with pytest.raises(ProviderTimeout) as caught:
        make(timeout_seconds=0.2, max_retries=1).complete(HELLO)

    assert (caught.value.status, caught.value.code) == (504, "provider_timeout")
    assert caught.value.details["attempts"] == 2
    assert len(fake.requests) == 2
    assert len(sleeps.waits) == 1


def test_a_timeout_then_success_returns_the_reply(fake: FakeOpenAI, make: Any) -> None:
    fake.script(HANG, text_reply("second time lucky"))

    assert make(timeout_seconds=0.2).complete(HELLO).text == "second time lucky"
    assert len(fake.requests) == 2


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_connection_failures_are_retried_then_a_provider_error(make: Any, sleeps: Sleeps) -> None:
    provider = make(base_url=f"http://127.0.0.1:{_closed_port()}/v1", max_retries=2)

    with pytest.raises(ProviderError) as caught:
        provider.complete(HELLO)

    assert type(caught.value) is ProviderError
    assert caught.value.details == {
        "reason": "connection_failed",
        "error": "ConnectError",
        "attempts": 3,
    }
    assert len(sleeps.waits) == 2


# --- before anything is sent ---------------------------------------------------------------


def test_several_user_messages_are_sent_as_one(fake: FakeOpenAI, make: Any) -> None:
    fake.script(text_reply("both read"))
    several = request(
        Message(role="user", content="first"),
        Message(role="user", content="second"),
    )

    assert make().complete(several).text == "both read"
    assert fake.requests[0].json()["messages"] == [{"role": "user", "content": "first\n\nsecond"}]


def test_a_broken_history_raises_before_any_request(fake: FakeOpenAI, make: Any) -> None:
    keys_read: list[int] = []

    def key() -> str:
        keys_read.append(1)
        return KEY

    # A tool result no call asked for cannot be built into a strict history: a bug.
    broken = request(
        Message(role="user", content="a"),
        Message(role="tool", tool_call_id="call_x", name="t", content="out"),
    )

    with pytest.raises(InvalidHistory) as caught:
        make(api_key=key).complete(broken)

    assert caught.value.details == {"index": 1, "rule": "result_follows_call"}
    assert fake.requests == []
    assert keys_read == []


def test_the_key_is_read_on_request_not_at_construction(fake: FakeOpenAI, make: Any) -> None:
    keys_read: list[int] = []

    def key() -> str:
        keys_read.append(1)
        return KEY

    provider = make(api_key=key)
    assert keys_read == []

    fake.script(text_reply("hi"))
    provider.complete(HELLO)

    assert keys_read == [1]


def test_a_failing_key_source_is_a_provider_error(fake: FakeOpenAI, make: Any) -> None:
    def key() -> str:
        raise RuntimeError(f"cannot read {KEY}")

    with pytest.raises(ProviderError) as caught:
        make(api_key=key).complete(HELLO)

    assert caught.value.details == {"reason": "api_key_unavailable", "error": "RuntimeError"}
    assert fake.requests == []


# --- the factory and where the key comes from ----------------------------------------------


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fake credentials, a region, moto, and Powertools' parameter cache emptied."""
    from aws_lambda_powertools.utilities.parameters import clear_caches

    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "POWERTOOLS_PARAMETERS_MAX_AGE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    clear_caches()
    with mock_aws():
        yield
    clear_caches()


def openai_settings(fake: FakeOpenAI, **overrides: Any) -> Settings:
    options: dict[str, Any] = {
        "provider": "openai-chat",
        "openai_base_url": fake.base_url,
        "provider_max_retries": 0,
    }
    options.update(overrides)
    return Settings(**options)


def authorization(fake: FakeOpenAI, settings: Settings) -> str | None:
    fake.script(text_reply("hi"))
    build_provider(settings).complete(HELLO)
    return fake.requests[-1].headers.get("authorization")


@pytest.mark.parametrize(
    "secret",
    ["sk-from-secrets", '{"api_key": "sk-from-secrets"}', '{"OPENROUTER": "sk-from-secrets"}'],
    ids=["bare key", "api_key field", "single field"],
)
def test_the_key_comes_from_secrets_manager_on_first_request(
    aws: None, fake: FakeOpenAI, secret: str
) -> None:
    settings = openai_settings(fake, openai_api_key_secret="turnledger/openai")
    # Built before the secret exists: nothing is read at build time.
    provider = build_provider(settings)
    boto3.client("secretsmanager").create_secret(Name="turnledger/openai", SecretString=secret)
    fake.script(text_reply("hi"))

    provider.complete(HELLO)

    assert fake.requests[0].headers["authorization"] == "Bearer sk-from-secrets"


def test_the_key_comes_from_an_ssm_secure_string(aws: None, fake: FakeOpenAI) -> None:
    boto3.client("ssm").put_parameter(
        Name="/turnledger/openai-key", Value="sk-from-ssm", Type="SecureString"
    )
    settings = openai_settings(fake, openai_api_key_parameter="/turnledger/openai-key")

    assert authorization(fake, settings) == "Bearer sk-from-ssm"


def test_the_key_is_cached_between_requests(aws: None, fake: FakeOpenAI) -> None:
    client = boto3.client("secretsmanager")
    client.create_secret(Name="k", SecretString="sk-first")
    provider = build_provider(openai_settings(fake, openai_api_key_secret="k"))
    fake.script(text_reply("1"), text_reply("2"))

    provider.complete(HELLO)
    client.put_secret_value(SecretId="k", SecretString="sk-rotated")
    provider.complete(HELLO)

    # Within KEY_MAX_AGE_SECONDS the cached key is used: AWS is not read every turn.
    assert [r.headers["authorization"] for r in fake.requests] == ["Bearer sk-first"] * 2


def test_a_plain_key_wins_over_the_secret_and_the_parameter(aws: None, fake: FakeOpenAI) -> None:
    settings = openai_settings(
        fake,
        openai_api_key="sk-plain",
        openai_api_key_secret="absent-secret",
        openai_api_key_parameter="/absent",
    )

    assert authorization(fake, settings) == "Bearer sk-plain"


def test_a_missing_secret_is_a_provider_error_at_request_time(aws: None, fake: FakeOpenAI) -> None:
    provider = build_provider(openai_settings(fake, openai_api_key_secret="absent-secret"))

    with pytest.raises(ProviderError) as caught:
        provider.complete(HELLO)

    assert caught.value.details["reason"] == "api_key_unavailable"
    assert fake.requests == []


def test_no_key_source_means_no_authorization_header(fake: FakeOpenAI) -> None:
    assert authorization(fake, openai_settings(fake)) is None


def test_the_factory_passes_timeout_and_retries(fake: FakeOpenAI) -> None:
    settings = openai_settings(fake, provider_timeout_seconds=7, provider_max_retries=5)

    provider = build_provider(settings)

    assert isinstance(provider, OpenAIChatProvider)
    assert provider.max_retries == 5
    assert provider.url == f"{fake.base_url}/chat/completions"


def test_importing_the_providers_loads_neither_powertools_parameters_nor_openai() -> None:
    """Cold start: the parameters utility is imported on the first key read, never before."""
    code = (
        "import sys, turnledger.providers as p\n"
        "p.build_provider(p.factory.Settings(provider='openai-chat', "
        "openai_api_key_secret='s'))\n"
        "print([m for m in ('aws_lambda_powertools.utilities.parameters', 'openai', 'boto3')"
        " if m in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout

    assert out.strip() == "[]"
