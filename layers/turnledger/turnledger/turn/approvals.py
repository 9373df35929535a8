"""The tenant's approval inbox (``GET /v1/approvals``).

Every call of the caller's tenant that waits for a person (an approval, an
``outcome_unknown`` decision, a human-input call), across all its
conversations, oldest request first, read from the ``by-inbox`` index (never a
scan: :mod:`turnledger.store.inbox`). Deciding stays where it was:
``POST /v1/conversations/{id}/approvals``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.exceptions import InvalidCursor
from ..store import inbox
from ..store.inbox import InboxEntry

if TYPE_CHECKING:
    from .reads import Reads

#: Entries a page holds unless the caller asks otherwise, and at most.
DEFAULT_LIMIT = 50
MAX_LIMIT = 100


@dataclass(frozen=True)
class InboxListing:
    """A page of a tenant's inbox: its entries, and the cursor of the next page."""

    entries: list[InboxEntry]
    #: Pass as ``cursor`` for the next page; ``None`` when there is none.
    next_cursor: str | None


def list_inbox(
    service: Reads,
    tenant: str,
    *,
    limit: int = DEFAULT_LIMIT,
    cursor: str | None = None,
    tool: str | None = None,
    conversation_id: str | None = None,
) -> InboxListing:
    """One page of ``tenant``'s inbox (calls whose window closed are left out).

    Raises:
        InvalidCursor: ``cursor`` is not one this API returned (to this tenant's inbox).
    """
    try:
        after = inbox.decode_cursor(tenant, cursor) if cursor else None
    except inbox.InvalidInboxCursor as exc:
        raise InvalidCursor(
            "cursor is not one this API returned; start again without it",
            details={"cursor": cursor},
        ) from exc
    page = service.store.inbox_page(
        tenant,
        now=service.clock(),
        limit=limit,
        after=after,
        tool=tool,
        conversation_id=conversation_id,
    )
    return InboxListing(
        entries=page.entries,
        next_cursor=inbox.encode_cursor(tenant, page.next) if page.next else None,
    )
