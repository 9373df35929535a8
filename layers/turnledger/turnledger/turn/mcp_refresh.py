"""Approvals a refreshed MCP listing invalidates, before anyone decides them.

A request on a conversation reads its servers' listings through the process's
:class:`~turnledger.tools.mcp_link.McpLink`: the kept listing while it is young, else a
refresh. When the listing it reads gives a waiting MCP call's tool another definition
(or no longer offers it), that approval is stale: :func:`stale_approvals` names it, the
request records the invalidation (:meth:`.execution.ToolCalls.invalidate_refreshed`)
and the listing, and the conversation no longer offers the approval; deciding it
answers ``409 tool_definition_changed`` (:func:`refuse_invalidated`), as a decision
that finds the change itself does (:func:`.approval_edits.check_definitions`).

The warm path lists nothing: a young kept listing is compared, with no round trip.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from ..core.exceptions import ToolDefinitionChanged, ToolServerUnavailable, UnknownTool
from ..core.models import ApprovalRequested, ApprovalResolved, PendingCall, ToolCallRequested
from ..core.observability import logger
from ..tools.registry import McpExecutorConfig, ToolRegistry
from .lifecycle import AWAITING_DECISION, CallMove
from .session import Session

#: The reason of an approval its tool's changed definition invalidated.
INVALIDATED = "invalidated: tool definition changed"


def current_definition(registry: ToolRegistry, name: str) -> str | None:
    """The sha256 of MCP tool ``name``'s definition in the listing the process reads now
    (kept while young, else refreshed); ``None``: the tool is offered no more.

    Raises:
        ToolServerUnavailable: the listing was due a refresh and the server could not list.
    """
    try:
        executor = registry.get(name).executor
    except UnknownTool:
        return None
    return executor.definition_sha256 if isinstance(executor, McpExecutorConfig) else None


def stale_approvals(
    registry: ToolRegistry, awaiting: Iterable[PendingCall]
) -> list[tuple[PendingCall, str | None]]:
    """The waiting MCP calls whose tool's definition differs from the one they were asked
    under, each with the current definition's hash (``None``: the tool is gone).

    A server that cannot list its tools invalidates nothing: its listing is unknown.
    """
    stale: list[tuple[PendingCall, str | None]] = []
    current: dict[str, str | ToolServerUnavailable | None] = {}
    for pending in awaiting:
        if pending.definition_sha256 is None:
            continue
        if pending.name not in current:
            try:
                current[pending.name] = current_definition(registry, pending.name)
            except ToolServerUnavailable as exc:
                current[pending.name] = exc
        found = current[pending.name]
        if isinstance(found, ToolServerUnavailable) or found == pending.definition_sha256:
            continue
        stale.append((pending, found))
    if stale:
        logger.info(
            "a refreshed MCP listing invalidates waiting approvals",
            extra={"calls": [p.id for p, _ in stale], "tools": sorted({p.name for p, _ in stale})},
        )
    return stale


def refuse_invalidated(
    registry: ToolRegistry, session: Session, named: Collection[str], waiting: Mapping[str, object]
) -> None:
    """Refuse a decision naming calls whose approval a changed definition invalidated
    (and that no longer wait), in this turn or an earlier one the session read.

    Raises:
        ToolDefinitionChanged: such calls are among ``named`` (``details.calls``).
    """
    # Earlier turns too: a refresh that invalidates lets a new message begin the next
    # turn. A call's last resolution counts (a model may reuse an id in a later turn).
    invalidated: dict[str, bool] = {}
    tools: dict[str, str] = {}
    asked: dict[str, str | None] = {}
    for event in session.events:
        body = event.body()
        if isinstance(body, ApprovalResolved):
            invalidated[body.call_id] = body.reason == INVALIDATED
        elif isinstance(body, ToolCallRequested):
            tools[body.call_id] = body.name
        elif isinstance(body, ApprovalRequested):
            asked[body.call_id] = body.definition_sha256
    calls = []
    for call_id in named:
        if call_id in waiting or not invalidated.get(call_id):
            continue
        name = tools.get(call_id, "")
        try:
            now = current_definition(registry, name)
        except ToolServerUnavailable:
            now = None
        calls.append(
            {
                "id": call_id,
                "tool": name,
                "approved_definition_sha256": asked.get(call_id),
                "current_definition_sha256": now,
            }
        )
    if calls:
        raise ToolDefinitionChanged(
            "the MCP server changed these tools' definitions since the calls were asked "
            "for: their approvals were invalidated; nothing was decided",
            details={"calls": calls},
        )


def invalidate(session: Session, call_ids: list[str]) -> None:
    """Reject the MCP calls whose tool definition changed while they awaited a decision
    (``approval_resolved`` by the system, reason :data:`INVALIDATED`); their error results
    follow with :meth:`.execution.ToolCalls.settle_rejected`."""
    waiting = {p.id: p for p in session.machine.pending if p.state in AWAITING_DECISION}
    for call_id in call_ids:
        pending = waiting[call_id]
        session.add(
            ApprovalResolved(
                call_id=call_id,
                decision="rejected",
                reason=INVALIDATED,
                approver="system",
                arguments_sha256=pending.arguments_sha256,
            ),
            actor="system",
        )
        session.machine.change(pending, CallMove.REJECT, reason=INVALIDATED)
