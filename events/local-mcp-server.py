"""A sample MCP server for the guide's session (docs/GUIDE.md, "MCP servers as tools"):
a read-only ``read_file`` and a ``delete_file`` that touch nothing, over Streamable HTTP.

    .venv/bin/python events/local-mcp-server.py 8001   # serves http://127.0.0.1:8001/mcp
"""

from __future__ import annotations

import sys

from mcp.server import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("files")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def read_file(path: str) -> str:
    """Read a file."""
    return f"contents of {path}"


@server.tool()
def delete_file(path: str) -> str:
    """Delete a file."""
    return f"deleted {path}"


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8001
    server.run(transport="streamable-http", host="127.0.0.1", port=port)
