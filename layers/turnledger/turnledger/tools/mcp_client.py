"""The adapters of :class:`~.mcp.McpPort`: the ``mcp`` package's client over Streamable
HTTP, and the same client on an in-process server for tests.

Loaded on the first listing or call of an MCP tool (the ``mcp`` package takes about a
second to import: no function's init pays for it). Each listing and each call is one
short session on its own event loop (``asyncio.run`` in the calling thread): stateless
requests, which fit Lambda, and the tool runner's threads each run their own. The
server's deadline bounds the whole session (``anyio.fail_after``); the library's
errors become :class:`~.mcp.McpError`.

A server on the 2026-07-28 protocol that asks the user for input mid-call answers the
``tools/call`` with an ``InputRequiredResult`` (SEP-2322): its one form-mode elicitation
is returned as an :class:`~turnledger.core.models.Elicitation` for a person to answer,
and the call is sent again later with the answer and the server's ``request_state``
(:func:`_call`); nothing is kept open across requests. An older server's
``elicitation/create`` mid-call cannot wait for a person (its call is open while it
asks): it is answered ``cancel`` (see :func:`_cancelling`); the result says what was asked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar, cast

import anyio
import mcp
import mcp_types
from mcp.client.session import ElicitationFnT
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from ..core import telemetry
from ..core.models import Elicitation
from .mcp import McpCallResult, McpError, McpListing, McpServerEntry, listing_of

_T = TypeVar("_T")

#: Pages of a listing read at most (a server that pages for ever is cut here).
_MAX_PAGES = 50

#: Rounds of an ``InputRequiredResult`` that asks nothing (only ``request_state``: "call
#: again") followed within one call, pausing 50 ms doubling to 250 ms (the library's).
_STATE_ONLY_ROUNDS = 10


async def _listing(client: mcp.Client, label: str) -> McpListing:
    tools: list[dict[str, Any]] = []
    ttl_ms: int | None = None
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        page = await client.list_tools(cursor=cursor, cache_mode="refresh")
        if ttl_ms is None:
            ttl_ms = page.ttl_ms
        tools.extend(
            t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in page.tools
        )
        cursor = page.next_cursor
        if cursor is None:
            break
    return listing_of(label, tools, ttl_ms)


async def _call(
    client: mcp.Client,
    tool: str,
    arguments: Mapping[str, Any],
    meta: Mapping[str, str],
    asked: list[str],
    answered: Elicitation | None,
) -> McpCallResult | Elicitation:
    responses: dict[str, Any] | None = None
    state: str | None = None
    if answered is not None:
        responses = {answered.key: mcp_types.ElicitResult.model_validate(answered.answer or {})}
        state = answered.request_state
    telemetry.mcp_session(client.protocol_version)
    pause = 0.05
    for _ in range(_STATE_ONLY_ROUNDS):
        # _meta is a TypedDict open to any key: ours are namespaced (turnledger/...), the
        # trace context's are not (SEP-414).
        result = await client.session.call_tool(
            tool,
            dict(arguments),
            meta=cast(Any, dict(meta)),
            input_responses=responses,
            request_state=state,
            allow_input_required=True,
        )
        if isinstance(result, mcp_types.CallToolResult):
            return McpCallResult(
                content=[
                    b.model_dump(mode="json", by_alias=True, exclude_none=True)
                    for b in result.content
                ],
                structured=result.structured_content,
                is_error=bool(result.is_error),
                elicited=tuple(asked),
            )
        if result.input_requests:
            return _question(result, answered.round + 1 if answered else 1)
        # Only request_state: the server asks to be called again as it is.
        responses, state = None, result.request_state
        await anyio.sleep(pause)
        pause = min(pause * 2, 0.25)
    raise McpError(f"the server asked to be called again more than {_STATE_ONLY_ROUNDS} times")


def _question(result: mcp_types.InputRequiredResult, round: int) -> Elicitation:
    """The one form-mode elicitation ``result`` asks, as a person answers it.

    Raises:
        McpError: it asks something else (several questions at once, a URL to visit,
            sampling, the client's roots), which no person is asked here.
    """
    requests = list((result.input_requests or {}).items())
    if len(requests) == 1:
        key, request = requests[0]
        if isinstance(request, mcp_types.ElicitRequest) and isinstance(
            request.params, mcp_types.ElicitRequestFormParams
        ):
            return Elicitation(
                key=key,
                message=request.params.message,
                requested_schema=dict(request.params.requested_schema),
                request_state=result.request_state,
                round=round,
            )
    kinds = sorted({request.method for _, request in requests})
    raise McpError(
        f"the server asked for input this client does not give ({len(requests)} "
        f"request(s): {', '.join(kinds)}); a person is asked one form-mode elicitation "
        "at a time"
    )


def _cancelling(asked: list[str]) -> ElicitationFnT:
    """An elicitation callback that notes what the server asked and cancels it: no person
    can answer within the call (nothing is kept open across requests), and ``cancel``
    (dismissed, no choice made) is what happened, where ``decline`` would claim a refusal.
    """

    async def cancel(context: Any, params: mcp_types.ElicitRequestParams) -> mcp_types.ElicitResult:
        asked.append(params.message)
        return mcp_types.ElicitResult(action="cancel")

    return cancel


class _ClientPort:
    """What both adapters share: a session per request, bounded, errors translated."""

    def _client(
        self, server: McpServerEntry, elicitation: ElicitationFnT | None = None
    ) -> mcp.Client:
        raise NotImplementedError

    def _run(
        self,
        server: McpServerEntry,
        timeout: float,
        work: Callable[[mcp.Client], Awaitable[_T]],
        elicitation: ElicitationFnT | None = None,
    ) -> _T:
        async def bounded() -> _T:
            with anyio.fail_after(timeout):
                async with self._client(server, elicitation) as client:
                    return await work(client)

        try:
            return asyncio.run(bounded())
        except TimeoutError:
            raise McpError(f"no answer within {timeout:g}s", timed_out=True) from None
        except mcp.MCPError as exc:
            raise McpError(f"the server answered an error: {exc}") from None
        except Exception as exc:  # the transport's errors (httpx2, anyio, ExceptionGroup)
            raise McpError(f"{type(exc).__name__}: {exc}") from None

    def list_tools(self, server: McpServerEntry, timeout: float) -> McpListing:
        """The server's listing (every page); :class:`McpError` on a failure."""
        return self._run(server, timeout, lambda c: _listing(c, server.server_label))

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
        """One ``tools/call`` (``answered``: sent again with a person's answer); the result,
        or the server's question for a person (:func:`_call`). :class:`McpError` on a
        failure of the server or network. An older server's ``elicitation/create`` is
        answered ``cancel`` (:func:`_cancelling`); what it asked is in ``elicited``."""
        asked: list[str] = []
        return self._run(
            server,
            timeout,
            lambda c: _call(c, tool, arguments, meta, asked, answered),
            _cancelling(asked),
        )


class StreamableHttpMcp(_ClientPort):
    """The servers at their ``server_url``, over Streamable HTTP, with their ``headers``."""

    def _client(
        self, server: McpServerEntry, elicitation: ElicitationFnT | None = None
    ) -> mcp.Client:
        http = create_mcp_http_client(headers=dict(server.headers) or None)
        # Our deadline bounds the session; the library's response cache is per client and
        # would outlive none, so it is off.
        return mcp.Client(
            streamable_http_client(server.server_url, http_client=http),
            cache=None,
            elicitation_callback=elicitation,
        )


class InMemoryMcp(_ClientPort):
    """In-process servers (``mcp.server.MCPServer`` objects) by label, for tests: the same
    client and protocol with no network."""

    def __init__(self, servers: Mapping[str, Any], *, mode: str = "auto") -> None:
        self.servers = dict(servers)
        #: The client's protocol: ``"auto"`` (the current one), ``"legacy"`` (the
        #: handshake before 2026-07-28: an older server's behaviour).
        self.mode = mode

    def _client(
        self, server: McpServerEntry, elicitation: ElicitationFnT | None = None
    ) -> mcp.Client:
        try:
            target = self.servers[server.server_label]
        except KeyError:
            raise McpError(f"no in-memory server {server.server_label!r}") from None
        return mcp.Client(target, cache=None, elicitation_callback=elicitation, mode=self.mode)
