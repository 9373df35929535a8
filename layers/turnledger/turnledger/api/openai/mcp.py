"""The OpenAI face's ``mcp`` tool for the registry's MCP servers, and its items.

A request's ``{"type": "mcp", "server_label", ...}`` must name a server the registry has
(:mod:`turnledger.tools.mcp`); a ``server_url`` that differs from the registered one is
``400``, and so is a field this face does not take (``400 unsupported_parameter``): never
accepted and ignored. ``allowed_tools`` narrows the server's tools; ``require_approval``
can only add approvals to the registry's rule, never waive one.

Output items: ``mcp_list_tools`` (the server's tools as listed), ``mcp_approval_request``
(id ``mcpr_<call id>``) for a call that waits, and ``mcp_call`` for a call of the turn that
has its result. ``mcp_approval_response`` names the request by that id.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from ...core.exceptions import ApprovalPending, InvalidRequest, UnsupportedParameter
from ...core.models import ConversationKey
from ...tools.mcp import McpServerEntry, approval_needed, split_name, tool_name
from ...tools.registry import ToolRegistry
from ...turn.lifecycle import AWAITING_DECISION
from ...turn.pipeline import Conversations
from ...turn.results import OutputCall, TurnResult

#: The prefix of an approval request's id: ``mcpr_<call id>``.
APPROVAL_PREFIX = "mcpr_"
#: The fields of an ``mcp`` tool this face takes.
SUPPORTED = frozenset({"type", "server_label", "server_url", "allowed_tools", "require_approval"})
#: Events read at most per page when a response gathers its turn's MCP calls.
_PAGE = 1000


def approval_request_id(call_id: str) -> str:
    """The ``mcp_approval_request`` id of call ``call_id``."""
    return f"{APPROVAL_PREFIX}{call_id}"


def _allowed(tool: dict[str, Any], index: int) -> list[str] | None:
    given = tool.get("allowed_tools")
    if given is None:
        return None
    if isinstance(given, dict):
        extra = set(given) - {"tool_names"}
        if extra:
            raise UnsupportedParameter(
                f"allowed_tools.{sorted(extra)[0]} is not supported",
                details={"param": f"tools.{index}.allowed_tools"},
            )
        given = given.get("tool_names")
    if not isinstance(given, list) or not all(isinstance(n, str) for n in given):
        raise InvalidRequest(
            "allowed_tools must be a list of tool names or {'tool_names': [...]}",
            details={"param": f"tools.{index}.allowed_tools"},
        )
    return list(given)


def mcp_tools(
    registry: ToolRegistry, tool: dict[str, Any], index: int
) -> tuple[list[str], list[str]]:
    """The tool names an ``mcp`` tool of a request offers, and those of them its own
    ``require_approval`` asks approval for.

    Raises:
        UnsupportedParameter: a field this face does not take.
        InvalidRequest: the server is not registered, its ``server_url`` differs, or a
            field is malformed.
        ToolServerUnavailable: the server could not list its tools.
    """
    extra = sorted(set(tool) - SUPPORTED)
    if extra:
        raise UnsupportedParameter(
            f"the mcp tool's {extra[0]!r} is not supported: this face takes "
            + ", ".join(sorted(SUPPORTED)),
            details={"param": f"tools.{index}.{extra[0]}"},
        )
    label = tool.get("server_label")
    server = registry.mcp.server(label) if isinstance(label, str) else None
    if server is None:
        raise InvalidRequest(
            f"MCP server {label!r} is not registered: an mcp tool names a server of the "
            "deployment's tool registry",
            details={"param": f"tools.{index}.server_label"},
        )
    url = tool.get("server_url")
    if url is not None and url != server.server_url:
        raise InvalidRequest(
            f"server_url of MCP server {label!r} differs from the registered one",
            details={"param": f"tools.{index}.server_url"},
        )
    allowed = _allowed(tool, index)
    rule = _rule(tool.get("require_approval"), index)
    names: list[str] = []
    stricter: list[str] = []
    for listed in registry.mcp.tools(server.server_label):
        if allowed is not None and listed.name not in allowed:
            continue
        name = tool_name(server.server_label, listed.name)
        names.append(name)
        if rule is not None and approval_needed(rule, listed.name, listed.read_only):
            stricter.append(name)
    return names, stricter


def _rule(given: Any, index: int) -> Any:
    if given is None:
        return None
    try:
        return McpServerEntry.model_validate(
            {
                "type": "mcp",
                "server_label": "x",
                "server_url": "http://x",
                "require_approval": given,
            }
        ).require_approval
    except ValidationError:
        raise InvalidRequest(
            'require_approval must be "always", "never" or {"always"|"never": '
            '{"tool_names": [...], "read_only": bool}}',
            details={"param": f"tools.{index}.require_approval"},
        ) from None


def declared_labels(tools: list[dict[str, Any]] | None, own: str) -> list[str]:
    """The registered servers' labels a request's ``mcp`` tools name (not ``own``)."""
    return [
        t["server_label"]
        for t in tools or []
        if t.get("type") == "mcp"
        and isinstance(t.get("server_label"), str)
        and t["server_label"] != own
    ]


def list_tools_item(registry: ToolRegistry, label: str) -> dict[str, Any]:
    """The ``mcp_list_tools`` item of server ``label`` (its listing as kept)."""
    listing = registry.mcp.listing(label)
    return {
        "type": "mcp_list_tools",
        "id": f"mcpl_{listing.sha256[:32]}",
        "server_label": label,
        "tools": [
            {
                "name": t.name,
                "description": t.description,
                "input_schema": t.input_schema,
                "annotations": {"read_only": t.read_only},
            }
            for t in registry.mcp.tools(label)
        ],
        "error": None,
    }


def unanswered(exc: ApprovalPending) -> InvalidRequest:
    """A turn sent while approval requests wait, in OpenAI's words: ``400``, naming them."""
    ids = [
        approval_request_id(p.id) if split_name(p.name) is not None else p.id
        for p in exc.pending
        if p.state in AWAITING_DECISION
    ]
    return InvalidRequest(
        f"Approval requests {', '.join(ids)} were not answered: send an "
        "mcp_approval_response for each before new input.",
        details={"param": "input", "approval_request_ids": ids},
    )


def approval_request_item(call_id: str, name: str, arguments: str) -> dict[str, Any] | None:
    """The ``mcp_approval_request`` of a waiting call of an MCP tool (``None``: another
    tool); ``arguments`` as JSON text."""
    parts = split_name(name)
    if parts is None:
        return None
    return {
        "type": "mcp_approval_request",
        "id": approval_request_id(call_id),
        "name": parts[1],
        "arguments": arguments,
        "server_label": parts[0],
    }


def call_items(
    service: Conversations, reply: TurnResult, key: ConversationKey
) -> list[dict[str, Any]]:
    """The ``mcp_call`` items of the reply's turn: its calls of MCP tools with a result."""
    requested: dict[str, dict[str, Any]] = {}
    approved: set[str] = set()
    items: list[dict[str, Any]] = []
    after = 0
    while True:
        page = service.events(key, after=after, limit=_PAGE)
        for event in page.events:
            if event.turn != reply.turn:
                continue
            payload, kind = event.payload, event.kind.value
            if kind == "tool_call_requested" and split_name(payload["name"]) is not None:
                requested[payload["call_id"]] = payload
            elif kind == "approval_resolved" and payload["decision"] == "approved":
                approved.add(payload["call_id"])
            elif kind == "tool_result" and payload["call_id"] in requested:
                call = requested[payload["call_id"]]
                label, name = split_name(call["name"]) or ("", "")
                failed = bool(payload.get("is_error"))
                items.append(
                    {
                        "type": "mcp_call",
                        "id": f"mcp_{call['call_id']}",
                        "server_label": label,
                        "name": name,
                        "arguments": json.dumps(call["arguments"]),
                        "output": None if failed else payload["output"],
                        "error": {
                            "type": "mcp_tool_execution_error",
                            "content": [{"type": "text", "text": payload["output"]}],
                        }
                        if failed
                        else None,
                        "approval_request_id": approval_request_id(call["call_id"])
                        if call["call_id"] in approved
                        else None,
                        "status": "failed" if failed else "completed",
                    }
                )
        if page.next_after is None:
            return items
        after = page.next_after


def items(
    service: Conversations,
    key: ConversationKey,
    tools: list[dict[str, Any]] | None,
    reply: TurnResult,
    own: str,
    *,
    decided: bool,
) -> list[dict[str, Any]]:
    """A response's MCP items before the rest of its output: ``mcp_list_tools`` of each
    server the request's tools name, then the turn's ``mcp_call`` items. ``own``: the
    label of the ledger's own registry (no listing of its own); ``decided``: the request
    decided calls. The turn's events are read only when MCP calls may have run in this
    request (the model called an MCP tool, or calls were decided)."""
    registry = service.tools
    labels = dict.fromkeys(declared_labels(tools, own))
    listed = [list_tools_item(registry, label) for label in labels]
    called = any(isinstance(o, OutputCall) and split_name(o.name) is not None for o in reply.output)
    calls = call_items(service, reply, key) if registry.mcp.servers and (called or decided) else []
    return [*listed, *calls]
