"""The purge: clear, sweep and erasure delete a conversation's life, and what forks keep.

The purge protocol (clear, sweep, a turn on an expired conversation)
    1. Replace the head with a *tombstone*, in one transaction with a *gravestone* that
       claims the life's next *slot* (the *claim*), on the condition that the head is
       still the one read (absent, when there was none but leftovers remain): a commit
       that read before can no longer land (its slot is taken, :func:`.slots.slot_free`),
       and readers see nothing. The tombstone names the next life (a new ``gen``) and
       keeps the storage sequence's high-water mark as its base, so a turn that starts
       during the purge writes above every old item and can never be mixed with them.
    2. Delete every item of the conversation's partition except the head and what the
       next life may have written: event items up to the tombstone's base (those that a
       late turn could still target become gravestones, :func:`.slots.keeps_slot`), and
       items of any other kind (idempotency records ``I#``, side items ``S#``...) unless
       they carry the next life's ``g``; then every object of the conversation that is
       not the next life's. The events forks still read stay (:func:`retention`), and
       the forks of the deleted lives are released (:func:`release_forks`).
    3. Delete the tombstone if it is unchanged (no new life began); one that forks still
       read below stays, with no expiry, until the release that frees the last of them.

Clear wins: the fence
    The sweep purges only the head it judged expired, so a turn that lands first makes it
    give up, as it should. A clear (``DELETE``, erasure) must win instead, in bounded
    time, however many turns keep committing; retrying step 1 cannot promise that, since
    each retry reads a head the next commit replaces. So a clear first *fences* the head:
    one transaction, conditional on the head as read (``ver``, ``g``, no ``fx``), that
    sets ``fx`` to a token of this clear and claims the next slot with a gravestone
    (:func:`_fence`; a head that cannot be read is fenced alone, as no turn commits on
    it). Every conditional head write compares ``fx`` together with ``ver`` and ``g``
    (each equal, or absent in both) and only a clear writes ``fx``, so from the fence on:

    * no commit can land: one that read before finds its slot claimed, one that reads
      after refuses a fenced head (:func:`.views.view_for`); both raise ConversationBusy;
    * the storage sequence's high-water mark is final: the tombstone's base, computed
      after the fence, covers every old item, and step 1's guarantee holds;
    * the sweep's conditional purge and re-filing fail too (they expect no fence) and
      leave the conversation to the clear.

    Step 1 is then conditional on the fenced head, token included: it fails only when
    another clear replaced it. A clear that finds a fence already there *adopts* it
    (writes none of its own, so two clears never undo each other's fences) and races
    its owner to step 1: the first tombstone wins, and the other clear reads it and
    finishes that purge. A clear that finds an unfenced tombstone finishes that purge; a
    fenced tombstone is replaced like any fenced head. Every round of a clear thus either
    writes its tombstone or moves to a state from which the next round ends: turns alone
    can never make it fail. A clear that dies between its fence and its tombstone leaves
    a fenced head on which turns answer busy until the next clear adopts the fence and
    finishes (the sweep clears such a head once it has expired).

    Leftovers of an old life are never read as the new one: a new life starts only on a
    tombstone (above its base) or on no head (conditionally, so a tombstone written
    meanwhile makes it fail), reads check ``g`` on every item, and the items of its range
    are all written by its own commits.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..core.exceptions import ContentUnreadable, ConversationBusy, InternalError, StateError
from ..core.models import MAX_FORK_DEPTH, ConversationKey, ConversationStatus, Head
from . import codec, forks, keys, slots, views
from .backend import Put, SlotFree, head_is
from .codec import Item
from .commit import new_generation
from .indexes import EventStamp
from .reads import events_in
from .sealed import NO_LIFE
from .views import View, head_identity, storage_sequence, tombstone_of

if TYPE_CHECKING:
    from .base import ConversationStore


#: Rounds of a clear before it gives up. Turns cannot make a round fail (see the
#: fence); a few rounds cover other clears, a head appearing over leftovers, TTL.
_CLEAR_ROUNDS = 32


@dataclass
class PurgeReport:
    """What a purge removed, and the provider-side state it found (for the caller to delete:
    the store talks to no model provider)."""

    conversations: int = 0
    events: int = 0
    objects: int = 0
    #: ``(provider, response id)`` of the stored responses the purged head knew of.
    provider_responses: list[tuple[str, str]] = field(default_factory=list)
    #: Deleted conversations' lives kept for their forks and reclaimed once no fork reads
    #: them any more (their events and objects are counted above).
    reclaimed_lives: int = 0

    def __iadd__(self, other: PurgeReport) -> PurgeReport:
        self.conversations += other.conversations
        self.events += other.events
        self.objects += other.objects
        self.reclaimed_lives += other.reclaimed_lives
        self.provider_responses.extend(other.provider_responses)
        return self


def _stored_responses(item: Item) -> list[tuple[str, str]]:
    """``(provider, response id)`` named by the run record of an answer's item, if any:
    answers of this conversation's own turns only (an imported answer's response is its
    source's, which a purge here never deletes).

    Best effort over whatever the item holds: a purge removes damaged items too.
    """
    body = item.get(codec.A_BODY)
    if not isinstance(body, str) or '"response_id"' not in body:
        return []
    try:
        parsed = json.loads(body)
    except ValueError:
        return []
    found: list[tuple[str, str]] = []
    # A turn item's body is the list of its events' bodies; an older item's, one body.
    for event in parsed if isinstance(parsed, list) else [parsed]:
        try:
            if event.get("imported"):
                continue
            run = event["payload"]["run"]
            found.append((str(run["provider"]), str(run["response_id"])))
        except (KeyError, TypeError, AttributeError):
            continue
    return found


def _cursor_responses(item: Item, owner: str) -> list[tuple[str, str]]:
    """``(provider, response id)`` of the provider cursor that the head state of a turn item
    (or ``HEAD``) names, if any: clear at rest (:data:`.codec.STATE_CONTENT`), so a purge
    reads it after an erasure destroyed the keys that sealed the run records. Only a cursor
    ``owner`` (the conversation purged) owns: a fork's inherited one is its parent's
    (:meth:`~turnledger.core.models.ProviderCursor.owned_by`).

    Best effort over whatever the item holds: a purge removes damaged items too.
    """
    name = codec.state_attribute(item)
    state = None if name is None else item.get(name)
    if not isinstance(state, str) or '"provider_cursor"' not in state:
        return []
    try:
        cursor = json.loads(state)["provider_cursor"]
        if cursor.get("conversation_id") not in (None, owner):
            return []
        return [(str(cursor["provider"]), str(cursor["response_id"]))]
    except (ValueError, KeyError, TypeError, AttributeError):
        return []


def clear(store: ConversationStore, key: ConversationKey, now: datetime) -> PurgeReport:
    """Delete the conversation, its events, its other items and its objects; absent is fine.

    Wins against concurrent turns in bounded time (the fence, in the module
    docstring): turns that race it answer ConversationBusy, the clear never does.
    Works on corrupted and unknown-version heads too: that is how they recover.
    Also removes what a head left behind when DynamoDB's TTL deleted it.

    Returns:
        What was removed (all zeros for an absent conversation).

    Raises:
        InternalError: the head kept changing in ways no turn can cause (a bug).
    """
    pk = keys.partition_key(key)
    for _ in range(_CLEAR_ROUNDS):
        item = store._get_item(pk, keys.HEAD_SK)
        if item is not None and codec.A_FENCE not in item:
            tomb = tombstone_of(item)
            if tomb is not None:
                return _finish_purge(store, key, tomb, PurgeReport())
            item = _fence(store, key, item, secrets.token_hex(8), now)
            if item is None:
                continue  # gone, changed, or fenced by another clear first: read again
        report = purge(store, key, item, now)
        if report is not None:
            return report
    raise InternalError("the conversation's head kept changing while it was being cleared")


def _fence(
    store: ConversationStore, key: ConversationKey, item: Item, token: str, now: datetime
) -> Item | None:
    """Fence the head ``item`` as read and claim the conversation's next slot with a
    gravestone, in one write (docs/STORAGE.md, "clear wins"): turns that read the head
    before can no longer land (the slot is taken), turns that read it after refuse.

    Returns the head as fenced, ``None`` when it changed since it was read (or another
    clear fenced it first). A head that cannot be read is fenced alone: no turn can
    commit on it anyway.
    """
    pk = keys.partition_key(key)
    try:
        codec.decode_head(codec.without_content(item))
    except StateError:
        return store._fence_head(pk, token)
    view, claim = _claim(store, key, now)
    if claim is None or not codec.same_head(view.head_item, head_identity(item)):
        return None
    # HEAD as read (its sealed content as it is: bound to HEAD, it opens there).
    fenced = {**item, codec.A_FENCE: token}
    try:
        store._transact(
            [
                Put(claim, SlotFree(str(claim[codec.A_GEN]), view.version)),
                Put(fenced, head_is(head_identity(item))),
            ]
        )
    except ConversationBusy:
        return None
    return fenced


def _claim(
    store: ConversationStore, key: ConversationKey, now: datetime
) -> tuple[View, Item | None]:
    """The view of the conversation as read now, and the gravestone that claims the next
    slot of its effective head (``None``: no head): holding that head's state, its
    content sealed again, when it opens; else no state at all (an erased life's content,
    restored from a backup, is not written again, and no key is made for it)."""
    pk = keys.partition_key(key)
    try:
        live, view = views.read_view(store, pk)
    except ContentUnreadable:
        live, view = views.read_view(store, pk, content=False)
        return view, None if live is None else slots.gravestone(key, live, now, False)
    if live is None:
        return view, None
    return view, store.sealer.seal(slots.gravestone(key, live, now))


def purge_if_unchanged(
    store: ConversationStore, key: ConversationKey, head: Head, now: datetime
) -> PurgeReport | None:
    """Purge the conversation if its head is still ``head`` (same version and life).

    Returns ``None`` (and deletes nothing) when a commit got there first:
    the sweep uses this so a conversation that just got a turn survives.
    """
    if head.status is ConversationStatus.CLEARED:
        # Finishing a tombstone's purge deletes only what lies below it and is not the
        # next life's: safe whatever happened since.
        return purge(store, key, codec.encode_head(key, head), now)
    _, view = views.read_view(store, keys.partition_key(key), content=False)
    item = view.head_item
    # ``head`` as read (the effective head: HEAD and the newest turn item).
    if item is None or item.get(codec.A_GEN) != head.gen or view.version != head.version:
        return None
    if codec.A_FENCE in item:
        return None  # a clear is in flight: it wins
    return purge(store, key, item, now)


def refile(store: ConversationStore, key: ConversationKey, head: Head) -> bool:
    """File a live head under the expiry bucket of its current ``expires_at``.

    The sweep calls this for a head it finds in a bucket that has come due
    while the conversation was still in use. Conditional on the head being
    unchanged; the version stays (this is index upkeep, not a new state), and a
    turn that read the old bucket re-files the head itself.

    Returns:
        Whether the head was re-filed (``False``: it changed meanwhile).
    """
    if head.expires_at is None:
        return False
    # HEAD as stored, re-filed: the head given is the effective one (docs/STORAGE.md).
    item = store._get_item(keys.partition_key(key), keys.HEAD_SK)
    if item is None or item.get(codec.A_GEN) != head.gen or codec.A_FENCE in item:
        return False
    moved = codec.decode_head(codec.without_content(item)).model_copy(
        update={
            "expiry_bucket": keys.bucket_of(head.expires_at),
            "expires_at": codec.bucket_end(head.expires_at),
            "wait_deadline": head.wait_deadline,
        }
    )
    return replace_filing(store, key, item, moved)


def replace_filing(store: ConversationStore, key: ConversationKey, item: Item, moved: Head) -> bool:
    """Replace ``HEAD`` as read (``item``) by ``moved``, the same head filed anew (index
    upkeep: its version stays), unless ``HEAD`` changed since; whether it was replaced."""
    refiled = codec.encode_head(key, moved)
    sealed = item.get(codec.A_CONTENT)
    if isinstance(sealed, bytes):
        # The content is unchanged and was not opened: HEAD keeps it as sealed.
        refiled = {**codec.split_content(refiled), codec.A_CONTENT: sealed}
    else:
        refiled = store.sealer.seal(refiled)
    return store._replace_head(refiled, item)


def purge(
    store: ConversationStore, key: ConversationKey, item: Item | None, now: datetime
) -> PurgeReport | None:
    """Purge the conversation whose head is ``item`` as read (``None``: no head).

    Returns ``None`` when the head is no longer ``item``.
    """
    pk = keys.partition_key(key)
    report = PurgeReport()
    old: Head | None = None
    if item is not None:
        try:
            old = codec.decode_head(codec.without_content(item))
        except StateError:
            old = None  # damaged or from a newer build: replaced all the same
        # A purge that did not finish; a fenced tombstone is replaced like any fenced head.
        if (
            old is not None
            and old.status is ConversationStatus.CLEARED
            and codec.A_FENCE not in item
        ):
            return _finish_purge(store, key, old, report)
    if item is None and not _has_items(store, pk) and not _has_objects(store, key):
        return report  # nothing at all: no tombstone to write
    # The next slot of the life being purged (docs/STORAGE.md, "clear wins"): the
    # tombstone claims it in the same write, so a turn that read before cannot land.
    # A fenced head's clear claimed it with its fence.
    claim: tuple[Item, int | None] | None = None
    if old is not None and item is not None and codec.A_FENCE not in item:
        view, grave = _claim(store, key, now)
        if grave is None or not codec.same_head(view.head_item, head_identity(item)):
            return None
        claim = (grave, view.version)
    top = max(old.seq if old else 0, highest_event_sequence(store, pk))
    if claim is not None:
        top = max(top, storage_sequence(claim[0]))
    # With no head, the tombstone still goes first (on the condition that there is
    # none): a turn creating the conversation meanwhile is never half deleted.
    raw_version = item.get(codec.A_VERSION) if item is not None else None
    version = raw_version if type(raw_version) is int and raw_version > 0 else 0
    tomb = Head(
        gen=new_generation(),
        version=version + 1,
        base=top,
        seq=top,
        turn=0,
        status=ConversationStatus.CLEARED,
        created_at=now,
        updated_at=now,
        ttl_seconds=0,
        # Due at once: if this purge dies before it ends, DynamoDB's TTL removes the
        # tombstone and the stream of that deletion reclaims what is left.
        expires_at=int(now.timestamp()),
    )
    if claim is not None:
        marker, claimed = claim
        try:
            store._transact(
                [
                    Put(marker, SlotFree(str(marker[codec.A_GEN]), claimed)),
                    Put(codec.encode_head(key, tomb), head_is(head_identity(item))),
                ]
            )
        except ConversationBusy:
            return None
    elif not store._replace_head(codec.encode_head(key, tomb), item):
        return None
    report.conversations = 0 if item is None else 1
    cursor = old.provider_cursor if old is not None else None
    if cursor is not None and cursor.owned_by(key.conversation_id):
        report.provider_responses.append((cursor.provider, cursor.response_id))
    return _finish_purge(store, key, tomb, report)


def _finish_purge(
    store: ConversationStore, key: ConversationKey, tomb: Head, report: PurgeReport
) -> PurgeReport:
    pk = keys.partition_key(key)
    kept = retention(store, key)
    report += release_forks(store, key, live_gen=tomb.gen, kept=kept)
    report.events += _delete_partition(store, pk, tomb, report, kept)
    report.provider_responses = list(dict.fromkeys(report.provider_responses))
    report.objects += _delete_objects(store, key, keep_gen=tomb.gen, kept=kept)
    if kept:
        # Forks still read events below the tombstone's base: it stays, so a new life
        # starts above them instead of over them. With no expiry (no TTL removes it, no
        # sweep finishes it); the release that frees the last of them deletes it.
        marker = tomb.model_copy(update={"version": tomb.version + 1, "expires_at": None})
        store._replace_head(codec.encode_head(key, marker), codec.encode_head(key, tomb))
    else:
        store._delete_head(pk, codec.encode_head(key, tomb))
    return report


def _has_items(store: ConversationStore, pk: str) -> bool:
    page = store._query(
        pk, lower=None, upper=None, descending=False, limit=1, cursor=None, keys_only=True
    )
    return bool(page.items)


def _has_objects(store: ConversationStore, key: ConversationKey) -> bool:
    return next(iter(store.blobs.list_keys(keys.blob_prefix(key))), None) is not None


def highest_event_sequence(store: ConversationStore, pk: str) -> int:
    page = store._query(
        pk,
        lower=None,
        upper=keys.event_sort_key(10**12 - 1),
        descending=True,
        limit=1,
        cursor=None,
    )
    if not page.items:
        return 0
    # A marker (a clear's claim among them) holds its slot without an event.
    return max(codec.last_sequence(page.items[0]), storage_sequence(page.items[0]))


def _delete_partition(
    store: ConversationStore, pk: str, tomb: Head, report: PurgeReport, kept: dict[str, int]
) -> int:
    """Delete every item of ``pk`` that ``tomb``'s purge removes; returns the events deleted.

    Kept: the head, event items above the tombstone's sequence (only the next
    life writes there), the events forks still read (``kept``: :meth:`retention`),
    fork references and origins (:func:`release_forks` owns them), and items of other
    kinds that carry the next life's ``g``.
    A deleted side item's companion (in the tenant's own partition) is deleted first.
    The stored provider responses that deleted answers name (their run records)
    are added to ``report``: whole items are read, since a query costs the same
    whatever it projects.
    """
    events = 0
    cursor: Any = None
    owner = keys.parse_partition_key(pk)
    # Erasure destroys keys first (.sealed): the data keys of the lives whose items go
    # are destroyed before their items are deleted, so a purge that dies halfway leaves
    # only ciphertext. ``held``: those keys, kept in memory for this purge's own reads
    # (the provider responses deleted answers name).
    held = store.sealer.hold(owner, [NO_LIFE])
    store.sealer.destroy(owner, [NO_LIFE])
    while True:
        page = store._query(
            pk,
            lower=None,
            upper=None,
            descending=False,
            limit=1000,
            cursor=cursor,
        )
        doomed: list[str] = []
        graves: list[Item] = []
        companions: list[str] = []
        lives = {
            str(item[codec.A_GEN])
            for item in page.items
            if item.get(codec.A_GEN) and item[codec.A_GEN] not in (tomb.gen, *kept, *held)
        }
        held.update(store.sealer.hold(owner, lives))
        store.sealer.destroy(owner, lives)
        for item in page.items:
            sort_key = str(item[codec.A_SK])
            if sort_key == keys.HEAD_SK:
                continue
            if sort_key.startswith((keys.FORK_REF_PREFIX, keys.ORIGIN_PREFIX)):
                continue
            if sort_key.startswith(keys.EVENT_PREFIX):
                try:
                    sequence = keys.sequence_of(sort_key)
                except ValueError:
                    sequence = 0  # not an event key of any life: garbage
                read = forks.reads(kept, item.get(codec.A_GEN), sequence)
                if slots.is_gravestone(item, tomb.updated_at):
                    continue  # it still holds the slot against late turns; TTL removes it
                if sequence <= tomb.base and not read:
                    events += events_in(item)
                    # Its stored provider responses: the cursor its head state names
                    # (clear), and those its run records name (sealed: unless the
                    # tenant's erasure destroyed their keys first).
                    report.provider_responses.extend(_cursor_responses(item, owner.conversation_id))
                    with contextlib.suppress(ContentUnreadable):
                        opened = store.sealer.open(item, held)
                        report.provider_responses.extend(_stored_responses(opened))
                    if slots.keeps_slot(item, tomb.updated_at):
                        # A turn that read before the clear may still target this slot:
                        # a gravestone replaces the item (it is never absent meanwhile).
                        graves.append(slots.bare_gravestone(item, tomb.updated_at))
                    else:
                        doomed.append(sort_key)
            elif item.get(codec.A_GEN) != tomb.gen:
                doomed.append(sort_key)
                companion = item.get(codec.A_COMPANION)
                if isinstance(companion, str) and companion.startswith(keys.SIDE_PREFIX):
                    companions.append(companion)
        if companions:
            tenant = keys.parse_partition_key(pk).tenant
            store._delete_items(keys.partition_key(keys.tenant_items(tenant)), companions)
        if graves:
            store._put_items(graves)
        if doomed:
            store._delete_items(pk, doomed)
        if page.cursor is None:
            return events
        cursor = page.cursor


def _delete_objects(
    store: ConversationStore, key: ConversationKey, *, keep_gen: str | None, kept: dict[str, int]
) -> int:
    """Delete ``key``'s objects but those of the life ``keep_gen`` and the event payloads
    forks still read (``kept``)."""
    keep = keys.blob_prefix(key, keep_gen) if keep_gen else None
    doomed: Iterator[str] = (
        k
        for k in store.blobs.list_keys(keys.blob_prefix(key))
        if not (keep is not None and k.startswith(keep)) and not forks.object_read(key, k, kept)
    )
    return store.blobs.delete_keys(doomed)


def retention(store: ConversationStore, key: ConversationKey) -> dict[str, int]:
    """What forks still read of ``key``'s lives: for each life with references to forks,
    the highest storage sequence any of them inherits (consistent read)."""
    lower, upper = forks.prefix_bounds(keys.FORK_REF_PREFIX)
    kept: dict[str, int] = {}
    for item in store._items_between(keys.partition_key(key), lower, upper):
        ref = forks.decode_ref(item)
        kept[ref.parent_gen] = max(kept.get(ref.parent_gen, 0), ref.keep_through)
    return kept


def release_forks(
    store: ConversationStore, key: ConversationKey, *, live_gen: str | None, kept: dict[str, int]
) -> PurgeReport:
    """Settle the forks among ``key``'s lives other than ``live_gen``, which are being
    deleted: one that forks still read (``kept``) is marked deleted in its parent's
    list; any other releases its reference, and a parent's life that is gone and
    that no fork reads any more is deleted in turn, up the lineage.

    Returns what the releases deleted in ancestors' partitions.
    """
    report = PurgeReport()
    pk = keys.partition_key(key)
    lower, upper = forks.prefix_bounds(keys.ORIGIN_PREFIX)
    for item in list(store._items_between(pk, lower, upper)):
        gen = str(item.get(codec.A_GEN, ""))
        if gen == live_gen:
            continue
        parent_id, parent_gen = forks.decode_origin(item)
        parent = ConversationKey(tenant=key.tenant, conversation_id=parent_id)
        if gen in kept:
            _mark_kept(store, parent, parent_gen, key.conversation_id, gen)
            continue
        report += _release(store, parent, parent_gen, key.conversation_id, gen)
        # Only once released: an origin left by a crash costs one small item, a
        # reference left would keep the parent's events for ever.
        store._delete_items(pk, [keys.origin_key(gen)])
    return report


def _mark_kept(
    store: ConversationStore, parent: ConversationKey, parent_gen: str, fork_id: str, fork_gen: str
) -> None:
    """Move the fork's reference from the parent's list of live forks to the kept ones."""
    pk = keys.partition_key(parent)
    live = keys.fork_ref_key(parent_gen, keys.FORK_LIVE, fork_id, fork_gen)
    item = store._get_item(pk, live)
    if item is None:
        return
    ref = forks.decode_ref(item)
    store._put_items([forks.ref_item(parent, replace(ref, live=False))])
    store._delete_items(pk, [live])


def _release(
    store: ConversationStore, parent: ConversationKey, parent_gen: str, fork_id: str, fork_gen: str
) -> PurgeReport:
    """Drop the reference of a deleted fork to its parent's life, and delete that life
    if it is gone (no head of it stands) and no other fork reads it; then the same for
    its own parent, and so on.

    Safe against the parent's own purge: a purge writes its tombstone before it reads
    the references, so either it sees none left (and deletes everything), or this
    release, deleting the last one after that, finds the life's head gone.
    """
    report = PurgeReport()
    # Origins of reclaimed lives go last, for the reason release_forks gives.
    origins: list[tuple[str, str]] = []
    try:
        _release_up(store, parent, parent_gen, fork_id, fork_gen, report, origins)
    finally:
        for pk, sort_key in origins:
            store._delete_items(pk, [sort_key])
    return report


def _release_up(
    store: ConversationStore,
    parent: ConversationKey,
    parent_gen: str,
    fork_id: str,
    fork_gen: str,
    report: PurgeReport,
    origins: list[tuple[str, str]],
) -> None:
    for _ in range(MAX_FORK_DEPTH + 1):
        pk = keys.partition_key(parent)
        store._delete_items(
            pk,
            [
                keys.fork_ref_key(parent_gen, state, fork_id, fork_gen)
                for state in (keys.FORK_LIVE, keys.FORK_KEPT)
            ],
        )
        head = store._get_item(pk, keys.HEAD_SK)
        if head is not None and head.get(codec.A_GEN) == parent_gen:
            return  # the life stands: its own purge decides
        lower, upper = forks.prefix_bounds(keys.fork_refs_prefix(parent_gen))
        if next(store._keys_between(pk, lower, upper), None) is not None:
            return  # other forks still read it
        report.reclaimed_lives += 1
        store.sealer.destroy(parent, [parent_gen])  # keys first, as a purge does
        report.objects += store.blobs.delete_keys(
            store.blobs.list_keys(keys.blob_prefix(parent, parent_gen))
        )
        report.events += _delete_life_events(store, parent, parent_gen)
        _drop_kept_tombstone(store, pk)
        origin = store._get_item(pk, keys.origin_key(parent_gen))
        if origin is None:
            return
        origins.append((pk, keys.origin_key(parent_gen)))
        fork_id, fork_gen = parent.conversation_id, parent_gen
        parent_id, parent_gen = forks.decode_origin(origin)
        parent = ConversationKey(tenant=parent.tenant, conversation_id=parent_id)


def _drop_kept_tombstone(store: ConversationStore, pk: str) -> None:
    """Delete the tombstone a purge kept for forks (:meth:`_finish_purge`) once no fork
    reads any event of the partition. Only such a tombstone (no expiry): one whose purge
    is still running must stay until that purge deletes it."""
    if next(store._keys_between(pk, *forks.prefix_bounds(keys.FORK_REF_PREFIX)), None):
        return
    item = store._get_item(pk, keys.HEAD_SK)
    if item is None or codec.A_FENCE in item or codec.A_EXPIRES in item:
        return
    tomb = tombstone_of(item)
    if tomb is not None:
        store._delete_head(pk, item)


def _delete_life_events(store: ConversationStore, key: ConversationKey, gen: str) -> int:
    """Delete the event items of ``key``'s life ``gen``: a gone life kept for its forks.

    Lives occupy consecutive ranges of storage sequences, so the scan stops at the
    first event of another life after this one's.
    """
    doomed: list[EventStamp] = []
    lower, upper = keys.event_sort_key(0), keys.event_sort_key(10**12 - 1)
    # Lazily, page by page: the reads stop where this life's events end.
    for item in store._keys_between(keys.partition_key(key), lower, upper):
        if item.get(codec.A_GEN) == gen:
            doomed.append(EventStamp(str(item[codec.A_SK]), gen, events_in(item)))
        elif doomed:
            break
    return sum(stamp.events for stamp in doomed if store.delete_event(key, stamp))
