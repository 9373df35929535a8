"""The spans of a turn, as OpenTelemetry's in-memory exporter receives them.

The service runs with the OpenTelemetry adapter over an SDK tracer provider whose spans
go to an :class:`InMemorySpanExporter`: a turn is ``invoke_agent turnledger`` with a
``chat {model}`` span per model call and an ``execute_tool {name}`` span per call the
service runs, named and attributed as the GenAI conventions give them
(``turnledger.core.telemetry``). A turn that waits stores its trace context; the request
that resumes it (an approval, a callback) is another trace, linked to the first. No
attribute of any span holds message text, tool arguments or results.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import format_span_id, format_trace_id
from turnledger.api.schemas import CallbackRequest, TurnRequest
from turnledger.core import deadline, telemetry
from turnledger.core.config import Settings
from turnledger.core.exceptions import ProviderTimeout
from turnledger.core.models import ConversationKey
from turnledger.core.otel import OtelTelemetry
from turnledger.providers.base import ModelRequest
from turnledger.providers.demo import DemoProvider
from turnledger.store.memory import MemoryConversationStore
from turnledger.tools import ToolRegistry, ToolRunner
from turnledger.tools.mcp_client import InMemoryMcp
from turnledger.tools.mcp_link import McpLink
from turnledger.turn import callbacks
from turnledger.turn.commands import TurnCommand
from turnledger.turn.pipeline import Conversations
from turnledger.turn.replay_records import ReplaySpec

from tests.functional.http_sink import HttpSink, Reply
from tests.functional.test_replays import converse, replay, replaying
from tests.functional.test_tool_turns import ANN, decide, lines, tool_line
from tests.support import edge
from tests.support.factories import FakeClock
from tests.support.mcp_servers import files_server
from tests.support.providers import Recording

KEY = bytes(range(32))
#: Text no span may hold: it is in every message, argument and result of the session.
SECRET = "zebra-7731"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Telemetry on, every finished span kept in memory; off again afterwards."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    previous = telemetry.install(OtelTelemetry(provider))
    try:
        yield exporter
    finally:
        telemetry.install(previous)
        provider.shutdown()


@pytest.fixture
def tools() -> Iterator[HttpSink]:
    with HttpSink() as sink:
        sink.respond("/weather", Reply(body={"forecast": f"sunny {SECRET}"}))
        sink.respond("/email", Reply(body={"sent": SECRET}))
        sink.respond("/report", Reply(status=202, body={"task_id": "job-7"}))
        yield sink


@pytest.fixture
def service(
    tools: HttpSink, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Conversations]:
    monkeypatch.setenv("CALLBACK_KEY", KEY.hex())
    monkeypatch.setenv("PUBLIC_BASE_URL", "https://api.example.com")
    definitions: list[dict[str, Any]] = [
        {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            "executor": {"type": "http", "url": tools.url("/weather")},
        },
        {
            "name": "send_email",
            "parameters": {"type": "object", "properties": {"to": {"type": "string"}}},
            "require_approval": True,
            "executor": {"type": "http", "url": tools.url("/email")},
        },
        {
            "name": "run_report",
            "parameters": {"type": "object"},
            "executor": {"type": "http", "url": tools.url("/report"), "deferred": True},
        },
    ]
    with httpx.Client() as http:
        yield Conversations(
            store=MemoryConversationStore(),
            provider=_demo(),
            settings=replace(Settings()),
            tools=ToolRegistry.from_json(json.dumps({"tools": definitions})),
            runner=ToolRunner(http, None),
            clock=clock.now,
        )


def _fail_on_request(request: ModelRequest) -> None:
    """The demo model, except that a last message ``/timeout`` times out."""
    if request.messages and request.messages[-1].content == "/timeout":
        raise ProviderTimeout("the model did not answer in time")


def _demo() -> Recording:
    return Recording(before=_fail_on_request)


def named(finished: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [span for span in finished if span.name == name]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def test_a_turn_with_an_approval_is_two_linked_traces_of_genai_spans(
    service: Conversations, spans: InMemorySpanExporter, tools: HttpSink
) -> None:
    """The turn: invoke_agent over chat and the automatic tool's execute_tool; it waits for
    the approval. The approval's request: a new trace linked to the first, over the
    approved tool's execute_tool and the model's answer."""
    first = edge.turn(
        service,
        ANN,
        "conv-1",
        TurnRequest(
            input=lines(tool_line("get_weather", city="Paris"), tool_line("send_email", to="a@x"))
        ),
    )
    assert first.status == "awaiting_approval"
    begun = spans.get_finished_spans()
    assert sorted(span.name for span in begun) == [
        "chat demo-1",
        "execute_tool get_weather",
        "invoke_agent turnledger",
    ]
    (agent,) = named(begun, "invoke_agent turnledger")
    (chat,) = named(begun, "chat demo-1")
    (weather,) = named(begun, "execute_tool get_weather")
    assert parent_of(chat) == parent_of(weather) == agent.context.span_id
    assert dict(agent.attributes or {}) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "turnledger",
        "gen_ai.conversation.id": "conv-1",
        "turnledger.tenant.hash": telemetry.tenant_hash("tenant-a"),
        "turnledger.turn": 1,
    }
    assert "tenant-a" not in json.dumps(dict(agent.attributes or {}))
    assert dict(chat.attributes or {}) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "demo",
        "turnledger.provider": "demo",
        "gen_ai.request.model": "demo-1",
        "gen_ai.response.model": "demo-1",
        "turnledger.purpose": "answer",
        "gen_ai.response.finish_reasons": ("tool_calls",),
        "gen_ai.usage.input_tokens": first.usage.input_tokens,
        "gen_ai.usage.output_tokens": first.usage.output_tokens,
    }
    assert dict(weather.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "get_weather",
        "gen_ai.tool.call.id": "call_1",
        "gen_ai.tool.type": "function",
        "turnledger.tool.executor": "http",
    }
    assert not agent.links
    spans.clear()

    done = decide(service, approve=["call_2"])
    assert done.status == "complete"
    resumed = spans.get_finished_spans()
    assert sorted(span.name for span in resumed) == [
        "chat demo-1",
        "execute_tool send_email",
        "invoke_agent turnledger",
    ]
    (again,) = named(resumed, "invoke_agent turnledger")
    (email,) = named(resumed, "execute_tool send_email")
    (answer,) = named(resumed, "chat demo-1")
    assert again.context.trace_id != agent.context.trace_id
    assert [(link.context.trace_id, link.context.span_id) for link in again.links] == [
        (agent.context.trace_id, agent.context.span_id)
    ]
    assert dict(again.links[0].attributes or {}) == {"turnledger.link": "resumes_wait"}
    assert parent_of(email) == parent_of(answer) == again.context.span_id
    assert (email.attributes or {})["turnledger.approval.decision"] == "approved"
    assert (email.attributes or {})["gen_ai.tool.call.id"] == "call_2"
    assert (answer.attributes or {})["gen_ai.response.finish_reasons"] == ("stop",)
    assert (again.attributes or {})["gen_ai.conversation.id"] == "conv-1"


def test_a_deferred_tool_carries_the_trace_and_its_callback_links_to_it(
    service: Conversations, spans: InMemorySpanExporter, tools: HttpSink, clock: FakeClock
) -> None:
    """The deferred tool's request carries ``traceparent`` (of its execute_tool span, in
    the turn's trace); the callback that settles the call is a trace linked to the turn."""
    waiting = edge.turn(service, ANN, "conv-2", TurnRequest(input=tool_line("run_report")))
    assert waiting.status == "awaiting_async_tools"
    (agent,) = named(spans.get_finished_spans(), "invoke_agent turnledger")
    (report,) = named(spans.get_finished_spans(), "execute_tool run_report")
    assert (report.attributes or {})["turnledger.tool.deferred"] is True
    (sent,) = tools.requests_for("/report")
    # The flags' byte is the SDK's (sampled, and since W3C level 2 a random trace id).
    version, trace_id, span_id, _flags = (sent.header("traceparent") or "").split("-")
    assert (version, trace_id, span_id) == (
        "00",
        format_trace_id(report.context.trace_id),
        format_span_id(report.context.span_id),
    )
    spans.clear()

    url = sent.json()["callback_url"]
    claims = callbacks.verify(KEY, url.rpartition("/")[2], now=clock.now())
    settle = CallbackRequest.model_validate(
        {"status": "succeeded", "output": "done", "continue": True}
    )
    edge.settle_callback(service, claims, settle)
    (settled,) = named(spans.get_finished_spans(), "invoke_agent turnledger")
    assert settled.context.trace_id != agent.context.trace_id
    assert [link.context.span_id for link in settled.links] == [agent.context.span_id]


def test_an_mcp_call_is_an_execute_tool_span_with_the_mcp_attributes(
    spans: InMemorySpanExporter, clock: FakeClock
) -> None:
    """An MCP tool's call: its ``execute_tool`` span under the turn's carries what the MCP
    conventions' ``tools/call`` client span would (merged into it), never the arguments
    or the result; the server is sent the span's ``traceparent`` in ``_meta``."""
    files = files_server()
    link = McpLink(lambda: InMemoryMcp({"files": files.server}))
    entry = {
        "type": "mcp",
        "server_label": "files",
        "server_url": "https://mcp.example.com/files/mcp",
        "require_approval": "never",
    }
    with httpx.Client() as http:
        svc = Conversations(
            store=MemoryConversationStore(),
            provider=_demo(),
            settings=replace(Settings()),
            tools=ToolRegistry.from_json(json.dumps({"tools": [entry]}), mcp=link),
            runner=ToolRunner(http, None, mcp=link),
            clock=clock.now,
        )
        done = edge.turn(
            svc, ANN, "conv-6", TurnRequest(input=tool_line("mcp__files__read_file", path=SECRET))
        )
    assert done.status == "complete"
    finished = spans.get_finished_spans()
    (agent,) = named(finished, "invoke_agent turnledger")
    (call,) = named(finished, "execute_tool mcp__files__read_file")
    assert parent_of(call) == agent.context.span_id
    attributes = dict(call.attributes or {})
    version = attributes.pop("mcp.protocol.version")
    assert isinstance(version, str) and version
    assert attributes == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "mcp__files__read_file",
        "gen_ai.tool.call.id": "call_1",
        "gen_ai.tool.type": "function",
        "turnledger.tool.executor": "mcp",
        "mcp.method.name": "tools/call",
        "network.transport": "tcp",
        "network.protocol.name": "http",
        "server.address": "mcp.example.com",
        "server.port": 443,
        "turnledger.mcp.server_label": "files",
        "turnledger.mcp.tool": "read_file",
    }
    [(_tool, _arguments, meta)] = files.calls
    _version, trace_id, span_id, _flags = meta["traceparent"].split("-")
    assert (trace_id, span_id) == (
        format_trace_id(call.context.trace_id),
        format_span_id(call.context.span_id),
    )
    assert [value for value in every_value(finished) if SECRET in value] == []


def test_a_failed_model_call_sets_the_error_code(
    service: Conversations, spans: InMemorySpanExporter
) -> None:
    """A provider failure: ``error.type`` is the service's code on the model call's span
    and the request's."""
    with pytest.raises(ProviderTimeout):
        edge.turn(service, ANN, "conv-3", TurnRequest(input="/timeout"))
    finished = spans.get_finished_spans()
    codes = {span.name: (span.attributes or {}).get("error.type") for span in finished}
    assert codes == {
        "chat demo-1": "provider_timeout",
        "invoke_agent turnledger": "provider_timeout",
    }
    assert all(span.status.status_code.name == "ERROR" for span in finished)


def every_value(finished: Sequence[ReadableSpan]) -> list[str]:
    """Every attribute value of every span, its events and its links, and every name."""
    values: list[str] = []
    for span in finished:
        values.append(span.name)
        groups = [span.attributes, *(e.attributes for e in span.events)]
        groups += [link.attributes for link in span.links]
        values += [event.name for event in span.events]
        for group in groups:
            values += [f"{name}={value!r}" for name, value in (group or {}).items()]
    return values


def test_no_span_of_a_whole_session_holds_message_text_or_tool_arguments(
    service: Conversations, spans: InMemorySpanExporter, tools: HttpSink, clock: FakeClock
) -> None:
    """A session: a message, tools with arguments and results (automatic, approved and
    deferred), a callback, a failed call; the secret is in each of them, in no span."""
    edge.turn(
        service,
        ANN,
        "conv-4",
        TurnRequest(
            input=lines(
                f"Hello {SECRET}",
                tool_line("get_weather", city=SECRET),
                tool_line("send_email", to=SECRET),
            )
        ),
    )
    decide(service, "conv-4", approve=["call_2"])
    edge.turn(service, ANN, "conv-4", TurnRequest(input=tool_line("run_report", note=SECRET)))
    url = tools.requests_for("/report")[-1].json()["callback_url"]
    claims = callbacks.verify(KEY, url.rpartition("/")[2], now=clock.now())
    edge.settle_callback(
        service,
        claims,
        CallbackRequest.model_validate({"status": "succeeded", "output": SECRET, "continue": True}),
    )
    edge.turn(service, ANN, "conv-4", TurnRequest(input=f"thanks {SECRET}"))
    finished = spans.get_finished_spans()
    assert len(named(finished, "invoke_agent turnledger")) == 5
    assert len([s for s in finished if s.name.startswith("execute_tool ")]) == 3
    values = every_value(finished)
    assert values
    assert [value for value in values if SECRET in value] == []
    # The same capture does see what it should: it is able to find a value.
    assert any("gen_ai.conversation.id='conv-4'" in value for value in values)


def test_summaries_and_memory_extraction_are_model_calls_of_their_own_purpose(
    spans: InMemorySpanExporter, clock: FakeClock
) -> None:
    """A turn that compacts its context and one that writes memory back: their summarizer
    calls are ``chat`` spans under the turn's, with ``turnledger.purpose``; no text."""
    svc = Conversations(
        store=MemoryConversationStore(),
        provider=DemoProvider(),
        settings=replace(Settings(), memory_enabled=True, context_max_tokens=120),
        clock=clock.now,
    )
    key = ConversationKey(tenant="tenant-a", conversation_id="conv-5")
    index = 0
    while not any(
        (s.attributes or {}).get("turnledger.purpose") == "summary"
        for s in spans.get_finished_spans()
    ):
        index += 1
        assert index < 30, "no summary was written"
        with deadline.request_deadline(30.0):
            svc.turn(key, "ann", TurnCommand(messages=[f"my name is Ann {SECRET} {index}"]))
    finished = spans.get_finished_spans()
    purposes = {(s.attributes or {}).get("turnledger.purpose") for s in finished}
    assert purposes >= {"answer", "summary", "memory_extraction"}
    agents = {s.context.span_id for s in named(finished, "invoke_agent turnledger")}
    chats = [s for s in finished if s.name.startswith("chat ")]
    assert all(parent_of(chat) in agents for chat in chats)
    summary = next(s for s in chats if (s.attributes or {})["turnledger.purpose"] == "summary")
    assert (summary.attributes or {})["gen_ai.usage.output_tokens"] > 0
    assert [value for value in every_value(finished) if SECRET in value] == []


def test_a_replays_candidate_calls_are_chat_spans_of_purpose_replay(
    spans: InMemorySpanExporter, clock: FakeClock, tools: HttpSink
) -> None:
    """Each call a replay sends its candidate is a ``chat {model}`` span
    (``turnledger.purpose=replay``, the candidate's provider), as a turn's calls are."""
    candidate = Recording()
    candidate.name = "demo-again"
    with httpx.Client() as http:
        svc = replaying(MemoryConversationStore(), clock, tools, http, candidate)
        converse(svc, 3)
        spans.clear()
        record = replay(svc, ReplaySpec(provider="demo-again", model="demo-1"))
    assert record.status == "complete"
    calls = [s for s in spans.get_finished_spans() if s.name == "chat demo-1"]
    assert len(calls) == len(record.calls) == 4
    for span in calls:
        attributes = dict(span.attributes or {})
        assert attributes["turnledger.purpose"] == "replay"
        assert attributes["turnledger.provider"] == "demo-again"
