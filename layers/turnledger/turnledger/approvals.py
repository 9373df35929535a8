"""The tenant's approval inbox as the API shows it (``GET /v1/approvals``).

Every call of the caller's tenant that waits for a person (an approval, an
``outcome_unknown`` decision, a human-input call), across all its
conversations, oldest request first, read from the ``by-inbox`` index (never a
scan: :mod:`.store.inbox`). Deciding stays where it was:
``POST /v1/conversations/{id}/approvals``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from .exceptions import InvalidCursor
from .pipeline import Caller, Conversations
from .store import inbox

#: Entries a page holds unless the caller asks otherwise, and at most.
DEFAULT_LIMIT = 50
MAX_LIMIT = 100


class InboxItemView(BaseModel):
    """One call waiting for a person."""

    kind: Literal["approval", "input"] = Field(
        description="approval: approve or reject it; input: supply its output"
    )
    conversation_id: str
    id: str = Field(description="The call id, as POST .../approvals names it.")
    tool: str
    arguments: dict[str, Any]
    requested_by: str | None = Field(
        description="The actor of the turn whose model asked for the call (null: not recorded)."
    )
    requested_at: datetime
    expires_at: datetime | None = Field(description="After this the call counts as rejected.")
    reason: str | None = Field(
        default=None,
        description="Why it waits when it is not a plain request (its tool may have run).",
    )


class InboxPageView(BaseModel):
    """A page of the tenant's approval inbox."""

    items: list[InboxItemView]
    next_cursor: str | None = Field(
        description="Pass as cursor= for the next page; null when there is none."
    )


def list_inbox(
    service: Conversations,
    caller: Caller,
    *,
    limit: int = DEFAULT_LIMIT,
    cursor: str | None = None,
    tool: str | None = None,
    conversation_id: str | None = None,
) -> InboxPageView:
    """One page of ``caller``'s tenant's inbox (calls whose window closed are left out).

    Raises:
        InvalidCursor: ``cursor`` is not one this API returned (to this tenant's inbox).
    """
    try:
        after = inbox.decode_cursor(caller.tenant, cursor) if cursor else None
    except inbox.InvalidInboxCursor as exc:
        raise InvalidCursor(
            "cursor is not one this API returned; start again without it",
            details={"cursor": cursor},
        ) from exc
    page = service.store.inbox_page(
        caller.tenant,
        now=service.clock(),
        limit=limit,
        after=after,
        tool=tool,
        conversation_id=conversation_id,
    )
    return InboxPageView(
        items=[
            InboxItemView(
                kind=e.kind,
                conversation_id=e.conversation_id,
                id=e.call_id,
                tool=e.tool,
                arguments=e.arguments,
                requested_by=e.requested_by,
                requested_at=e.requested_at,
                expires_at=e.expires_at,
                reason=e.reason,
            )
            for e in page.entries
        ],
        next_cursor=inbox.encode_cursor(page.next) if page.next else None,
    )
