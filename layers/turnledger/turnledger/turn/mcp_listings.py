"""The MCP listings a conversation's calls were made under, as records of its ledger.

When a turn records calls of MCP tools, the listing each tool came from is put beside
the transcript: a side item ``S#mcpl#<server_label>#<sha256 of the listing>`` holding the
listing's canonical JSON, its hash, the server's URL and when it was recorded. The key is
the hash, so a listing is one item however many calls use it, and a refresh whose hash
is unchanged records nothing new; a changed listing is a new item beside the old one
(the old approvals' definitions stay readable). The process's
:class:`~turnledger.tools.mcp_link.McpLink` remembers what it recorded (bounded), so the
warm path writes once per listing and conversation.
The item lives as long as the conversation (its TTL) and goes with its purge.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..core.exceptions import ToolServerUnavailable
from ..store.codec import SideItem
from ..store.keys import SIDE_PREFIX
from ..tools.registry import McpExecutorConfig, ToolDefinition, ToolRegistry
from .session import Session

#: Sort key prefix of a recorded listing.
LISTING_PREFIX = f"{SIDE_PREFIX}mcpl#"


def listing_key(server_label: str, sha256: str) -> str:
    """The sort key of a listing's record."""
    return f"{LISTING_PREFIX}{server_label}#{sha256}"


def record_listings(
    session: Session, registry: ToolRegistry, tools: Iterable[ToolDefinition]
) -> int:
    """Put the listings of the MCP ``tools`` a turn called in ``session``'s conversation,
    each once.

    Returns:
        How many items were written (``0`` on the warm path).
    """
    labels = {
        t.executor.server.server_label for t in tools if isinstance(t.executor, McpExecutorConfig)
    }
    written = 0
    now = session.clock()
    expires_at = int(now.timestamp()) + session.ttl_seconds if session.ttl_seconds else None
    for label in sorted(labels):
        try:
            listing = registry.mcp.listing(label)  # the kept one: the calls were made under it
        except ToolServerUnavailable:
            continue  # expired since and unreachable now: the next call records it
        server = registry.mcp.servers[label]
        sort_key = listing_key(label, listing.sha256)
        memo = (session.key.tenant, session.key.conversation_id, session.gen, sort_key)
        if not registry.mcp.link.first_record(memo):
            continue
        session.store.put_side_item(
            session.key,
            SideItem(
                sort_key,
                {
                    "server_label": label,
                    "server_url": server.server_url,
                    "sha256": listing.sha256,
                    "listing": listing.model_dump_json(),
                    "recorded_at": now.isoformat(),
                },
                expires_at=expires_at,
                gen=session.gen,
            ),
        )
        written += 1
    return written
