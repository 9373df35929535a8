"""Content sealed at rest under conversation data keys (:mod:`.keyring`): the one seam.

:class:`ItemSealer` seals the content attributes of table items
(:func:`content_attributes`) on their way to the backend and opens them on the way
back; :class:`~.base.ConversationStore` calls it where it encodes and decodes items,
and destroys keys through it before a purge deletes what they sealed.

Objects sealed under their conversation's data key on their way to S3:

:class:`SealedBlobStore` wraps any :class:`.blobs.BlobStore`: every object a
conversation life writes with :meth:`~SealedBlobStore.put` (offloaded payloads,
draft chunks) is stored as ciphertext bound to its own object key, under the data
key of the life its key names (``t/<tenant>/c/<conversation>/g/<gen>/...``). So an
object restored from a bucket's old version after erasure, or copied to another
key, does not open.

Objects written before encryption was turned on carry no :data:`MAGIC` and are read
as they are, so existing conversations keep working; they are sealed when next
written. Streamed objects (:meth:`~SealedBlobStore.put_stream`: a large export, which
its owner downloads by URL) are stored as given: the export is the one place content
leaves in clear, by its owner's request, and it lives only until the conversation's
next purge.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from ..core.exceptions import ContentUnreadable, CorruptedState, InternalError, InvalidRequest
from ..core.models import ConversationKey
from . import codec, inbox, keyring, keys, records
from .backend import ConditionFailed, Unchanged, Update
from .blobs import BlobStore
from .codec import Item
from .keyring import DataKey, Keyring
from .views import tombstone_of

if TYPE_CHECKING:
    from .base import ConversationStore


#: What a sealed object starts with (then :func:`.keyring.seal`'s format).
MAGIC = b"TLSEAL1\n"


def object_life(object_key: str) -> tuple[str, str, str] | None:
    """The ``(tenant, conversation_id, gen)`` an object key of a conversation life names."""
    parts = object_key.split("/")
    if len(parts) < 7 or parts[0] != "t" or parts[2] != "c" or parts[4] != "g":
        return None
    return unquote(parts[1]), parts[3], parts[5]


class SealedBlobStore(BlobStore):
    """A :class:`BlobStore` that seals what conversation lives put into ``inner``."""

    def __init__(self, inner: BlobStore, keyring: Keyring) -> None:
        self.inner = inner
        self.keyring = keyring
        self.makes_urls = inner.makes_urls

    def _key(self, object_key: str, *, create: bool) -> DataKey:
        life = object_life(object_key)
        if life is None:
            raise InternalError(f"object {object_key!r} belongs to no conversation life")
        return self.keyring.data_key(*life, create=create)

    def put(self, key: str, data: bytes) -> None:
        self._put_sealed(key, self._key(key, create=True), data)

    def _put_sealed(self, key: str, data_key: DataKey, data: bytes) -> None:
        """Store ``data`` at ``key`` sealed under ``data_key``, bound to ``key``."""
        self.inner.put(key, MAGIC + data_key.seal(data, key.encode()))

    def get(self, key: str) -> bytes:
        data = self.inner.get(key)
        if not data.startswith(MAGIC):
            return data  # written before encryption was on
        try:
            return self._key(key, create=False).unseal(data[len(MAGIC) :], key.encode(), where=key)
        except CorruptedState as exc:
            raise ContentUnreadable(
                "this object's content does not open here: it was sealed for another object",
                details={"item": key},
            ) from exc

    def seal_existing(self, key: str) -> bool | None:
        """Seal the object ``key`` if it was stored in clear (before encryption was on),
        under the data key its life already has: ``True`` sealed, ``False`` sealed before,
        ``None`` left as it was (its life has no key: erased, or never sealed anything).

        Never makes a key: a copy sealed under a key that an erasure destroyed meanwhile
        (and put back after the erasure deleted the object) opens nowhere.
        """
        data = self.inner.get(key)
        if data.startswith(MAGIC):
            return False
        try:
            data_key = self._key(key, create=False)
        except ContentUnreadable:
            return None
        self._put_sealed(key, data_key, data)
        return True

    def list_keys(self, prefix: str) -> Iterator[str]:
        return self.inner.list_keys(prefix)

    def delete_keys(self, keys: Iterable[str]) -> int:
        return self.inner.delete_keys(keys)

    def put_stream(self, key: str, chunks: Iterable[bytes], content_type: str) -> int:
        return self.inner.put_stream(key, chunks, content_type)

    def download_url(self, key: str, expires_in: int) -> str | None:
        return self.inner.download_url(key, expires_in)


# --- table items --------------------------------------------------------------------------


#: What a sealed attribute value starts with, then :func:`.keyring.seal`'s bytes. Sealed
#: values are binary attributes (DynamoDB's ``B``): every clear value the store writes is
#: a string or a number, so no clear value is ever taken for a sealed one, and a sealed
#: value weighs its clear text plus 34 bytes (base64 text would weigh a third more: write
#: units are paid per started KiB).
SEALED_VALUE = b"\x1ftl1:"
#: After :data:`SEALED_VALUE`, instead of :func:`.keyring.seal`'s format byte: the clear
#: text was deflated before it was sealed (then :func:`.keyring.seal`'s bytes, bound to the
#: item's attribute *and* to this encoding: :func:`.keyring.item_aad`).
DEFLATED = b"z"
#: What a content value stored in clear but deflated starts with (a store without keys),
#: then the raw DEFLATE stream (:mod:`zlib`, no header) of its UTF-8 text.
DEFLATED_VALUE = b"\x1ftlz:"
#: What every value in one of the formats above starts with: a binary value that starts
#: with it and is in none of them was written by a newer build (or damaged) and is refused.
STORE_VALUE = b"\x1ftl"
#: Content values of fewer UTF-8 bytes are stored as they are: DEFLATE saves little below
#: (an event body of ~130 bytes shrinks by ~20), and every started KiB of an item is paid.
COMPRESS_MIN_BYTES = 128
#: The most a deflated value may inflate to: well over any item DynamoDB holds, so a
#: damaged or forged value cannot make a reader allocate without bound.
MAX_INFLATED_BYTES = 64 * 1024 * 1024
#: The life of an item that names none (idempotency records, side items without ``g``):
#: they are sealed under the conversation's data key for this "life", destroyed with it.
NO_LIFE = "-"


def content_attributes(item: Item) -> list[str]:
    """The attributes of ``item`` that hold content, by its kind (its sort key).

    Events and inbox entries: the body (message texts, tool arguments and outputs, run
    records, summaries, the arguments a person decides on); ``HEAD`` and turn items: the
    content of their head state (:data:`.codec.A_CONTENT`: pending calls' arguments and
    reasons, ...: :data:`.codec.STATE_CONTENT`); idempotency records: the
    recorded answer; side items (drafts, memory records, the OpenAI face's index): every
    text attribute of the caller's. Keys, kinds, sequence numbers, lives, expiries and
    index attributes stay clear, so queries, conditions and the sweep work without keys.
    """
    sort_key = str(item.get(codec.A_SK, ""))
    if sort_key == keys.HEAD_SK or sort_key.startswith(keys.EVENT_PREFIX):
        # A head state's content (codec.split_content): HEAD's and a turn item's alike.
        held = [codec.A_BODY] if sort_key != keys.HEAD_SK else []
        return [name for name in (*held, codec.A_CONTENT) if name in item]
    if sort_key.startswith(inbox.ENTRY_PREFIX):
        return [codec.A_BODY] if codec.A_BODY in item else []
    if sort_key.startswith(keys.RECORD_PREFIX):
        return [records.A_DATA] if records.A_DATA in item else []
    if sort_key.startswith(keys.MEMORY_USER_PREFIX):
        return []  # a user id (tenant erasure lists them after the tenant key is gone)
    if sort_key.startswith(keys.SIDE_PREFIX):
        return [
            name
            for name, value in item.items()
            if name not in codec.RESERVED_ATTRIBUTES and isinstance(value, str)
        ]
    return []


def _life(sort_key: str, gen: object) -> str:
    """The life whose data key seals the item ``sort_key`` of life ``gen``: its own, but for
    inbox entries (read from an index that projects no ``g``) and items without one."""
    if not gen or sort_key.startswith(inbox.ENTRY_PREFIX):
        return NO_LIFE
    return str(gen)


def deflate(text: bytes) -> bytes | None:
    """``text`` as a raw DEFLATE stream (:mod:`zlib`, level 9, no header or checksum: the
    seal's tag, or the item's own integrity, already covers it), or ``None`` when that
    would not save bytes: under :data:`COMPRESS_MIN_BYTES`, or not shorter than ``text``
    by more than a marker; or over :data:`MAX_INFLATED_BYTES`, which no reader inflates."""
    if not COMPRESS_MIN_BYTES <= len(text) <= MAX_INFLATED_BYTES:
        return None
    packer = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    packed = packer.compress(text) + packer.flush()
    return packed if len(packed) + len(DEFLATED_VALUE) < len(text) else None


def inflate(packed: bytes, *, where: str) -> bytes:
    """What :func:`deflate` packed.

    Raises:
        CorruptedState: ``packed`` is no whole DEFLATE stream, or inflates to more than
            :data:`MAX_INFLATED_BYTES`.
    """
    unpacker = zlib.decompressobj(-zlib.MAX_WBITS)
    try:
        text = unpacker.decompress(packed, MAX_INFLATED_BYTES)
    except zlib.error as exc:
        raise CorruptedState(
            "a stored value does not inflate", details={"item": where, "reason": str(exc)}
        ) from exc
    if not unpacker.eof or unpacker.unconsumed_tail or unpacker.unused_data:
        raise CorruptedState(
            "a stored value does not inflate", details={"item": where, "reason": "not whole"}
        )
    return text


def _text(clear: bytes, where: str) -> str:
    try:
        return clear.decode()
    except UnicodeDecodeError as exc:
        raise CorruptedState(
            "a stored value is not text", details={"item": where, "reason": str(exc)}
        ) from exc


def _deflated_in_clear(value: object) -> bool:
    return isinstance(value, bytes) and value.startswith(DEFLATED_VALUE)


def _unknown(where: str) -> CorruptedState:
    return CorruptedState(
        "a stored value is in no format this build reads", details={"item": where}
    )


class ItemSealer:
    """Seals the content attributes of table items (:func:`content_attributes`) on their
    way to the backend, and opens them on the way back: the one seam of the store's
    encryption and compression at rest.

    A value is sealed under the data key of its item's conversation life (``g``; else
    :data:`NO_LIFE`) with ``(pk, sk, attribute)`` as associated data: a ciphertext copied
    into another attribute, item, conversation or life does not open. A value of at least
    :data:`COMPRESS_MIN_BYTES` is deflated first when that makes it shorter (its marker
    :data:`DEFLATED` is in the associated data too); without keys it is stored deflated in
    clear (:data:`DEFLATED_VALUE`). Values written before (clear text, sealed without
    compression) are read as they are and sealed when next written.

    Args:
        keyring: the keys (``None``: nothing is sealed, long values are deflated in clear;
            a sealed value met is unreadable).
    """

    def __init__(self, keyring: Keyring | None) -> None:
        self.keyring = keyring

    def seal(self, item: Item) -> Item:
        """``item`` with its content attributes as :meth:`seal_attributes` stores them: the
        content of a head state (``HEAD``'s, a turn item's) split out of it first when
        sealing (:func:`.codec.split_content`), so what the sweep and purges read stays clear."""
        if self.keyring is not None:
            item = codec.split_content(item)
        return self.seal_attributes(
            str(item[codec.A_PK]), str(item[codec.A_SK]), item.get(codec.A_GEN), item
        )

    def seal_attributes(self, pk: str, sk: str, gen: object, attributes: Item) -> Item:
        """``attributes`` of the item (``pk``, ``sk``) of life ``gen`` with those that hold
        content stored as the backend keeps them: a whole item, or the few an update sets.

        A content value of at least :data:`COMPRESS_MIN_BYTES` is deflated when that makes
        it shorter (:func:`deflate`); then, with keys, sealed (its marker saying which);
        without keys, stored deflated in clear (:data:`DEFLATED_VALUE`). A value a store
        without keys deflated is sealed as it is by one with keys (``seal-existing``).
        """
        names = [
            name
            for name in content_attributes({codec.A_PK: pk, codec.A_SK: sk, **attributes})
            if isinstance(attributes.get(name), str)
            or (self.keyring is not None and _deflated_in_clear(attributes.get(name)))
        ]
        if not names:
            return attributes
        key: DataKey | None = None
        if self.keyring is not None:
            life = _life(sk, gen)
            # A life's key is never needed again once its purge began (its commits fail),
            # but the conversation-wide one is: another environment may have destroyed it
            # since this one cached it (a DELETE), so a write under it reads it afresh.
            key = self._key(pk, life, create=True, recheck=life == NO_LIFE)
        stored = dict(attributes)
        for name in names:
            value = attributes[name]
            deflated = (
                bytes(value[len(DEFLATED_VALUE) :])
                if isinstance(value, bytes)
                else deflate(str(value).encode())
            )
            if key is None:
                if deflated is not None:
                    stored[name] = DEFLATED_VALUE + deflated
            elif deflated is not None:
                aad = keyring.item_aad(pk, sk, name, deflated=True)
                stored[name] = SEALED_VALUE + DEFLATED + key.seal(deflated, aad)
            else:
                aad = keyring.item_aad(pk, sk, name)
                stored[name] = SEALED_VALUE + key.seal(str(value).encode(), aad)
        return stored

    def reseals(self, item: Item | None) -> bool:
        """Whether ``item`` (``HEAD`` as stored) holds head-state content in clear that this
        sealer would seal: written before encryption was on, it is rewritten sealed."""
        return self.keyring is not None and codec.holds_clear_content(item)

    def clear_limit(self, limit: int) -> int:
        """The clear bytes of an item that is at most ``limit`` bytes once sealed (the
        marker, a nonce and a tag come on top of each sealed value)."""
        return limit if self.keyring is None else limit - 1024

    def open(self, item: Item, held: Mapping[str, DataKey] | None = None) -> Item:
        """``item`` with its stored values opened (sealed ones unsealed, deflated ones
        inflated: :meth:`seal_attributes`; text values as they are), the content of its head
        state put back (:func:`.codec.join_content`).

        Args:
            held: data keys by life, taken before an erasure destroyed them (the purge
                reads what its deleted items name: :meth:`hold`).

        Raises:
            ContentUnreadable: a value's key is destroyed (erased, or the item was restored
                from a copy taken before), or it was sealed for another item.
            CorruptedState: a value in no format this build reads (:data:`STORE_VALUE`
                followed by an unknown marker), or one that does not inflate.
        """
        stored = [
            name
            for name, value in item.items()
            if isinstance(value, bytes) and value.startswith(STORE_VALUE)
        ]
        if not stored:
            return codec.join_content(item)
        pk, sk = str(item[codec.A_PK]), str(item.get(codec.A_SK, ""))
        key: DataKey | None = None
        opened = dict(item)
        for name in stored:
            value = bytes(item[name])
            if value.startswith(DEFLATED_VALUE):
                opened[name] = _text(inflate(value[len(DEFLATED_VALUE) :], where=sk), sk)
                continue
            if not value.startswith(SEALED_VALUE):
                raise _unknown(sk)
            body = value[len(SEALED_VALUE) :]
            deflated = body[:1] == DEFLATED
            if deflated:
                body = body[1:]
            if body[:1] != keyring.FORMAT:
                raise _unknown(sk)
            if key is None:
                life = _life(sk, item.get(codec.A_GEN))
                key = (held or {}).get(life) or self._key(pk, life, create=False)
            try:
                aad = keyring.item_aad(pk, sk, name, deflated=deflated)
                clear = key.unseal(body, aad, where=sk)
                if not deflated:
                    opened[name] = clear.decode()
            except (ValueError, CorruptedState) as exc:
                raise ContentUnreadable(
                    "this item's content does not open here: it was sealed for another item",
                    details={"item": sk},
                ) from exc
            if deflated:
                opened[name] = _text(inflate(clear, where=sk), sk)
        return codec.join_content(opened)

    def hold(self, key: ConversationKey, gens: Iterable[str]) -> dict[str, DataKey]:
        """The data keys of ``key``'s lives ``gens`` that still exist, by life: what a
        purge reads its items with once it destroyed them."""
        held: dict[str, DataKey] = {}
        if self.keyring is None:
            return held
        for gen in set(gens):
            with contextlib.suppress(ContentUnreadable):
                held[gen] = self.keyring.data_key(
                    key.tenant, key.conversation_id, gen, create=False
                )
        return held

    def destroy(self, key: ConversationKey, gens: Iterable[str]) -> None:
        """Destroy the data keys of ``key``'s lives ``gens``: their content no longer
        opens, in this table or in any copy of it."""
        if self.keyring is not None:
            self.keyring.destroy_conversation(key.tenant, key.conversation_id, sorted(set(gens)))

    def destroy_tenant(self, tenant: str) -> str | None:
        """Destroy ``tenant``'s key, then its data keys (:meth:`.keyring.Keyring.destroy_tenant`).

        Returns:
            The tenant's own KMS key scheduled for deletion, if it named one.
        """
        return None if self.keyring is None else self.keyring.destroy_tenant(tenant)

    def _key(self, pk: str, life: str, *, create: bool, recheck: bool = False) -> DataKey:
        if self.keyring is None:
            raise ContentUnreadable(
                "this item's content is sealed and this deployment has no keys",
                details={"item": pk},
            )
        try:
            owner = keys.parse_partition_key(pk)
        except ValueError as exc:
            raise InternalError(f"item of {pk!r} belongs to no conversation") from exc
        return self.keyring.data_key(
            owner.tenant, owner.conversation_id, life, create=create, recheck=recheck
        )


# --- sealing what was written clear (the migration) --------------------------------------


@dataclass
class SealReport:
    """What :meth:`ConversationStore.seal_existing` did to the items and objects it walked."""

    #: Items (and objects) whose clear content it rewrote sealed.
    sealed: int = 0
    #: Items that held no clear content (sealed before, or holding none).
    already_sealed: int = 0
    #: Items left as they were: of a life being purged (a fenced head, a tombstone, no
    #: head), changed while being sealed (the writer that changed them sealed them), or too
    #: large once sealed.
    skipped: int = 0

    def __iadd__(self, other: SealReport) -> SealReport:
        self.sealed += other.sealed
        self.already_sealed += other.already_sealed
        self.skipped += other.skipped
        return self


def seal_existing(store: ConversationStore, key: ConversationKey) -> SealReport:
    """Rewrite sealed every item of ``key``'s partition whose content is still clear
    (written before encryption was on), as a write would seal it (:class:`.ItemSealer`),
    then the objects of its live life (:meth:`.SealedBlobStore.seal_existing`):
    the migration's one-off command (``turnledger seal-existing``).

    Each rewrite is conditional on the item being unchanged since it was read, so a
    concurrent commit, clear or erasure is never overwritten. Items of a life being
    purged are left alone: all of them when the head is fenced or absent, those of
    other lives than the tombstone's when it is a tombstone. Idempotent: a second run
    seals nothing.

    Also works on the partitions that hold no head (:func:`.keys.tenant_items`,
    :func:`.keys.memory_items`): their items belong to no life.
    """
    if store.sealer.keyring is None:
        raise InvalidRequest("this store has no keys: content sealing is not configured")
    pk = keys.partition_key(key)
    report = SealReport()
    headless = key.conversation_id == keys.TENANT_ITEMS_ID or key.conversation_id.startswith(
        keys.MEMORY_ITEMS_PREFIX
    )
    head = None if headless else store._get_item(pk, keys.HEAD_SK)
    purging: str | None = None  # the one life whose items may be sealed, if any
    if not headless:
        tomb = None if head is None else tombstone_of(head)
        if head is None or codec.A_FENCE in head:
            purging = ""  # no life
        elif tomb is not None:
            purging = tomb.gen
    cursor: Any = None
    while True:
        page = store._query(pk, lower=None, upper=None, descending=False, limit=1000, cursor=cursor)
        for item in page.items:
            sealed = store.sealer.seal(item)
            if sealed is item or sealed == item:
                report.already_sealed += 1
            elif purging is not None and item.get(codec.A_GEN) != purging:
                report.skipped += 1
            elif codec.item_size(sealed) > codec.MAX_ITEM_BYTES:
                report.skipped += 1  # read with its content clear, as it was written
            else:
                # Only what sealing changes is set, on the condition that it is still
                # as read: a concurrent writer's change (a fence, a gravestone) stays.
                changed = {n: v for n, v in sealed.items() if item.get(n) != v}
                expected = {n: item.get(n) for n in changed}
                pk, sk = str(item[codec.A_PK]), str(item[codec.A_SK])
                try:
                    store._write(Update(pk, sk, changed, Unchanged(expected)))
                except ConditionFailed:
                    report.skipped += 1
                else:
                    report.sealed += 1
        if page.cursor is None:
            break
        cursor = page.cursor
    if head is not None and purging is None and isinstance(store.blobs, SealedBlobStore):
        # The live life's objects, once its items are sealed (so its key exists).
        for object_key in list(store.blobs.list_keys(keys.blob_prefix(key, head[codec.A_GEN]))):
            done = store.blobs.seal_existing(object_key)
            if done is None:
                report.skipped += 1
            elif done:
                report.sealed += 1
            else:
                report.already_sealed += 1
    return report
