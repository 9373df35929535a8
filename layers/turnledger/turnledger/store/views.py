"""Reads of the head, and what an execution environment remembers of them.

A *view* (:class:`View`) is what a commit needs of what its turn read: the ``HEAD``
item as stored and the effective head's version (``HEAD`` holds the slow state; the
newest turn item of its life holds the fast state: docs/STORAGE.md, "The head").
A store keeps the views and the newest items of the conversations it read or wrote in
an explicit :class:`ViewCache`, so a commit needs no read of its own and a load reads
only what lies above the items it kept (docs/STORAGE.md, "Reads").
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from ..core.exceptions import ConversationBusy, CorruptedState, StateError
from ..core.models import ConversationStatus, Head
from . import codec, keys
from .backend import Page
from .codec import Item
from .runs import flag_off

if TYPE_CHECKING:
    from .base import ConversationStore


#: Items the first query of a load reads: the head and the newest events, consistently.
#: Enough for a short conversation in one round trip; small, because the rest is read at
#: the eventually consistent (half) price, and what it reads below the summary is paid for.
FIRST_PAGE = 8


def storage_sequence(item: Item) -> int:
    """The storage sequence of the event item (or marker) ``item``: its sort key's."""
    sort_key = str(item.get(codec.A_SK, ""))
    try:
        return keys.sequence_of(sort_key)
    except ValueError as exc:
        raise CorruptedState(
            "an item of the transcript has no event key",
            details={"item": sort_key, "reason": str(exc)},
        ) from exc


def head_identity(item: Item | None) -> Item | None:
    """What a conditional write expects of the ``HEAD`` item ``item`` (``None``: no head)."""
    if item is None:
        return None
    return {
        name: item[name] for name in (codec.A_VERSION, codec.A_GEN, codec.A_FENCE) if name in item
    }


def needs_more(items: Sequence[Item]) -> bool:
    """Whether a descending read from ``HEAD`` (``items``, so far) has yet to reach the newest
    item of ``HEAD``'s life: a live ``HEAD`` followed by no item, or only by other lives'."""
    if not items or items[0].get(codec.A_SK) != keys.HEAD_SK:
        return False
    gen = items[0].get(codec.A_GEN)
    if any(item.get(codec.A_GEN) == gen for item in items[1:]):
        return False
    # A tombstone's life has no item yet; the items below it are the purge's to delete.
    return len(items) == 1 or tombstone_of(items[0]) is None


def tombstone_of(item: Item) -> Head | None:
    """The tombstone ``item`` holds, or ``None`` (a live head, or one that cannot be read)."""
    try:
        head = codec.decode_head(codec.without_content(item))
    except StateError:
        return None
    return head if head.status is ConversationStatus.CLEARED else None


@dataclass(frozen=True)
class View:
    """What a commit needs of what its turn read: the ``HEAD`` item as stored (``None``:
    none) and the effective head's version (docs/STORAGE.md)."""

    head_item: Item | None
    version: int | None
    #: The newest item below ``HEAD`` is another life's: leftovers may hold the next slots,
    #: so commits put ``HEAD`` too (its condition is then the lock, as before issue 21).
    crowded: bool = False


#: Views a store keeps (the newest conversations it read or wrote), so a commit needs no
#: read of its own: an execution environment serves the same conversations again and again.
_VIEWS = 1024


@dataclass(frozen=True)
class Context:
    """The newest event items of one life a load read (newest first, consecutive slots),
    kept by the execution environment: the next load checks that the newest is still the
    newest item and reads only what is above it (docs/STORAGE.md, "Reads")."""

    gen: str
    items: tuple[Item, ...]


#: Conversations whose newest items an execution environment keeps, and items kept of each:
#: as many as a load may read (:class:`ContextBudget`'s 400 events, 400,000 characters), so
#: at most some 16 MB in all.
_CONTEXTS = 32
CONTEXT_ITEMS = 400


class ViewCache:
    """What one execution environment remembers of the conversations it read or wrote: the
    newest :data:`_VIEWS` views (so a commit needs no read of its own) and the newest items
    of :data:`_CONTEXTS` conversations (so a load reads only what is above them). Thread
    safe; a store holds one (``ConversationStore.views``), another environment has its own.
    """

    def __init__(self) -> None:
        self._views: dict[str, View] = {}
        self._contexts: dict[str, Context] = {}
        self._lock = threading.Lock()

    def remember(self, pk: str, view: View) -> None:
        """Keep ``view`` as the newest of ``pk``."""
        with self._lock:
            self._views.pop(pk, None)
            self._views[pk] = view
            while len(self._views) > _VIEWS:
                del self._views[next(iter(self._views))]

    def recalled(self, pk: str) -> View | None:
        """The view kept of ``pk``, if any."""
        with self._lock:
            return self._views.get(pk)

    def forget(self, pk: str) -> None:
        """Drop the view and the items kept of ``pk`` (the next commit and load read anew)."""
        with self._lock:
            self._views.pop(pk, None)
            self._contexts.pop(pk, None)

    def keep_context(self, pk: str, context: Context | None) -> None:
        """Keep ``context`` as the newest items of ``pk`` (``None``: keep none)."""
        with self._lock:
            self._contexts.pop(pk, None)
            if context is not None and context.items:
                self._contexts[pk] = Context(context.gen, context.items[:CONTEXT_ITEMS])
                while len(self._contexts) > _CONTEXTS:
                    del self._contexts[next(iter(self._contexts))]

    def kept_context(self, pk: str) -> Context | None:
        """The newest items kept of ``pk``, if any."""
        with self._lock:
            return self._contexts.get(pk)


def _same_item(a: Item, b: Item) -> bool:
    """Whether ``a`` and ``b`` are one stored item: an item of a life at a slot is never
    rewritten, but for a marker, which a commit replaces at a new version."""
    names = (codec.A_SK, codec.A_GEN, codec.A_VERSION, codec.A_COUNT)
    return all(a.get(name) == b.get(name) for name in names)


def first_page(store: ConversationStore, pk: str) -> tuple[Page, Item | None]:
    """The load's first read: the run flag, ``HEAD`` and the newest items, consistently.
    When this environment kept the newest items of its last read (or commit) and the
    newest of them is still the newest item, only ``HEAD`` and what lies above it are
    read, and the kept items follow (one round trip of about 1 RCU on most turns).

    Returns:
        The page from ``HEAD`` down (the flag taken out), and the run flag's item."""
    kept = store.views.kept_context(pk)
    if kept is not None:
        newest = kept.items[0]
        flag, page = flag_off(
            store._query(
                pk,
                upper=keys.RUN_FLAG_SK,
                lower=str(newest[codec.A_SK]),
                descending=True,
                limit=FIRST_PAGE,
                cursor=None,
            )
        )
        items = page.items
        if (
            page.cursor is None
            and len(items) >= 2
            and items[0].get(codec.A_SK) == keys.HEAD_SK
            and items[0].get(codec.A_GEN) == kept.gen
            and _same_item(items[-1], newest)
        ):
            # The newest item as just read (its head state is what counts), then the
            # kept ones below it, never rewritten; older ones may follow (a cursor).
            return Page([*items, *kept.items[1:]], cursor=True), flag
        store.views.keep_context(pk, None)  # another environment wrote meanwhile: read anew
    page = from_head(store, pk, FIRST_PAGE, upper=keys.RUN_FLAG_SK)
    flag, page = flag_off(page)
    return page, flag


def effective(
    store: ConversationStore, pk: str, items: Sequence[Item], *, content: bool = True
) -> Head | None:
    """The effective head from a descending read from ``HEAD`` (``items``: ``HEAD`` first,
    then the newest event items), remembered for the next commit.

    Args:
        content: open the content of the head state (:mod:`.sealed`); ``False``: leave
            it out (:func:`.codec.without_content`), for readers that use none.

    Raises:
        ContentUnreadable: ``content``, and it does not open (its key was destroyed).
    """
    if not items or items[0].get(codec.A_SK) != keys.HEAD_SK:
        # No HEAD: items read are leftovers of a life whose HEAD TTL removed.
        store.views.remember(pk, View(None, None, crowded=bool(items)))
        return None
    state = partial(opened_state, store) if content else codec.without_content
    head = codec.decode_head(state(items[0]))
    # The newest item of this life: past another life's leftovers and gravestones.
    newest = next((i for i in items[1:] if i.get(codec.A_GEN) == head.gen), None)
    effective = codec.effective_head(head, None if newest is None else state(newest))
    crowded = len(items) > 1 and items[1].get(codec.A_GEN) != head.gen
    store.views.remember(pk, View(items[0], effective.version, crowded))
    return effective


def opened_state(store: ConversationStore, item: Item) -> Item:
    """``item`` (``HEAD`` or an event item) with its head state's content opened; a turn
    item's events are left out (only its state is read here)."""
    if codec.A_SK in item and item[codec.A_SK] != keys.HEAD_SK:
        item = {name: value for name, value in item.items() if name != codec.A_BODY}
    return store.sealer.open(item)


def from_head(store: ConversationStore, pk: str, limit: int, *, upper: str = keys.HEAD_SK) -> Page:
    """The first ``limit`` items descending from ``HEAD``, consistently; at least ``HEAD``
    and the newest item of ``HEAD``'s life below it when there is one, however the
    backend pages and however many leftovers of other lives lie above it.
    ``upper=keys.RUN_FLAG_SK``: the run flag first, when there is one."""
    page = store._query(pk, upper=upper, lower=None, descending=True, limit=limit, cursor=None)
    items = page.items
    while page.cursor is not None and needs_more(flag_off(Page(items))[1].items):
        # Only past leftovers (a life that began after TTL removed the last HEAD, before
        # the stream's reclaim) or a page of HEAD alone: rare, and bounded by them.
        page = store._query(
            pk,
            upper=keys.HEAD_SK,
            lower=None,
            descending=True,
            limit=FIRST_PAGE,
            cursor=page.cursor,
        )
        items = [*items, *page.items]
    return Page(items, page.cursor)


def read_view(
    store: ConversationStore, pk: str, *, content: bool = True
) -> tuple[Head | None, View]:
    """The effective head and its view, read consistently: ``HEAD`` and the newest items
    (``content``: as in :meth:`effective`)."""
    items = from_head(store, pk, 2).items
    head = effective(store, pk, items, content=content)
    view = store.views.recalled(pk)
    assert view is not None
    return head, view


def view_for(store: ConversationStore, pk: str, expected_version: int | None) -> View:
    """The view a commit expecting ``expected_version`` works from: remembered when it is
    that version, else read.

    Raises:
        ConversationBusy: the conversation is at another version, or being cleared.
    """
    view = store.views.recalled(pk)
    if view is None or view.version != expected_version:
        _, view = read_view(store, pk)
    if view.version != expected_version:
        raise ConversationBusy("another turn or decision on this conversation committed first")
    if view.head_item is not None and codec.A_FENCE in view.head_item:
        raise ConversationBusy("the conversation is being cleared; retry")
    return view


def context_after(store: ConversationStore, pk: str, gen: str, written: list[Item]) -> Context:
    """What this environment keeps of the conversation once it wrote ``written`` (turn
    items or a marker, oldest first): those, over what it kept before when that ends
    just below them (a marker they replaced left out)."""
    kept = store.views.kept_context(pk)
    newest = tuple(reversed(written))
    if kept is None or kept.gen != gen:
        return Context(gen, newest)
    below = [i for i in kept.items if i.get(codec.A_SK) != written[0].get(codec.A_SK)]
    if below and codec.last_sequence(below[0]) + 1 == storage_sequence(written[0]):
        return Context(gen, (*newest, *below))
    return Context(gen, newest)
