"""Idempotency records: one item per keyed request, in its conversation's partition.

The layout is the one Powertools' own ``DynamoDBPersistenceLayer`` writes with its
default attribute names (a table written by either reads with the other)::

    pk                      the conversation's partition key
    sk                      "I#<hash>": the record's key (after "HEAD", outside the events)
    expires_at              epoch seconds: the record counts until then (the table's TTL)
    status                  "INPROGRESS", "COMPLETED", ...
    in_progress_expiration  epoch milliseconds: an in-progress record's run ends by then
    data                    the recorded answer
    validation              the hash of the request body it answered

No ``g``: a purge deletes every item of the partition that is not of the next life,
so clearing or erasing a conversation removes its records with it.

The store knows records only as data and one rule, Powertools' put condition
(:func:`may_replace`, the backend condition :class:`Replaceable`);
:mod:`turnledger.api.idempotency` adapts them to Powertools.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.exceptions import ConversationBusy, InternalError
from ..core.models import ConversationKey
from . import codec, keys
from .backend import Condition, ConditionFailed, Put, Update
from .codec import Item

if TYPE_CHECKING:
    from .base import ConversationStore


#: Attribute names (Powertools' ``DynamoDBPersistenceLayer`` defaults).
A_STATUS = "status"
A_IN_PROGRESS_EXPIRY = "in_progress_expiration"
A_DATA = "data"
A_VALIDATION = "validation"


#: The status of a record whose request is running: its key is taken over once its
#: ``in_progress_expiration`` has passed (the run that wrote it died).
IN_PROGRESS = "INPROGRESS"


@dataclass(frozen=True)
class Record:
    """One idempotency record."""

    #: The record's sort key in its conversation's partition (``"I#<hash>"``).
    key: str
    status: str
    #: Epoch seconds after which the record no longer counts.
    expires_at: int
    #: Epoch milliseconds after which an in-progress record may be taken over.
    in_progress_expires_at: int | None = None
    #: The recorded answer (``None``: none yet).
    data: str | None = None
    #: The hash of the request body the record answers (``None``: not checked).
    validation: str | None = None


def record_item(pk: str, record: Record) -> Item:
    """The item of ``record`` in partition ``pk``."""
    item: Item = {
        codec.A_PK: pk,
        codec.A_SK: record.key,
        codec.A_EXPIRES: record.expires_at,
        A_STATUS: record.status,
    }
    if record.in_progress_expires_at is not None:
        item[A_IN_PROGRESS_EXPIRY] = record.in_progress_expires_at
    if record.data is not None:
        item[A_DATA] = record.data
    if record.validation is not None:
        item[A_VALIDATION] = record.validation
    return item


def update_attributes(record: Record) -> Item:
    """What :meth:`~.base.ConversationStore.update_record` sets: status, expiry, answer
    and (when it has one) validation hash; the in-progress expiry is left as stored."""
    attributes: Item = {
        codec.A_EXPIRES: record.expires_at,
        A_STATUS: record.status,
        A_DATA: record.data or "",
    }
    if record.validation is not None:
        attributes[A_VALIDATION] = record.validation
    return attributes


def decode_record(item: Item) -> Record:
    """The record ``item`` holds (missing attributes read as absent)."""
    in_progress = item.get(A_IN_PROGRESS_EXPIRY)
    data = item.get(A_DATA)
    validation = item.get(A_VALIDATION)
    return Record(
        key=str(item[codec.A_SK]),
        status=str(item.get(A_STATUS, "")),
        expires_at=int(item.get(codec.A_EXPIRES) or 0),
        in_progress_expires_at=None if in_progress is None else int(in_progress),
        data=None if data is None else str(data),
        validation=None if validation is None else str(validation),
    )


def may_replace(stored: Item | None, now: float) -> bool:
    """Whether a put of a record may replace ``stored`` (``None``: nothing stored) at
    ``now`` (epoch seconds): Powertools' condition. Nothing is stored, the stored record
    has expired, or it is in progress and its in-progress expiry has passed."""
    if stored is None:
        return True
    expires = stored.get(codec.A_EXPIRES)
    if isinstance(expires, int | float) and expires < int(now):
        return True
    in_progress = stored.get(A_IN_PROGRESS_EXPIRY)
    return (
        stored.get(A_STATUS) == IN_PROGRESS
        and isinstance(in_progress, int | float)
        and in_progress < int(now * 1000)
    )


@dataclass(frozen=True)
class Replaceable(Condition):
    """The backend condition of a record's put: :func:`may_replace` at ``now``."""

    now: float

    def holds(self, stored: Item | None) -> bool:
        return may_replace(stored, self.now)


#: Puts of a record that found a live one deleted before it could be read.
_PUT_ATTEMPTS = 3
#: What a caller is told to wait before retrying such a put (as DynamoDB's conflicts).
_RETRY_AFTER_SECONDS = 1


# --- records in the store (api/idempotency_records.py) -----------------------------------


def _record_key(record_key: str) -> str:
    """``record_key`` if it names an idempotency record (never a head, an event or
    another kind of item).

    Raises:
        InternalError: it does not.
    """
    if not record_key.startswith(keys.RECORD_PREFIX):
        raise InternalError(f"not an idempotency record key: {record_key!r}")
    return record_key


def _checked_record(record: Record) -> Record:
    """``record`` if its key names an idempotency record (see :func:`_record_key`)."""
    _record_key(record.key)
    return record


def get_record(store: ConversationStore, key: ConversationKey, record_key: str) -> Record | None:
    """The idempotency record ``record_key`` of ``key``, read consistently, or ``None``
    (whether or not it has expired: the caller judges that)."""
    item = store._get_item(keys.partition_key(key), _record_key(record_key))
    return None if item is None else decode_record(store.sealer.open(item))


def put_record(
    store: ConversationStore, key: ConversationKey, record: Record, *, now: float
) -> Record | None:
    """Put ``record`` unless a live record holds its key at ``now`` (epoch seconds).

    The put condition is Powertools' (:func:`.may_replace`): no record, an
    expired one, or one in progress whose in-progress expiry has passed. Atomic: of
    two puts racing for one key, exactly one is written.

    Returns:
        ``None`` when ``record`` was written; else the live record that refused it.

    Raises:
        PayloadTooLarge: the record is over the backend's item size limit.
    """
    item = store.sealer.seal(record_item(keys.partition_key(key), _checked_record(record)))
    codec.check_item_sizes([item])
    for _ in range(_PUT_ATTEMPTS):
        try:
            store._write(Put(item, Replaceable(now)))
        except ConditionFailed as refused:
            # DynamoDB returns the refusing item; when it does not (deleted since the
            # condition failed), it is read, and if gone the put is tried again.
            stored = refused.stored or store._get_item(item[codec.A_PK], item[codec.A_SK])
            if stored is not None:
                return decode_record(store.sealer.open(stored))
            continue
        return None
    raise ConversationBusy(
        "the idempotency record kept changing; retry",
        details={"retry_after_seconds": _RETRY_AFTER_SECONDS},
    )


def update_record(store: ConversationStore, key: ConversationKey, record: Record) -> None:
    """Set ``record``'s status, expiry, answer and validation hash (when it has one),
    unconditionally, creating the record if it is absent; its in-progress expiry stays
    as stored.

    Raises:
        PayloadTooLarge: the record would be over the backend's item size limit.
    """
    pk = keys.partition_key(key)
    codec.check_item_sizes([record_item(pk, _checked_record(record))])
    attributes = update_attributes(record)
    sealed = store.sealer.seal_attributes(pk, record.key, None, attributes)
    store._write(Update(pk, record.key, sealed))


def delete_record(store: ConversationStore, key: ConversationKey, record_key: str) -> None:
    """Delete the idempotency record ``record_key`` of ``key`` (absent is fine)."""
    store._delete_items(keys.partition_key(key), [_record_key(record_key)])
