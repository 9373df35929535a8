"""MCP servers as tools: the registry entry, the listing, the approval rule, the port.

A registry entry ``{"type": "mcp", "server_label", "server_url", ...}`` names a server
of the Model Context Protocol; its tools reach the model and the API as
``mcp__<server_label>__<tool>`` (:func:`tool_name`). The server is always the
registry's: a request may narrow it, never name another.

The tools come from the server's listing (``tools/list``), read through a
:class:`McpPort` (:mod:`.mcp_client` holds the ``mcp`` package's client over Streamable
HTTP and an in-memory one for tests; neither is imported by this module). A listing is
kept with the sha256 of its canonical JSON and of each tool's definition, and reused
while younger than the server's ``ttlMs`` (else the entry's ``max_list_age_seconds``);
a refresh keeps the listing it had when the hash is unchanged. What a process keeps
(the port, the listings) is :mod:`.mcp_link`'s; the executor is :mod:`.mcp_calls`'.

Each tool becomes a :class:`~.registry.ToolDefinition` whose executor
(:class:`~.registry.McpExecutorConfig`) carries the definition's hash: an approval is
asked for that hash, and a changed definition invalidates it
(:func:`turnledger.turn.approval_edits.check_definitions`). A tool annotated
``readOnlyHint`` is idempotent; any other is not, so a crash after its dispatch is
``outcome_unknown`` and goes to a person, as for ``http`` tools.

A server on the 2026-07-28 protocol that asks the user for input mid-call answers the
call with its question (a form-mode elicitation) and an opaque ``request_state``
instead of a result: the port returns it as an :class:`~turnledger.core.models.Elicitation`,
the call waits for a person (``awaiting_input``), and is sent again with the answer and
the state (:func:`elicitation_refusal` bounds what is kept). An older server's
``elicitation/create`` mid-call is answered ``cancel`` (:mod:`.mcp_client`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic import ConfigDict, Field, field_validator

from ..core import deadline
from ..core.models import Deferred, Elicitation

#: What tool names of MCP servers start with.
MCP_PREFIX = "mcp__"

#: How long a listing is reused when its server gives no ``ttlMs`` (seconds).
DEFAULT_MAX_LIST_AGE_SECONDS = 300

#: The most of a server's question kept on a waiting call (its message, in characters;
#: its requested schema and its ``request_state``, in bytes of JSON): the call lives in
#: the conversation's head item (400 KB in all, shared by every pending call).
ELICITATION_MESSAGE_MAX_CHARS = 4096
ELICITATION_SCHEMA_MAX_BYTES = 16384
REQUEST_STATE_MAX_BYTES = 65536

#: The ``_meta`` key that carries turnledger's call id (and the one with its idempotency
#: key) on every ``tools/call``.
CALL_ID_META = "turnledger/call_id"
IDEMPOTENCY_KEY_META = "turnledger/idempotency_key"


class _Config(Deferred):
    model_config = ConfigDict(extra="forbid", frozen=True)


class McpToolFilter(_Config):
    """Which tools a rule of ``require_approval`` speaks of: those named in ``tool_names``,
    and those whose ``readOnlyHint`` equals ``read_only``; a tool that meets any given
    criterion is covered (OpenAI's filter)."""

    tool_names: list[str] | None = None
    read_only: bool | None = None

    def covers(self, tool: str, read_only: bool) -> bool:
        """Whether the filter names ``tool`` (of that read-only hint)."""
        if self.tool_names is not None and tool in self.tool_names:
            return True
        return self.read_only is not None and self.read_only == read_only


class McpApprovalRule(_Config):
    """``{"always": filter, "never": filter}``: the tools ``never`` covers run at once,
    unless ``always`` covers them too; every other tool waits for approval."""

    always: McpToolFilter | None = None
    never: McpToolFilter | None = None


def approval_needed(
    rule: Literal["always", "never"] | McpApprovalRule, tool: str, read_only: bool
) -> bool:
    """Whether a call of ``tool`` waits for a person under ``rule``.

    A tool neither ``always`` nor ``never`` covers waits: the safe default.
    """
    if rule == "always":
        return True
    if rule == "never":
        return False
    assert isinstance(rule, McpApprovalRule)
    if rule.always is not None and rule.always.covers(tool, read_only):
        return True
    return not (rule.never is not None and rule.never.covers(tool, read_only))


class McpServerEntry(_Config):
    """A registry entry of one MCP server."""

    type: Literal["mcp"]
    #: Names the server in its tools' names (``mcp__<label>__<tool>``): letters, digits,
    #: single ``-`` or ``_`` between them (a double ``_`` would make names ambiguous).
    server_label: str = Field(pattern=r"^[A-Za-z0-9]+(?:[-_][A-Za-z0-9]+)*$", max_length=32)
    server_url: str
    #: Sent with every request (an ``Authorization`` header, say).
    headers: dict[str, str] = Field(default_factory=dict)
    #: The tools offered; ``None``: every tool the server lists.
    allowed_tools: list[str] | None = None
    require_approval: Literal["always", "never"] | McpApprovalRule = "always"
    #: The hard deadline of one call (and of one listing), cut to the request's remaining
    #: time; the deployment's ``TOOL_TIMEOUT_SECONDS`` when ``None``.
    timeout_seconds: float | None = Field(default=None, gt=0)
    #: How long a listing is reused when the server gives no ``ttlMs`` (seconds).
    max_list_age_seconds: int = Field(default=DEFAULT_MAX_LIST_AGE_SECONDS, ge=0)
    #: Four-eyes and notify, as for any registered tool.
    four_eyes: bool = False
    notify: str | None = Field(default=None, pattern=r"^https?://\S+$")

    @field_validator("server_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        from urllib.parse import urlsplit

        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an absolute http:// or https:// URL")
        return value


def tool_name(server_label: str, tool: str) -> str:
    """The name an MCP server's tool has here: ``mcp__<server_label>__<tool>``."""
    return f"{MCP_PREFIX}{server_label}__{tool}"


def split_name(name: str) -> tuple[str, str] | None:
    """``(server_label, tool)`` of an MCP tool's name; ``None`` for any other name."""
    if not name.startswith(MCP_PREFIX):
        return None
    label, sep, tool = name[len(MCP_PREFIX) :].partition("__")
    return (label, tool) if sep and label and tool else None


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def canonical_sha256(value: Any) -> str:
    """The sha256 of ``value``'s canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class McpTool(_Config):
    """One tool of a listing, as the server defined it."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    read_only: bool = False
    #: The sha256 of the tool's definition as the server sent it (canonical JSON).
    definition_sha256: str


class McpListing(_Config):
    """A server's tool listing: its tools, the hash of the whole, how long it is reused."""

    server_label: str
    tools: list[McpTool]
    sha256: str
    #: The server's ``ttlMs``, when it gave one above zero.
    ttl_ms: int | None = None

    def tool(self, name: str) -> McpTool | None:
        """The listed tool called ``name``."""
        return next((t for t in self.tools if t.name == name), None)


def listing_of(server_label: str, tools: list[dict[str, Any]], ttl_ms: int | None) -> McpListing:
    """A listing of the raw tool definitions a server sent (``Tool`` objects as JSON)."""
    listed = []
    for raw in tools:
        annotations = raw.get("annotations") or {}
        listed.append(
            McpTool(
                name=str(raw["name"]),
                description=str(raw.get("description") or ""),
                input_schema=raw.get("inputSchema") or {"type": "object"},
                read_only=annotations.get("readOnlyHint") is True,
                definition_sha256=canonical_sha256(raw),
            )
        )
    return McpListing(
        server_label=server_label,
        tools=listed,
        sha256=canonical_sha256(tools),
        ttl_ms=ttl_ms if ttl_ms else None,
    )


@dataclass(frozen=True)
class McpCallResult:
    """What a server answered a ``tools/call``: its content blocks and structured content."""

    content: list[dict[str, Any]]
    structured: dict[str, Any] | None = None
    is_error: bool = False
    #: What the server asked the user mid-call (elicitation messages), each cancelled.
    elicited: tuple[str, ...] = ()

    def output(self) -> str:
        """The answer as the model reads it: its text blocks, else the structured content,
        else every block as JSON."""
        texts = [str(b.get("text", "")) for b in self.content if b.get("type") == "text"]
        if texts and len(texts) == len(self.content):
            return "\n".join(texts)
        if self.structured is not None:
            return _compact(self.structured)
        return _compact(self.content)


def elicitation_refusal(asked: Elicitation) -> str | None:
    """Why ``asked`` cannot be kept on its call (over a bound above); ``None``: it can."""
    state = len((asked.request_state or "").encode("utf-8"))
    schema = len(_compact(asked.requested_schema).encode("utf-8"))
    if state > REQUEST_STATE_MAX_BYTES:
        return f"its request_state is {state} bytes, over the {REQUEST_STATE_MAX_BYTES} kept"
    if schema > ELICITATION_SCHEMA_MAX_BYTES:
        return (
            f"its requested schema is {schema} bytes, over the {ELICITATION_SCHEMA_MAX_BYTES} kept"
        )
    if len(asked.message) > ELICITATION_MESSAGE_MAX_CHARS:
        return (
            f"its message is {len(asked.message)} characters, over the "
            f"{ELICITATION_MESSAGE_MAX_CHARS} kept"
        )
    return None


class McpError(Exception):
    """The server could not be reached, timed out or broke the protocol (the port's
    only exception: the adapters translate their library's errors into it)."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class McpPort(Protocol):
    """Talks to MCP servers: one listing, one call, each within ``timeout`` seconds.

    Both raise :class:`McpError` for a failure of the server or the network.
    """

    def list_tools(self, server: McpServerEntry, timeout: float) -> McpListing:
        """The server's current listing (every page)."""
        ...

    def call_tool(
        self,
        server: McpServerEntry,
        tool: str,
        arguments: Mapping[str, Any],
        *,
        meta: Mapping[str, str],
        timeout: float,
        answered: Elicitation | None = None,
    ) -> McpCallResult | Elicitation:
        """Call ``tool`` once with ``arguments`` and ``meta`` as the request's ``_meta``;
        ``answered``: send it again with a person's answer to what it asked (and its
        ``request_state``). Returns the result, or what the server asks a person first."""
        ...


def call_timeout(server: McpServerEntry, default: float) -> float:
    """The server's deadline (else ``default``), cut to the request's remaining time;
    ``0.0``: no time is left."""
    return deadline.cap(server.timeout_seconds or default) or 0.0
