"""Every tool call ends within its timeout and the request's remaining time.

Against real servers on 127.0.0.1: an HTTP tool that trickles its answer a byte at a
time or answers too much, and a fake Lambda Invoke endpoint
(``POST /2015-03-31/functions/{name}/invocations``) that answers late, reached by a
real boto3 Lambda client. Timings are asserted only as generous upper bounds that
express the rule ("within the timeout plus 1.5 s").
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import boto3
import httpx
import pytest
from botocore.config import Config
from turnledger.core import deadline
from turnledger.core.models import ToolCall
from turnledger.tools import ToolDefinition, ToolInvocation, ToolOutcome, ToolRunner
from turnledger.tools.executors import LAMBDA_TIMEOUT_MARGIN_SECONDS, idempotency_key
from turnledger.tools.http import MAX_RESPONSE_BYTES, HttpExecutor, tool_http_client

from .http_sink import HttpSink, Reply

if TYPE_CHECKING:
    from mypy_boto3_lambda import LambdaClient

#: Slack over a bound for scheduling and connecting on a busy machine (seconds).
SLACK = 1.5

FUNCTION = "weather-fn"
INVOKE_PATH = f"/2015-03-31/functions/{FUNCTION}/invocations"

#: A JSON answer of 41 bytes: trickled at 0.5 s a byte it would take 20 s.
SLOW_BODY = b'{"sky": "' + b"c" * 30 + b'"}'


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with tool_http_client() as client:
        yield client


def tool(executor: dict[str, Any], name: str = "weather") -> ToolDefinition:
    return ToolDefinition.model_validate({"name": name, "executor": executor})


def invocation(definition: ToolDefinition, call_id: str = "call_1") -> ToolInvocation:
    return ToolInvocation(
        tool=definition,
        call=ToolCall(id=call_id, name=definition.name, arguments={"city": "Lima"}),
        tenant="acme",
        conversation_id="conv-1",
        idempotency_key=idempotency_key("acme", "conv-1", "gen-1", call_id, 3),
    )


def timed(run: Callable[[], ToolOutcome]) -> tuple[ToolOutcome, float]:
    started = time.monotonic()
    outcome = run()
    return outcome, time.monotonic() - started


# --- http tools: one deadline for the whole call ----------------------------------------


@pytest.mark.parametrize(
    "make_client", [tool_http_client, httpx.Client], ids=["tool-client", "plain-client"]
)
def test_a_trickling_body_ends_at_the_tools_timeout(
    sink: HttpSink, make_client: Callable[[], httpx.Client]
) -> None:
    """Rule: ``timeout_seconds`` bounds the whole call, not each read.

    A byte every half second never trips a 2 s read timeout; the call must still end
    at about 2 s, with any client (between chunks at the latest).
    """
    sink.respond("/weather", Reply(raw=SLOW_BODY, trickle=0.5))
    definition = tool({"type": "http", "url": sink.url("/weather"), "timeout_seconds": 2})

    with make_client() as client:
        outcome, took = timed(lambda: HttpExecutor(client).execute(invocation(definition)))

    assert outcome == ToolOutcome("tool weather timed out after 2s", is_error=True)
    assert took < 2 + SLACK


def test_trickling_headers_end_at_the_tools_timeout(sink: HttpSink, http: httpx.Client) -> None:
    """Rule: every read counts against the call's deadline, the headers' too."""
    sink.respond("/weather", Reply(raw=SLOW_BODY, trickle=0.5, trickle_headers=True))
    definition = tool({"type": "http", "url": sink.url("/weather"), "timeout_seconds": 2})

    outcome, took = timed(lambda: HttpExecutor(http).execute(invocation(definition)))

    assert outcome == ToolOutcome("tool weather timed out after 2s", is_error=True)
    assert took < 2 + SLACK


def test_a_trickling_tool_ends_by_the_requests_deadline(sink: HttpSink, http: httpx.Client) -> None:
    """Rule: the request's remaining time cuts a longer tool timeout."""
    sink.respond("/weather", Reply(raw=SLOW_BODY, trickle=0.5))
    definition = tool({"type": "http", "url": sink.url("/weather"), "timeout_seconds": 30})

    with deadline.request_deadline(1.5, margin_seconds=0):
        outcome, took = timed(lambda: HttpExecutor(http).execute(invocation(definition)))

    assert outcome.is_error
    assert outcome.output.startswith("tool weather timed out after 1.")
    assert took < 1.5 + SLACK


@pytest.mark.parametrize("length", [True, False], ids=["declared", "until-close"])
def test_a_body_over_the_cap_is_an_error(sink: HttpSink, http: httpx.Client, length: bool) -> None:
    """Rule: a body over the cap is refused, whether or not its length is declared; one
    exactly at the cap is an answer like any other."""
    at_cap = "y" * (MAX_RESPONSE_BYTES - 2)
    over_cap = b'"' + b"x" * (4 * MAX_RESPONSE_BYTES) + b'"'
    sink.respond(
        "/weather",
        Reply(raw=json.dumps(at_cap).encode(), length=length),
        Reply(raw=over_cap, length=length),
    )
    definition = tool({"type": "http", "url": sink.url("/weather")})
    executor = HttpExecutor(http)

    accepted = executor.execute(invocation(definition, "call_1"))
    refused = executor.execute(invocation(definition, "call_2"))

    assert accepted == ToolOutcome(at_cap)
    assert refused == ToolOutcome(
        f"tool weather answered more than {MAX_RESPONSE_BYTES} bytes", is_error=True
    )


# --- lambda tools: one Invoke, awaited no longer than its bound ---------------------------


class FakeLambda:
    """The Invoke endpoint of Lambda on a real HTTP server, and clients pointed at it."""

    def __init__(self, sink: HttpSink) -> None:
        self.sink = sink
        self.configs: list[Config] = []

    def client(self, config: Config) -> LambdaClient:
        self.configs.append(config)
        session = boto3.session.Session(
            aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
        )
        return session.client("lambda", endpoint_url=self.sink.base_url, config=config)

    @property
    def invocations(self) -> list[dict[str, Any]]:
        return [r.json() for r in self.sink.requests_for(INVOKE_PATH)]


@pytest.fixture
def fake_lambda(sink: HttpSink) -> FakeLambda:
    return FakeLambda(sink)


def lambda_tool(**executor: Any) -> ToolDefinition:
    return tool({"type": "lambda", "function_name": FUNCTION, **executor})


def test_a_late_lambda_tool_is_invoked_once_and_times_out_within_its_bound(
    fake_lambda: FakeLambda, http: httpx.Client
) -> None:
    """Rule: an Invoke is never retried (a retry runs the function again), and is
    awaited for the tool's timeout plus a margin, not the client's 10 s x 4 attempts."""
    fake_lambda.sink.respond(INVOKE_PATH, Reply(body={"temp": 19}, delay=30))
    runner = ToolRunner(http, fake_lambda.client)
    call = invocation(lambda_tool(timeout_seconds=1))

    [outcome], took = timed(lambda: runner.run([call]))

    bound = 1 + LAMBDA_TIMEOUT_MARGIN_SECONDS
    assert outcome == ToolOutcome(f"tool weather timed out after {bound:g}s", is_error=True)
    assert took < bound + SLACK
    [sent] = fake_lambda.invocations
    assert sent["idempotency_key"] == call.idempotency_key


def test_a_late_lambda_tool_ends_by_the_requests_deadline(
    fake_lambda: FakeLambda, http: httpx.Client
) -> None:
    """Rule: the request's remaining time cuts the wait for a tool with a long timeout."""
    fake_lambda.sink.respond(INVOKE_PATH, Reply(body={"temp": 19}, delay=30))
    runner = ToolRunner(http, fake_lambda.client, timeout_seconds=8)

    with deadline.request_deadline(1.6, margin_seconds=0):
        [outcome], took = timed(lambda: runner.run([invocation(lambda_tool())]))

    assert outcome == ToolOutcome("tool weather timed out after 1.5s", is_error=True)
    assert took < 1.6 + SLACK
    assert len(fake_lambda.invocations) == 1


def test_a_lambda_tool_answering_in_time_keeps_its_key_across_calls(
    fake_lambda: FakeLambda, http: httpx.Client
) -> None:
    """Rule: the payload carries the same idempotency key on every run of one call, and
    calls with the same read timeout share one client."""
    fake_lambda.sink.respond(INVOKE_PATH, Reply(body={"temp": 19}))
    runner = ToolRunner(http, fake_lambda.client)
    definition = lambda_tool(timeout_seconds=5)

    first = runner.run([invocation(definition)])
    again = runner.run([invocation(definition)])

    assert first == again == [ToolOutcome('{"temp":19}')]
    keys = [sent["idempotency_key"] for sent in fake_lambda.invocations]
    assert keys == [invocation(definition).idempotency_key] * 2
    [config] = fake_lambda.configs
    assert config.read_timeout == 5 + LAMBDA_TIMEOUT_MARGIN_SECONDS
    assert config.retries == {"total_max_attempts": 1, "mode": "standard"}
