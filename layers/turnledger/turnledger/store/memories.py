"""Long-term memory records of one user, kept beside the tenant's conversations.

A user's records live in their own partition under the tenant's prefix
(:func:`.keys.memory_items`: no conversation can have it, and tenant-scoped
credentials cover it like any partition of the tenant), one side item per record
(sort key ``S#m#<id>``). The first record of a user also files the user in the
tenant's own partition (``S#mu#<user>``, :func:`.keys.memory_user_key`), so tenant
erasure finds every user's partition without a scan.

Record ids sort by creation time (``m<ns since epoch, hex><random>``): a listing in key
order is oldest first, and a page's cursor is the last id it holds. A user keeps at most
``MEMORY_MAX_RECORDS`` records: write-back drops the least recently updated beyond it; a
record added by hand past it is refused (``409 memory_full``, see docs/API.md).
"""

from __future__ import annotations

import secrets
import time
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..core.models import ConversationKey
from . import keys
from .base import ConversationStore
from .codec import SideItem

#: The side item attribute holding a record's JSON.
_BODY = "mem"
#: The pattern of a record's ``key``: a short lower-case name (``name``, ``city``, ...).
MEMORY_KEY_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,63}$"
#: The pattern of a record id.
MEMORY_ID_PATTERN = r"^m[0-9a-f]{16}[0-9a-f]{8}$"
#: Sorts after every character of an id or a percent-encoded user: a prefix range's end.
_END = "\x7f"
#: The longest text a record holds.
MEMORY_TEXT_MAX = 1000


class MemoryRecord(BaseModel):
    """One thing remembered about a user: its text, the key it answers (a newer record of
    the same key supersedes it), where it came from, and when."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=MEMORY_ID_PATTERN)
    text: str = Field(min_length=1, max_length=MEMORY_TEXT_MAX)
    key: str | None = Field(default=None, pattern=MEMORY_KEY_PATTERN)
    #: ``extracted``: written back after a turn; ``manual``: added or edited by the API.
    source: Literal["extracted", "manual"] = "manual"
    #: The conversation and the events (first and last sequence) it was extracted from.
    conversation_id: str | None = None
    from_sequence: int | None = None
    to_sequence: int | None = None
    created_at: datetime
    updated_at: datetime
    #: The text's embedding (base64 of little-endian float32), when embeddings rank records.
    embedding: str | None = None


_last_ns = 0


def new_memory_id() -> str:
    """A new record id: creation time (ns) first, so ids sort oldest first (strictly
    increasing within a process), then a random part."""
    global _last_ns
    _last_ns = max(time.time_ns(), _last_ns + 1)
    return f"m{_last_ns:016x}{secrets.token_hex(4)}"


class MemoryBook:
    """One user's records in one tenant (the store's side items; no conversation's)."""

    def __init__(self, store: ConversationStore, tenant: str, user: str) -> None:
        self.store = store
        self.tenant = tenant
        self.user = user
        self.key: ConversationKey = keys.memory_items(tenant, user)

    def records(self, *, consistent: bool = True) -> list[MemoryRecord]:
        """Every record of the user, oldest first (one query: at most the cap's worth)."""
        found = self.store.query_side_items(
            self.key,
            lower=keys.MEMORY_RECORD_PREFIX,
            upper=keys.MEMORY_RECORD_PREFIX + _END,
            consistent=consistent,
        )
        return [MemoryRecord.model_validate_json(str(item.attributes[_BODY])) for item in found]

    def get(self, record_id: str) -> MemoryRecord | None:
        """The record ``record_id``, or ``None``."""
        item = self.store.get_side_item(self.key, keys.MEMORY_RECORD_PREFIX + record_id)
        return (
            None if item is None else MemoryRecord.model_validate_json(str(item.attributes[_BODY]))
        )

    def put(self, record: MemoryRecord, *, first: bool = False) -> None:
        """Write ``record`` (replacing the one with its id). ``first``: the user may have no
        record yet, so file the user in the tenant's partition too (for tenant erasure)."""
        if first:
            self.store.put_side_item(
                keys.tenant_items(self.tenant),
                SideItem(sort_key=keys.memory_user_key(self.user), attributes={"user": self.user}),
            )
        self.store.put_side_item(
            self.key,
            SideItem(
                sort_key=keys.MEMORY_RECORD_PREFIX + record.id,
                attributes={_BODY: record.model_dump_json(exclude_none=True)},
            ),
        )

    def delete(self, record_ids: list[str]) -> None:
        """Delete the records ``record_ids`` (absent ones are fine)."""
        if record_ids:
            self.store.delete_side_items(
                self.key, [keys.MEMORY_RECORD_PREFIX + rid for rid in record_ids]
            )

    def clear(self) -> int:
        """Delete every record of the user, and the user's entry when the user has no pins
        (:mod:`.user_pins`); returns how many records."""
        ids = [record.id for record in self.records()]
        self.delete(ids)
        pinned = self.store.query_side_items(
            self.key,
            lower=keys.USER_PIN_PREFIX,
            upper=keys.USER_PIN_REMOVED_PREFIX + _END,
            limit=1,
        )
        if not pinned:
            # The user's pins (.user_pins) stay: tenant erasure must still find the user.
            self.store.delete_side_items(
                keys.tenant_items(self.tenant), [keys.memory_user_key(self.user)]
            )
        return len(ids)


def memory_users(store: ConversationStore, tenant: str) -> list[str]:
    """Every user of ``tenant`` who has (or had) memory records."""
    items = store.query_side_items(
        keys.tenant_items(tenant),
        lower=keys.MEMORY_USER_PREFIX,
        upper=keys.MEMORY_USER_PREFIX + _END,
    )
    return [keys.memory_user_of(item.sort_key) for item in items]
