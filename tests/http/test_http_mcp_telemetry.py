"""An MCP tool's call joins the turn's trace: the local runner with ``--otlp-endpoint``
(spans to the OTLP/HTTP receiver of :mod:`tests.http.test_http_telemetry`) calls a real
MCP server on loopback (:mod:`tests.support.mcp_servers`, logging the ``traceparent``
header of each request it serves).

The call's HTTP request and its ``_meta`` carry the W3C trace context of its
``execute_tool`` span, itself under the turn's ``invoke_agent``; the span carries the MCP
conventions' attributes of a ``tools/call``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from turnledger.core.telemetry import ENV_OTLP_ENDPOINT
from turnledger_local.runner import LocalRunner

from tests.functional.test_tool_turns import tool_line
from tests.http.test_http_mcp import post_turn
from tests.http.test_http_telemetry import Received, receiver, wait_for
from tests.support.mcp_loopback import ANN, McpProcess, config_of, free_port

pytestmark = pytest.mark.integration

__all__ = ["receiver"]  # the OTLP receiver: a fixture, imported for the test below


@pytest.fixture
def mcp_server(tmp_path: Path) -> Iterator[McpProcess]:
    calls = tmp_path / "mcp-calls"
    calls.mkdir()
    server = McpProcess(free_port(), calls)
    server.start()
    yield server
    server.stop()


def test_an_mcp_call_carries_the_trace_of_its_execute_tool_span(
    receiver: tuple[str, Received],
    mcp_server: McpProcess,
    ddb_local_endpoint: str,
    tmp_path: Path,
) -> None:
    """The server sees a ``traceparent`` (header and ``_meta``) whose trace is the turn's and
    whose parent is the call's ``execute_tool`` span; that span names the method, the
    server's address and port, the transport and the protocol's version it agreed on."""
    url, received = receiver
    config = config_of(mcp_server, ddb_local_endpoint, tmp_path, env={ENV_OTLP_ENDPOINT: url})
    conversation = f"mcp-{uuid.uuid4().hex[:12]}"
    path = f"/{conversation}"
    with (
        LocalRunner(config) as runner,
        httpx.Client(base_url=runner.url, headers=ANN, timeout=60) as client,
    ):
        read = post_turn(client, conversation, tool_line("mcp__files__read_file", path=path))
        assert read.status_code == 200, read.text
        assert read.json()["status"] == "complete"
        wait_for(received, "invoke_agent turnledger", 1)
        wait_for(received, "execute_tool mcp__files__read_file", 1)
    (agent,) = received.named("invoke_agent turnledger")
    (call,) = received.named("execute_tool mcp__files__read_file")
    assert (call["trace_id"], call["parent"]) == (agent["trace_id"], agent["span_id"])

    [seen] = mcp_server.calls(path)
    for traceparent in (seen["traceparent"], seen["meta"].get("traceparent")):
        assert traceparent is not None, seen
        version, trace_id, parent_id, _flags = traceparent.split("-")
        assert (version, trace_id, parent_id) == ("00", call["trace_id"], call["span_id"])

    attributes = call["attributes"]
    assert attributes["gen_ai.operation.name"] == "execute_tool"
    assert attributes["gen_ai.tool.call.id"] == seen["meta"]["turnledger/call_id"]
    assert attributes["mcp.method.name"] == "tools/call"
    assert attributes["mcp.protocol.version"] == seen["protocol_version"]
    assert attributes["network.transport"] == "tcp"
    assert (attributes["server.address"], attributes["server.port"]) == (
        "127.0.0.1",
        mcp_server.port,
    )
    assert path not in repr(attributes)
