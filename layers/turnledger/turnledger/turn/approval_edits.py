"""Checks on a decision before anything is recorded: who may approve (four-eyes), and
approving with edited arguments: ``{"approve": [{"id": "call_1", "arguments": {...}}]}``.

**Four-eyes.** A tool with ``four_eyes`` (or every tool, with ``APPROVAL_FOUR_EYES``) is
approved only by someone other than the actor of the turn that asked for the call
(:func:`check_four_eyes`). Rejecting stays open to everyone who may decide.

The person deciding may correct what the model asked for (a recipient, an
amount) and approve that instead. The edited arguments are checked against the
tool's ``parameters`` like the model's own, before anything is recorded; the
decision then records the hash of what was requested and of what was approved
(and the approved arguments), and the call runs with the edited arguments under
its own idempotency key. A call whose tool may already have run
(``outcome_unknown``) cannot be edited: running other arguments under the key of
a run that may have happened would make that key lie.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..core.exceptions import (
    ApproverIsRequester,
    RequestValidationFailed,
    ToolDefinitionChanged,
    ToolServerUnavailable,
    UnknownTool,
)
from ..core.models import PendingCall
from ..tools.approval import arguments_sha256

if TYPE_CHECKING:
    from ..tools.registry import ToolRegistry


def check_edits(
    registry: ToolRegistry,
    awaiting: Mapping[str, PendingCall],
    approvals: Mapping[str, dict[str, Any] | None],
) -> dict[str, tuple[dict[str, Any], str]]:
    """The edited approvals among ``approvals``, as ``{call id: (arguments, their sha256)}``.

    Calls not in ``awaiting`` are left to the caller's own unknown-id check.
    An edit equal to the requested arguments is no edit.

    Raises:
        RequestValidationFailed: edited arguments fail the tool's schema, or edit a call
            that may have run already; nothing is recorded.
    """
    edits: dict[str, tuple[dict[str, Any], str]] = {}
    errors: list[dict[str, Any]] = []
    for call_id, arguments in approvals.items():
        pending = awaiting.get(call_id)
        if arguments is None or pending is None:
            continue
        digest = arguments_sha256(arguments)
        if digest == pending.arguments_sha256:
            continue
        if pending.state == "outcome_unknown":
            errors.append(
                {
                    "id": call_id,
                    "msg": "its tool may have run already: approve it as it is, or reject it",
                }
            )
            continue
        if pending.name not in registry:
            errors.append(
                {
                    "id": call_id,
                    "msg": f"its tool {pending.name!r} is no longer registered: approve it as "
                    "it is (it answers with an error and does not run), or reject it",
                }
            )
            continue
        problem = registry.get(pending.name).validate_arguments(arguments)
        if problem is not None:
            errors.append({"id": call_id, "msg": problem})
            continue
        edits[call_id] = (arguments, digest)
    if errors:
        raise RequestValidationFailed(
            "edited arguments were refused; nothing was decided", details={"errors": errors}
        )
    return edits


def check_four_eyes(
    registry: ToolRegistry,
    awaiting: Mapping[str, PendingCall],
    approved: Iterable[str],
    approver: str,
    *,
    always: bool,
    requester: str | None = None,
) -> None:
    """Refuse approvals of calls that ``approver`` asked for, where four-eyes applies.

    ``always``: the deployment's ``APPROVAL_FOUR_EYES``; otherwise the tool's ``four_eyes``
    decides (a tool no longer registered: the deployment's rule alone). A call's requester
    is its ``requested_by``, else ``requester`` (the turn's actor, when known).

    Raises:
        ApproverIsRequester: such a call is among ``approved``; nothing is decided.
    """
    own: list[str] = []
    for call_id in approved:
        pending = awaiting.get(call_id)
        if pending is None:
            continue
        try:
            required = always or registry.get(pending.name).four_eyes
        except UnknownTool:
            required = always
        if required and (pending.requested_by or requester) == approver:
            own.append(call_id)
    if own:
        raise ApproverIsRequester(
            "four-eyes: these calls were asked for by your own turn; another person must "
            "approve them (rejecting is allowed); nothing was decided",
            details={"calls": own, "requested_by": approver},
        )


def check_definitions(
    registry: ToolRegistry,
    awaiting: Mapping[str, PendingCall],
    approving: Collection[str],
    *,
    read_since: float,
) -> None:
    """Refuse deciding MCP calls whose tool definition changed since they were asked for.

    Each MCP tool among ``awaiting`` is from a listing read since ``read_since`` (the
    decision's start: the one the decision read already, else one read now): a
    definition whose hash differs from the call's ``definition_sha256``, or a tool its
    server no longer offers, invalidates the approval. A server that cannot list its
    tools now blocks only the approval of its calls (``approving``): a rejection needs
    no server.

    Raises:
        ToolDefinitionChanged: such calls are among ``awaiting`` (``details.calls``);
            nothing is decided.
        ToolServerUnavailable: a call being approved is of a server that could not list
            its tools; nothing is decided.
    """
    from ..tools.registry import McpExecutorConfig

    changed: list[dict[str, str | None]] = []
    listed: dict[str, str | ToolServerUnavailable | None] = {}
    for call_id, pending in awaiting.items():
        if pending.definition_sha256 is None:
            continue
        if pending.name not in listed:
            try:
                executor = registry.get(pending.name, read_since=read_since).executor
            except UnknownTool:
                listed[pending.name] = None
            except ToolServerUnavailable as exc:
                listed[pending.name] = exc
            else:
                listed[pending.name] = (
                    executor.definition_sha256 if isinstance(executor, McpExecutorConfig) else None
                )
        current = listed[pending.name]
        if isinstance(current, ToolServerUnavailable):
            if call_id in approving:
                raise current
            continue
        if current != pending.definition_sha256:
            changed.append(
                {
                    "id": call_id,
                    "tool": pending.name,
                    "approved_definition_sha256": pending.definition_sha256,
                    "current_definition_sha256": current,
                }
            )
    if changed:
        raise ToolDefinitionChanged(
            "the MCP server changed these tools' definitions since the calls were asked "
            "for: their approvals are invalidated; nothing was decided",
            details={"calls": changed},
        )
