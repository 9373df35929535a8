"""What a process keeps for its MCP servers (:class:`McpLink`: the port and the listings
read) and a registry's view of its servers through it (:class:`McpCatalog`).

Kept apart from :mod:`.mcp` (the entry, the listing, the rules) because the link builds
the default port, :mod:`.mcp_client`, which loads the ``mcp`` package: on first use, never
at import.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from ..core.exceptions import ToolServerUnavailable, UnknownTool
from ..core.models import TOOL_NAME_PATTERN
from ..core.observability import logger
from .mcp import McpError, McpListing, McpPort, McpServerEntry, McpTool, call_timeout, tool_name

#: Listing records (:mod:`turnledger.turn.mcp_listings`) a process remembers writing.
RECORDS_KEPT = 4096


@dataclass
class _Kept:
    listing: McpListing
    fetched_at: float


def _default_port() -> McpPort:
    from .mcp_client import StreamableHttpMcp  # here: loads the mcp package

    return StreamableHttpMcp()


class McpLink:
    """What a process keeps for its MCP servers across requests: the port (built on first
    use: the ``mcp`` package is loaded then) and the listings read, by server.

    One per process, shared by every registry it loads and by the tool runner, so a
    listing is reused across turns while young enough.
    """

    def __init__(
        self,
        port: Callable[[], McpPort] = _default_port,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._build = port
        self._port: McpPort | None = None
        self.clock = clock
        self._kept: dict[tuple[str, str], _Kept] = {}
        self._lock = threading.Lock()
        #: Hears of every listing whose hash is new (its server's first, or a change).
        self.on_listing: Callable[[McpListing], None] | None = None
        self._recorded: OrderedDict[tuple[str, ...], None] = OrderedDict()

    def first_record(self, record: tuple[str, ...]) -> bool:
        """Whether ``record`` (a listing's record in a conversation) is new to this
        process; it is remembered (the oldest of :data:`RECORDS_KEPT` go first). A
        record whose write then fails is written again by the next process to see it."""
        with self._lock:
            if record in self._recorded:
                self._recorded.move_to_end(record)
                return False
            self._recorded[record] = None
            if len(self._recorded) > RECORDS_KEPT:
                self._recorded.popitem(last=False)
            return True

    def port(self) -> McpPort:
        """The port, built by the first call."""
        with self._lock:
            if self._port is None:
                self._port = self._build()
            return self._port

    def listing(
        self, server: McpServerEntry, timeout: float, *, read_since: float | None = None
    ) -> McpListing:
        """The listing of ``server``: the kept one while younger than the server's ``ttlMs``
        (else its ``max_list_age_seconds``), else a new one; a new listing with the kept
        one's hash keeps the kept one. ``read_since`` (an instant of :attr:`clock`):
        the kept one only if it was read then or later, whatever its age, else a new one
        (a decision's check reuses the listing the decision read, and reads one if not).

        Raises:
            McpError: the server could not list its tools.
        """
        key = (server.server_label, server.server_url)
        now = self.clock()
        with self._lock:
            kept = self._kept.get(key)
        if kept is not None and read_since is not None:
            if kept.fetched_at >= read_since:
                return kept.listing
        elif kept is not None:
            ttl_ms = kept.listing.ttl_ms
            max_age = ttl_ms / 1000 if ttl_ms else server.max_list_age_seconds
            if now - kept.fetched_at < max_age:
                return kept.listing
        fresh = self.port().list_tools(server, timeout)
        changed = kept is None or kept.listing.sha256 != fresh.sha256
        listing = fresh if kept is None or changed else kept.listing
        with self._lock:
            # Its age counts from its answer: a slow read (a cold process's first) is as
            # young as any other when it lands.
            self._kept[key] = _Kept(listing, self.clock())
        if changed and self.on_listing is not None:
            self.on_listing(listing)
        return listing


@dataclass
class McpCatalog:
    """A registry's MCP servers, with the process's :class:`McpLink` to reach them."""

    servers: dict[str, McpServerEntry]
    link: McpLink = field(default_factory=McpLink)
    timeout_seconds: float = 30.0

    def server(self, label: str) -> McpServerEntry | None:
        """The registered server called ``label``."""
        return self.servers.get(label)

    def now(self) -> float:
        """The link's clock now: an instant to pass as ``read_since``."""
        return self.link.clock()

    def listing(self, label: str, *, read_since: float | None = None) -> McpListing:
        """The listing of server ``label`` (see :meth:`McpLink.listing`).

        Raises:
            UnknownTool: no server has that label.
            ToolServerUnavailable: the server could not list its tools.
        """
        server = self.servers.get(label)
        if server is None:
            raise UnknownTool(
                f"MCP server {label!r} is not registered",
                details={"server_label": label, "registered": sorted(self.servers)},
            )
        try:
            return self.link.listing(
                server, call_timeout(server, self.timeout_seconds), read_since=read_since
            )
        except McpError as exc:
            logger.warning(
                "an MCP server could not list its tools",
                extra={"server_label": label, "error_type": type(exc).__name__},
            )
            raise ToolServerUnavailable(
                f"MCP server {label!r} could not list its tools: {exc}",
                details={"server_label": label},
            ) from None

    def tools(self, label: str, *, read_since: float | None = None) -> list[McpTool]:
        """The tools of server ``label`` the registry allows, whose names are valid here.

        Raises:
            UnknownTool: no server has that label.
            ToolServerUnavailable: the server could not list its tools.
        """
        listing = self.listing(label, read_since=read_since)
        server = self.servers[label]
        offered = []
        for tool in listing.tools:
            if server.allowed_tools is not None and tool.name not in server.allowed_tools:
                continue
            if not _valid_name(tool_name(label, tool.name)):
                logger.warning(
                    "an MCP tool's name is not usable here; it is not offered",
                    extra={"server_label": label, "tool": tool.name[:200]},
                )
                continue
            offered.append(tool)
        return offered


def _valid_name(name: str) -> bool:
    return re.fullmatch(TOOL_NAME_PATTERN, name) is not None
