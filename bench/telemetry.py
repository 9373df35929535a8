"""Telemetry's cost (issue 45): what a span adds to a warm turn with OpenTelemetry on, and
what the port costs with it off.

One warm process runs ``--turns`` turns through
:class:`~turnledger.turn.pipeline.Conversations` (in-memory store, the demo model, an
``http`` tool served on 127.0.0.1), alternately with telemetry off (the default port) and
on (the OpenTelemetry adapter over an SDK tracer provider with a batch processor and an
exporter that drops what it is sent: the export itself is the collector's cost, not the
turn's). Each turn calls the tool once: four spans (``invoke_agent``, two ``chat``, one
``execute_tool``). The cost of a span is the difference of the medians over the spans of
a turn. The port's cost while off is timed alone: entering and leaving the block of one
span, as the turn's code does.

The section ``## Telemetry`` of ``bench/RESULTS.md`` is rewritten with the results.
Run from the repository root: ``.venv/bin/python -m bench.telemetry``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import timeit
from collections.abc import Callable, Sequence
from time import perf_counter

import httpx
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from turnledger.core import telemetry
from turnledger.core.config import Settings
from turnledger.core.models import ConversationKey
from turnledger.core.otel import OtelTelemetry
from turnledger.providers.demo import DemoProvider
from turnledger.store.memory import MemoryConversationStore
from turnledger.tools import ToolRegistry, ToolRunner
from turnledger.turn.commands import TurnCommand
from turnledger.turn.pipeline import Conversations
from turnledger_local.template import PROJECT_ROOT

from bench.results import command_line, machine_line, publish
from tests.functional.http_sink import HttpSink, Reply

TITLE = "Telemetry"
#: The spans of one benchmark turn: invoke_agent, chat (the call), execute_tool, chat.
SPANS_PER_TURN = 4


class Dropped(SpanExporter):
    """An exporter that counts what it is sent and sends nothing."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def _service(sink: HttpSink, http: httpx.Client) -> Conversations:
    tool = {
        "name": "lookup",
        "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
        "executor": {"type": "http", "url": sink.url("/lookup")},
    }
    return Conversations(
        store=MemoryConversationStore(),
        provider=DemoProvider(),
        settings=Settings(),
        tools=ToolRegistry.from_json(json.dumps({"tools": [tool]})),
        runner=ToolRunner(http, None),
    )


def _turn(service: Conversations, index: int) -> float:
    """One turn of a new conversation: the model calls the tool, then answers (ms)."""
    key = ConversationKey(tenant="bench", conversation_id=f"telemetry-{index}")
    command = TurnCommand(messages=['/tool lookup {"id": "42"}'])
    started = perf_counter()
    result = service.turn(key, "bench", command)
    elapsed = (perf_counter() - started) * 1000
    assert result.status == "complete", result.status
    return elapsed


def _span_ns(number: int, flush: Callable[[], object] = lambda: None) -> float:
    """Entering and leaving one span's block (ns), with the port installed now; ``flush``
    before each repeat (the batch processor's queue holds 2,048 spans: none dropped)."""

    def span() -> None:
        with telemetry.tool_call("lookup", "call_1", kind="http") as traced:
            telemetry.tool_outcome(traced, is_error=False, deferred=False)

    return min(timeit.repeat(span, setup=flush, number=number, repeat=5)) / number * 1e9


_INIT_PROBE = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
started = time.perf_counter()
import app
elapsed = (time.perf_counter() - started) * 1000
otel = [m for m in sys.modules if m.startswith(("opentelemetry", "turnledger.core.otel"))]
print(json.dumps({"ms": elapsed, "modules": len(sys.modules), "otel": len(otel)}))
"""


def init(endpoint: str | None, runs: int = 5) -> dict[str, float]:
    """The turn handler's init (its import) in fresh interpreters, telemetry off or on
    (``endpoint``): the median ms, the modules it loads and how many are OpenTelemetry's."""
    samples = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as data:
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": data,
                "AWS_REGION": "us-east-1",
                "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing",
                "STORE": "sqlite",
                "DATA_DIR": data,
                "POWERTOOLS_TRACE_DISABLED": "true",
                "PYDANTIC_DISABLE_PLUGINS": "__all__",
                "PYTHONPATH": str(PROJECT_ROOT / "layers" / "turnledger"),
            }
            if endpoint is not None:
                env["TURNLEDGER_OTLP_ENDPOINT"] = endpoint
            done = subprocess.run(
                [sys.executable, "-c", _INIT_PROBE, str(PROJECT_ROOT / "functions" / "turn")],
                env=env,
                capture_output=True,
                text=True,
                check=True,
                timeout=120,
            )
            samples.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {
        "ms": statistics.median(s["ms"] for s in samples),
        "modules": float(samples[-1]["modules"]),
        "otel": float(samples[-1]["otel"]),
    }


def run(turns: int) -> dict[str, float]:
    exporter = Dropped()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    on = OtelTelemetry(provider)
    off_ms: list[float] = []
    on_ms: list[float] = []
    with HttpSink() as sink, httpx.Client() as http:
        sink.respond("/lookup", Reply(body={"name": "Ada"}))
        service = _service(sink, http)
        for index in range(20):  # warm: imports, first model built, connections
            _turn(service, -index - 1)
        for index in range(turns):
            telemetry.install(telemetry.OFF)
            off_ms.append(_turn(service, 2 * index))
            telemetry.install(on)
            on_ms.append(_turn(service, 2 * index + 1))
        telemetry.install(telemetry.OFF)
        off_span = _span_ns(200_000)
        telemetry.install(on)
        on_span = _span_ns(1_500, provider.force_flush)
        telemetry.install(telemetry.OFF)
    provider.force_flush()
    provider.shutdown()
    assert exporter.spans == turns * SPANS_PER_TURN + 5 * 1_500, exporter.spans
    off, on_median = statistics.median(off_ms), statistics.median(on_ms)
    cold_off, cold_on = init(None), init("http://127.0.0.1:9")
    return {
        "init_off_ms": cold_off["ms"],
        "init_on_ms": cold_on["ms"],
        "init_off_modules": cold_off["modules"],
        "init_on_modules": cold_on["modules"],
        "init_off_otel": cold_off["otel"],
        "init_on_otel": cold_on["otel"],
        "off_ms": off,
        "on_ms": on_median,
        "span_us": (on_median - off) / SPANS_PER_TURN * 1000,
        "off_span_ns": off_span,
        "on_span_us": on_span / 1000,
        "spans": float(turns * SPANS_PER_TURN),
    }


def render(found: dict[str, float], turns: int, args: Sequence[str]) -> str:
    return "\n".join(
        [
            f"Command: {command_line('bench.telemetry', args)}",
            "",
            machine_line(),
            "",
            f"{turns} warm turns each way, alternately off and on, in one process "
            "(`Conversations.turn`, in-memory store, demo model, one `http` tool call on "
            f"127.0.0.1: {SPANS_PER_TURN} spans a turn; on: the SDK's batch processor, an "
            "exporter that drops the spans). The turn handler's init is sampled in fresh "
            "interpreters, off and then on (`TURNLEDGER_OTLP_ENDPOINT` set: the SDK and the "
            "OTLP exporter imported, as the ADOT layer brings them): off, it imports nothing "
            "of OpenTelemetry (`tests/unit/test_cold_import.py`); its init time is the "
            "machine's noise, the `## Cold start` section measures it against the minimal "
            "handler.",
            "",
            "| figure | off | on |",
            "| --- | --- | --- |",
            f"| turn handler's init, median of 5 fresh interpreters (SQLite store) | "
            f"{found['init_off_ms']:.0f} ms | {found['init_on_ms']:.0f} ms |",
            f"| modules its init loads (of them OpenTelemetry's and the adapter) | "
            f"{found['init_off_modules']:.0f} ({found['init_off_otel']:.0f}) | "
            f"{found['init_on_modules']:.0f} ({found['init_on_otel']:.0f}) |",
            "",
            "| figure | value |",
            "| --- | --- |",
            f"| warm turn, telemetry off (median) | {found['off_ms']:.2f} ms |",
            f"| warm turn, telemetry on (median) | {found['on_ms']:.2f} ms |",
            f"| cost of a span in a turn, on (difference of the medians / {SPANS_PER_TURN}) | "
            f"{found['span_us']:.0f} µs |",
            f"| one span's block alone, on (best of 5 x 1,500) | {found['on_span_us']:.1f} µs |",
            f"| one span's block alone, off (best of 5 x 200,000) | "
            f"{found['off_span_ns']:.0f} ns |",
            f"| spans exported | {found['spans']:.0f} |",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and write its section of ``bench/RESULTS.md``."""
    parser = argparse.ArgumentParser(prog="python -m bench.telemetry", description=__doc__)
    parser.add_argument("--turns", type=int, default=300, help="turns each way")
    parser.add_argument(
        "--print-only", action="store_true", help="print the section, leave RESULTS.md alone"
    )
    args = parser.parse_args(argv)
    if args.turns < 1:
        parser.error("--turns must be at least 1")
    found = run(args.turns)
    given = list(argv) if argv is not None else sys.argv[1:]
    publish(TITLE, render(found, args.turns, given), print_only=args.print_only)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
