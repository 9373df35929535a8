"""The commit: a turn lands whole or not at all, in one conditional write.

A commit puts its events in one *turn item* at the life's next *slot* (the storage
sequence after the newest item: docs/STORAGE.md, "One item per turn"); the newest turn
item also holds the head's *fast state*. The slot's condition is the optimistic lock
(:func:`.slots.slot_free`): free, another life's gravestone, or this life's *marker* of
the version the turn read. ``HEAD`` (the *slow state*) is put in the same transaction
only when what it holds changes, when inbox entries change, when the events need more
than one item, or when the conversation is *crowded* (leftovers of another life lie
below ``HEAD``: then ``HEAD``'s condition is the lock). A lost race raises
:class:`~turnledger.core.exceptions.ConversationBusy` and nothing of it is stored.
Offloaded payloads are written first under keys unique to the commit call, and deleted
again when the backend refuses the write.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..core.exceptions import InternalError, TurnledgerError
from ..core.models import ConversationKey, Event, Head
from . import codec, inbox, keys, views
from .backend import Delete, Put, SlotFree, head_is
from .codec import BlobRef, Item
from .views import View, head_identity

if TYPE_CHECKING:
    from .base import ConversationStore


#: Payloads at or over this size go to S3. DynamoDB's item limit is 400 KB; a
#: 64 KiB threshold leaves wide margin for the item's other attributes and
#: keeps event reads cheap (a read unit covers 4 KiB).
DEFAULT_OFFLOAD_THRESHOLD = 64 * 1024


#: A transaction holds at most 100 items; one is the head.
MAX_EVENTS_PER_COMMIT = 99


def new_generation() -> str:
    """A fresh name for one life of a conversation."""
    return secrets.token_hex(6)


def turn_chunks(bodies: list[Item], limit: int = codec.MAX_ITEM_BYTES) -> list[list[Item]]:
    """``bodies`` (one commit's event items, oldest first) in runs that each fit one turn
    item under ``limit`` (the item size limit, less what sealing adds), as few as
    possible, in order."""
    chunks: list[list[Item]] = []
    size = 0
    for body in bodies:
        grows = codec.item_size(body)
        if chunks and size + grows <= limit:
            chunks[-1].append(body)
            size += grows
        else:
            chunks.append([body])
            size = grows
    return chunks


def commit(
    store: ConversationStore,
    key: ConversationKey,
    *,
    expected_version: int | None,
    head: Head,
    events: Sequence[Event],
    inbox_changes: inbox.InboxChanges | None = None,
) -> int:
    """Append ``events`` and replace the head, atomically.

    Args:
        expected_version: the head version the caller read (``None``: no head).
        head: the new head; its ``version`` must be ``expected_version + 1``
            and its ``seq`` must cover ``events``.
        events: new events with consecutive public sequences after the old head.
        inbox_changes: the approval inbox entries to write and delete in the same
            transaction, as the turn layer decided them (the calls that start or
            stop waiting for a person: :func:`turnledger.turn.lifecycle.inbox_changes`).

    Returns:
        The bytes written: the items' attribute names and values, and offloaded objects.

    Raises:
        ConversationBusy: the head changed since it was read (another version, or
            another life of the conversation); nothing was stored.
        PayloadTooLarge: an item, or the whole write, would exceed what the backend
            can hold; nothing was stored.
        InternalError: the commit breaks its own rules (more than
            ``MAX_EVENTS_PER_COMMIT`` events, ``head.seq`` not covering them).
    """
    if len(events) > MAX_EVENTS_PER_COMMIT:
        raise InternalError(f"a commit holds at most {MAX_EVENTS_PER_COMMIT} events")
    if events and head.base + events[-1].sequence != head.seq:
        raise InternalError("head.seq does not cover the committed events")
    attempt = secrets.token_hex(4)
    written: list[str] = []
    offloaded = 0
    try:
        items = []
        for event in events:
            payload = codec.stored_payload(event)
            ref = offload(store, key, head, event.sequence, payload, attempt)
            if ref is not None:
                written.append(ref.key)
                offloaded += ref.size
            items.append(codec.encode_event(key, head, event, ref, payload=payload))
    except BaseException:
        discard(store, written)
        raise
    # One item for the commit's events (docs/STORAGE.md): 1 WCU per started KiB of it
    # (more only when they would not fit one); with none, a marker. The first takes the
    # next slot; the newest holds the head's fast state.
    turn_items = [
        codec.encode_turn_item(key, head, chunk)
        for chunk in turn_chunks(items, store.sealer.clear_limit(codec.MAX_ITEM_BYTES))
    ]
    turn_items = turn_items or [codec.marker_item(key, head)]
    turn_items[-1] = codec.with_state(turn_items[-1], head)
    turn_items = [store.sealer.seal(item) for item in turn_items]
    pk = keys.partition_key(key)
    try:
        view = views.view_for(store, pk, expected_version)
    except BaseException:
        discard(store, written)
        raise
    head_item = store.sealer.seal(codec.encode_head(key, codec.head_of_record(head)))
    # HEAD only when what it holds changes (or leftovers of another life crowd the next
    # slots, or it holds content a build that did not seal wrote there): a plain turn
    # is one conditional put. Slow fields are never content: they compare in clear.
    write_head = (
        view.crowded
        or not codec.same_slow_state(view.head_item, head_item)
        or store.sealer.reseals(view.head_item)
    )
    changes = inbox_changes or inbox.InboxChanges()
    puts = [store.sealer.seal(inbox.entry_item(key, head.gen, entry)) for entry in changes.puts]
    deletes = [inbox.entry_sort_key(call_id) for call_id in changes.deletes]
    if len(events) + len(puts) + len(deletes) > MAX_EVENTS_PER_COMMIT:
        # One transaction holds 100 items; the inbox entries count with the events.
        discard(store, written)
        raise InternalError(
            f"a commit holds at most {MAX_EVENTS_PER_COMMIT} events and inbox entries"
        )
    try:
        if write_head or puts or deletes or len(turn_items) > 1:
            # HEAD's condition is the lock: another life's items are leftovers.
            free = SlotFree(head.gen, expected_version, head_locked=write_head)
            # Inbox entries (store/inbox.py): unconditional, the slot's condition guards them.
            store._transact(
                [
                    *(Put(item, free) for item in turn_items),
                    *(Put(entry) for entry in puts),
                    *(Delete(pk, sort_key) for sort_key in deletes),
                    *(
                        [Put(head_item, head_is(head_identity(view.head_item)))]
                        if write_head
                        else []
                    ),
                ]
            )
        else:
            store._put_turn(turn_items[0], expected_version)
    except TurnledgerError as exc:
        # The backend answered "no": nothing of the turn is stored, so its objects go too.
        # Unless it failed on its side (ServiceUnavailable.outcome_unknown): the
        # transaction may have landed, and then its events point at these objects.
        if not getattr(exc, "outcome_unknown", False):
            discard(store, written)
        raise
    # Any other failure (a timeout, a dropped connection) leaves the outcome unknown:
    # the objects stay, since deleting them could break a turn that did land. If it
    # did not, they are leftovers under the conversation's prefix that clear and sweep
    # remove.
    # Leftovers may lie above the slot just written: the next commit reads again.
    if view.crowded:
        store.views.forget(pk)
    else:
        store.views.remember(pk, View(head_item if write_head else view.head_item, head.version))
        store.views.keep_context(pk, views.context_after(store, pk, head.gen, turn_items))
    heads = [head_item] if write_head else []
    return sum(codec.item_size(item) for item in [*turn_items, *puts, *heads]) + offloaded


def offload(
    store: ConversationStore,
    key: ConversationKey,
    head: Head,
    sequence: int,
    payload: dict[str, Any],
    attempt: str,
) -> BlobRef | None:
    data = codec.payload_bytes(payload)
    if len(data) < store.offload_threshold:
        return None
    digest = hashlib.sha256(data).hexdigest()
    blob = keys.blob_key(key, head.gen, head.base + sequence, digest, attempt=attempt)
    store.blobs.put(blob, data)
    return BlobRef(key=blob, sha256=digest, size=len(data))


def discard(store: ConversationStore, written: list[str]) -> None:
    # Best effort: the commit's own error is what the caller must see, and an object
    # left behind is removed with the conversation's prefix later.
    if written:
        with contextlib.suppress(Exception):
            store.blobs.delete_keys(written)
