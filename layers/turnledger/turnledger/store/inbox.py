"""The approval inbox: one entry item per call waiting for a person, on a sparse index.

A call that waits for a human (``requires`` ``"approval"``, kind ``approval``;
``"input"``, kind ``input``) has an *entry* item in its conversation's
partition::

    pk  = "T#<tenant>#C#<conversation_id>"       the conversation's partition
    sk  = "W#<sha256(call id)[:32]>"              one entry per call
    g   = the life that wrote it                  (a purge removes it with the rest)
    ib  = "T#<tenant>#C#"                         by-inbox partition: the tenant
    is  = "<requested_at>#<conversation_id>#<call id>"   by-inbox sort: oldest first
    wb  = the by-wait partition of the hour its window closes (calls with a window)
    d   = the entry (JSON): kind, call, tool, arguments, who asked, when, until when

Entries are written in the *same* transaction that records the request and
deleted in the one that decides (or expires) it: the turn layer says which
(:func:`turnledger.turn.lifecycle.inbox_changes` compares the pending calls of the
head a commit replaces with those of the head it writes) and hands the commit an
:class:`InboxChanges`; this module only encodes, decodes and lists entries. So
the index never holds an entry for a decided call that the table does not (the
global index itself lags the table by its usual fraction of a second).

An entry files its own wait on the ``by-wait`` index (``wb``), so the commit that
starts a person's wait leaves ``HEAD`` alone: ``HEAD``'s ``wb`` files only the waits
no entry of this build files (:func:`turnledger.turn.lifecycle.head_wait_deadline`).
Entries written before carry no ``wb`` (their ``HEAD`` did); they list and go alike.

``"W#"`` sorts after ``"HEAD"``, so no read of the head and events meets an
entry, and a clear, an erasure or a sweep (which delete every item of the
partition not of the next life) remove them with the conversation.

The index partition is the tenant's key prefix (``T#<tenant>#C#``), so the
tenant-scoped role's ``dynamodb:LeadingKeys`` condition covers its queries as
it covers the table's: a tenant can only ever list its own inbox.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from ..core.exceptions import ContentUnreadable
from ..core.models import ConversationKey
from . import codec, keys
from .codec import Item

if TYPE_CHECKING:
    from .base import ConversationStore


#: The index's name, as declared in template.yaml.
INBOX_INDEX = "by-inbox"
#: Item attributes of the index's keys.
A_INBOX = "ib"
A_INBOX_SORT = "is"
#: Sort keys of entries start with this (after ``"HEAD"`` and ``"I#"``).
ENTRY_PREFIX = "W#"
ENTRY_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class InboxEntry:
    """One call waiting for a person, as the inbox lists it."""

    kind: Literal["approval", "input"]
    conversation_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any]
    requested_by: str | None
    requested_at: datetime
    expires_at: datetime | None
    #: ``outcome_unknown`` calls: a run of this call may have happened already.
    reason: str | None = None
    #: A call whose tool asked a person mid-call (kind ``input``): its question.
    message: str | None = None
    requested_schema: dict[str, Any] | None = None


@dataclass(frozen=True)
class EntryKey:
    """Where an entry sits in the index: enough to resume a listing after it."""

    sort: str
    pk: str
    sk: str


def entry_sort_key(call_id: str) -> str:
    """The sort key of the entry of ``call_id`` in its conversation's partition."""
    return f"{ENTRY_PREFIX}{hashlib.sha256(call_id.encode('utf-8')).hexdigest()[:32]}"


def inbox_partition(tenant: str) -> str:
    """The by-inbox partition of ``tenant``: its key prefix (see the module docstring)."""
    return keys.tenant_partition_prefix(tenant)


def _instant(value: datetime) -> str:
    """A fixed-width UTC timestamp that sorts as the instant does."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


#: Entries one index query reads at least when a listing is filtered (it skips most).
FILTERED_READ = 100


#: Longest call id kept as is in an index sort key (DynamoDB allows 1,024 bytes in all).
_CALL_PART_MAX = 200


def _call_part(call_id: str) -> str:
    """The call's part of the index sort key: its id (calls of one turn, requested at one
    instant, list in id order), or for an id too long for a key, its entry hash."""
    if len(call_id.encode("utf-8")) <= _CALL_PART_MAX:
        return call_id
    return entry_sort_key(call_id)


def entry_item(key: ConversationKey, gen: str, entry: InboxEntry) -> Item:
    """The entry item of ``entry``, in the life ``gen`` of ``key`` (the life of the head
    the same commit writes)."""
    body = {
        "kind": entry.kind,
        "conversation_id": key.conversation_id,
        "call_id": entry.call_id,
        "tool": entry.tool,
        "arguments": entry.arguments,
        "requested_by": entry.requested_by,
        "requested_at": entry.requested_at.isoformat(),
        "expires_at": entry.expires_at.isoformat() if entry.expires_at else None,
        "reason": entry.reason,
    }
    if entry.message is not None:
        body["message"] = entry.message
        body["requested_schema"] = entry.requested_schema
    pk = keys.partition_key(key)
    item: Item = {
        codec.A_PK: pk,
        codec.A_SK: entry_sort_key(entry.call_id),
        codec.A_SCHEMA: ENTRY_SCHEMA_VERSION,
        codec.A_GEN: gen,
        A_INBOX: inbox_partition(key.tenant),
        A_INBOX_SORT: (
            f"{_instant(entry.requested_at)}#{key.conversation_id}#{_call_part(entry.call_id)}"
        ),
        codec.A_BODY: json.dumps(body, ensure_ascii=False, separators=(",", ":")),
    }
    if entry.expires_at is not None:
        # Filed for the sweep's expiry pass under the hour its window closes, as a head is.
        due = int(entry.expires_at.timestamp())
        item[codec.A_WAIT_BUCKET] = keys.expiry_bucket(keys.bucket_of(due), pk)
    return item


@dataclass(frozen=True)
class InboxChanges:
    """The inbox entries one commit writes and deletes, as the turn layer decided them."""

    #: Entries of calls that start waiting for a person with this commit.
    puts: Sequence[InboxEntry] = ()
    #: Call ids whose entries go (decided, expired, settled, cancelled).
    deletes: Sequence[str] = ()

    def __len__(self) -> int:
        return len(self.puts) + len(self.deletes)


def decode_entry(item: Item) -> InboxEntry | None:
    """The entry ``item`` holds; ``None`` for an item that is not a readable entry."""
    if item.get(codec.A_SCHEMA) != ENTRY_SCHEMA_VERSION:
        return None
    try:
        body = json.loads(str(item[codec.A_BODY]))
        return InboxEntry(
            kind=body["kind"],
            conversation_id=str(body["conversation_id"]),
            call_id=str(body["call_id"]),
            tool=str(body["tool"]),
            arguments=dict(body["arguments"]),
            requested_by=body.get("requested_by"),
            requested_at=datetime.fromisoformat(body["requested_at"]),
            expires_at=datetime.fromisoformat(body["expires_at"])
            if body.get("expires_at")
            else None,
            reason=body.get("reason"),
            message=body.get("message"),
            requested_schema=body.get("requested_schema"),
        )
    except (KeyError, TypeError, ValueError):
        return None


def entry_key(item: Item) -> EntryKey:
    """Where ``item`` (an entry) sits in the index."""
    return EntryKey(str(item[A_INBOX_SORT]), str(item[codec.A_PK]), str(item[codec.A_SK]))


class InvalidInboxCursor(ValueError):
    """A cursor that this deployment did not hand out to this tenant."""


def _tenant_tag(tenant: str) -> str:
    # Says which tenant a cursor was handed to, without naming it. Not a secret: a cursor
    # is only ever read within the caller's own tenant, so a forged tag reads nothing more.
    return hashlib.sha256(tenant.encode("utf-8")).hexdigest()[:16]


def encode_cursor(tenant: str, position: EntryKey) -> str:
    """The public, opaque form of a listing position of ``tenant``'s inbox (the tenant
    is implied; a tag of it binds the cursor to it)."""
    raw = json.dumps(
        [position.sort, position.sk, _tenant_tag(tenant)], separators=(",", ":")
    ).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(tenant: str, cursor: str) -> EntryKey:
    """Invert :func:`encode_cursor` for ``tenant``.

    Raises:
        InvalidInboxCursor: not a cursor of this API, or one handed to another tenant.
    """
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        sort, sk, tag = json.loads(raw)
        if tag != _tenant_tag(tenant):
            raise ValueError("a cursor of another tenant")
        _, conversation_id, _ = str(sort).split("#", 2)
        if not str(sk).startswith(ENTRY_PREFIX):
            raise ValueError("not an entry key")
        pk = keys.partition_key(ConversationKey(tenant=tenant, conversation_id=conversation_id))
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError) as exc:
        raise InvalidInboxCursor("cursor is not one this API returned") from exc
    return EntryKey(str(sort), pk, str(sk))


@dataclass(frozen=True)
class InboxPage:
    """One page of the inbox."""

    entries: list[InboxEntry]
    #: Where the next page starts; ``None`` when the inbox has nothing after this page.
    next: EntryKey | None


def select(
    items: Sequence[Item],
    *,
    now: datetime,
    tool: str | None,
    conversation_id: str | None,
) -> list[tuple[InboxEntry, EntryKey]]:
    """The entries of ``items`` a listing shows: readable, not expired at ``now``, filtered."""
    chosen = []
    for item in items:
        entry = decode_entry(item)
        if entry is None:
            continue
        if entry.expires_at is not None and entry.expires_at <= now:
            continue  # its window closed: the next request or the sweep records the expiry
        if tool is not None and entry.tool != tool:
            continue
        if conversation_id is not None and entry.conversation_id != conversation_id:
            continue
        chosen.append((entry, entry_key(item)))
    return chosen


# --- reading the inbox -------------------------------------------------------------------


def readable(store: ConversationStore, item: Item) -> list[Item]:
    """``item`` opened, or nothing when its content is unreadable (erased: a listing
    leaves such an item out rather than failing for every other one)."""
    try:
        return [store.sealer.open(item)]
    except ContentUnreadable:
        return []


def inbox_page(
    store: ConversationStore,
    tenant: str,
    *,
    now: datetime,
    limit: int,
    after: EntryKey | None = None,
    tool: str | None = None,
    conversation_id: str | None = None,
) -> InboxPage:
    """Up to ``limit`` calls of ``tenant`` waiting for a person, oldest request first.

    Calls whose window closed by ``now`` are left out (the next request on their
    conversation, or the sweep, records the expiry and removes the entry), as are
    entries not matching ``tool`` or ``conversation_id``: reading goes on past them
    for at most :attr:`inbox_rounds` index queries, so a filter that matches little
    costs a bounded time per request. A page may then hold fewer than ``limit``
    calls and still name where the next one starts.
    """
    partition = inbox_partition(tenant)
    filtering = tool is not None or conversation_id is not None
    chosen: list[tuple[InboxEntry, EntryKey]] = []
    position = after
    for _ in range(store.inbox_rounds):
        wanted = limit - len(chosen) + 1  # one more than needed: is there a next page?
        page = store._inbox_query(
            partition,
            after=position,
            limit=max(wanted, FILTERED_READ) if filtering else wanted,
        )
        for item in page.items:
            chosen.extend(
                select(readable(store, item), now=now, tool=tool, conversation_id=conversation_id)
            )
            if len(chosen) > limit:
                # The next page starts right after the last call shown.
                return InboxPage([e for e, _ in chosen[:limit]], chosen[limit - 1][1])
        if page.cursor is None:
            return InboxPage([e for e, _ in chosen], None)
        # Everything read so far was shown or skipped: go on after the last item read.
        position = page.cursor
        if len(chosen) == limit:
            break
    return InboxPage([e for e, _ in chosen], position)
