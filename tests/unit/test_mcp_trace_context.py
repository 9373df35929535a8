"""The trace context an MCP call carries (:mod:`turnledger.tools.mcp_calls`): the entry's
headers with the call's ``traceparent`` over a registry header of that name, and nothing
of it while telemetry is off."""

from __future__ import annotations

import json

import pytest
from turnledger.core import telemetry
from turnledger.core.models import ToolCall
from turnledger.tools import ToolRegistry
from turnledger.tools.calls import ToolInvocation
from turnledger.tools.executors import ToolRunner
from turnledger.tools.mcp import CALL_ID_META, McpServerEntry
from turnledger.tools.mcp_calls import traced
from turnledger.tools.mcp_client import InMemoryMcp
from turnledger.tools.mcp_link import McpLink

from tests.support.mcp_servers import files_server

TRACE = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


def entry(headers: dict[str, str]) -> McpServerEntry:
    return McpServerEntry(
        type="mcp", server_label="files", server_url="https://mcp.example.com/mcp", headers=headers
    )


def test_the_calls_trace_context_replaces_a_registry_header_of_its_name_in_any_case() -> None:
    server = entry({"Authorization": "Bearer k", "TraceParent": "00-fixed-fixed-01"})
    sent = traced(server, TRACE)
    assert sent.headers == {"Authorization": "Bearer k", **TRACE}
    # The registry's entry is left as it was: the next call starts from it again.
    assert server.headers["TraceParent"] == "00-fixed-fixed-01"


def test_without_a_trace_context_the_entry_is_sent_as_registered() -> None:
    server = entry({"Authorization": "Bearer k"})
    assert traced(server, {}) is server


def test_telemetry_off_a_call_carries_no_trace_context() -> None:
    assert telemetry.active() is telemetry.OFF
    files = files_server()
    link = McpLink(lambda: InMemoryMcp({"files": files.server}))
    registry = ToolRegistry.from_json(
        json.dumps({"tools": [entry({}).model_dump(exclude_defaults=False)]}), mcp=link
    )
    runner = ToolRunner(lambda: pytest.fail("no http"), None, mcp=link)
    outcome = runner.run_one(
        ToolInvocation(
            tool=registry.get("mcp__files__read_file"),
            call=ToolCall(id="call_1", name="mcp__files__read_file", arguments={"path": "/a"}),
            tenant="t",
            conversation_id="c",
            idempotency_key="k" * 32,
        )
    )
    assert not outcome.is_error, outcome.output
    [(_tool, _arguments, meta)] = files.calls
    assert meta[CALL_ID_META] == "call_1"
    assert "traceparent" not in meta and "tracestate" not in meta
