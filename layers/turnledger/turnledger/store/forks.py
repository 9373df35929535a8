"""The items that keep forks' inherited history readable (:meth:`.base.ConversationStore.fork`).

A fork copies no event: its head's :class:`~turnledger.core.models.ForkOrigin` says which
partitions and lives hold its inherited events. Two small items make that safe against
deletes, expiry and TTL, whatever order they come in:

* a **reference** in the parent's partition, ``R#<parent gen>#<state>#<fork id>#<fork gen>``,
  for each fork of that life. A purge of the parent keeps that life's events up to the
  highest fork point its references name (and their S3 objects), instead of deleting them;
  state ``L`` while the fork lives (``GET .../forks`` lists those), ``K`` once the fork is
  deleted but forks of its own still read through it;
* the **origin** in the fork's own partition, ``P#<fork gen>``, naming the parent's life: a
  fork whose head DynamoDB's TTL removed (the stream hands over only keys) still says whose
  reference to release.

When a life with no references left is purged, its reference in its parent goes; a parent
life that is gone and has no references left is then deleted too, and so on up the lineage.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..core.exceptions import CorruptedState, InternalError
from ..core.models import ConversationKey, ForkOrigin, Head
from . import codec, keys, views
from .backend import Check, Put, SlotFree, head_is
from .codec import Item

if TYPE_CHECKING:
    from .base import ConversationStore


#: Schema version of both kinds of item.
SCHEMA_VERSION = 1
#: Past any character of a conversation id or a life's name: the upper bound of a prefix.
_PAST = "~"


@dataclass(frozen=True)
class ForkRef:
    """A fork of one life of a conversation, as the parent's partition records it."""

    parent_gen: str
    fork_id: str
    fork_gen: str
    live: bool
    turn: int
    #: The fork point's public sequence.
    seq: int
    #: The fork point's storage sequence in the parent's partition: the parent's life keeps
    #: its events up to here while the reference stands.
    keep_through: int
    created_at: datetime

    @property
    def sort_key(self) -> str:
        """Where the reference is in the parent's partition."""
        state = keys.FORK_LIVE if self.live else keys.FORK_KEPT
        return keys.fork_ref_key(self.parent_gen, state, self.fork_id, self.fork_gen)


def prefix_bounds(prefix: str) -> tuple[str, str]:
    """Query bounds (inclusive) covering every sort key that starts with ``prefix``."""
    return prefix, prefix + _PAST


def ref_item(parent: ConversationKey, ref: ForkRef) -> Item:
    """The item of ``ref`` in ``parent``'s partition."""
    body = {
        "turn": ref.turn,
        "seq": ref.seq,
        "keep": ref.keep_through,
        "at": ref.created_at.isoformat(),
    }
    return {
        codec.A_PK: keys.partition_key(parent),
        codec.A_SK: ref.sort_key,
        codec.A_SCHEMA: SCHEMA_VERSION,
        codec.A_GEN: ref.parent_gen,
        codec.A_BODY: json.dumps(body, separators=(",", ":")),
    }


def decode_ref(item: Item) -> ForkRef:
    """The reference ``item`` holds.

    Raises:
        CorruptedState: it is not a reference this build can read.
    """
    sort_key = str(item.get(codec.A_SK, ""))
    try:
        if item.get(codec.A_SCHEMA) != SCHEMA_VERSION:
            raise ValueError(f"schema version {item.get(codec.A_SCHEMA)!r}")
        parent_gen, state, fork_id, fork_gen = sort_key.removeprefix(keys.FORK_REF_PREFIX).split(
            "#"
        )
        if state not in (keys.FORK_LIVE, keys.FORK_KEPT):
            raise ValueError(f"state {state!r}")
        body = json.loads(str(item[codec.A_BODY]))
        return ForkRef(
            parent_gen=parent_gen,
            fork_id=fork_id,
            fork_gen=fork_gen,
            live=state == keys.FORK_LIVE,
            turn=int(body["turn"]),
            seq=int(body["seq"]),
            keep_through=int(body["keep"]),
            created_at=datetime.fromisoformat(body["at"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptedState(
            "a fork reference cannot be read", details={"item": sort_key, "reason": str(exc)}
        ) from exc


def origin_item(key: ConversationKey, gen: str, origin: ForkOrigin) -> Item:
    """The item, in the fork ``key``'s partition, naming the parent of its life ``gen``."""
    body = {"parent": origin.conversation_id, "gen": origin.gen}
    return {
        codec.A_PK: keys.partition_key(key),
        codec.A_SK: keys.origin_key(gen),
        codec.A_SCHEMA: SCHEMA_VERSION,
        codec.A_GEN: gen,
        codec.A_BODY: json.dumps(body, separators=(",", ":")),
    }


def decode_origin(item: Item) -> tuple[str, str]:
    """``(parent conversation id, parent life)`` of an origin item.

    Raises:
        CorruptedState: it is not an origin this build can read.
    """
    try:
        if item.get(codec.A_SCHEMA) != SCHEMA_VERSION:
            raise ValueError(f"schema version {item.get(codec.A_SCHEMA)!r}")
        body = json.loads(str(item[codec.A_BODY]))
        return str(body["parent"]), str(body["gen"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptedState(
            "a fork's origin cannot be read",
            details={"item": str(item.get(codec.A_SK)), "reason": str(exc)},
        ) from exc


def reads(kept: dict[str, int], gen: Any, sequence: int) -> bool:
    """Whether a fork still reads the event at storage ``sequence`` of the life ``gen``
    (``kept``: :meth:`.base.ConversationStore.retention`)."""
    return isinstance(gen, str) and sequence <= kept.get(gen, 0)


def object_read(key: ConversationKey, object_key: str, kept: dict[str, int]) -> bool:
    """Whether a fork still reads the event payload at ``object_key`` of ``key``."""
    return any(
        object_key.startswith(keys.event_blob_prefix(key, gen))
        and reads(kept, gen, keys.blob_sequence(object_key) or 0)
        for gen in kept
    )


# --- the fork protocol -------------------------------------------------------------------


def fork(
    store: ConversationStore,
    parent: ConversationKey,
    parent_head: Head,
    target: ConversationKey,
    head: Head,
    *,
    expected_version: int | None,
    now: datetime,
) -> None:
    """Create the fork ``head`` at ``target``: its head, its reference in the parent's
    partition and its origin in its own, atomically, whatever the parent's length (no
    event is copied: ``head.fork`` says where the inherited ones are).

    Conditions: ``parent``'s head is still ``parent_head`` (same version and life, no
    clear's fence), and ``target`` has no head (``expected_version`` ``None``) or the
    tombstone of that version whose next life is ``head.gen``.

    Raises:
        ConversationBusy: a condition failed; nothing was written.
        InternalError: ``head`` is not a fork.
    """
    origin = head.fork
    if origin is None:
        raise InternalError("a fork's head names its origin")
    ref = ForkRef(
        parent_gen=parent_head.gen,
        fork_id=target.conversation_id,
        fork_gen=head.gen,
        live=True,
        turn=origin.turn,
        seq=origin.seq,
        keep_through=parent_head.base + origin.seq,
        created_at=now,
    )
    view = views.view_for(store, keys.partition_key(parent), parent_head.version)
    assert view.head_item is not None  # a version was read: there is a head
    # The parent's next slot as read: a commit on the parent since makes the fork fail.
    parent_pk = keys.partition_key(parent)
    next_slot = keys.event_sort_key(parent_head.seq + 1)
    store._transact(
        [
            Put(ref_item(parent, ref)),
            Put(origin_item(target, head.gen, origin)),
            Check(parent_pk, keys.HEAD_SK, head_is(view.head_item)),
            Check(parent_pk, next_slot, SlotFree(parent_head.gen, parent_head.version)),
            Put(
                store.sealer.seal(codec.encode_head(target, head)),
                head_is(codec.expected_head(expected_version, head.gen)),
            ),
        ]
    )


def fork_refs(
    store: ConversationStore, key: ConversationKey, head: Head, *, after: str | None, limit: int
) -> tuple[list[ForkRef], bool]:
    """Up to ``limit`` live forks of ``head``'s life, by fork id, after the fork id
    ``after``; and whether more follow."""
    lower, upper = prefix_bounds(keys.fork_refs_prefix(head.gen, keys.FORK_LIVE))
    if after is not None:
        # Past every life of the fork ``after``: its references end ``#<fork gen>``.
        lower = prefix_bounds(f"{lower}{after}#")[1]
    page = store._query(
        keys.partition_key(key),
        lower=lower,
        upper=upper,
        descending=False,
        limit=limit + 1,
        cursor=None,
    )
    refs = [decode_ref(item) for item in page.items]
    return refs[:limit], len(refs) > limit or page.cursor is not None


def fork_count(store: ConversationStore, key: ConversationKey, head: Head) -> int:
    """How many live forks ``head``'s life has (keys only, every page)."""
    lower, upper = prefix_bounds(keys.fork_refs_prefix(head.gen, keys.FORK_LIVE))
    return sum(1 for _ in store._keys_between(keys.partition_key(key), lower, upper))
