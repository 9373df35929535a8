"""The OpenTelemetry adapter of the telemetry port (:mod:`.telemetry`).

Imported only when telemetry is on (:func:`.instrumentation.configure`): it needs the
OpenTelemetry API, and the SDK where it exports spans itself (``TURNLEDGER_OTLP_ENDPOINT``:
the local runner's receiver; deployed, the template's endpoint or the ADOT layer's
collector extension, the layer bringing the SDK). With ``TURNLEDGER_TELEMETRY=otel`` and
no endpoint, it uses the process's global tracer provider (one a wrapper configured).

Trace context crosses waits and outgoing calls as W3C ``traceparent`` (with
``tracestate``), whatever propagator the process is set up with (ADOT's may be
X-Ray's): a wait stores it, a deferred tool's request carries it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .telemetry import (
    ENV_OTLP_ENDPOINT,
    ERROR_TYPE,
    LINK_KIND,
    LINK_RESUMES,
    NO_SPAN,
    SCHEMA_URL,
    SCOPE,
    Attributes,
)
from .telemetry import Span as PortSpan

_PROPAGATOR = TraceContextTextMapPropagator()
#: How often the local runner's batch exporter sends (ms): a span shows soon after its turn.
_LOCAL_EXPORT_DELAY_MS = 500


class OtelSpan:
    """An OpenTelemetry span seen through the port."""

    __slots__ = ("span",)

    def __init__(self, span: trace.Span) -> None:
        self.span = span

    def set(self, attributes: Attributes) -> None:
        self.span.set_attributes(attributes)

    def link(self, trace_context: str) -> None:
        context = _PROPAGATOR.extract({"traceparent": trace_context})
        linked = trace.get_current_span(context).get_span_context()
        if linked.is_valid:
            self.span.add_link(linked, {LINK_KIND: LINK_RESUMES})

    def fail(self, error_type: str) -> None:
        self.span.set_attribute(ERROR_TYPE, error_type)
        self.span.set_status(Status(StatusCode.ERROR))

    def trace_context(self) -> str | None:
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, trace.set_span_in_context(self.span))
        return carrier.get("traceparent")


class OtelTelemetry:
    """The port over an OpenTelemetry tracer provider (the global one by default)."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        self.tracer = trace.get_tracer(SCOPE, schema_url=SCHEMA_URL, tracer_provider=provider)

    def start(self, name: str, attributes: Attributes) -> AbstractContextManager[PortSpan]:
        return self._start(name, attributes)

    @contextmanager
    def _start(self, name: str, attributes: Attributes) -> Iterator[PortSpan]:
        # Exceptions are the port's to record (``error.type``, never their message: it
        # may quote content), so the SDK neither records nor sets a status of its own.
        with self.tracer.start_as_current_span(
            name,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            links=(),
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            yield OtelSpan(span)

    def current(self) -> PortSpan:
        span = trace.get_current_span()
        return OtelSpan(span) if span.get_span_context().is_valid else NO_SPAN

    def headers(self) -> dict[str, str]:
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier)
        return carrier


def exporting_provider(endpoint: str) -> TracerProvider:
    """An SDK tracer provider that sends its spans over OTLP/HTTP (protobuf) to
    ``{endpoint}/v1/traces``, in batches (the SDK flushes them when the process exits)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = SdkTracerProvider(resource=Resource.create({"service.name": SCOPE}))
    exporter = OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")
    provider.add_span_processor(
        BatchSpanProcessor(exporter, schedule_delay_millis=_LOCAL_EXPORT_DELAY_MS)
    )
    return provider


def from_environment(environ: Mapping[str, str]) -> OtelTelemetry:
    """The adapter the environment asks for: exporting to ``TURNLEDGER_OTLP_ENDPOINT``
    when it is set, else over the global tracer provider."""
    endpoint = environ.get(ENV_OTLP_ENDPOINT, "").strip()
    return OtelTelemetry(exporting_provider(endpoint) if endpoint else None)
