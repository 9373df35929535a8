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
(:func:`may_replace`); :mod:`turnledger.api.idempotency` adapts them to Powertools.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import codec
from .codec import Item

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
