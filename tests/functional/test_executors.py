"""Tool executors against a real HTTP endpoint (the sink) and a stubbed Lambda client."""

from __future__ import annotations

import io
import json
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import boto3
import httpx
import pytest
from botocore.config import Config
from botocore.response import StreamingBody
from botocore.stub import ANY, Stubber
from turnledger.core.models import ToolCall
from turnledger.core.observability import logger
from turnledger.tools import (
    ToolDefinition,
    ToolInvocation,
    ToolOutcome,
    ToolRunner,
    idempotency_key,
)
from turnledger.tools.executors import LambdaExecutor
from turnledger.tools.http import HttpExecutor, tool_http_client

from .http_sink import HttpSink, Reply

if TYPE_CHECKING:
    from mypy_boto3_lambda import LambdaClient

TENANT = "acme"
CONVERSATION = "conv-1"
FUNCTION = "weather-fn"


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with tool_http_client() as client:
        yield client


def http_tool(url: str, name: str = "weather", **executor: Any) -> ToolDefinition:
    return ToolDefinition.model_validate(
        {
            "name": name,
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
            "executor": {"type": "http", "url": url, **executor},
        }
    )


def lambda_tool(name: str = "weather") -> ToolDefinition:
    return ToolDefinition.model_validate(
        {"name": name, "executor": {"type": "lambda", "function_name": FUNCTION}}
    )


def invocation(
    tool: ToolDefinition,
    call_id: str = "call_1",
    arguments: dict[str, Any] | None = None,
    *,
    raw_arguments: str | None = None,
    sequence: int = 3,
) -> ToolInvocation:
    call = ToolCall(
        id=call_id,
        name=tool.name,
        arguments={"city": "Paris"} if arguments is None else arguments,
        raw_arguments=raw_arguments,
    )
    key = idempotency_key(TENANT, CONVERSATION, "gen-1", call_id, sequence)
    return ToolInvocation(
        tool=tool,
        call=call,
        tenant=TENANT,
        conversation_id=CONVERSATION,
        idempotency_key=key,
    )


# --- HTTP executor ---------------------------------------------------------------------


def test_http_tool_posts_the_call_and_takes_the_json_body_as_output(
    sink: HttpSink, http: httpx.Client
) -> None:
    sink.respond("/weather", Reply(body={"temp": 21, "sky": "clear ☀"}))
    tool = http_tool(sink.url("/weather"), headers={"Authorization": "Bearer tool-secret"})
    call = invocation(tool, arguments={"city": "Zürich"})

    outcome = HttpExecutor(http).execute(call)

    assert not outcome.is_error
    assert outcome.output == '{"temp":21,"sky":"clear ☀"}'
    [request] = sink.requests_for("/weather")
    assert request.method == "POST"
    assert request.json() == {
        "tool": "weather",
        "call_id": "call_1",
        "conversation_id": CONVERSATION,
        "arguments": {"city": "Zürich"},
    }
    assert request.header("Content-Type") == "application/json"
    assert request.header("Authorization") == "Bearer tool-secret"
    assert request.idempotency_key == call.idempotency_key


def test_a_json_string_body_is_the_output_itself(sink: HttpSink, http: httpx.Client) -> None:
    sink.respond("/weather", Reply(body="sunny, 21 degrees"))

    outcome = HttpExecutor(http).execute(invocation(http_tool(sink.url("/weather"))))

    assert outcome.output == "sunny, 21 degrees"
    assert not outcome.is_error


def test_a_retried_call_sends_the_same_idempotency_key_and_has_one_side_effect(
    http: httpx.Client,
) -> None:
    """Rule: the key is stable per tool call, so a tool that dedupes runs it once."""
    with HttpSink(dedupe=True) as sink:
        sink.respond("/weather", Reply(body={"n": 1}), Reply(body={"n": 2}))
        tool = http_tool(sink.url("/weather"))
        executor = HttpExecutor(http)

        first = executor.execute(invocation(tool, "call_1"))
        # A retry rebuilds the invocation from the recorded call: same parts, same key.
        retry = executor.execute(invocation(tool, "call_1"))
        other = executor.execute(invocation(tool, "call_2"))

        requests = sink.requests_for("/weather")
        keys = [r.idempotency_key for r in requests]
        assert keys[0] == keys[1] != keys[2]
        assert [r.replayed for r in requests] == [False, True, False]
        assert len(sink.side_effects("/weather")) == 2
        assert first.output == retry.output == '{"n":1}'
        assert other.output == '{"n":2}'


def test_idempotency_key_depends_on_every_part() -> None:
    base = ("acme", "conv-1", "gen-1", "call_1", 3)
    key = idempotency_key(*base)
    assert key == idempotency_key(*base)
    assert len(key) == 32
    int(key, 16)
    variants = [
        ("other", "conv-1", "gen-1", "call_1", 3),
        ("acme", "conv-2", "gen-1", "call_1", 3),
        ("acme", "conv-1", "gen-2", "call_1", 3),
        ("acme", "conv-1", "gen-1", "call_2", 3),
        ("acme", "conv-1", "gen-1", "call_1", 4),
        # Shifting text between parts must not collide.
        ("acme", "conv-1g", "en-1", "call_1", 3),
    ]
    assert len({idempotency_key(*v) for v in variants} | {key}) == len(variants) + 1


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (500, b"boom", "tool weather failed: HTTP 500: boom"),
        (
            404,
            b'{"error": "no such city"}',
            'tool weather failed: HTTP 404: {"error": "no such city"}',
        ),
        (503, b"line one\n   line two", "tool weather failed: HTTP 503: line one line two"),
    ],
)
def test_error_statuses_are_error_outcomes(
    sink: HttpSink, http: httpx.Client, status: int, body: bytes, message: str
) -> None:
    sink.respond("/weather", Reply(status=status, raw=body, content_type="text/plain"))

    outcome = HttpExecutor(http).execute(invocation(http_tool(sink.url("/weather"))))

    assert outcome.is_error
    assert outcome.output == message


def test_a_long_error_body_is_shortened(sink: HttpSink, http: httpx.Client) -> None:
    sink.respond("/weather", Reply(status=500, raw=b"x" * 5000))

    outcome = HttpExecutor(http).execute(invocation(http_tool(sink.url("/weather"))))

    assert outcome.is_error
    assert outcome.output.startswith("tool weather failed: HTTP 500: xxx")
    assert outcome.output.endswith("...")
    assert len(outcome.output) < 300


def test_a_slow_tool_times_out_with_its_own_timeout(sink: HttpSink, http: httpx.Client) -> None:
    sink.respond("/weather", Reply(body={"late": True}, delay=30))
    tool = http_tool(sink.url("/weather"), timeout_seconds=0.2)

    outcome = HttpExecutor(http, timeout_seconds=60).execute(invocation(tool))

    assert outcome.is_error
    assert outcome.output == "tool weather timed out after 0.2s"


def test_a_tool_without_a_timeout_uses_the_runners(sink: HttpSink, http: httpx.Client) -> None:
    sink.respond("/weather", Reply(body={"late": True}, delay=30))

    [outcome] = ToolRunner(http, timeout_seconds=0.25).run(
        [invocation(http_tool(sink.url("/weather")))]
    )

    assert outcome.is_error
    assert outcome.output == "tool weather timed out after 0.25s"


@pytest.mark.parametrize("raw", [b"not json", b"", b'{"unterminated": '])
def test_a_body_that_is_not_json_is_an_error(
    sink: HttpSink, http: httpx.Client, raw: bytes
) -> None:
    sink.respond("/weather", Reply(raw=raw))

    outcome = HttpExecutor(http).execute(invocation(http_tool(sink.url("/weather"))))

    assert outcome.is_error
    assert outcome.output.startswith("tool weather returned malformed JSON: the answer is not JSON")


def test_an_unreachable_tool_is_an_error(http: httpx.Client) -> None:
    # A bound socket that does not listen refuses connections, and no one else can take it.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        tool = http_tool(f"http://127.0.0.1:{port}/weather")

        outcome = HttpExecutor(http).execute(invocation(tool))

    assert outcome.is_error
    assert outcome.output == "tool weather is unreachable"


# --- runner ------------------------------------------------------------------------------


def test_runner_runs_calls_concurrently_and_answers_in_call_order(
    sink: HttpSink, http: httpx.Client
) -> None:
    """Rule: parallel calls run together; outcomes come back in the order of the calls.

    The sink answers none of them until all three are in flight at once, so three
    successes prove concurrency without measuring time.
    """
    sink.respond("/weather", Reply(echo=True, delay=0.3))
    sink.rendezvous("/weather", parties=3, timeout=10)
    tool = http_tool(sink.url("/weather"))
    calls = [invocation(tool, f"call_{i}", {"city": city}) for i, city in enumerate("ABC")]

    outcomes = ToolRunner(http, max_workers=8).run(calls)

    assert [o.is_error for o in outcomes] == [False, False, False]
    echoed = [json.loads(o.output) for o in outcomes]
    assert [e["call_id"] for e in echoed] == ["call_0", "call_1", "call_2"]
    assert [e["arguments"]["city"] for e in echoed] == ["A", "B", "C"]
    assert sink.max_in_flight == 3


def test_the_concurrency_check_fails_when_calls_run_one_at_a_time(
    sink: HttpSink, http: httpx.Client
) -> None:
    """The rendezvous really detects serial execution (so the test above can fail)."""
    sink.respond("/weather", Reply(body={"ok": True}))
    sink.rendezvous("/weather", parties=2, timeout=0.3)
    tool = http_tool(sink.url("/weather"))

    outcomes = ToolRunner(http, max_workers=1).run(
        [invocation(tool, "call_1"), invocation(tool, "call_2")]
    )

    assert all(o.is_error and "HTTP 503" in o.output for o in outcomes)
    assert sink.max_in_flight == 1


def test_runner_refuses_client_tools_before_running_anything(
    sink: HttpSink, http: httpx.Client
) -> None:
    sink.respond("/weather", Reply(body={"ok": True}))
    client_tool = ToolDefinition.model_validate(
        {"name": "lookup_user", "executor": {"type": "client"}}
    )

    with pytest.raises(ValueError, match="lookup_user"):
        ToolRunner(http).run([invocation(http_tool(sink.url("/weather"))), invocation(client_tool)])
    assert sink.requests == []


def test_runner_answers_invalid_arguments_without_calling_the_tool(
    sink: HttpSink, http: httpx.Client
) -> None:
    sink.respond("/weather", Reply(body={"ok": True}))
    tool = http_tool(sink.url("/weather"))

    missing, wrong_type, unparsable, valid = ToolRunner(http).run(
        [
            invocation(tool, "c1", {}),
            invocation(tool, "c2", {"city": 7}),
            invocation(tool, "c3", {}, raw_arguments='{"city": '),
            invocation(tool, "c4", {"city": "Oslo"}),
        ]
    )

    assert missing.is_error and "missing required property 'city'" in missing.output
    assert wrong_type.is_error and "arguments.city must be string" in wrong_type.output
    assert unparsable.is_error and "not a JSON object" in unparsable.output
    assert valid == ToolOutcome(output='{"ok":true}', is_error=False)
    assert [r.json()["call_id"] for r in sink.requests_for("/weather")] == ["c4"]


def test_an_empty_run_runs_nothing(http: httpx.Client) -> None:
    assert ToolRunner(http).run([]) == []


def test_a_lambda_tool_without_a_lambda_client_is_an_error(http: httpx.Client) -> None:
    [outcome] = ToolRunner(http, lambda_client_factory=None).run([invocation(lambda_tool())])

    assert outcome.is_error
    assert "Lambda tools are not available" in outcome.output


# --- Lambda executor ---------------------------------------------------------------------


def make_lambda_client() -> LambdaClient:
    return boto3.client(
        "lambda",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def payload(data: bytes) -> StreamingBody:
    return StreamingBody(io.BytesIO(data), len(data))


class CapturedInvokes:
    """Records the parameters of every ``Invoke`` the client is asked to make."""

    def __init__(self, client: LambdaClient) -> None:
        self.params: list[dict[str, Any]] = []
        client.meta.events.register("provide-client-params.lambda.Invoke", self._capture)

    def _capture(self, params: dict[str, Any], **_: Any) -> None:
        self.params.append(dict(params))


EXPECTED_INVOKE = {"FunctionName": FUNCTION, "InvocationType": "RequestResponse", "Payload": ANY}


def test_lambda_tool_invokes_the_function_and_takes_its_json_result() -> None:
    client = make_lambda_client()
    captured = CapturedInvokes(client)
    call = invocation(lambda_tool(), arguments={"city": "Lima"})
    with Stubber(client) as stubber:
        stubber.add_response(
            "invoke",
            {"StatusCode": 200, "Payload": payload(b'{"temp": 19}')},
            EXPECTED_INVOKE,
        )

        outcome = LambdaExecutor(lambda _config: client).execute(call)

        stubber.assert_no_pending_responses()
    assert outcome.output == '{"temp":19}'
    assert not outcome.is_error
    [params] = captured.params
    assert json.loads(params["Payload"]) == {
        "tool": "weather",
        "call_id": "call_1",
        "conversation_id": CONVERSATION,
        "arguments": {"city": "Lima"},
        "idempotency_key": call.idempotency_key,
    }


def test_lambda_function_error_is_an_error_outcome() -> None:
    client = make_lambda_client()
    report = b'{"errorMessage": "city not found", "errorType": "KeyError"}'
    with Stubber(client) as stubber:
        stubber.add_response(
            "invoke",
            {"StatusCode": 200, "FunctionError": "Unhandled", "Payload": payload(report)},
            EXPECTED_INVOKE,
        )

        outcome = LambdaExecutor(lambda _config: client).execute(invocation(lambda_tool()))

    assert outcome.is_error
    assert outcome.output == (
        "tool weather failed: Lambda function error (Unhandled): KeyError: city not found"
    )


def test_lambda_payload_that_is_not_json_is_an_error() -> None:
    client = make_lambda_client()
    with Stubber(client) as stubber:
        stubber.add_response(
            "invoke", {"StatusCode": 200, "Payload": payload(b"<html>")}, EXPECTED_INVOKE
        )

        outcome = LambdaExecutor(lambda _config: client).execute(invocation(lambda_tool()))

    assert outcome.is_error
    assert outcome.output == (
        "tool weather returned malformed JSON: the answer is not JSON: "
        "expecting value at line 1, column 1"
    )


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"x": "\\ud800"}', "a string holds a lone surrogate (invalid Unicode)"),
        (b"[" * 100_000, "the answer nests deeper than 64 levels"),
        (b'{"x": 1, "x": 2}', "the key 'x' appears twice in one object"),
    ],
    ids=["surrogate", "deep", "duplicate-key"],
)
@pytest.mark.parametrize("function_error", [False, True], ids=["result", "error-report"])
def test_a_lambda_payload_is_read_strictly(raw: bytes, reason: str, function_error: bool) -> None:
    """What the function returned is held to the strict parser's limits: an error the model
    reads, never a crash (its error report too, which is then no report)."""
    client = make_lambda_client()
    answer: dict[str, Any] = {"StatusCode": 200, "Payload": payload(raw)}
    if function_error:
        answer["FunctionError"] = "Unhandled"
    with Stubber(client) as stubber:
        stubber.add_response("invoke", answer, EXPECTED_INVOKE)

        outcome = LambdaExecutor(lambda _config: client).execute(invocation(lambda_tool()))

    assert outcome.is_error
    expected = (
        "tool weather failed: Lambda function error (Unhandled): unreadable report"
        if function_error
        else f"tool weather returned malformed JSON: {reason}"
    )
    assert outcome.output == expected


def test_lambda_service_error_is_an_error_outcome() -> None:
    client = make_lambda_client()
    with Stubber(client) as stubber:
        stubber.add_client_error(
            "invoke",
            service_error_code="ResourceNotFoundException",
            service_message="Function not found: weather-fn",
            http_status_code=404,
        )

        outcome = LambdaExecutor(lambda _config: client).execute(invocation(lambda_tool()))

    assert outcome.is_error
    assert outcome.output == (
        "tool weather failed: its function could not be invoked (see the service's logs)"
    )


ACCESS_DENIED = (
    "User: arn:aws:sts::123456789012:assumed-role/turnledger-TurnFunctionRole-X/fn is not "
    "authorized to perform: lambda:InvokeFunction on resource: "
    "arn:aws:lambda:us-east-1:123456789012:function:weather-fn"
)


def test_lambda_errors_tell_the_model_nothing_of_the_account() -> None:
    """Issue 22: AWS's message (account id, role and function ARNs) reaches the logs only;
    so does the report of a function Lambda itself stopped."""
    client = make_lambda_client()
    stream = io.StringIO()
    previous = logger.registered_handler.setStream(stream)  # type: ignore[attr-defined]
    try:
        with Stubber(client) as stubber:
            stubber.add_client_error(
                "invoke",
                service_error_code="AccessDeniedException",
                service_message=ACCESS_DENIED,
                http_status_code=403,
            )
            crash = (
                b'{"errorType": "Runtime.ExitError", "errorMessage": "RequestId: 1f2e '
                b'Error: Runtime exited with error: signal: killed"}'
            )
            stubber.add_response(
                "invoke",
                {"StatusCode": 200, "FunctionError": "Unhandled", "Payload": payload(crash)},
                EXPECTED_INVOKE,
            )
            executor = LambdaExecutor(lambda _config: client)
            denied = executor.execute(invocation(lambda_tool()))
            killed = executor.execute(invocation(lambda_tool()))
    finally:
        logger.registered_handler.setStream(previous)  # type: ignore[attr-defined]

    assert denied.is_error and killed.is_error
    for outcome in (denied, killed):
        assert "123456789012" not in outcome.output and "arn:" not in outcome.output
        assert "RequestId" not in outcome.output
    assert (
        killed.output == "tool weather failed: Lambda function error (Unhandled): Runtime.ExitError"
    )
    logged = stream.getvalue()
    assert "AccessDeniedException" in logged and "123456789012" in logged
    assert "Runtime exited with error" in logged


def test_runner_creates_the_lambda_client_once_on_first_use(http: httpx.Client) -> None:
    client = make_lambda_client()
    created: list[LambdaClient] = []

    def factory(config: Config) -> LambdaClient:
        created.append(client)
        return client

    runner = ToolRunner(http, lambda_client_factory=factory)
    assert created == []
    with Stubber(client) as stubber:
        for n in (1, 2, 3):
            stubber.add_response(
                "invoke",
                {"StatusCode": 200, "Payload": payload(json.dumps({"n": n}).encode())},
                EXPECTED_INVOKE,
            )

        first = runner.run([invocation(lambda_tool(), "call_1")])
        # Two at once: both threads must share the one client.
        both = runner.run(
            [invocation(lambda_tool(), "call_2"), invocation(lambda_tool(), "call_3")]
        )

        stubber.assert_no_pending_responses()
    assert len(created) == 1
    assert first[0].output == '{"n":1}'
    assert sorted(o.output for o in both) == ['{"n":2}', '{"n":3}']
