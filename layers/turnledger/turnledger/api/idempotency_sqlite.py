"""Powertools idempotency records in the SQLite store (``turnledger local --data-dir``).

The same records as on DynamoDB (:mod:`.idempotency`): item ``(pk, sk)`` =
(the conversation's partition key, ``I#<hash>``), with Powertools' attributes and
the expiry in the table's TTL attribute, written into the SQLite store's own
table. So they survive a restart of the local runner like the conversations do,
and a clear or an erasure removes them with the conversation's partition.

Each write is one SQLite transaction that checks Powertools' put condition (no
record, an expired one, or an in-progress one whose Lambda timed out) under the
database's write lock: atomic across the runner's processes, as DynamoDB's
conditional put is.
"""

from __future__ import annotations

import time

from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyItemAlreadyExistsError,
    IdempotencyItemNotFoundError,
)
from aws_lambda_powertools.utilities.idempotency.persistence.base import BasePersistenceLayer
from aws_lambda_powertools.utilities.idempotency.persistence.datarecord import (
    STATUS_CONSTANTS,
    DataRecord,
)

from ..store import codec
from ..store.codec import Item
from ..store.sqlite import SQLiteConversationStore

#: Powertools' attribute names (those of its DynamoDB layer's defaults).
STATUS = "status"
DATA = "data"
VALIDATION = "validation"
IN_PROGRESS_EXPIRY = "in_progress_expiration"


class SQLiteRecordPersistence(BasePersistenceLayer):
    """Powertools' persistence layer over one conversation's partition of a SQLite store."""

    def __init__(self, store: SQLiteConversationStore, partition_key: str) -> None:
        """Records go to ``partition_key``'s partition of ``store``."""
        self.store = store
        self.partition_key = partition_key
        super().__init__()  # type: ignore[no-untyped-call]

    def _item(self, record: DataRecord) -> Item:
        item: Item = {
            codec.A_PK: self.partition_key,
            codec.A_SK: record.idempotency_key,
            codec.A_EXPIRES: record.expiry_timestamp,
            STATUS: record.status,
        }
        if record.in_progress_expiry_timestamp is not None:
            item[IN_PROGRESS_EXPIRY] = record.in_progress_expiry_timestamp
        if record.response_data:
            item[DATA] = record.response_data
        if self.payload_validation_enabled and record.payload_hash:
            item[VALIDATION] = record.payload_hash
        return item

    @staticmethod
    def _record(item: Item) -> DataRecord:
        return DataRecord(
            idempotency_key=str(item[codec.A_SK]),
            status=str(item[STATUS]),
            expiry_timestamp=item.get(codec.A_EXPIRES),
            in_progress_expiry_timestamp=item.get(IN_PROGRESS_EXPIRY),
            response_data=str(item.get(DATA, "")),
            payload_hash=str(item.get(VALIDATION, "")),
        )

    def _get_record(self, idempotency_key: str) -> DataRecord:
        item = self.store.get_record(self.partition_key, idempotency_key)
        if item is None:
            raise IdempotencyItemNotFoundError
        return self._record(item)

    def _put_record(self, data_record: DataRecord) -> None:
        now = time.time()

        def free(stored: Item | None) -> bool:
            # Powertools' DynamoDB condition: no record, an expired one, or one in progress
            # whose in-progress expiry (the Lambda's remaining time) has passed.
            if stored is None:
                return True
            if int(stored.get(codec.A_EXPIRES) or 0) < int(now):
                return True
            in_progress_expiry = stored.get(IN_PROGRESS_EXPIRY)
            return (
                stored.get(STATUS) == STATUS_CONSTANTS["INPROGRESS"]
                and in_progress_expiry is not None
                and int(in_progress_expiry) < int(now * 1000)
            )

        written, stored = self.store.put_record_if(self._item(data_record), free)
        if written:
            return
        if stored is None:  # refused with nothing stored cannot happen; say so plainly
            raise IdempotencyItemAlreadyExistsError()
        old = self._record(stored)
        # As Powertools' DynamoDB layer does with the item its failed put returns: another
        # body under the same key is IdempotencyValidationError, else the stored record.
        self._validate_payload(data_payload=data_record, stored_data_record=old)
        self._save_to_cache(data_record=old)
        raise IdempotencyItemAlreadyExistsError(old_data_record=old)

    def _update_record(self, data_record: DataRecord) -> None:
        self.store.put_record_if(self._item(data_record), lambda _: True)

    def _delete_record(self, data_record: DataRecord) -> None:
        self.store.delete_record(self.partition_key, data_record.idempotency_key)
