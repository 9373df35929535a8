"""Content removed when its data class's retention is due: the rewrite of event items.

A data class's ``retention_seconds`` (``turnledger.context.policy``) may be shorter than
its conversation's life. The sweep (``turnledger.ops.sweep``) then removes the content of
the conversation's events older than the retention with :func:`remove_content`: each event
item (a turn item of several events, or an item of one: docs/STORAGE.md) holding such an
event has its body rewritten, the event's content replaced by a marker
(:func:`removal_marker`) and everything else kept: ids, kinds, sequences, the turn, the
time, the tool call's id and name, the model and usage. A payload offloaded to the bucket
is brought inline as its marker and its object deleted.

What is content (:data:`REMOVABLE`): the texts of user and assistant messages, an
assistant's tool call arguments, a tool call's arguments, a tool's output and the input a
tool was given. An event already removed is left as it is, so a second sweep writes
nothing.

Each rewrite is one conditional update of the item's body (:class:`.backend.Update` on
:class:`.backend.Unchanged` of the body read): only the body changes, the head state a
turn item carries stays as it is, and a body another writer changed meanwhile is not
overwritten (the next sweep tries again). Only the conversation's own life is rewritten:
events a fork inherits are its ancestor's, removed by its ancestor's retention.

The rewrite also says when the oldest content it kept was written (:attr:`Removal.kept_since`):
the sweep files the head under the time that falls due (:func:`refile_retention`), so the
scheduled sweep finds it then on the ``by-wait`` index (docs/STORAGE.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..core.models import ConversationKey, ConversationStatus, EventKind, Head
from . import codec, keys
from .backend import ConditionFailed, Unchanged, Update
from .codec import Item, StoredEvent
from .purge import replace_filing
from .reads import _fetch, leftover, pieces

if TYPE_CHECKING:
    from .base import ConversationStore

#: What a removal marker says removed the content.
RETENTION = "retention"
#: Items a page of the rewrite reads.
_PAGE = 100


def removal_marker(data_class: str, at: datetime) -> dict[str, str]:
    """The marker that takes the place of removed content: why, the class, and when."""
    return {"removed": RETENTION, "class": data_class, "at": at.isoformat()}


def _marker_text(marker: dict[str, str]) -> str:
    return json.dumps(marker, separators=(",", ":"))


def _message(payload: dict[str, Any], marker: dict[str, str]) -> dict[str, Any]:
    return {**payload, "content": _marker_text(marker), "metadata": {}}


def _answer(payload: dict[str, Any], marker: dict[str, str]) -> dict[str, Any]:
    removed = dict(payload)
    if payload.get("content") is not None:
        removed["content"] = _marker_text(marker)
    if payload.get("content_json") is not None:
        removed["content_json"] = marker
    removed["tool_calls"] = [
        {**call, "arguments": marker, "raw_arguments": None}
        for call in payload.get("tool_calls") or []
    ]
    return removed


def _arguments(payload: dict[str, Any], marker: dict[str, str]) -> dict[str, Any]:
    return {**payload, "arguments": marker}


def _output(payload: dict[str, Any], marker: dict[str, str]) -> dict[str, Any]:
    return {**payload, "output": _marker_text(marker)}


def _question(payload: dict[str, Any], marker: dict[str, str]) -> dict[str, Any]:
    return {**payload, "message": _marker_text(marker)}


#: The kinds whose payload holds content, and what their payload becomes.
REMOVABLE: dict[EventKind, Callable[[dict[str, Any], dict[str, str]], dict[str, Any]]] = {
    EventKind.USER_MESSAGE: _message,
    EventKind.ASSISTANT_MESSAGE: _answer,
    EventKind.TOOL_CALL_REQUESTED: _arguments,
    EventKind.TOOL_RESULT: _output,
    EventKind.TOOL_INPUT_PROVIDED: _output,
    EventKind.TOOL_INPUT_REQUESTED: _question,
}


def is_removed(payload: dict[str, Any]) -> bool:
    """Whether ``payload`` is one whose content :func:`remove_content` already removed."""
    return any(
        isinstance(value, dict) and value.get("removed") == RETENTION
        for value in (payload.get("arguments"), payload.get("content_json"))
    ) or any(
        isinstance(value, str) and value.startswith('{"removed":"' + RETENTION)
        for value in (payload.get("content"), payload.get("output"))
    )


@dataclass
class Removal:
    """What :func:`remove_content` removed."""

    #: The public sequences whose content was removed.
    sequences: list[int] = field(default_factory=list)
    #: Event items rewritten (one write each).
    items: int = 0
    #: Event items another writer changed meanwhile: left for the next sweep.
    skipped: int = 0
    #: When the oldest content left in place was written (``None``: none is left).
    kept_since: datetime | None = None

    def keep(self, at: datetime) -> None:
        """Note content written at ``at`` that stays."""
        if self.kept_since is None or at < self.kept_since:
            self.kept_since = at


def remove_content(
    store: ConversationStore,
    key: ConversationKey,
    head: Head,
    *,
    before: datetime,
    marker: dict[str, str],
) -> Removal:
    """Replace by ``marker`` the content of ``head``'s own events that occurred before
    ``before`` (:data:`REMOVABLE`), rewriting only the items that hold one.

    Raises:
        CorruptedState, UnsupportedStateVersion: an event item cannot be read.
    """
    removal = Removal()
    own = [piece for piece in pieces(key, head) if piece.key == key]
    if not own:
        return removal
    piece = own[0]
    pk = keys.partition_key(key)
    cursor: Any = None
    while True:
        page = store._query(
            pk,
            lower=keys.event_sort_key(piece.base + piece.first),
            upper=keys.event_sort_key(piece.base + piece.last),
            descending=False,
            limit=_PAGE,
            cursor=cursor,
        )
        for item in page.items:
            if leftover(item, piece):
                continue
            _rewrite(store, pk, item, piece.gen, piece.base, before, marker, removal)
        if page.cursor is None:
            break
        cursor = page.cursor
    if removal.items:
        # The newest items this environment remembers may be among those rewritten.
        store.views.forget(pk)
    return removal


def _rewrite(
    store: ConversationStore,
    pk: str,
    item: Item,
    gen: str,
    base: int,
    before: datetime,
    marker: dict[str, str],
    removal: Removal,
) -> None:
    """Rewrite ``item``'s body if one of its events is due (:func:`remove_content`)."""
    opened = store.sealer.open(item)
    if codec.event_count(opened) == 0:
        return  # a marker of a commit: a head state, no event
    events = codec.decode_turn_item(opened, gen)
    changed: list[StoredEvent] = []
    objects: list[str] = []
    sequences: list[int] = []
    for sequence, stored, _ in events:
        remove = REMOVABLE.get(stored.kind)
        if remove is None or stored.at >= before:
            if remove is not None:
                removal.keep(stored.at)
            changed.append(stored)
            continue
        payload = _fetch(store, stored.ref) if stored.ref is not None else stored.payload or {}
        if is_removed(payload):
            changed.append(stored)
            continue
        if stored.ref is not None:
            objects.append(stored.ref.key)
        changed.append(stored.model_copy(update={"payload": remove(payload, marker), "ref": None}))
        sequences.append(sequence - base)
    if not sequences:
        return
    bodies = [s.model_dump_json(exclude_none=True) for s in changed]
    body = bodies[0] if codec.A_COUNT not in opened else "[" + ",".join(bodies) + "]"
    sk = str(item[codec.A_SK])
    attributes = store.sealer.seal_attributes(pk, sk, item.get(codec.A_GEN), {codec.A_BODY: body})
    try:
        store._write(
            Update(pk, sk, attributes, when=Unchanged({codec.A_BODY: item.get(codec.A_BODY)}))
        )
    except ConditionFailed:
        removal.skipped += 1
        # Kept for now: the next sweep must still find what it could not remove.
        for _, unchanged, _ in events:
            if unchanged.kind in REMOVABLE:
                removal.keep(unchanged.at)
        return
    if objects:
        store.blobs.delete_keys(objects)
    removal.items += 1
    removal.sequences.extend(sequences)


def refile_retention(
    store: ConversationStore, key: ConversationKey, head: Head, due: datetime | None
) -> bool:
    """File ``key``'s ``HEAD`` (of ``head``'s life; ``head`` the effective head read) as
    holding retained content that falls due at ``due`` (``None``: none), on ``by-wait``
    under the earlier of ``due`` and its wait deadline; nothing else of it changes (its
    version stays). Conditional on ``HEAD`` being unchanged since it is read here.

    Returns:
        Whether ``HEAD`` holds ``due`` now (``False``: it changed meanwhile, or is gone,
        fenced or of another life: the writer that changed it filed it).
    """
    item = store._get_item(keys.partition_key(key), keys.HEAD_SK)
    if item is None or item.get(codec.A_GEN) != head.gen or codec.A_FENCE in item:
        return False
    stored = codec.decode_head(codec.without_content(item))
    if stored.status is ConversationStatus.CLEARED:
        return False
    if stored.retention_due == due and stored.wait_deadline == head.wait_deadline:
        return True  # filed so already: nothing to write
    moved = stored.model_copy(update={"retention_due": due, "wait_deadline": head.wait_deadline})
    return replace_filing(store, key, item, moved)
