"""The slot rules: which item a commit may write over, and how a deleted life keeps its slots.

A commit writes at its life's next *slot* (:mod:`.commit`); the slot being free is the
optimistic lock (:func:`slot_free`). A purge (:mod:`.purge`) claims the next slot of the
life it deletes with a *gravestone* (a marker with an expiry, :func:`gravestone`), and
replaces the items a late turn could still target with bare gravestones
(:func:`keeps_slot`), so a turn of a deleted life never lands. Backends evaluate
:func:`slot_free` as the condition of a write (:mod:`.backend`).
"""

from __future__ import annotations

import json
from datetime import datetime

from ..core.models import SCHEMA_VERSION, ConversationKey, Head
from .codec import (
    A_BODY,
    A_COUNT,
    A_EXPIRES,
    A_GEN,
    A_PK,
    A_SCHEMA,
    A_SK,
    A_STATE,
    A_VERSION,
    Item,
    marker_item,
    with_state,
)

#: How long a clear's or purge's claim on the next slot outlives the purge: longer than any
#: request that read the conversation before it can run (a Lambda function runs 15 minutes
#: at most), so that a turn of the deleted life never lands once the slot is free again.
GRAVESTONE_SECONDS = 24 * 3600


def gravestone(key: ConversationKey, head: Head, now: datetime, state: bool = True) -> Item:
    """The claim of the slot after ``head`` by a clear or purge: a marker of ``head``'s state
    (``state=False``: of none, a bare gravestone) that no commit may replace (it carries an
    expiry, so :func:`slot_free` never holds for its life), left by the purge for
    DynamoDB's TTL to remove."""
    item = marker_item(key, head)
    if state:
        item = with_state(item, head)
    item[A_EXPIRES] = int(now.timestamp()) + GRAVESTONE_SECONDS
    return item


def is_gravestone(item: Item, now: datetime) -> bool:
    """Whether ``item`` is a bare :func:`gravestone` (no head state) still due to hold its
    slot at ``now``."""
    expires = item.get(A_EXPIRES)
    return (
        item.get(A_COUNT) == 0
        and A_STATE not in item
        and isinstance(expires, int | float)
        and expires > now.timestamp()
    )


#: How long after an item was written a purge replaces it with a bare gravestone instead of
#: deleting it: longer than a request can run between its read and its commit (a Lambda
#: function runs 15 minutes at most), with margin for clocks. A turn that read before a
#: clear and commits after its purge targets a slot whose item was written after that read
#: (or the clear's own claim): the gravestone keeps it taken, so the turn is told busy,
#: never lands an answer that the clear's erasure would not find.
LATE_TURN_SECONDS = 3600


def bare_gravestone(item: Item, now: datetime) -> Item:
    """What a purge leaves at the slot of the event item (or claim) ``item`` written within
    :data:`LATE_TURN_SECONDS` of ``now``: its key and life, no data, removed by TTL."""
    return {
        A_PK: item[A_PK],
        A_SK: item[A_SK],
        A_SCHEMA: SCHEMA_VERSION,
        A_GEN: item.get(A_GEN, ""),
        A_COUNT: 0,
        A_EXPIRES: int(now.timestamp()) + GRAVESTONE_SECONDS,
    }


def keeps_slot(item: Item, now: datetime) -> bool:
    """Whether a purge at ``now`` leaves a bare gravestone at the slot of the event item
    ``item`` instead of deleting it: a clear's claim still due, or an item written within
    :data:`LATE_TURN_SECONDS` (by the time of its head state, else of its newest event;
    ``True`` when neither can be read: a purge keeps the slot of what it cannot date)."""
    expires = item.get(A_EXPIRES)
    if item.get(A_COUNT) == 0 and isinstance(expires, int | float):
        return expires > now.timestamp()
    try:
        if A_STATE in item:
            state = json.loads(str(item[A_STATE]))
            stamps = [state["updated_at"]]
        else:
            body = json.loads(str(item[A_BODY]))
            stamps = [event["at"] for event in (body if isinstance(body, list) else [body])]
        written = max(datetime.fromisoformat(str(stamp)) for stamp in stamps)
        return (now - written).total_seconds() < LATE_TURN_SECONDS
    except (KeyError, TypeError, ValueError):
        return True


def slot_free(
    stored: Item | None, gen: str, marker_version: int | None, *, head_locked: bool = False
) -> bool:
    """Whether a commit of the life ``gen`` may write at a slot holding ``stored``: nothing;
    another life's gravestone (that life is deleted); or this life's marker of version
    ``marker_version`` (the head the commit read), when it is no gravestone.

    Nothing else of another life is ever overwritten, and a life's own gravestone never:
    so a late turn of a deleted life cannot land, neither in its old slot nor on a new
    life's items. The one exception is ``head_locked``: a commit that puts ``HEAD`` in the
    same transaction, on the condition that it is still the one read (or absent), may write
    over any item of another life, as every older build did: ``HEAD`` says which life is
    the live one, so another life's item is a leftover (of a life whose ``HEAD``
    DynamoDB's TTL removed, before the stream's reclaim deletes it).
    """
    if stored is None:
        return True
    if head_locked and stored.get(A_GEN) != gen:
        return True
    if stored.get(A_COUNT) != 0:
        return False
    if stored.get(A_GEN) != gen:
        return A_EXPIRES in stored
    return (
        marker_version is not None
        and stored.get(A_VERSION) == marker_version
        and A_EXPIRES not in stored
    )
