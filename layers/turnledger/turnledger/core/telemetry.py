"""OpenTelemetry spans of the GenAI semantic conventions, behind a port that does nothing
by default.

Every span and attribute name the service emits is here, with the conventions' schema
(:data:`SCHEMA_URL`); the spans a turn makes are:

* ``invoke_agent turnledger``: one per request that runs a turn (a turn, an approval, a
  callback), with the conversation (``gen_ai.conversation.id``), its turn, the fork it
  was made from, and a hash of the tenant (never its name). A request that resumes a
  turn that waited links its span to the span of the request that left it waiting (the
  wait stores its trace context: :attr:`turnledger.core.models.TurnOptions.trace_context`);
* ``chat {model}``: one per model call (the turn's answer, a summary, a memory
  extraction, a replay's candidate, told apart by ``turnledger.purpose``), with provider,
  model, response id, finish reasons and usage (cached input included);
* ``execute_tool {name}``: one per tool call the service runs, with the call's id and
  the approval's decision when it needed one; an MCP tool's call also carries what the
  MCP conventions' client span of a ``tools/call`` would (:func:`mcp_call`: that span is
  merged into this one), and its requests carry the span's ``traceparent``.

A failure sets ``error.type`` to the service's error code (``provider_timeout``...), or the
exception's type when it has none. **No content**: message text, tool arguments and
results never go into a span: every attribute set here is an id, a name, a count, a
hash or a code.

The port (:class:`Telemetry`) is :data:`OFF` until the runtime
(:func:`turnledger.core.instrumentation.configure`, at init) finds telemetry
asked for (``TURNLEDGER_OTLP_ENDPOINT``, set by the template's ``Observability``
parameter and by ``turnledger local --otlp-endpoint``) and the OpenTelemetry API
installed: only then is :mod:`turnledger.core.otel` (the adapter) imported, so a
function without telemetry imports nothing of OpenTelemetry (the cold-start bench and
``tests/unit/test_cold_import.py`` check it). A span costs one call and an empty context
manager while telemetry is off.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping, Sequence, Sized
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .models import Usage

#: The semantic conventions' version the names follow (GenAI: still in development; their
#: instrumentations emit these names with ``OTEL_SEMCONV_STABILITY_OPT_IN=
#: gen_ai_latest_experimental``).
SCHEMA_URL = "https://opentelemetry.io/schemas/1.38.0"
#: The instrumentation scope of every span.
SCOPE = "turnledger"

#: Environment: ``otel`` turns telemetry on over the process's global tracer provider (one
#: a wrapper such as ADOT's ``/opt/otel-instrument`` configured).
ENV_TELEMETRY = "TURNLEDGER_TELEMETRY"
#: Environment: turns telemetry on, spans exported over OTLP/HTTP (protobuf) to
#: ``{this}/v1/traces`` by an SDK tracer provider of the service's own (the local runner;
#: deployed, the template's ``Observability``: the ADOT layer brings the SDK).
ENV_OTLP_ENDPOINT = "TURNLEDGER_OTLP_ENDPOINT"

# --- names: operations and spans ------------------------------------------------------------
AGENT_NAME = "turnledger"
OP_INVOKE_AGENT = "invoke_agent"
OP_CHAT = "chat"
OP_EXECUTE_TOOL = "execute_tool"
#: What a model call was for (``turnledger.purpose``).
PURPOSE_ANSWER = "answer"
PURPOSE_SUMMARY = "summary"
PURPOSE_MEMORY = "memory_extraction"
#: A candidate model's answer to a recorded context (``POST .../replays``).
PURPOSE_REPLAY = "replay"

# --- names: attributes of the conventions -----------------------------------------------------
OPERATION_NAME = "gen_ai.operation.name"
PROVIDER_NAME = "gen_ai.provider.name"
AGENT = "gen_ai.agent.name"
CONVERSATION_ID = "gen_ai.conversation.id"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
RESPONSE_ID = "gen_ai.response.id"
FINISH_REASONS = "gen_ai.response.finish_reasons"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
CACHE_CREATION_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_NAME = "gen_ai.tool.name"
TOOL_TYPE = "gen_ai.tool.type"
ERROR_TYPE = "error.type"

# --- names: the service's own attributes ------------------------------------------------------
TURN = "turnledger.turn"
TENANT_HASH = "turnledger.tenant.hash"
FORK_OF = "turnledger.fork.parent_id"
PURPOSE = "turnledger.purpose"
APPROVAL_DECISION = "turnledger.approval.decision"
TOOL_DEFERRED = "turnledger.tool.deferred"
TOOL_EXECUTOR = "turnledger.tool.executor"
#: ``error.type`` of a tool call that answered an error (its text is content: not kept).
TOOL_ERROR = "tool_error"
PROVIDER = "turnledger.provider"
#: ``gen_ai.provider.name`` of each provider (the conventions' values); another provider
#: (the demo ones) is named as the service names it.
PROVIDER_NAMES = {
    "openai-responses": "openai",
    "openai-chat": "openai",
    "bedrock-converse": "aws.bedrock",
}
# --- names: an MCP tool's call (the MCP conventions' client span, merged into ``execute_tool``) --
MCP_METHOD = "mcp.method.name"
MCP_PROTOCOL_VERSION = "mcp.protocol.version"
NETWORK_TRANSPORT = "network.transport"
NETWORK_PROTOCOL = "network.protocol.name"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
#: The one MCP method an ``execute_tool`` span covers.
MCP_TOOLS_CALL = "tools/call"
#: The registry's label of the server, and the tool's name there (``gen_ai.tool.name`` is
#: the name the model called: ``mcp__{label}__{tool}``).
MCP_SERVER_LABEL = "turnledger.mcp.server_label"
MCP_TOOL = "turnledger.mcp.tool"
#: On a link: why the span links there (:data:`LINK_RESUMES`).
LINK_KIND = "turnledger.link"
LINK_RESUMES = "resumes_wait"

#: What an attribute may hold (OpenTelemetry's ``AttributeValue``, as far as it is used).
type AttributeValue = str | bool | int | float | Sequence[str]
type Attributes = Mapping[str, AttributeValue]


class Span(Protocol):
    """One open span: what the service tells it while it is open."""

    def set(self, attributes: Attributes) -> None:
        """Add (or replace) attributes."""
        ...

    def link(self, trace_context: str) -> None:
        """Link this span to the span a W3C ``traceparent`` names (a wait's)."""
        ...

    def fail(self, error_type: str) -> None:
        """Mark the span failed, with ``error.type``."""
        ...

    def trace_context(self) -> str | None:
        """This span's W3C ``traceparent`` (``None``: not recorded)."""
        ...


class Telemetry(Protocol):
    """The port: opens spans. :data:`OFF` does nothing; :mod:`.otel` is OpenTelemetry."""

    def start(self, name: str, attributes: Attributes) -> AbstractContextManager[Span]:
        """Open a span named ``name``, current (the parent of spans opened inside it)
        until the block ends."""
        ...

    def current(self) -> Span:
        """The span open in this context (a span that does nothing when there is none)."""
        ...

    def headers(self) -> dict[str, str]:
        """The W3C trace context (``traceparent``, ``tracestate``) of the current span, as
        an outgoing request carries it (empty when off)."""
        ...


class _NoSpan:
    """A span that records nothing."""

    def set(self, attributes: Attributes) -> None:
        return None

    def link(self, trace_context: str) -> None:
        return None

    def fail(self, error_type: str) -> None:
        return None

    def trace_context(self) -> str | None:
        return None


NO_SPAN = _NoSpan()


class _NoSpanBlock:
    """The block of a span that records nothing: reused, it allocates nothing."""

    def __enter__(self) -> Span:
        return NO_SPAN

    def __exit__(self, *exc: object) -> None:
        return None


_NO_BLOCK = _NoSpanBlock()


class _Off:
    """Telemetry off: every span is :data:`NO_SPAN`."""

    def start(self, name: str, attributes: Attributes) -> AbstractContextManager[Span]:
        return _NO_BLOCK

    def current(self) -> Span:
        return NO_SPAN

    def headers(self) -> dict[str, str]:
        return {}


OFF: Telemetry = _Off()
_active: Telemetry = OFF


def active() -> Telemetry:
    """The port in use."""
    return _active


def install(telemetry: Telemetry) -> Telemetry:
    """Use ``telemetry`` from now on (tests, the local runner); returns the one it replaces."""
    global _active
    previous, _active = _active, telemetry
    return previous


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment asks for telemetry: ``TURNLEDGER_TELEMETRY=otel``, or an
    endpoint to send spans to (``TURNLEDGER_OTLP_ENDPOINT``)."""
    if environ.get(ENV_OTLP_ENDPOINT, "").strip():
        return True
    return environ.get(ENV_TELEMETRY, "").strip().lower() == "otel"


def tenant_hash(tenant: str) -> str:
    """What a span says of a tenant: the first 16 hex characters of its sha256."""
    return hashlib.sha256(tenant.encode()).hexdigest()[:16]


def _error_type(exc: BaseException) -> str:
    """``error.type`` of ``exc``: the service's error code, else its type's name."""
    code = getattr(exc, "code", None)
    return code if isinstance(code, str) and code else type(exc).__qualname__


@contextmanager
def _span(name: str, attributes: Attributes) -> Iterator[Span]:
    with _active.start(name, attributes) as span:
        try:
            yield span
        except BaseException as exc:
            span.fail(_error_type(exc))
            raise


def agent_run() -> AbstractContextManager[Span]:
    """The ``invoke_agent turnledger`` span of a request that runs a turn; the
    conversation's attributes come once its session is open (:func:`conversation`)."""
    if _active is OFF:
        return _NO_BLOCK
    return _span(
        f"{OP_INVOKE_AGENT} {AGENT_NAME}", {OPERATION_NAME: OP_INVOKE_AGENT, AGENT: AGENT_NAME}
    )


def conversation(
    conversation_id: str,
    tenant: str,
    turn: int,
    *,
    fork_of: str | None = None,
    resumes: str | None = None,
) -> None:
    """Say on the current span which conversation and turn it runs; ``resumes``: the
    trace context the turn's wait stored, linked to."""
    if _active is OFF:
        return
    span = _active.current()
    attributes: dict[str, AttributeValue] = {
        CONVERSATION_ID: conversation_id,
        TENANT_HASH: tenant_hash(tenant),
        TURN: turn,
    }
    if fork_of is not None:
        attributes[FORK_OF] = fork_of
    span.set(attributes)
    if resumes is not None and resumes != span.trace_context():
        span.link(resumes)


def trace_context() -> str | None:
    """The current span's ``traceparent``, to store with a wait (``None`` when off)."""
    return None if _active is OFF else _active.current().trace_context()


def headers() -> dict[str, str]:
    """The trace context an outgoing call carries (``traceparent``; empty when off)."""
    return {} if _active is OFF else _active.headers()


class Reply(Protocol):
    """What a model answered, as a span reads it (the providers' ``ModelReply``)."""

    @property
    def model(self) -> str: ...
    @property
    def response_id(self) -> str | None: ...
    @property
    def tool_calls(self) -> Sized: ...
    @property
    def usage(self) -> Usage: ...


class ModelSpan:
    """The span of one model call, told what the model answered."""

    __slots__ = ("span",)

    def __init__(self, span: Span) -> None:
        self.span = span

    def answered(self, reply: Reply) -> None:
        """Record the answer: model, id, finish reason (``tool_calls`` when it asked for
        calls, else ``stop``: the providers report no other) and usage."""
        if self.span is NO_SPAN:
            return
        usage = reply.usage
        attributes: dict[str, AttributeValue] = {
            FINISH_REASONS: ["tool_calls" if reply.tool_calls else "stop"],
            INPUT_TOKENS: usage.input_tokens,
            OUTPUT_TOKENS: usage.output_tokens,
        }
        if reply.model:
            attributes[RESPONSE_MODEL] = reply.model
        if reply.response_id is not None:
            attributes[RESPONSE_ID] = reply.response_id
        if usage.cached_input_tokens:
            attributes[CACHE_READ_TOKENS] = usage.cached_input_tokens
        if usage.cache_write_input_tokens:
            attributes[CACHE_CREATION_TOKENS] = usage.cache_write_input_tokens
        self.span.set(attributes)


_NO_MODEL_SPAN = ModelSpan(NO_SPAN)


@contextmanager
def _model_span(name: str, attributes: Attributes) -> Iterator[ModelSpan]:
    with _span(name, attributes) as span:
        yield ModelSpan(span)


class _NoModelBlock:
    def __enter__(self) -> ModelSpan:
        return _NO_MODEL_SPAN

    def __exit__(self, *exc: object) -> None:
        return None


_NO_MODEL_BLOCK = _NoModelBlock()


def model_call(
    provider: str, model: str, purpose: str = PURPOSE_ANSWER
) -> AbstractContextManager[ModelSpan]:
    """The ``chat {model}`` span of one model call."""
    if _active is OFF:
        return _NO_MODEL_BLOCK
    return _model_span(
        f"{OP_CHAT} {model}",
        {
            OPERATION_NAME: OP_CHAT,
            PROVIDER_NAME: PROVIDER_NAMES.get(provider, provider),
            PROVIDER: provider,
            REQUEST_MODEL: model,
            PURPOSE: purpose,
        },
    )


def tool_call(
    name: str, call_id: str, *, kind: str, approval: str | None = None
) -> AbstractContextManager[Span]:
    """The ``execute_tool {name}`` span of one call the service runs (``kind``: how it
    runs, ``http`` or ``lambda``; ``approval``: the decision it ran under, if it needed
    one)."""
    if _active is OFF:
        return _NO_BLOCK
    attributes: dict[str, AttributeValue] = {
        OPERATION_NAME: OP_EXECUTE_TOOL,
        TOOL_NAME: name,
        TOOL_CALL_ID: call_id,
        # The conventions' values: a function the application runs (``extension``: an
        # agent-side extension such as an MCP server is not run here).
        TOOL_TYPE: "function",
        TOOL_EXECUTOR: kind,
    }
    if approval is not None:
        attributes[APPROVAL_DECISION] = approval
    return _span(f"{OP_EXECUTE_TOOL} {name}", attributes)


def tool_outcome(span: Span, *, is_error: bool, deferred: bool) -> None:
    """Record how a tool call ended: an error (``error.type`` :data:`TOOL_ERROR`), or
    accepted to finish later (deferred)."""
    if span is NO_SPAN:
        return
    if deferred:
        span.set({TOOL_DEFERRED: True})
    if is_error:
        span.fail(TOOL_ERROR)


def mcp_call(server_url: str, server_label: str, tool: str) -> None:
    """Say on the current span (an MCP tool's ``execute_tool``) what the MCP conventions'
    client span of a ``tools/call`` says of it: the method, the server's address and port
    (from its URL: Streamable HTTP, over TCP), the server's label and the tool's name
    there. Never the arguments or the result."""
    if _active is OFF:
        return
    from urllib.parse import urlsplit

    url = urlsplit(server_url)
    attributes: dict[str, AttributeValue] = {
        MCP_METHOD: MCP_TOOLS_CALL,
        NETWORK_TRANSPORT: "tcp",
        NETWORK_PROTOCOL: "http",
        MCP_SERVER_LABEL: server_label,
        MCP_TOOL: tool,
    }
    if url.hostname:
        attributes[SERVER_ADDRESS] = url.hostname
        attributes[SERVER_PORT] = url.port or (443 if url.scheme == "https" else 80)
    _active.current().set(attributes)


def mcp_session(protocol_version: str) -> None:
    """Say on the current span (an MCP tool's ``execute_tool``) which version of the
    protocol its session agreed on (``mcp.protocol.version``)."""
    if _active is OFF:
        return
    _active.current().set({MCP_PROTOCOL_VERSION: protocol_version})
