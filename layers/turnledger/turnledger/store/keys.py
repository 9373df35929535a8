"""Physical keys of the single table and the bucket, built and checked before any I/O.

Table layout (one partition per conversation)::

    pk = "T#<tenant>#C#<conversation_id>"
    sk = "HEAD"                      the head's slow state: life, expiry filing, fence
    sk = "HEAD#run"                  the run flag: the turn whose draft began last
                                     (.runs); read with the head
    sk = "E#<storage sequence:012>"  a turn item: every event of one commit, at the
                                     slot of its first, with the head's fast state
                                     (a marker: none, n = 0; a gravestone: a marker
                                     with an expiry, holding a deleted life's slot)
    sk = "I#<hash>"                  a request's idempotency record (.records)
    sk = "S#..."                     a side item: a long turn's draft (turnledger/turn/drafts.py)
    sk = "W#<hash>"                  an approval inbox entry (.inbox)
    sk = "R#<gen>#<L|K>#<fork id>#<fork gen>"
                                     a fork of this conversation's life <gen>: L while the
                                     fork lives, K once it is deleted but its own forks still
                                     read through it (.forks, .purge)
    sk = "P#<gen>"                   the parent of this conversation's life <gen>, when that
                                     life is a fork

    pk = "T#<tenant>#C##tenant"      the tenant's own side items (no head, no events):
                                     the OpenAI face's transcript index (:func:`tenant_items`),
                                     the list of users with memory (:func:`memory_user_key`)
    pk = "T#<tenant>#C##memory#<user>"  one user's memory records (:func:`memory_items`)
                                     and pins (.user_pins)

``"HEAD"`` sorts after every ``"E#..."`` key, so one descending Query returns
the head followed by the newest turn items: a turn reads its state in one round
trip. docs/STORAGE.md, "Items", is the full layout table; docs/DESIGN.md's glossary
names each kind. The tenant is percent-encoded so it can never contain the ``#``
separator; conversation ids cannot contain it by their own rule.

S3 objects of offloaded payloads live under the conversation's prefix and its
life (``gen``), so clear and sweep delete them by prefix::

    t/<tenant>/c/<conversation_id>/g/<gen>/e/<storage sequence:012>-<sha256[:16]>-<attempt>.json

``attempt`` is unique to one commit call: two turns racing to commit the same
payload at the same sequence (a client retrying while its first request still
runs) write different objects, so the loser's cleanup never deletes the
winner's object.
"""

from __future__ import annotations

import hashlib
from urllib.parse import quote, unquote

from ..core.models import EXPIRY_BUCKET_SECONDS as EXPIRY_BUCKET_SECONDS
from ..core.models import ConversationKey

HEAD_SK = "HEAD"
#: The run flag (:func:`.runs.put_run_flag`): right after ``"HEAD"``
#: (before every other kind), so the load's one query reads it with the head, and no other
#: read of the head and events (bounded by ``"HEAD"``) ever meets it.
RUN_FLAG_SK = "HEAD#run"
EVENT_PREFIX = "E#"
#: Powertools idempotency records of the conversation's keyed requests; after ``"HEAD"``,
#: so no read of the head and events ever meets one, and a purge deletes them.
RECORD_PREFIX = "I#"
#: Side items (long turns' drafts: turnledger/turn/drafts.py); after ``"HEAD"``, so no read of
#: the head and events ever meets one, and a purge deletes them.
SIDE_PREFIX = "S#"
#: References to a life's forks (in the parent's partition) and a fork's origin (in its own);
#: after ``"HEAD"``, so no read of the head and events ever meets one.
FORK_REF_PREFIX = "R#"
ORIGIN_PREFIX = "P#"
#: A fork reference's state: the fork lives (listed, counted), or it is deleted and kept
#: only while forks of its own read through it.
FORK_LIVE = "L"
FORK_KEPT = "K"
_SEQ_WIDTH = 12
#: The "conversation id" of the partition holding a tenant's own side items: no conversation
#: id can contain ``#``, so no conversation ever has this partition.
TENANT_ITEMS_ID = "#tenant"
#: What the "conversation id" of a user's memory partition starts with (``#``: no
#: conversation has it); the percent-encoded user follows.
MEMORY_ITEMS_PREFIX = "#memory#"
#: Sort key prefix of a memory record (in the user's partition) and of a user's entry in
#: the tenant's own partition (what tenant erasure reads to find every user's partition).
MEMORY_RECORD_PREFIX = f"{SIDE_PREFIX}m#"
MEMORY_USER_PREFIX = f"{SIDE_PREFIX}mu#"
#: Sort key prefixes of a user's active pins and of their removals (in the user's memory
#: partition, after the records: one query reads the records and the active pins).
USER_PIN_PREFIX = f"{SIDE_PREFIX}up#"
USER_PIN_REMOVED_PREFIX = f"{SIDE_PREFIX}ux#"

#: The expiry index groups heads by the hour their TTL falls in, split into
#: shards so one busy hour does not become one hot index partition.
EXPIRY_SHARDS = 4


def tenant_partition_prefix(tenant: str) -> str:
    """What every partition key of ``tenant``'s conversations starts with.

    It ends with the separator: no other tenant's keys start with it (tenant-scoped
    credentials grant exactly this prefix, see :mod:`.tenancy`).
    """
    return f"T#{quote(tenant, safe='')}#C#"


def partition_key(key: ConversationKey) -> str:
    """The table partition key of a conversation."""
    return f"{tenant_partition_prefix(key.tenant)}{key.conversation_id}"


def tenant_items(tenant: str) -> ConversationKey:
    """Where ``tenant``'s own side items live: a partition under the tenant's prefix that no
    conversation has (it never holds a head or events; clearing it deletes its items)."""
    return ConversationKey(tenant=tenant, conversation_id=TENANT_ITEMS_ID)


def memory_items(tenant: str, user: str) -> ConversationKey:
    """Where ``user``'s memory records live: a partition under ``tenant``'s prefix that no
    conversation has (the user is percent-encoded, so it never holds a separator)."""
    return ConversationKey(
        tenant=tenant, conversation_id=f"{MEMORY_ITEMS_PREFIX}{quote(user, safe='')}"
    )


def memory_user_key(user: str) -> str:
    """The sort key of ``user``'s entry in the tenant's own partition (:func:`tenant_items`)."""
    return f"{MEMORY_USER_PREFIX}{quote(user, safe='')}"


def memory_user_of(sort_key: str) -> str:
    """Invert :func:`memory_user_key`."""
    return unquote(sort_key.removeprefix(MEMORY_USER_PREFIX))


def parse_partition_key(pk: str) -> ConversationKey:
    """Invert :func:`partition_key`.

    Raises:
        ValueError: ``pk`` is not a conversation partition key.
    """
    prefix, _, rest = pk.partition("T#")
    tenant, sep, conversation_id = rest.partition("#C#")
    if prefix or not sep or not tenant or not conversation_id:
        raise ValueError(f"not a conversation partition key: {pk!r}")
    return ConversationKey(tenant=unquote(tenant), conversation_id=conversation_id)


def event_sort_key(storage_sequence: int) -> str:
    """The sort key of the event at ``storage_sequence``."""
    return f"{EVENT_PREFIX}{storage_sequence:0{_SEQ_WIDTH}d}"


def sequence_of(sort_key: str) -> int:
    """The storage sequence encoded in an event sort key."""
    return int(sort_key.removeprefix(EVENT_PREFIX))


def fork_refs_prefix(gen: str, state: str | None = None) -> str:
    """What the sort keys of the references to life ``gen``'s forks start with (of one
    ``state`` when given: :data:`FORK_LIVE` or :data:`FORK_KEPT`)."""
    return f"{FORK_REF_PREFIX}{gen}#" if state is None else f"{FORK_REF_PREFIX}{gen}#{state}#"


def fork_ref_key(gen: str, state: str, fork_id: str, fork_gen: str) -> str:
    """The sort key of the reference, in the parent's partition, to the fork ``fork_id`` (its
    life ``fork_gen``) of the parent's life ``gen``."""
    return f"{fork_refs_prefix(gen, state)}{fork_id}#{fork_gen}"


def origin_key(gen: str) -> str:
    """The sort key of the item naming the parent of the life ``gen`` (a fork)."""
    return f"{ORIGIN_PREFIX}{gen}"


def tenant_blob_prefix(tenant: str) -> str:
    """What every object key of ``tenant``'s conversations starts with (ends with ``/``)."""
    return f"t/{quote(tenant, safe='')}/"


def blob_prefix(key: ConversationKey, gen: str | None = None) -> str:
    """The S3 prefix of a conversation's objects (of one life when ``gen`` is given)."""
    base = f"{tenant_blob_prefix(key.tenant)}c/{key.conversation_id}/"
    return base if gen is None else f"{base}g/{gen}/"


def event_blob_prefix(key: ConversationKey, gen: str) -> str:
    """The S3 prefix of the offloaded event payloads of ``key``'s life ``gen``."""
    return f"{blob_prefix(key, gen)}e/"


def blob_sequence(object_key: str) -> int | None:
    """The storage sequence an event payload's object key names (``None``: not one)."""
    _, sep, rest = object_key.rpartition("/e/")
    head = rest.partition("-")[0]
    return int(head) if sep and head.isdigit() else None


def blob_key(
    key: ConversationKey, gen: str, storage_sequence: int, sha256: str, *, attempt: str
) -> str:
    """The S3 key of one offloaded event payload, written by the commit call ``attempt``."""
    name = f"{storage_sequence:0{_SEQ_WIDTH}d}-{sha256[:16]}-{attempt}.json"
    return f"{event_blob_prefix(key, gen)}{name}"


def export_key(key: ConversationKey, gen: str) -> str:
    """The S3 key of the conversation's latest large export, in its life ``gen`` (each export
    overwrites it; clear, sweep and purge remove it with the life's other objects)."""
    return f"{blob_prefix(key, gen)}x/export.ndjson"


def bucket_of(epoch_seconds: int) -> int:
    """The expiry bucket (hour number) an instant falls in."""
    return epoch_seconds // EXPIRY_BUCKET_SECONDS


def expiry_partition(bucket: int, shard: int) -> str:
    """The expiry-index partition of one shard of the expiry bucket ``bucket``."""
    return f"{bucket}#{shard}"


def expiry_bucket(bucket: int, pk: str) -> str:
    """The expiry-index partition of a head of partition ``pk`` filed under ``bucket``."""
    shard = int.from_bytes(hashlib.sha256(pk.encode()).digest()[:2], "big") % EXPIRY_SHARDS
    return expiry_partition(bucket, shard)
