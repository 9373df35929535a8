"""A sample MCP server for the guide's session (docs/GUIDE.md, "MCP servers as tools"):
a read-only ``read_file``, a ``delete_file`` and a ``rename_file`` that asks the user for
the new name mid-call (elicitation), all touching nothing, over Streamable HTTP.

    .venv/bin/python events/local-mcp-server.py 8001   # serves http://127.0.0.1:8001/mcp
"""

from __future__ import annotations

import sys
from typing import Annotated

from mcp.server import MCPServer
from mcp.server.mcpserver import Elicit, ElicitationResult, Resolve
from mcp.types import ToolAnnotations
from pydantic import BaseModel

server = MCPServer("files")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def read_file(path: str) -> str:
    """Read a file."""
    return f"contents of {path}"


@server.tool()
def delete_file(path: str) -> str:
    """Delete a file."""
    return f"deleted {path}"


class NewName(BaseModel):
    """What ``rename_file`` asks the user for."""

    new_name: str


def ask_new_name(path: str) -> Elicit[NewName]:
    """``rename_file``'s question, asked before its body runs."""
    return Elicit(f"Rename {path} to what?", NewName)


@server.tool()
def rename_file(
    path: str, answer: Annotated[ElicitationResult[NewName], Resolve(ask_new_name)]
) -> str:
    """Rename a file, to the name the user gives."""
    if answer.action != "accept":
        return f"not renamed ({answer.action})"
    return f"renamed {path} to {answer.data.new_name}"


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8001
    server.run(transport="streamable-http", host="127.0.0.1", port=port)
