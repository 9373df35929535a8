"""The executor of ``mcp`` tools: one ``tools/call`` per call, through the process's
:class:`~.mcp.McpLink` (its port loads the ``mcp`` package on the first call). A server
that asks a person first answers with its question: the outcome carries it (the call
waits for the answer), and the call's next run sends the answer back.

With telemetry on, the call is told on its ``execute_tool`` span
(:func:`turnledger.core.telemetry.mcp_call`), and carries the span's W3C trace context
(``traceparent``, ``tracestate``) both in its HTTP headers and in ``_meta`` (unprefixed,
as SEP-414 and the MCP conventions give them), so the server's spans join the turn's
trace whether it reads the transport's context or the message's.
"""

from __future__ import annotations

from ..core import telemetry
from ..core.models import Elicitation
from ..core.observability import logger
from .calls import ToolInvocation, ToolOutcome, short, unreachable
from .mcp import (
    CALL_ID_META,
    IDEMPOTENCY_KEY_META,
    McpError,
    McpServerEntry,
    call_timeout,
    elicitation_refusal,
)
from .mcp_link import McpLink
from .registry import McpExecutorConfig


def traced(server: McpServerEntry, trace: dict[str, str]) -> McpServerEntry:
    """The entry whose ``headers`` carry ``trace`` (the call's trace context; ``server``
    itself when there is none). The trace context wins over a registry header of the same
    name, in any case: the registry's would be fixed, naming no span of this call (an
    ``http`` tool's request does the same)."""
    if not trace:
        return server
    names = {name.lower() for name in trace}
    kept = {name: value for name, value in server.headers.items() if name.lower() not in names}
    return server.model_copy(update={"headers": {**kept, **trace}})


class McpExecutor:
    """Runs an MCP tool's call: one ``tools/call`` within the server's deadline, the call's
    id and idempotency key in ``_meta``; a failure is an error outcome."""

    def __init__(self, link: McpLink, *, timeout_seconds: float = 30.0) -> None:
        self.link = link
        self.timeout_seconds = timeout_seconds

    def execute(self, invocation: ToolInvocation) -> ToolOutcome:
        """Call the tool once; see the module docstring."""
        config = invocation.tool.executor
        if not isinstance(config, McpExecutorConfig):
            raise ValueError(f"tool {invocation.tool.name} is not an MCP tool")
        name = invocation.tool.name
        timeout = call_timeout(config.server, self.timeout_seconds)
        if timeout <= 0:
            return ToolOutcome(
                f"tool {name} was not run: the request ran out of time", is_error=True
            )
        trace = telemetry.headers()
        meta = {
            CALL_ID_META: invocation.call.id,
            IDEMPOTENCY_KEY_META: invocation.idempotency_key,
            **trace,
        }
        telemetry.mcp_call(config.server.server_url, config.server.server_label, config.tool)
        try:
            result = self.link.port().call_tool(
                traced(config.server, trace),
                config.tool,
                invocation.call.arguments,
                meta=meta,
                timeout=timeout,
                answered=invocation.elicitation,
            )
        except McpError as exc:
            unreachable(name, exc)
            if exc.timed_out:
                return ToolOutcome(f"tool {name} timed out after {timeout:g}s", is_error=True)
            return ToolOutcome(f"tool {name} failed: {short(str(exc))}", is_error=True)
        if isinstance(result, Elicitation):
            refusal = elicitation_refusal(result)
            if refusal is not None:
                return ToolOutcome(
                    f"tool {name} asked for input that cannot be kept: {refusal}", is_error=True
                )
            return ToolOutcome("", elicitation=result)
        output = result.output()
        if result.elicited:
            # An older server asks while its call is open: no person can answer within it,
            # so the server was told "cancel" and the model reads why, with what was asked.
            logger.warning(
                "an MCP server asked for input mid-call; the elicitation was cancelled",
                extra={"tool": name, "call_id": invocation.call.id},
            )
            asked = "; ".join(short(m) for m in result.elicited)
            output += (
                f"\n[the server asked for input ({asked}); it was cancelled: a person is "
                "asked only by servers of the 2026-07-28 protocol, not in the middle of a call]"
            )
        if result.is_error:
            return ToolOutcome(f"tool {name} failed: {short(output)}", is_error=True)
        return ToolOutcome(output)
