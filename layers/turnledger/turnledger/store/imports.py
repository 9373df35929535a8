"""Imports: a conversation created whole from an export, all or nothing over several writes.

The events go under a hidden *staging head* (a tombstone, which every reader sees as
absent) whose base covers everything staged so far; the last write replaces it with the
conversation's head, conditionally, so the conversation appears whole or not at all. A
failure purges what was staged; a crash leaves a due tombstone that clear, sweep and
TTL remove like a purge that died (:mod:`.purge`).
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from ..core.exceptions import ConversationBusy, ConversationExists, StateError, TurnledgerError
from ..core.models import ConversationKey, ConversationStatus, Event, Head
from . import codec, commit, keys, purge
from .backend import Put, SlotFree, head_is
from .codec import Item
from .commit import MAX_EVENTS_PER_COMMIT, new_generation

if TYPE_CHECKING:
    from .base import ConversationStore


def import_conversation(
    store: ConversationStore,
    key: ConversationKey,
    head: Head,
    events: Sequence[Event],
    now: datetime,
) -> Head:
    """Create ``key`` as ``head`` with ``events`` (public sequences 1..n), all or nothing.

    ``head`` gives the conversation's state; its ``gen``, ``version``, ``base`` and
    ``seq`` are chosen here. The events go in commits of at most
    ``MAX_EVENTS_PER_COMMIT``, each under a *staging head*: a tombstone (which
    every reader sees as absent) whose ``base`` covers everything staged so far,
    naming a next life other than the one the events are written in. The final
    write replaces the staging head with ``head``, conditionally, so the
    conversation appears whole or not at all. A failure purges the staging head;
    a crash leaves it, and since it is a tombstone due in
    ``import_staging_seconds``, clear, sweep and TTL remove it with every event
    and object it covers, like a purge that died. A turn sent meanwhile starts its
    life above the staged events and makes the import fail ``ConversationBusy``.

    Returns:
        The head as written.

    Raises:
        ConversationExists: the id holds a live (or unreadable) conversation.
        ConversationBusy: a clear is in flight, or the head changed during the import.
        PayloadTooLarge: an event is over what the backend holds.
    """
    pk = keys.partition_key(key)
    item = store._get_item(pk, keys.HEAD_SK)
    if item is not None and codec.A_FENCE in item:
        raise ConversationBusy("the conversation is being cleared; retry")
    previous: Head | None = None
    if item is not None:
        try:
            previous = codec.decode_head(codec.without_content(item))
        except StateError as exc:
            raise ConversationExists(
                f"conversation {key.conversation_id!r} exists (its head cannot be read)"
            ) from exc
        if previous.status is not ConversationStatus.CLEARED:
            raise ConversationExists(f"conversation {key.conversation_id!r} exists")
    # Above every item of the partition, so nothing staged ever overwrites an old one.
    base = max(previous.seq if previous else 0, purge.highest_event_sequence(store, pk))
    final = head.model_copy(update={"gen": new_generation(), "base": base})
    staging_gen = new_generation()
    expected = item  # the stored head each step is conditional on
    version = previous.version if previous else 0
    written = 0
    attempt = secrets.token_hex(4)
    try:
        for chunk in _import_chunks(store, key, final, events, attempt):
            staging = Head(
                gen=staging_gen,
                version=version + 1,
                base=base + written + len(chunk),
                seq=base + written + len(chunk),
                turn=0,
                status=ConversationStatus.CLEARED,
                created_at=now,
                updated_at=now,
                ttl_seconds=0,
                expires_at=int(now.timestamp()) + store.import_staging_seconds,
            )
            staging_item = codec.encode_head(key, staging)
            stored_gen = str(expected.get(codec.A_GEN, "")) if expected is not None else ""
            try:
                read = None if expected is None else codec.expected_head(version, stored_gen)
                store._transact(
                    [
                        *(Put(event_item, SlotFree(stored_gen)) for event_item, _ in chunk),
                        Put(staging_item, head_is(read)),
                    ]
                )
            except BaseException:
                commit.discard(store, [ref for _, ref in chunk if ref is not None])
                raise
            expected, version, written = staging_item, staging.version, written + len(chunk)
        final = final.model_copy(update={"version": version + 1, "seq": base + written})
        if not store._replace_head(store.sealer.seal(codec.encode_head(key, final)), expected):
            raise ConversationBusy("the conversation changed during the import; retry")
    except TurnledgerError:
        if written:
            # Best effort: what is left is a due tombstone that the sweep finishes.
            with contextlib.suppress(Exception):
                purge.purge(store, key, expected, now)
        raise
    return final


def _import_chunks(
    store: ConversationStore,
    key: ConversationKey,
    head: Head,
    events: Sequence[Event],
    attempt: str,
) -> Iterator[list[tuple[Item, str | None]]]:
    """``events`` as items of ``head``'s life (payloads offloaded as a commit would), in
    chunks of at most ``MAX_EVENTS_PER_COMMIT`` items and ``import_chunk_bytes``."""
    chunk: list[tuple[Item, str | None]] = []
    size = 0
    for event in events:
        payload = codec.stored_payload(event)
        ref = commit.offload(store, key, head, event.sequence, payload, attempt)
        event_item = store.sealer.seal(codec.encode_event(key, head, event, ref, payload=payload))
        item_bytes = codec.item_size(event_item)
        if chunk and (
            len(chunk) >= MAX_EVENTS_PER_COMMIT or size + item_bytes > store.import_chunk_bytes
        ):
            yield chunk
            chunk, size = [], 0
        chunk.append((event_item, ref.key if ref else None))
        size += item_bytes
    if chunk:
        yield chunk
