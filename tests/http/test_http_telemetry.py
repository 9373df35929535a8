"""``turnledger local --otlp-endpoint URL``: the functions' spans reach an OTLP/HTTP receiver.

The receiver is a small HTTP server in the test that takes ``POST /v1/traces`` and decodes
each body as OTLP's protobuf ``ExportTraceServiceRequest`` (``opentelemetry-proto``), as a
collector or Jaeger does. A turn on the runner shows as its GenAI spans there.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from turnledger_local.cli import build_parser, config_from_args
from turnledger_local.runner import LocalRunner

from tests.http.conftest import ANN

pytestmark = pytest.mark.http


@dataclass
class Received:
    """What the receiver was sent: each request's path and content type, each span."""

    requests: list[tuple[str, str]] = field(default_factory=list)
    spans: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def named(self, name: str) -> list[dict[str, Any]]:
        with self.lock:
            return [span for span in self.spans if span["name"] == name]


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


@pytest.fixture
def receiver() -> Iterator[tuple[str, Received]]:
    """An OTLP/HTTP receiver on a free port: its base URL and what it received."""
    received = Received()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            with received.lock:
                received.requests.append((self.path, self.headers.get("Content-Type", "")))
                for resource in request.resource_spans:
                    service = {a.key: _value(a.value) for a in resource.resource.attributes}
                    for scope in resource.scope_spans:
                        for span in scope.spans:
                            received.spans.append(
                                {
                                    "name": span.name,
                                    "scope": scope.scope.name,
                                    "service": service.get("service.name"),
                                    "trace_id": span.trace_id.hex(),
                                    "span_id": span.span_id.hex(),
                                    "parent": span.parent_span_id.hex(),
                                    "attributes": {a.key: _value(a.value) for a in span.attributes},
                                }
                            )
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


def wait_for(received: Received, name: str, count: int, seconds: float = 20) -> None:
    end = time.monotonic() + seconds
    while len(received.named(name)) < count and time.monotonic() < end:
        time.sleep(0.1)


def test_local_runner_exports_a_turns_spans_over_otlp_http(
    receiver: tuple[str, Received], tmp_path: Path
) -> None:
    """A turn with a tool call: ``invoke_agent turnledger`` over ``chat demo-1`` (twice) and
    ``execute_tool echo``, sent as protobuf to ``URL/v1/traces``."""
    url, received = receiver
    tools = tmp_path / "tools.json"
    tools.write_text(
        '{"tools": [{"name": "echo", "parameters": {"type": "object"}, '
        '"executor": {"type": "http", "url": "${LOCAL_URL}/_local/echo"}}]}'
    )
    suffix = uuid.uuid4().hex[:8]
    argv = [
        "local",
        "--port",
        "0",
        "--otlp-endpoint",
        url + "/",
        "--tools",
        str(tools),
        "--table",
        f"otel-{suffix}",
        "--bucket",
        f"otel-{suffix}",
    ]
    with (
        LocalRunner(config_from_args(build_parser().parse_args(argv))) as runner,
        httpx.Client(base_url=runner.url, timeout=30) as http,
    ):
        answer = http.post(
            "/v1/conversations/traced/turns",
            json={"input": '/tool echo {"x": 1}'},
            headers=ANN,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "complete"
        wait_for(received, "invoke_agent turnledger", 1)
        wait_for(received, "chat demo-1", 2)
        wait_for(received, "execute_tool echo", 1)
    (agent,) = received.named("invoke_agent turnledger")
    chats = received.named("chat demo-1")
    (tool,) = received.named("execute_tool echo")
    assert {path for path, _ in received.requests} == {"/v1/traces"}
    assert {kind for _, kind in received.requests} == {"application/x-protobuf"}
    assert agent["scope"] == "turnledger" and agent["service"] == "turnledger"
    assert agent["attributes"]["gen_ai.operation.name"] == "invoke_agent"
    assert agent["attributes"]["gen_ai.conversation.id"] == "traced"
    assert len(chats) == 2
    for child in [*chats, tool]:
        assert (child["trace_id"], child["parent"]) == (agent["trace_id"], agent["span_id"])
    reasons = sorted(chat["attributes"]["gen_ai.response.finish_reasons"] for chat in chats)
    assert reasons == [["stop"], ["tool_calls"]]
    assert tool["attributes"]["gen_ai.tool.call.id"] == "call_1"


def test_an_otlp_endpoint_must_be_an_http_url() -> None:
    """A bad endpoint is a usage error, before anything starts."""
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["local", "--otlp-endpoint", "localhost:4318"])
    assert exit_.value.code == 2
