"""MCP servers of the ``mcp`` package for tests: a files server with a read-only
``read_file`` and a ``delete_file``, in process or on loopback (``python -m
tests.support.mcp_servers PORT [--changed]``), counting the calls it sees.

``--asking`` serves :func:`asking_server` instead (tools that elicit).
``--changed`` serves ``delete_file`` with another schema (a ``force`` flag): the server
"restarted with a changed definition". Every call is appended to ``calls.jsonl`` in
``MCP_CALLS_DIR`` when set (the loopback server's calls, read by the test), with the
``traceparent`` header of its HTTP request and the protocol's version; so is every
``tools/list`` the files server answers (as a call of ``tools/list``).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from mcp.server import MCPServer
from mcp.server.elicitation import AcceptedElicitation
from mcp.server.mcpserver import Context, Elicit, ElicitationResult, Resolve
from mcp.types import ToolAnnotations
from pydantic import BaseModel


@dataclass
class FilesServer:
    """The files server and what it was called with (``(tool, arguments, _meta)``)."""

    server: MCPServer
    calls: list[tuple[str, dict[str, Any], dict[str, Any]]] = field(default_factory=list)


def files_server(*, changed: bool = False, calls_dir: str | None = None) -> FilesServer:
    """A files server; ``changed``: its ``delete_file`` takes a ``force`` flag too."""
    server = MCPServer("files")
    made = FilesServer(server)

    def seen(tool: str, arguments: dict[str, Any], ctx: Context) -> None:
        meta = dict(ctx.request_context.meta or {})
        made.calls.append((tool, arguments, meta))
        if calls_dir:
            # Over HTTP: the request's trace context and the protocol's version too.
            headers = ctx.headers or {}
            logged = {
                "tool": tool,
                "arguments": arguments,
                "meta": meta,
                "traceparent": headers.get("traceparent"),
                "protocol_version": ctx.request_context.protocol_version,
            }
            with (Path(calls_dir) / "calls.jsonl").open("a", encoding="utf-8") as log:
                log.write(json.dumps(logged) + "\n")

    listing = server.list_tools

    async def counted_listing() -> Any:
        # Each tools/list request is logged as a call of "tools/list" (no path).
        if calls_dir:
            with (Path(calls_dir) / "calls.jsonl").open("a", encoding="utf-8") as log:
                log.write(json.dumps({"tool": "tools/list", "arguments": {}, "meta": {}}) + "\n")
        return await listing()

    server.list_tools = counted_listing  # type: ignore[method-assign]

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def read_file(path: str, ctx: Context) -> str:
        """Read a file."""
        seen("read_file", {"path": path}, ctx)
        return f"contents of {path}"

    if changed:

        @server.tool()
        def delete_file(path: str, force: bool, ctx: Context) -> str:
            """Delete a file, forcibly if need be."""
            seen("delete_file", {"path": path, "force": force}, ctx)
            return f"deleted {path}"

    else:

        @server.tool()
        def delete_file(path: str, ctx: Context) -> str:  # type: ignore[misc]
            """Delete a file."""
            seen("delete_file", {"path": path}, ctx)
            return f"deleted {path}"

    return made


class Confirm(BaseModel):
    """What ``rename_file`` asks the user for."""

    confirm: bool


class ConfirmName(BaseModel):
    """What ``delete_file`` of the asking server asks the user for: the file's name."""

    name: str


def ask_rename(path: str) -> Elicit[Confirm]:
    """What ``rename_file`` asks before it runs (a resolver: module level, so the tool's
    annotations resolve)."""
    return Elicit(f"Rename {path}?", Confirm)


def ask_name(path: str) -> Elicit[ConfirmName]:
    """What the asking server's ``delete_file`` asks first: the file's name, typed."""
    return Elicit(f"Type the name of {path} to delete it", ConfirmName)


def ask_sure(
    path: str, named: Annotated[ElicitationResult[ConfirmName], Resolve(ask_name)]
) -> Elicit[Confirm] | AcceptedElicitation[Confirm]:
    """Asked next (a second round) only when the name typed is not the file's; else it
    needs no asking (taken as confirmed)."""
    if named.action == "accept" and named.data.name != Path(path).name:
        return Elicit(f"{named.data.name!r} is not the name of {path}: delete it anyway?", Confirm)
    return AcceptedElicitation(data=Confirm(confirm=True))


def asking_server(*, calls_dir: str | None = None) -> FilesServer:
    """A server whose tools ask the user mid-call (elicitation) and log what they were
    answered: ``rename_file`` asks to confirm (``{"action": ...}``); ``delete_file`` asks
    for the file's name, and when it is not the file's asks again whether to delete anyway
    (``{"action", "name"[, "sure"]}``)."""
    server = MCPServer("asking")
    made = FilesServer(server)

    def seen(tool: str, arguments: dict[str, Any], ctx: Context) -> None:
        made.calls.append((tool, arguments, dict(ctx.request_context.meta or {})))
        if calls_dir:
            with (Path(calls_dir) / "calls.jsonl").open("a", encoding="utf-8") as log:
                log.write(json.dumps({"tool": tool, "arguments": arguments, "meta": {}}) + "\n")

    @server.tool()
    def rename_file(
        path: str, answer: Annotated[ElicitationResult[Confirm], Resolve(ask_rename)], ctx: Context
    ) -> str:
        """Rename a file, once the user confirms."""
        seen("rename_file", {"path": path, "action": answer.action}, ctx)
        return f"renamed {path}" if answer.action == "accept" else f"not renamed ({answer.action})"

    @server.tool()
    def delete_file(
        path: str,
        named: Annotated[ElicitationResult[ConfirmName], Resolve(ask_name)],
        sure: Annotated[ElicitationResult[Confirm], Resolve(ask_sure)],
        ctx: Context,
    ) -> str:
        """Delete a file, once the user types its name."""
        if named.action != "accept":
            seen("delete_file", {"path": path, "action": named.action}, ctx)
            return f"not deleted ({named.action})"
        answered: dict[str, Any] = {"path": path, "action": "accept", "name": named.data.name}
        if named.data.name != Path(path).name:
            answered["sure"] = sure.action == "accept" and sure.data.confirm
        seen("delete_file", answered, ctx)
        if answered.get("sure") is False:
            return f"not deleted ({named.data.name!r} is not its name)"
        return f"deleted {path}"

    return made


if __name__ == "__main__":
    port = int(sys.argv[1])
    calls_dir = os.environ.get("MCP_CALLS_DIR")
    if "--asking" in sys.argv:
        made = asking_server(calls_dir=calls_dir)
    else:
        made = files_server(changed="--changed" in sys.argv, calls_dir=calls_dir)
    made.server.run(transport="streamable-http", host="127.0.0.1", port=port)
